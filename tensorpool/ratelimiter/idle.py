"""Idling between duty cycles: sleep until the next rate slot instead of spinning.

A rate-limited mapping has nothing to do between its slots: descriptors wait in the Aeron log
(a 16 MiB IPC term holds ~260k of them) and, when the agent wakes at the slot, it drains them
all and publishes the newest. So the rate limiter's cost follows the *output* rate, not the
source rate: at 30 Hz it wakes ~30 times a second instead of running a duty cycle per source
frame. :class:`SlotIdleStrategy` asks the agent how long it may sleep
(:func:`~tensorpool.ratelimiter.gate.idle_hint_ns`, capped so leases, hellos and forwarded
metadata stay timely) and falls back to an Aeron-style backoff (spin, yield, park) while a
slot is open or a mapping is unlimited, when frames should go out as they arrive.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.idle import BackoffIdleStrategy, IdleStrategy

__all__ = ["SlotIdleStrategy"]


class SlotIdleStrategy:
    """``idle(work)``: after work, back off as usual; when idle, sleep the hinted time."""

    __slots__ = ("_backoff", "_clock", "_hint", "_sleep", "sleeps")

    def __init__(
        self,
        hint_ns: Callable[[int], int],
        backoff: IdleStrategy | None = None,
        *,
        clock: NanoClock = now_ns,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._hint = hint_ns
        self._backoff = backoff if backoff is not None else BackoffIdleStrategy()
        self._clock = clock
        self._sleep = sleep
        self.sleeps = 0

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            self._backoff.idle(work_count)
            return
        hint = self._hint(self._clock())
        if hint > 0:
            self._backoff.reset()
            self.sleeps += 1
            self._sleep(hint / 1e9)
        else:
            self._backoff.idle(0)

    def reset(self) -> None:
        self._backoff.reset()
