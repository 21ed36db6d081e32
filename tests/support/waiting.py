"""Waiting on a condition, never on the clock.

`wait_until` (inside the event loop) and `wait_until_sync` (for subprocesses and plain threads)
poll a predicate until it holds and fail with a message naming what did not happen once the
deadline passes. A fixed sleep in a test is the behaviour under test or a bug; these are for the
rest.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import pytest

Check = Callable[[], bool] | Callable[[], Awaitable[bool]]
What = str | Callable[[], str] | None


def _describe(check: Callable[..., object], what: What) -> str:
    if callable(what):
        return what()
    return what or getattr(check, "__qualname__", repr(check))


async def wait_until(check: Check, within: float = 2.0, what: What = None, interval: float = 0.01) -> None:
    """Poll `check` (sync or async) every `interval` s until it is true; fail after `within` s."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within} s: {_describe(check, what)}")
        await asyncio.sleep(interval)


def wait_until_sync(check: Callable[[], bool], within: float = 10.0, what: What = None, interval: float = 0.1) -> None:
    """`wait_until` for code outside an event loop (subprocess servers, blocking clients)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within} s: {_describe(check, what)}")
        time.sleep(interval)
