"""Waiting in tests by condition, never by a fixed sleep: poll until it holds, fail with what was awaited
when a generous bound passes (the bound is for a hung process, not a speed test)."""

from __future__ import annotations

import time
from collections.abc import Callable

BOUND_S = 60.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = BOUND_S, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"after {timeout:g} s still waiting for {what}"
        time.sleep(every)
