"""AgentRunner and CompositeAgent: work counting, fault survival, prompt stop."""

from __future__ import annotations

import threading

import pytest

from tensorpool.transport import (
    Agent,
    AgentRunner,
    AgentTermination,
    CompositeAgent,
    NoOpIdleStrategy,
    SleepingIdleStrategy,
)
from tensorpool.transport.agent import WorkAgent
from tensorpool.transport.process import StopSignals


class _Scripted:
    """An agent whose duty cycles follow a script: ints are work counts, exceptions raise."""

    def __init__(self, script: list[int | BaseException], role_name: str = "scripted") -> None:
        self.role_name = role_name
        self.script = list(script)
        self.events: list[str] = []
        self.cycles = 0
        self.thread: threading.Thread | None = None

    def on_start(self) -> None:
        self.events.append("start")
        self.thread = threading.current_thread()

    def do_work(self) -> int:
        self.cycles += 1
        item = self.script.pop(0) if self.script else AgentTermination()
        if isinstance(item, BaseException):
            raise item
        return item

    def on_close(self) -> None:
        self.events.append("close")


def test_runner_counts_work_and_ends_on_termination() -> None:
    agent = _Scripted([1, 0, 3, 0, 2])
    assert isinstance(agent, Agent)
    runner = AgentRunner(agent, NoOpIdleStrategy())
    runner.run()
    assert runner.total_work == 6
    assert runner.duty_cycles == 5
    assert runner.terminated_by_agent
    assert runner.errors == 0
    assert agent.events == ["start", "close"]
    assert not runner.is_running


def test_runner_survives_agent_exceptions_and_counts_them() -> None:
    seen: list[BaseException] = []
    boom = ValueError("bad input")
    agent = _Scripted([1, boom, 2, KeyError("k"), 4])
    runner = AgentRunner(agent, NoOpIdleStrategy(), error_handler=seen.append)
    runner.run()
    assert runner.errors == 2
    assert seen[0] is boom and isinstance(seen[1], KeyError)
    assert runner.last_error is seen[1]
    assert runner.total_work == 7  # the loop kept going after each error
    assert agent.events == ["start", "close"]


def test_runner_default_error_handler_logs(caplog: pytest.LogCaptureFixture) -> None:
    runner = AgentRunner(_Scripted([RuntimeError("x")] * 3), NoOpIdleStrategy())
    runner.run()
    assert runner.errors == 3
    # logged at counts 1 and 2 (powers of two), not at 3
    assert len([r for r in caplog.records if "do_work raised" in r.getMessage()]) == 2


def test_runner_background_thread_stops_promptly() -> None:
    class Forever:
        role_name = "forever"

        def __init__(self) -> None:
            self.started = threading.Event()
            self.closed_on: threading.Thread | None = None

        def on_start(self) -> None:
            self.started.set()

        def do_work(self) -> int:
            return 0

        def on_close(self) -> None:
            self.closed_on = threading.current_thread()

    agent = Forever()
    runner = AgentRunner(agent, SleepingIdleStrategy(1_000_000)).start()
    assert agent.started.wait(5.0)
    assert runner.is_running
    assert runner.thread is not None and runner.thread.name == "agent-forever"
    assert runner.stop(timeout_s=5.0) is True
    assert not runner.is_running
    assert agent.closed_on is runner.thread  # on_close ran on the agent's own thread
    assert runner.duty_cycles > 0


def test_runner_on_start_failure_skips_loop_but_closes() -> None:
    class BadStart(_Scripted):
        def on_start(self) -> None:
            super().on_start()
            raise OSError("cannot map")

    agent = BadStart([1, 1])
    runner = AgentRunner(agent, NoOpIdleStrategy())
    with pytest.raises(OSError):
        runner.run()
    assert agent.cycles == 0
    assert agent.events == ["start", "close"]
    assert isinstance(runner.start_error, OSError)


def test_runner_keyboard_interrupt_propagates_after_close() -> None:
    agent = _Scripted([1, KeyboardInterrupt()])
    runner = AgentRunner(agent, NoOpIdleStrategy())
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert agent.events == ["start", "close"]


def test_composite_runs_all_agents_and_sums_work() -> None:
    a = _Scripted([1, 1, 1], "a")
    b = _Scripted([2, 2, 2, 2], "b")
    composite = CompositeAgent([a, b])
    assert composite.role_name == "[a,b]"
    runner = AgentRunner(composite, NoOpIdleStrategy())
    runner.run()  # ends when a runs out of script (AgentTermination)
    assert runner.total_work == 9
    assert a.events == b.events == ["start", "close"]
    assert a.thread is b.thread is threading.current_thread()


def test_composite_failing_agent_does_not_starve_the_next() -> None:
    a = _Scripted([ValueError("a1"), ValueError("a2"), 0, AgentTermination()], "a")
    b = _Scripted([5, 5, 5, 5], "b")
    runner = AgentRunner(CompositeAgent([a, b]), NoOpIdleStrategy())
    runner.run()
    assert runner.errors == 2
    # after each failure of a, the next cycle resumes with b
    assert b.cycles == 3
    assert runner.total_work == 15


def test_composite_start_failure_closes_started_agents() -> None:
    class BadStart(_Scripted):
        def on_start(self) -> None:
            raise OSError("no")

    a, bad, c = _Scripted([], "a"), BadStart([], "bad"), _Scripted([], "c")
    with pytest.raises(OSError):
        CompositeAgent([a, bad, c]).on_start()
    assert a.events == ["start", "close"]
    assert c.events == []
    with pytest.raises(ValueError):
        CompositeAgent([])


def test_stop_requested_from_inside_the_agent() -> None:
    holder: list[AgentRunner] = []

    class SelfStopping(_Scripted):
        def do_work(self) -> int:
            work = super().do_work()
            if self.cycles == 3:
                assert holder[0].stop() is False  # cannot join itself; stops after this cycle
            return work

    agent = SelfStopping([1] * 10)
    runner = AgentRunner(agent, NoOpIdleStrategy())
    holder.append(runner)
    runner.run()
    assert agent.cycles == 3
    assert not runner.terminated_by_agent


# --- the services the runner owns (#26.1) ----------------------------------------------------


def test_26_1_runner_reports_on_its_interval_and_once_more_at_the_end() -> None:
    """``report(False)`` every interval (on the clock the runner is given), ``report(True)``
    once when the loop ends; ``duration_s`` ends the loop."""
    now = [0]

    def clock() -> int:
        now[0] += 10_000_000  # 10 ms per read
        return now[0]

    calls: list[bool] = []
    runner = AgentRunner(
        WorkAgent("w", lambda: 1),
        NoOpIdleStrategy(),
        report=calls.append,
        report_interval_s=0.1,
        duration_s=1.0,
        clock=clock,
    )
    runner.run()
    assert calls[-1] is True and calls.count(True) == 1
    assert 8 <= calls.count(False) <= 10  # 1 s of 10 ms cycles, one report per 100 ms


def test_26_1_fatal_errors_end_the_loop_and_propagate_after_the_final_report() -> None:
    class ConfigMistake(Exception):
        pass

    def work() -> int:
        raise ConfigMistake("destination pools too small")

    calls: list[bool] = []
    runner = AgentRunner(
        WorkAgent("w", work), NoOpIdleStrategy(), report=calls.append, fatal=(ConfigMistake,)
    )
    with pytest.raises(ConfigMistake):
        runner.run()
    assert calls == [True] and runner.errors == 0


def test_26_1_a_stop_signal_ends_the_loop_and_the_handlers_are_restored() -> None:
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    stop = StopSignals((signal.SIGTERM,))
    sent = []

    def work() -> int:
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)  # handled between bytecodes: only a flag
        return 0

    runner = AgentRunner(WorkAgent("w", work), NoOpIdleStrategy(), stop_signals=stop)
    runner.run()
    assert stop.requested and stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_26_1_health_without_a_context_is_the_runners_own() -> None:
    runner = AgentRunner(WorkAgent("w", lambda: 0), NoOpIdleStrategy(), duration_s=0.01)
    runner.run()
    health = runner.health()
    assert health["role"] == "w" and health["state"] == "stopped"
    assert "media_driver" not in health
