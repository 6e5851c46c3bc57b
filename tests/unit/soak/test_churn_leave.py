"""#30 (the 30-minute run): a churned consumer that leaves by plan is nobody's client.

The run counted 3 of 205 faults as not survived only because a churned consumer left at the
end of its planned hold: two before they could deliver again after a driver / media driver
restart, one before its first frame (a consumer takes seconds to start at load 30).
"""

from __future__ import annotations

import random
import signal
from pathlib import Path
from types import SimpleNamespace

from tensorpool.commands.soak import RECOVERY_TIMEOUT_S, Injected, Injector
from tensorpool.soak.schedule import Fault


class _Topo:
    """The parts of the topology `Injector.due` uses: who runs, who delivered, signals."""

    def __init__(self, started: float) -> None:
        self.current = {"churn-1-102": SimpleNamespace(started=started)}
        self.delivered: dict[str, int] = {}
        self.signals: list[tuple[str, int]] = []

    def signal(self, name: str, sig: int, *, expected: bool = True) -> None:
        self.signals.append((name, sig))


def _injector(topo: _Topo) -> Injector:
    inj = Injector(topo, Path("/nonexistent"), random.Random(1))  # type: ignore[arg-type]
    inj.pending_stop.append((10.0, "churn-1-102"))
    return inj


def _fault(kind: str, affected: list[str]) -> Injected:
    return Injected(Fault(1.0, kind, "driver-a"), 5.0, affected, {a: 0 for a in affected})


def test_30_a_churned_consumer_leaves_after_its_hold_only_once_it_delivered() -> None:
    topo = _Topo(started=0.0)
    injector = _injector(topo)
    injector.due(11.0, [])
    assert topo.signals == []  # no frame yet: it stays
    topo.delivered["churn-1-102"] = 3
    injector.due(12.0, [])
    assert topo.signals == [("churn-1-102", signal.SIGTERM)]


def test_30_a_churned_consumer_that_never_delivers_leaves_at_the_recovery_window() -> None:
    topo = _Topo(started=0.0)
    injector = _injector(topo)
    injector.due(RECOVERY_TIMEOUT_S + 0.1, [])
    assert topo.signals == [("churn-1-102", signal.SIGTERM)]


def test_30_a_fault_is_judged_without_the_churned_consumer_that_left_unrecovered() -> None:
    topo = _Topo(started=0.0)
    topo.delivered["churn-1-102"] = 3
    injector = _injector(topo)
    driver_kill = _fault("kill9-driver", ["churn-1-102", "consumer-102"])
    own = _fault("consumer-churn", ["churn-1-102"])
    injector.due(11.0, [driver_kill, own])
    assert driver_kill.affected == ["consumer-102"]
    assert own.affected == ["churn-1-102"]  # its own churn is still judged by it
