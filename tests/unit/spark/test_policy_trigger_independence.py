"""#31 and #27.1: the source's policies decide the same whatever the trigger timing and across
producer restarts -- the watermark is the maximum over every delivered frame, a new epoch
starts fresh per-stream meters, late / lag decisions do not depend on trigger boundaries, the
rate is sustained whatever the trigger interval, and the minimum rule bounds admission by
what each stream will have *delivered*. Sans-IO, with a driven clock."""

from __future__ import annotations

import numpy as np

from tensorpool.spark_source.offsets import Limits, RingState, StreamPlanner, StreamPos
from tensorpool.spark_source.policy import SourcePolicy
from tensorpool.spark_source.policy_options import PolicyOptions

MS = 1_000_000
S = 1_000_000_000


def stamped(epoch: int, stamps: list[int] | np.ndarray, nslots: int = 4096, size: int = 64):
    """A dense ring holding seqs 0..len(stamps)-1 with the given stamps."""
    slot_seq = np.full(nslots, -1, np.int64)
    st = np.zeros(nslots, np.int64)
    lens = np.zeros(nslots, np.int64)
    for s, t in enumerate(stamps):
        slot_seq[s % nslots] = s
        st[s % nslots] = t
        lens[s % nslots] = size
    return RingState.from_slots(epoch, slot_seq, slot_seq >= 0, lens, st)


def plan(pol, planner, start, states, now_wall, now_mono=0, limits=None):
    pol.begin(start, states, {}, now_mono, now_wall)
    p = planner.plan(start, states, pol.limits(limits or Limits()), admit=pol.admit)
    pol.finish(start, p.end, p.runs, states)
    return p


# --- #31.3 ---------------------------------------------------------------------------------------
def test_31_3_watermark_is_the_max_over_every_delivered_frame():
    """A batch whose newest stamp is in its middle (the producer's clock stepped back 200 ms
    within the allowed lateness): the stream's watermark is that stamp, not the last frame's
    or a run start's."""
    stamps = [t * 10 * MS for t in range(50)] + [(490 - 200 + t * 10) * MS for t in range(10)]
    pol = SourcePolicy(PolicyOptions(late="flag", allowed_lateness_ms=500, idle_ms=60_000))
    p = plan(pol, StreamPlanner((1,)), {1: StreamPos(1, 0)}, {1: stamped(1, stamps)}, S)
    assert p.end[1].frames == 60 and p.end[1].late == 0
    assert p.end[1].event_ns == 490 * MS  # seq 49, the middle of the batch
    assert pol.report([1])[0][1]["watermarkMs"] == 490


# --- #31.4 ---------------------------------------------------------------------------------------
def stutter(n: int, t0: int = 0) -> list[int]:
    """Groups of 10 frames 1 ms apart, a group every 100 ms (a producer that stutters)."""
    return [t0 + (i // 10) * 100 * MS + (i % 10) * MS for i in range(n)]


def smooth(n: int, t0: int = 0) -> list[int]:
    return [t0 + i * 10 * MS for i in range(n)]


def _restart(first: list[int], second: list[int]) -> dict:
    """Plan all of epoch 1, then the producer restarts (epoch 2, seq from 0): progress of the
    first plan of epoch 2's frames."""
    pol = SourcePolicy(PolicyOptions(max_jitter_ms=50, idle_ms=60_000))
    planner = StreamPlanner((1,))
    p = plan(pol, planner, {1: StreamPos(1, 0)}, {1: stamped(1, first)}, 100 * S)
    assert p.end[1].frames == len(first)
    before = pol.report([1])[0][1]
    ring2 = {1: stamped(2, second)}
    p = plan(pol, planner, p.end, ring2, 100 * S)  # the epoch transition
    p = plan(pol, planner, p.end, ring2, 100 * S)
    assert p.end[1].epoch == 2 and p.end[1].seq == len(second)
    return {"before": before, "after": pol.report([1])[0][1]}


def test_31_4_a_restarted_smooth_producer_clears_the_stutter_flag():
    """A stream that stuttered for 1500 frames is restarted as a smooth producer: the new
    epoch's first plan measures only its own intervals (fewer seqs than the old epoch had)."""
    r = _restart(stutter(1500), smooth(200, 200 * S))
    assert r["before"]["jitterExceeded"] is True
    assert r["after"]["jitterExceeded"] is False and r["after"]["jitterP99Ms"] == 0.0


def test_31_4_a_restarted_stuttering_producer_is_flagged():
    """Conversely: smooth for 1500 frames, restarted stuttering: flagged at once, not after the
    new epoch's seqs pass the old epoch's last seq."""
    r = _restart(smooth(1500), stutter(200, 200 * S))
    assert r["before"]["jitterExceeded"] is False
    assert r["after"]["jitterExceeded"] is True and r["after"]["jitterP99Ms"] > 50
