"""Idle strategies: what a duty-cycle loop does when a cycle found no work.

Model (Agrona's): after each cycle the runner calls ``idle(work_count)``. Work > 0 means "keep
going, and forget any backoff"; 0 means "nothing happened", and the strategy decides how to wait:
spin (lowest latency, burns a core), yield the CPU, sleep a fixed time, or back off through
spin -> yield -> park with doubling park times (fast response after activity, near-zero CPU when
quiet). ``reset()`` returns a strategy to its most eager state.

These are pure Python on purpose: ``time.sleep`` and ``os.sched_yield`` release the GIL like
pyaeron's C strategies do (measured: native and Python yield ~1.1-1.2 us, a 1 us sleep ~60 us
either way because of the kernel's timer slack), and a Python backoff exposes its state and takes
injected ``sleep``/``yield_`` functions, so escalation is tested exactly with a fake clock.
:class:`NativeIdleStrategy` wraps ``pyaeron.IdleStrategy`` for callers who want the C version;
its busy-spin/noop idle(0) costs ~0.2 us per call because it drops and re-takes the GIL, which
is what a busy-spinning thread should do when other Python threads need to run.

Python busy-spin holds the GIL between the interpreter's switch points; in a process with other
busy Python threads prefer backoff, or ``NativeIdleStrategy.busy_spin()``.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable
from typing import Final, Protocol, runtime_checkable

import pyaeron


@runtime_checkable
class IdleStrategy(Protocol):
    def idle(self, work_count: int) -> None: ...

    def reset(self) -> None: ...


class NoOpIdleStrategy:
    """Never waits (for loops that wait elsewhere, e.g. in a blocking call)."""

    __slots__ = ()
    name: Final = "noop"

    def idle(self, work_count: int) -> None:
        pass

    def reset(self) -> None:
        pass


class BusySpinIdleStrategy:
    """Returns immediately: lowest latency, one core at 100 %."""

    __slots__ = ()
    name: Final = "busy_spin"

    def idle(self, work_count: int) -> None:
        pass

    def reset(self) -> None:
        pass


class YieldingIdleStrategy:
    """Gives the CPU to any runnable thread (``sched_yield``), releasing the GIL."""

    __slots__ = ("_yield",)
    name: Final = "yield"

    def __init__(self, yield_: Callable[[], None] = os.sched_yield) -> None:
        self._yield = yield_

    def idle(self, work_count: int) -> None:
        if work_count <= 0:
            self._yield()

    def reset(self) -> None:
        pass


class SleepingIdleStrategy:
    """Sleeps a fixed time when idle (low CPU, latency up to the sleep + timer slack)."""

    __slots__ = ("_seconds", "_sleep", "sleep_ns")
    name: Final = "sleep"

    def __init__(
        self, sleep_ns: int = 1_000_000, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        if sleep_ns <= 0:
            raise ValueError(f"sleep_ns must be > 0, got {sleep_ns}")
        self.sleep_ns = sleep_ns
        self._seconds = sleep_ns / 1e9
        self._sleep = sleep

    def idle(self, work_count: int) -> None:
        if work_count <= 0:
            self._sleep(self._seconds)

    def reset(self) -> None:
        pass


class BackoffState(enum.IntEnum):
    NOT_IDLE = 0
    SPINNING = 1
    YIELDING = 2
    PARKING = 3


_NOT_IDLE: Final = BackoffState.NOT_IDLE
_SPINNING: Final = BackoffState.SPINNING
_YIELDING: Final = BackoffState.YIELDING
_PARKING: Final = BackoffState.PARKING


class BackoffIdleStrategy:
    """Spin ``max_spins`` times, yield ``max_yields`` times, then park with doubling sleeps.

    Park time starts at ``min_park_ns`` and doubles per idle cycle up to ``max_park_ns``; any
    cycle with work (or :meth:`reset`) returns to NOT_IDLE. Same state machine as Agrona's
    BackoffIdleStrategy, with pyaeron's ``IdleStrategy.backoff`` defaults.
    """

    __slots__ = (
        "_sleep",
        "_yield",
        "max_park_ns",
        "max_spins",
        "max_yields",
        "min_park_ns",
        "park_period_ns",
        "spins",
        "state",
        "yields",
    )
    name: Final = "backoff"

    def __init__(
        self,
        max_spins: int = 10,
        max_yields: int = 20,
        min_park_ns: int = 1_000,
        max_park_ns: int = 1_000_000,
        *,
        sleep: Callable[[float], None] = time.sleep,
        yield_: Callable[[], None] = os.sched_yield,
    ) -> None:
        if max_spins < 0 or max_yields < 0:
            raise ValueError("max_spins and max_yields must be >= 0")
        if not 0 < min_park_ns <= max_park_ns:
            raise ValueError(
                f"need 0 < min_park_ns <= max_park_ns, got {min_park_ns}, {max_park_ns}"
            )
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_park_ns = min_park_ns
        self.max_park_ns = max_park_ns
        self._sleep = sleep
        self._yield = yield_
        self.state = _NOT_IDLE
        self.spins = 0
        self.yields = 0
        self.park_period_ns = min_park_ns

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            if self.state is not _NOT_IDLE:
                self.reset()
            return
        # One step per idle call; a step that changes state does not wait (as in Agrona).
        state = self.state
        if state is _NOT_IDLE:
            self.state = _SPINNING
            self.spins = 1
        elif state is _SPINNING:
            self.spins += 1
            if self.spins > self.max_spins:
                self.state = _YIELDING
                self.yields = 0
        elif state is _YIELDING:
            self.yields += 1
            if self.yields > self.max_yields:
                self.state = _PARKING
                self.park_period_ns = self.min_park_ns
            else:
                self._yield()
        else:
            self._sleep(self.park_period_ns / 1e9)
            self.park_period_ns = min(self.park_period_ns * 2, self.max_park_ns)

    def reset(self) -> None:
        self.state = _NOT_IDLE
        self.spins = 0
        self.yields = 0
        self.park_period_ns = self.min_park_ns


class NativeIdleStrategy:
    """pyaeron's C idle strategies behind the same two methods."""

    __slots__ = ("_native", "idle", "name", "reset")

    def __init__(self, native: pyaeron.IdleStrategy, name: str) -> None:
        self._native = native
        self.idle = native.idle
        self.reset = native.reset
        self.name = name

    @classmethod
    def busy_spin(cls) -> NativeIdleStrategy:
        return cls(pyaeron.IdleStrategy.busy_spin(), "busy_spin")

    @classmethod
    def noop(cls) -> NativeIdleStrategy:
        return cls(pyaeron.IdleStrategy.noop(), "noop")

    @classmethod
    def yielding(cls) -> NativeIdleStrategy:
        return cls(pyaeron.IdleStrategy.yielding(), "yield")

    @classmethod
    def sleeping(cls, sleep_ns: int = 1_000_000) -> NativeIdleStrategy:
        return cls(pyaeron.IdleStrategy.sleeping(sleep_ns), "sleep")

    @classmethod
    def backoff(
        cls,
        max_spins: int = 10,
        max_yields: int = 20,
        min_park_ns: int = 1_000,
        max_park_ns: int = 1_000_000,
    ) -> NativeIdleStrategy:
        native = pyaeron.IdleStrategy.backoff(
            max_spins=max_spins,
            max_yields=max_yields,
            min_park_ns=min_park_ns,
            max_park_ns=max_park_ns,
        )
        return cls(native, "backoff")


IDLE_STRATEGY_NAMES: Final = ("noop", "busy_spin", "yield", "sleep", "backoff")


def idle_strategy(name: str, *, native: bool = False, **params: int) -> IdleStrategy:
    """Build a strategy from a config name: noop, busy_spin, yield, sleep, backoff.

    ``params``: ``sleep_ns`` for sleep; ``max_spins``, ``max_yields``, ``min_park_ns``,
    ``max_park_ns`` for backoff. Unknown names or parameters raise ValueError.
    """
    allowed = {
        "noop": (),
        "busy_spin": (),
        "yield": (),
        "sleep": ("sleep_ns",),
        "backoff": ("max_spins", "max_yields", "min_park_ns", "max_park_ns"),
    }.get(name)
    if allowed is None:
        raise ValueError(f"unknown idle strategy {name!r}; expected one of {IDLE_STRATEGY_NAMES}")
    unknown = set(params) - set(allowed)
    if unknown:
        raise ValueError(f"idle strategy {name!r} takes no parameter(s) {sorted(unknown)}")
    if native:
        factory = {
            "noop": NativeIdleStrategy.noop,
            "busy_spin": NativeIdleStrategy.busy_spin,
            "yield": NativeIdleStrategy.yielding,
            "sleep": NativeIdleStrategy.sleeping,
            "backoff": NativeIdleStrategy.backoff,
        }[name]
        return factory(**params)
    if name == "noop":
        return NoOpIdleStrategy()
    if name == "busy_spin":
        return BusySpinIdleStrategy()
    if name == "yield":
        return YieldingIdleStrategy()
    if name == "sleep":
        return SleepingIdleStrategy(**params)
    return BackoffIdleStrategy(**params)
