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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from tensorpool.transport.idle import BackoffIdleStrategy, IdleStrategy

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
    ) -> None:
        self.agent = agent
        self.idle_strategy: IdleStrategy = idle if idle is not None else BackoffIdleStrategy()
        self._error_handler = error_handler
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
        try:
            try:
                agent.on_start()
            except BaseException as exc:
                self.start_error = exc
                raise
            do_work = agent.do_work
            idle = self.idle_strategy.idle
            while not self._stop_requested:
                try:
                    work = do_work()
                except AgentTermination:
                    self.terminated_by_agent = True
                    break
                except Exception as exc:
                    self._on_error(exc)
                    work = 0
                self.duty_cycles += 1
                self.total_work += work
                idle(work)
        finally:
            try:
                agent.on_close()
            except Exception:
                log.exception("agent %s: on_close raised", self.role_name)
            self._running = False
            self._run_thread = None
            self._done.set()

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
