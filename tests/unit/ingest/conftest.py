"""Shared helpers for the ingest tests: a scripted clock (the only fake these tests use)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest


class ScriptedClock:
    """A host clock whose readings are scripted; ``step`` advances it after each reading.

    ``script`` values are returned first (one per call), then the clock keeps counting up by
    ``step`` from the last numeric reading.
    """

    def __init__(self, start: float = 0.0, step: float = 0.0, script: Iterable[object] = ()):
        self.now: float = start
        self.step = step
        self.script = list(script)
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.script:
            value = self.script.pop(0)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.now = float(value)
            return value
        value = self.now
        self.now += self.step
        return value


@pytest.fixture
def clock_factory() -> type[ScriptedClock]:
    return ScriptedClock
