"""#27.2: one trigger of the micro-batch reader as a pure step (``plan/trigger.py``).

The order ``latestOffset`` followed inline is now the step's rule: health before anything is
planned, the ``minFramesPerTrigger`` hold only while no read-time loss waits to be recorded
and never for ``ReadAllAvailable``, then the planner. Real planner, health monitor and gate;
the clock is a number.
"""

from __future__ import annotations

import pytest

from tensorpool.spark_source.plan.health import HealthMonitor, TensorPoolStaleStreamError
from tensorpool.spark_source.plan.offsets import Limits, RingState, StreamPos
from tensorpool.spark_source.plan.planner import StreamPlanner
from tensorpool.spark_source.plan.trigger import Trigger, TriggerInput

MS = 1_000_000
SID = 7


def _trigger(min_frames: int | None = 100, stale_ms: int = 5_000) -> Trigger:
    return Trigger(
        StreamPlanner((SID,)),
        HealthMonitor(stale_ms, warn_only=False),
        "control test",
        None if min_frames is None else (min_frames, 60_000),
        None,
    )


def _input(
    head: int,
    now_ns: int,
    *,
    late: dict[int, int] | None = None,
    live: bool = True,
    read_all: bool = False,
) -> TriggerInput:
    return TriggerInput(
        begin={SID: StreamPos(1, 0)},
        states={SID: RingState(1, 0, head, 64)},
        limits=Limits(),
        read_all=read_all,
        late=late or {},
        liveness={SID: (live, 10)},
        newest_wall_ns={SID: None},
        wall_shifts={},
        feed=None,
        now_ns=now_ns,
        wall_now_ns=now_ns,
    )


def test_27_2_min_frames_holds_a_small_backlog() -> None:
    """#16.4 through the step: 5 frames < minFramesPerTrigger=100 within the delay: held."""
    out = _trigger().step((SID,), _input(5, 1_000 * MS))
    assert out.plan is None


def test_27_2_the_hold_never_keeps_reported_loss_waiting() -> None:
    """Read-time loss reported since the last offset is recorded now, whatever the backlog:
    the same 5 frames with 2 frames lost late give a plan that records them."""
    out = _trigger().step((SID,), _input(5, 1_000 * MS, late={SID: 2}))
    assert out.plan is not None
    assert out.plan.end[SID] == StreamPos(1, 5, frames=5, lost=0, lost_late=2)


def test_27_2_read_all_available_is_never_held() -> None:
    """``ReadAllAvailable`` (and AvailableNow) plans whatever is there."""
    out = _trigger().step((SID,), _input(5, 1_000 * MS, read_all=True))
    assert out.plan is not None and out.plan.frames == 5


def test_27_2_health_is_checked_before_anything_is_planned() -> None:
    """A stream with no live producer past ``staleStreamTimeoutMs`` fails the trigger before
    the planner moves: the planner has not admitted anything when the error comes."""
    trig = _trigger(min_frames=None, stale_ms=1_000)
    trig.step((SID,), _input(0, 0, live=False))  # first sighting starts the clock
    with pytest.raises(TensorPoolStaleStreamError):
        trig.step((SID,), _input(10, 2_000 * MS, live=False))
    assert trig.planner.planned_runs(SID, 1, 0, 10) is None
