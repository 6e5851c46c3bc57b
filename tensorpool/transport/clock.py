"""The one monotonic clock the transport layer (and everything above it) reads.

Model: every timestamp that crosses a process boundary on one host in the MONOTONIC clock
domain (Wire Spec §10.1.1 ``announce_clock_domain=MONOTONIC``, §15.7 ``timestamp_ns``) must
come from the same system-wide clock, or comparisons such as "announce stamped before the
consumer joined" are meaningless. On Linux ``time.monotonic_ns`` is ``CLOCK_MONOTONIC``, which
is system-wide (not per process) and never steps backwards.

``pyaeron.nano_clock`` wraps ``aeron_nano_clock``, which also reads ``CLOCK_MONOTONIC`` on
Linux (checked here: interleaved readings of the two are ordered, see the unit tests), so
values from Aeron and from Python are interchangeable. We still call the stdlib function:
it is a C builtin (no Python frame), exactly as fast, and needs no Aeron import.

Code never calls the clock directly in protocol logic; it receives a ``NanoClock`` so tests can
drive time with :class:`ManualClock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

NanoClock = Callable[[], int]
"""A zero-argument callable returning nanoseconds from a monotonic origin."""

now_ns: Final[NanoClock] = time.monotonic_ns
"""CLOCK_MONOTONIC in nanoseconds; bound to the builtin so a call costs no Python frame."""


class ManualClock:
    """A clock that moves only when told to, so time-dependent logic is tested exactly.

    Also usable as a fake ``sleep``: :meth:`sleep` advances time instead of blocking, which lets
    idle strategies and retry loops be tested without real waiting.
    """

    __slots__ = ("_now_ns", "sleeps")

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns
        self.sleeps: list[int] = []

    def __call__(self) -> int:
        return self._now_ns

    def advance(self, delta_ns: int) -> int:
        if delta_ns < 0:
            raise ValueError(f"a monotonic clock cannot go back (delta_ns={delta_ns})")
        self._now_ns += delta_ns
        return self._now_ns

    def set(self, value_ns: int) -> None:
        if value_ns < self._now_ns:
            raise ValueError(f"a monotonic clock cannot go back ({value_ns} < {self._now_ns})")
        self._now_ns = value_ns

    def sleep(self, seconds: float) -> None:
        """Record the requested sleep and advance time by it (drop-in for ``time.sleep``)."""
        delta = round(seconds * 1_000_000_000)
        self.sleeps.append(delta)
        self._now_ns += delta
