"""The service's JSON log lines, read back from the captured stdout (`logs` fixture).

Start the gateway inside the test, after `logs` (capfd) began: the service's log writer binds the
stdout it finds at start-up, and only a gateway started after `capfd` writes where `capfd` reads.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.gateway import GatewayHandle


class Logs:
    def __init__(self, capfd: pytest.CaptureFixture[str]) -> None:
        self.capfd = capfd
        self.seen: list[dict[str, Any]] = []
        self.raw = ""

    def lines(self, event: str, *gateways: GatewayHandle) -> list[dict[str, Any]]:
        for gw in gateways:
            assert gw.service.log_writer is not None
            gw.service.log_writer.flush()
        out = self.capfd.readouterr().out
        self.raw += out
        self.seen += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return [{k: v for k, v in line.items() if k != "timestamp"} for line in self.seen if line["event"] == event]


@pytest.fixture
def logs(capfd: pytest.CaptureFixture[str]) -> Logs:
    return Logs(capfd)
