# The one test command (README, .ci/run): a fresh virtualenv, the project with its test extras,
# lint, types, tests. PostgreSQL and Redis must be answering on 127.0.0.1 (.ci/run starts them).
#
# Installs are stamped (.venv/.installed*, newer than pyproject.toml means up to date), so only a
# fresh machine or a changed pyproject.toml reinstalls. `make check` is the quick loop: lint,
# types and every test but the `local` ones, with the test extras only (no torch).
PYTHON ?= python3
VENV ?= .venv
INSTALLED := $(VENV)/.installed
INSTALLED_TEST := $(VENV)/.installed-test

.PHONY: test check install lint serve
.NOTPARALLEL:

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e '.[test,local]'
	touch $(INSTALLED_TEST) $@

$(INSTALLED_TEST): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

install: $(INSTALLED)

lint: $(INSTALLED_TEST)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: install lint
	$(VENV)/bin/python -m pytest -q

check: lint
	$(VENV)/bin/python -m pytest -q -m "not local"

serve: $(VENV)/bin/python
	$(VENV)/bin/pip install -q -e .
	$(VENV)/bin/switchyard serve
