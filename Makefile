# The one test command (README, .ci/run): a fresh virtualenv, the project with its test extras,
# lint, types, tests. PostgreSQL and Redis must be answering on 127.0.0.1 (.ci/run starts them).
PYTHON ?= python3
VENV ?= .venv

.PHONY: test install serve lint

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

install: $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e '.[test,local]'

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/python -m pytest -q

serve: $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e .
	$(VENV)/bin/switchyard serve
