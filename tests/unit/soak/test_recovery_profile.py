"""#30.5: recovery p99 above 5 s for restarted parts: the report says where the seconds go.

For a fault that replaces a process, the soak times the new process's start and its first
output line (Python started, imports done, attached) against the fault; the clients' first
frames against that line. ``recovery_phases`` splits one fault's recovery time that way.
"""

from __future__ import annotations

import subprocess

from tensorpool.commands.soak import Injected, Instance, Role, _track_recovery, recovery_phases
from tensorpool.soak.schedule import Fault


class _Lock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Topo:
    """What `_track_recovery` reads: the current instance per part, deliveries, a lock."""

    def __init__(self) -> None:
        self.current: dict[str, Instance] = {}
        self.delivered: dict[str, int] = {"consumer-101": 0}
        self.delivered_at: dict[str, float] = {}
        self.lock = _Lock()


def _instance(started: float, first_line: float = 0.0) -> Instance:
    role = Role("producer-101", "producer", ["true"])
    inst = Instance(role, subprocess.Popen(["true"]), started)
    inst.proc.wait()
    inst.first_output_at = first_line
    return inst


def test_30_5_restart_recovery_splits_into_restart_process_start_and_first_frame() -> None:
    topo = _Topo()
    old = _instance(0.0, 0.5)
    inj = Injected(Fault(1.0, "kill9-producer", "producer-101"), 100.0, ["consumer-101"], {})
    inj.replaced = old
    topo.current["producer-101"] = old
    _track_recovery(topo, [inj], 100.5)  # the old one still current: nothing known yet
    assert inj.started_s is None
    new = _instance(100.4)  # started 0.4 s after the kill, silent for now
    topo.current["producer-101"] = new
    _track_recovery(topo, [inj], 103.0)  # 2 s without a line: the baseline is taken
    assert inj.baseline_taken and inj.first_line_s is None
    new.first_output_at = 108.4  # imports and attach took 8 s under load
    _track_recovery(topo, [inj], 108.5)
    topo.delivered["consumer-101"], topo.delivered_at["consumer-101"] = 5, 109.9
    _track_recovery(topo, [inj], 110.0)
    assert round(inj.recovered["consumer-101"], 2) == 9.9
    phases = recovery_phases(inj)
    assert {k: round(v, 2) for k, v in phases.items()} == {
        "restart": 0.4,
        "process_start": 8.0,
        "first_frame": 1.5,
    }


def test_30_5_a_fault_that_restarts_nothing_has_no_profile() -> None:
    inj = Injected(Fault(1.0, "stall", "producer-101"), 100.0, ["consumer-101"], {})
    inj.recovered = {"consumer-101": 3.0}
    assert recovery_phases(inj) == {}


def test_30_5_a_silent_part_keeps_its_first_replacements_start() -> None:
    """A driver prints nothing: its profile is its first replacement's start, not that of
    one started by a later fault (the 30-minute run reported a 1 404 s "restart")."""
    topo = _Topo()
    old = _instance(0.0)
    inj = Injected(Fault(1.0, "kill9-driver", "producer-101"), 100.0, ["consumer-101"], {})
    inj.replaced = old
    topo.current["producer-101"] = _instance(100.3)
    _track_recovery(topo, [inj], 103.0)
    topo.delivered["consumer-101"], topo.delivered_at["consumer-101"] = 5, 104.0
    _track_recovery(topo, [inj], 104.1)
    topo.current["producer-101"] = _instance(500.0)  # a later fault's replacement
    _track_recovery(topo, [inj], 501.0)
    assert {k: round(v, 2) for k, v in recovery_phases(inj).items()} == {
        "restart": 0.3,
        "first_frame": 3.7,
    }
