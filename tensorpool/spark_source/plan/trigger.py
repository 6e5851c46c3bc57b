"""One trigger of the micro-batch reader, sans-IO (#27.2): what ``latestOffset`` decides.

The order is the rule: the streams' health first (a stream with no live producer fails or
warns before anything is planned, #16.2); then the ``minFramesPerTrigger`` hold (#16.4), which
never holds while read-time loss waits to be recorded (the spool's, the servers', or a replay's
found by ``partitions``), for ``ReadAllAvailable``/``Trigger.AvailableNow``, or for a stream
that appeared or changed epoch; then the policy's per-stream limits (#17), the planner (offsets,
admission, loss at planning, event-time alignment #27.1), the policy's bookkeeping of what was
admitted and the gate's. The adapter gathers the inputs (ring scans, liveness, reported loss,
clocks) and acts on the outcome (offsets, logs, errors); nothing here reads a file, a socket or
a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tensorpool.spark_source.plan.health import HealthMonitor, MinFramesGate, backlog
from tensorpool.spark_source.plan.offsets import Limits, RingState, StreamPos
from tensorpool.spark_source.plan.planner import DescriptorFeed, Plan, StreamPlanner
from tensorpool.spark_source.plan.policy import SourcePolicy


@dataclass(frozen=True, slots=True)
class TriggerInput:
    """What one trigger is decided from (gathered by the adapter)."""

    begin: dict[int, StreamPos]  # the previous end offset
    states: dict[int, RingState | None]  # each ring now (None: not readable now)
    limits: Limits  # Spark's read limit with the options' caps
    read_all: bool  # ReadAllAvailable: minFramesPerTrigger never holds
    #: read-time loss reported since the last recorded offset, per stream
    late: dict[int, int]
    liveness: Mapping[int, tuple[bool, int | None]]  # producer live, announce age (ms)
    newest_wall_ns: Mapping[int, int | None]  # wall time of each ring's newest frame
    wall_shifts: Mapping[int, int]  # add to a frame's timestamp_ns for wall time (#17)
    feed: DescriptorFeed | None  # received descriptors of sparse streams
    now_ns: int  # monotonic
    wall_now_ns: int


@dataclass(frozen=True, slots=True)
class TriggerOutcome:
    """``plan`` None: held by ``minFramesPerTrigger`` (the same offset, Spark runs no batch;
    the reported loss stays to be recorded). Else the plan, which records ``late``."""

    plan: Plan | None


class Trigger:
    """The reader's planning state kept between triggers, and the step that advances it."""

    def __init__(
        self,
        planner: StreamPlanner,
        health: HealthMonitor,
        where: str,
        min_frames: tuple[int, int] | None,
        policy: SourcePolicy | None,
    ) -> None:
        self.planner = planner
        self.health = health
        self.where = where  # names the control channel in a stale-stream error
        #: ``(minFramesPerTrigger, maxTriggerDelayMs)``; the gate starts at the first trigger
        #: it could hold, so ``maxTriggerDelay`` counts from there
        self.min_frames = min_frames
        self.gate: MinFramesGate | None = None
        self.policy = policy

    def step(self, streams: tuple[int, ...], inp: TriggerInput) -> TriggerOutcome:
        now = inp.now_ns
        self.health.observe(inp.liveness, streams, now)
        self.health.check(now, self.where)  # #16.2: fails (or warns) on a stale stream
        if not inp.late and self._hold(inp):
            self._observe_rings(streams, inp, inp.begin)
            return TriggerOutcome(None)
        pol, limits = self.policy, inp.limits
        if pol is not None:  # #17: lag, jitter, late, memory, alignment, rate; adaptive bytes
            pol.begin(inp.begin, inp.states, dict(inp.wall_shifts), now, inp.wall_now_ns)
            limits = pol.limits(limits)
        plan = self.planner.plan(
            inp.begin,
            inp.states,
            limits,
            late=inp.late,
            feed=inp.feed,
            admit=None if pol is None else pol.admit,
            align=pol.align if pol is not None and pol.p.align else None,  # #27.1
        )
        if pol is not None:
            pol.finish(inp.begin, plan.end, plan.runs, inp.states)
        if self.gate is not None:
            self.gate.admitted(plan.frames, now)
        self._observe_rings(streams, inp, plan.end)
        return TriggerOutcome(plan)

    def _hold(self, inp: TriggerInput) -> bool:
        """Whether ``minFramesPerTrigger`` holds this trigger (never for ReadAllAvailable,
        AvailableNow, or a stream that appeared or changed epoch)."""
        if self.min_frames is None or inp.read_all or self.planner.target is not None:
            return False  # AvailableNow must reach its target, not wait for frames
        if self.gate is None:
            self.gate = MinFramesGate(*self.min_frames)
        available = backlog(inp.begin, inp.states)
        return available is not None and self.gate.hold(available, inp.now_ns)

    def _observe_rings(
        self, streams: tuple[int, ...], inp: TriggerInput, end: dict[int, StreamPos]
    ) -> None:
        for sid in streams:
            self.health.observe_ring(
                sid, inp.states.get(sid), inp.newest_wall_ns.get(sid), end.get(sid)
            )


__all__ = ["Trigger", "TriggerInput", "TriggerOutcome"]
