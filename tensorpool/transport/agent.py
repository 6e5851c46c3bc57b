"""Agents and the runner that drives them (Aeron/Agrona's Agent pattern).

Model: an *agent* owns some I/O (subscriptions to poll, publications to offer on, timers to
check) and exposes one duty cycle, ``do_work() -> int``, returning how much it did. It never
blocks and never sleeps; waiting is the job of the :class:`AgentRunner`, which loops
``do_work`` then ``idle(work)`` with an idle strategy until told to stop. ``on_start`` and
``on_close`` run on the agent's own thread, so an agent can create thread-bound resources there.

Faults: an exception from ``do_work`` is counted (``errors``), handed to ``error_handler``
(default: log at exponentially spaced counts), and the loop goes on — one bad input must not kill
a long-running service. The exception to the rule is :class:`AgentTermination`: raising it ends
the loop cleanly (Agrona's AgentTerminationException). ``BaseException``s that are not
``Exception``s (KeyboardInterrupt, SystemExit) also stop the loop and propagate, after
``on_close``.

Several light agents can share one thread through :class:`CompositeAgent` (useful on a 2-core
host, where one thread per agent would just contend).

The runner owns the services every duty cycle needs (#26.1), so that no agent and no daemon can
forget one: media-driver liveness and reconnection (:meth:`AeronContext.maintain` on the
``context`` it is given), the idle strategy, stop signals (``StopSignals``) and the parent
watch, a periodic ``report`` and a ``duration``, and the health record (:meth:`health`) that
status files and the ``tensorpool_media_driver_connected`` gauge are built from. An agent only
does its work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.idle import BackoffIdleStrategy, IdleStrategy
from tensorpool.transport.process import StopSignals, exit_with_parent

if TYPE_CHECKING:  # the runner only calls it: importing pyaeron stays the caller's choice
    from tensorpool.transport.context import AeronContext

log = logging.getLogger(__name__)


class AgentTermination(Exception):
    """Raised by an agent to end its runner's loop on purpose (not counted as an error)."""


@runtime_checkable
class Agent(Protocol):
    role_name: str

    def on_start(self) -> None: ...

    def do_work(self) -> int: ...

    def on_close(self) -> None: ...


ErrorHandler = Callable[[BaseException], object]


class AgentRunner:
    """Runs one agent's duty cycle on this thread (:meth:`run`) or a new one (:meth:`start`).

    One-shot, like Agrona's: once stopped it does not run again; make a new runner.
    """

    def __init__(
        self,
        agent: Agent,
        idle: IdleStrategy | None = None,
        *,
        error_handler: ErrorHandler | None = None,
        context: AeronContext | None = None,
        context_lock: threading.Lock | threading.RLock | None = None,
        stop_signals: StopSignals | None = None,
        watch_parent: bool = False,
        report: Callable[[bool], object] | None = None,
        report_interval_s: float = 0.0,
        duration_s: float = 0.0,
        fatal: tuple[type[Exception], ...] = (),
        clock: NanoClock = now_ns,
    ) -> None:
        """``context``: the Aeron context whose media driver this runner keeps (checked every
        100 ms, reconnected after a loss). ``stop_signals``: installed by :meth:`run` on the
        main thread (SIGTERM/SIGINT end the loop; restored after). ``watch_parent``: stop when
        the process that started this one for itself is gone (``exit_with_parent``).
        ``context_lock``: held while the context is checked (a reconnect re-creates the
        subscriptions other threads poll under that lock); a cycle that cannot take it at
        once skips the check.
        ``report(final)`` runs every ``report_interval_s`` (0: never) on the agent's thread
        with ``final=False``, and once with ``final=True`` when the loop ends; ``duration_s``
        > 0 ends the loop after that long. ``fatal``: exception types from ``do_work`` that end
        the loop and propagate (a configuration mistake seen only at run time) instead of being
        counted."""
        self.agent = agent
        self.idle_strategy: IdleStrategy = idle if idle is not None else BackoffIdleStrategy()
        self._error_handler = error_handler
        self.context = context
        self._context_lock = context_lock
        self.stop_signals = stop_signals
        self._watch_parent = watch_parent
        self._report = report
        self._report_ns = int(report_interval_s * 1e9) if report_interval_s > 0 else 0
        self._duration_ns = int(duration_s * 1e9) if duration_s > 0 else 0
        self._fatal = fatal
        self._clock = clock
        self.started_ns: int | None = None
        self._running = False
        self._stop_requested = False
        self._thread: threading.Thread | None = None
        self._run_thread: threading.Thread | None = None
        self._done = threading.Event()
        self.duty_cycles = 0
        self.total_work = 0
        self.errors = 0
        self.last_error: BaseException | None = None
        self.start_error: BaseException | None = None
        self.terminated_by_agent = False

    @property
    def role_name(self) -> str:
        return self.agent.role_name

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def health(self) -> dict[str, object]:
        """The runner's record of itself and its media driver, for status files and metrics.

        ``state`` is ``running`` while all is well and ``media_driver_lost`` from the moment
        the loss is noticed until a reconnect succeeds (#26.3); ``media_driver`` says since
        when (``lost_for_s``), why, and how many reconnect attempts failed so far."""
        ctx = self.context
        doc: dict[str, object] = {
            "role": self.role_name,
            "state": "running" if self._running else "stopped",
            "duty_cycles": self.duty_cycles,
            "errors": self.errors,
        }
        if ctx is not None:
            doc["media_driver"] = ctx.media_driver_health(self._clock())
            if self._running and ctx.media_driver_lost:
                doc["state"] = "media_driver_lost"
        return doc

    def _on_error(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = exc
        if self._error_handler is not None:
            try:
                self._error_handler(exc)
            except Exception:
                log.exception("error handler of agent %s failed", self.role_name)
        elif self.errors & (self.errors - 1) == 0:
            log.error(
                "agent %s: do_work raised (%d errors so far)",
                self.role_name,
                self.errors,
                exc_info=exc,
            )

    def run(self) -> None:
        """Run on the calling thread until :meth:`stop`, AgentTermination, or a fatal error.

        If ``on_start`` raises, the loop does not run, ``on_close`` still runs, and the error
        is re-raised (kept in ``start_error`` for background runners).
        """
        if self._running:
            raise RuntimeError(f"agent {self.role_name} is already running")
        self._running = True
        self._run_thread = threading.current_thread()
        self._done.clear()
        agent = self.agent
        signals = self.stop_signals
        if signals is not None and not signals.installed:
            signals.install()
        if self._watch_parent:
            exit_with_parent()  # through SIGTERM, so the stop signals above end the loop
        try:
            try:
                agent.on_start()
            except BaseException as exc:
                self.start_error = exc
                raise
            self._loop(agent, signals)
        finally:
            try:
                agent.on_close()
            except Exception:
                log.exception("agent %s: on_close raised", self.role_name)
            finally:
                if signals is not None:
                    signals.restore()
            self._running = False
            self._run_thread = None
            self._done.set()

    def _loop(self, agent: Agent, signals: StopSignals | None) -> None:
        do_work = agent.do_work
        idle = self.idle_strategy.idle
        clock = self._clock
        ctx = self.context
        report = self._report
        start = self.started_ns = clock()
        end = start + self._duration_ns if self._duration_ns else None
        next_report = start + self._report_ns if report is not None and self._report_ns else None
        try:
            while not self._stop_requested and not (signals is not None and signals.requested):
                now = clock()
                # the media driver first: after a reconnect the agent works on live resources
                work = int(self._maintain(ctx, now)) if ctx is not None else 0
                try:
                    work += do_work()
                except AgentTermination:
                    self.terminated_by_agent = True
                    break
                except Exception as exc:
                    if isinstance(exc, self._fatal):
                        raise
                    self._on_error(exc)
                self.duty_cycles += 1
                self.total_work += work
                if end is not None and now >= end:
                    break
                if next_report is not None and now >= next_report:
                    next_report += self._report_ns
                    report(False)  # type: ignore[misc]
                idle(work)
        finally:
            if report is not None:
                report(True)  # the final one, also after a stop signal or an error

    def _maintain(self, ctx: AeronContext, now: int) -> bool:
        lock = self._context_lock
        if lock is None:
            return ctx.maintain(now)
        if not lock.acquire(blocking=False):
            return False
        try:
            return ctx.maintain(now)
        finally:
            lock.release()

    def start(self, *, name: str | None = None, daemon: bool = True) -> Self:
        """Run on a new thread (named after the role). Call :meth:`stop` to end it."""
        if self._thread is not None:
            raise RuntimeError(f"agent {self.role_name} was already started")

        def target() -> None:
            try:
                self.run()
            except Exception:
                log.exception("agent %s stopped by an error", self.role_name)

        self._thread = threading.Thread(
            target=target, name=name or f"agent-{self.role_name}", daemon=daemon
        )
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the loop to finish after its current cycle (safe from any thread or signal)."""
        self._stop_requested = True

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Request a stop and wait for the loop to finish; True if it did within the timeout."""
        self._stop_requested = True
        if threading.current_thread() is self._run_thread:
            return False  # called from the agent itself: it ends when this cycle returns
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return not self._running or self._done.wait(timeout_s)

    def close(self) -> None:
        if not self.stop():
            log.warning("agent %s did not stop in time", self.role_name)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class WorkAgent:
    """An agent that is only a duty cycle: a command's loop body, given as a function."""

    def __init__(self, role_name: str, do_work: Callable[[], int]) -> None:
        self.role_name = role_name
        self.do_work = do_work

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        pass


class CompositeAgent:
    """Several agents on one duty cycle; the work count is their sum.

    If one agent's ``do_work`` raises, the exception goes to the runner (counted there) and the
    next cycle resumes with the *following* agent, so a failing agent cannot starve the ones
    after it. AgentTermination from any agent ends the composite.
    """

    def __init__(self, agents: Sequence[Agent], role_name: str | None = None) -> None:
        if not agents:
            raise ValueError("CompositeAgent needs at least one agent")
        self.agents: tuple[Agent, ...] = tuple(agents)
        self.role_name = role_name or "[" + ",".join(a.role_name for a in self.agents) + "]"
        self._next = 0
        self._started = 0

    def on_start(self) -> None:
        try:
            for agent in self.agents:
                agent.on_start()
                self._started += 1
        except BaseException:
            self.on_close()
            raise

    def do_work(self) -> int:
        agents = self.agents
        n = len(agents)
        work = 0
        i = self._next
        self._next = 0
        while i < n:
            try:
                work += agents[i].do_work()
            except Exception:
                self._next = (i + 1) % n
                raise
            i += 1
        return work

    def on_close(self) -> None:
        started, self._started = self._started, 0
        for agent in self.agents[:started]:
            try:
                agent.on_close()
            except Exception:
                log.exception("agent %s: on_close raised", agent.role_name)
