"""A journal directory the service cannot write: no request is served unrecorded (503
`unavailable`), unless `[ledger] required = false`, when requests are served and recorded from
memory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ledger_journal.test_cut_mid_load import ledger_is
from tests.support.cli import CATALOG, Process
from tests.support.client import body, post
from tests.support.gateway import StartGateway
from tests.support.waiting import wait_until


class ReadOnly:
    """`switchyard-journal` in the tmp dir, read-only: mode 0555, and immutable when the tests run
    as root (whom mode bits do not stop) until `release()`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        directory.chmod(0o555)
        self.root = os.geteuid() == 0
        if self.root:
            subprocess.run(["chattr", "+i", str(directory)], check=True)
        with pytest.raises(OSError):  # noqa: PT011 (EACCES or EPERM, whichever stops this user)
            (directory / "probe").write_text("")

    def release(self) -> None:
        if self.root:
            subprocess.run(["chattr", "-i", str(self.directory)], check=True)
        self.directory.chmod(0o755)


@pytest.fixture
def read_only_journal(tmp_path: Path) -> Iterator[ReadOnly]:
    read_only = ReadOnly(tmp_path / "switchyard-journal")
    try:
        yield read_only
    finally:
        read_only.release()


@pytest.mark.parametrize("required", [True, False])
async def test_a_read_only_journal_refuses_traffic_unless_not_required(
    required: bool, start_gateway: StartGateway, mock_upstream: tuple[int, list[Process]], read_only_journal: ReadOnly
) -> None:
    port, _ = mock_upstream
    gw = await start_gateway(
        providers={"local": {"kind": "local", "base_url": f"http://127.0.0.1:{port}/v1"}},
        catalog=CATALOG,
        ledger={"required": required},
    )
    ready = await gw.client.get("/readyz")
    assert ready.json()["ledger"] == "unwritable"
    metrics = (await gw.client.get("/metrics")).text
    assert "switchyard_ledger_journal_writable 0.0" in metrics
    answers = [await post(gw, body("tiny", stream=stream)) for stream in (False, True)]
    if required:
        assert ready.status_code == 503
        for answer in answers:
            assert answer.status_code == 503
            error = answer.json()["error"]
            assert (error["type"], error["message"]) == ("unavailable", "usage cannot be recorded")
        assert await gw.ledger_rows() == []
        assert list(read_only_journal.directory.iterdir()) == []
        read_only_journal.release()  # the operator fixes the disk: traffic is served again
        await wait_until(ledger_is(gw, "ok"), within=5.0, what="/readyz: ledger ok")
        served = await post(gw, body("tiny"))
        assert served.status_code == 200
        assert [row["request_id"] for row in await gw.ledger_rows()] == [served.headers["x-request-id"]]
    else:
        assert ready.status_code == 200
        assert [answer.status_code for answer in answers] == [200, 200]
        rows = await gw.ledger_rows()
        assert sorted(row["request_id"] for row in rows) == sorted(a.headers["x-request-id"] for a in answers)
        assert list(read_only_journal.directory.iterdir()) == []
