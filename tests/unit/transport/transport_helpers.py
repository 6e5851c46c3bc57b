"""Helpers for the transport tests (a plain module: conftest names are not importable)."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(
    step: Callable[[], object], done: Callable[[], bool], timeout_s: float = 10.0
) -> bool:
    """Drive ``step`` until ``done()``; a generous safety net, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        if not step():
            time.sleep(0.0005)
    return True
