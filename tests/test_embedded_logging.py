"""rev2 review: `create_app` in an application of its own leaves that application's logging as it was."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from app.application import create_app
from app.settings import load_settings
from tests.support.cli import write_config


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_create_app_leaves_an_embedding_applications_logging_alone(tmp_path: Path) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    kept = _Kept()
    root.addHandler(kept)
    root.setLevel(logging.INFO)
    try:
        create_app(load_settings(str(write_config(tmp_path))), prepare=False)
        logging.getLogger("embedder").info("the embedding application's own line")
        assert kept.lines == ["the embedding application's own line"]  # was: root clamped to WARNING
        assert root.level == logging.INFO
        assert [type(h).__name__ for h in root.handlers if h not in handlers] == ["_Kept"]  # no second handler
        assert warnings.showwarning is not logging._showwarning  # type: ignore[attr-defined]  # nor warnings taken over
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)
