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


def stamped(epoch: int, stamps: list[int] | np.ndarray, nslots: int = 1024, size: int = 64):
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
