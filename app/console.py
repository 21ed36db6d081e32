"""The `switchyard` console script's entry point (`[project.scripts]` in pyproject.toml): it
imports `app.cli` inside a handler. Importing the command's modules (SQLAlchemy, uvicorn, Redis,
Litestar) takes about half a second, and a Ctrl-C in that time used to end the command with the
import's traceback; now it ends as a Ctrl-C later does (`app.cli.main`): exit 1, nothing printed.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from app.cli import main as command  # imported here: the point of this module
    except KeyboardInterrupt:
        return 1
    return command(sys.argv[1:])
