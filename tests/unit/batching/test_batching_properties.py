"""Property tests of the seed 000 invariants over randomized multi-stream traffic.

Traffic: a gated detector and monitor (various rates, incl. sub-Hz and 1 slot per
batch) and an ungated log, with jitter, dropped pulses, duplicated (split) messages,
local reordering, outliers (seconds to years off), a silence, an optional batch-length
change, polled message by message or in chunks. Invariants checked:

* every message is delivered exactly once (after ``flush``), never in an empty batch;
* window starts strictly increase and windows never overlap;
* no ungated stream ever gates or blocks a close, and no window outlives its timeout;
* an ungated message is never in a window that ends at or before its timestamp,
  unless it was implausibly far ahead (> window_end + 3 batch lengths);
* the HWM never decreases and moves at most to the active start + 3 batch lengths;
* a snapshot taken anywhere, sent through JSON and restored, continues identically.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass

from batching_helpers import T0, S
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.batching import HOLD_BATCHES, Batch, RateAwareMessageBatcher

DET, MON, LOG = "det", "mon", "log"
GATED = frozenset({DET, MON})
YEAR = 365 * 86_400 * S


@dataclass(frozen=True)
class Case:
    seed: int
    duration_s: int
    det_hz: float
    mon_hz: float
    jitter_ms: int
    drop: float
    dup: float
    outlier: float
    reorder: float
    logs: int
    silence: bool
    batch_ms: int
    anchored: bool
    chunk: int
    new_batch_ms: int | None
    cut: float


cases = st.builds(
    Case,
    seed=st.integers(0, 2**32 - 1),
    duration_s=st.integers(2, 10),
    det_hz=st.sampled_from([14.0, 10.0, 1.0]),
    mon_hz=st.sampled_from([5.0, 2.0, 0.5]),
    jitter_ms=st.sampled_from([0, 2, 10, 30]),
    drop=st.sampled_from([0.0, 0.05, 0.3]),
    dup=st.sampled_from([0.0, 0.1]),
    outlier=st.sampled_from([0.0, 0.02]),
    reorder=st.sampled_from([0.0, 0.1]),
    logs=st.integers(0, 30),
    silence=st.booleans(),
    batch_ms=st.sampled_from([500, 1000, 2000]),
    anchored=st.booleans(),
    chunk=st.sampled_from([1, 4, 25]),
    new_batch_ms=st.sampled_from([None, 500, 2000]),
    cut=st.floats(0.0, 1.0),
)


def make_traffic(c: Case) -> list[tuple[str, int, str]]:
    rng = random.Random(c.seed)
    msgs: list[tuple[str, int, str]] = []
    hole = (rng.uniform(0, c.duration_s), rng.uniform(1, 6)) if c.silence else (0.0, 0.0)
    for sid, rate in ((DET, c.det_hz), (MON, c.mon_hz)):
        phase = rng.uniform(0, 1 / rate)
        for i in range(int(c.duration_s * rate)):
            t = phase + i / rate
            if hole[0] <= t < hole[0] + hole[1] or rng.random() < c.drop:
                continue
            ts = T0 + round(t * S) + rng.randint(-c.jitter_ms, c.jitter_ms) * 1_000_000
            msgs.append((sid, ts, f"{sid}#{i}"))
            if rng.random() < c.dup:
                msgs.append((sid, ts, f"{sid}#{i}/split"))
    for i in range(c.logs):
        msgs.append((LOG, T0 + round(rng.uniform(0, c.duration_s) * S), f"log#{i}"))
    msgs.sort(key=lambda m: m[1])
    for i in range(len(msgs) - 1):  # local reordering
        if rng.random() < c.reorder:
            msgs[i], msgs[i + 1] = msgs[i + 1], msgs[i]
    out = []
    for sid, ts, item in msgs:  # outliers: seconds to years off, either way
        if rng.random() < c.outlier:
            ts += rng.choice([-1, 1]) * rng.choice([5 * S, 40 * S, YEAR, 43 * YEAR])
        out.append((sid, ts, item))
    return out


def drive(
    b: RateAwareMessageBatcher[str, str],
    c: Case,
    msgs: list[tuple[str, int, str]],
    check: bool,
    polls: range | None = None,
) -> list[Batch[str, str]]:
    """Feed polls of ``c.chunk`` messages (1 = plain offers); check invariants after each.

    ``polls`` selects which polls of the whole run to play, so that a run can be
    split at a snapshot and resumed with the same poll boundaries and the same
    batch-length change point.
    """
    out: list[Batch[str, str]] = []
    chunks = [msgs[i : i + c.chunk] for i in range(0, len(msgs), c.chunk)]
    for n in polls if polls is not None else range(len(chunks)):
        chunk = chunks[n]
        if c.new_batch_ms and n == len(chunks) // 2:
            b.set_batch_length(c.new_batch_ms * 1_000_000)
        prev_hwm = b.high_water_mark_ns
        length_before = b.batch_length_ns
        if c.chunk == 1:
            b.offer(*chunk[0])
            out += b.take()
        else:
            out += b.feed(chunk)
        if check:
            check_live(b, prev_hwm, length_before)
    return out


def check_live(b: RateAwareMessageBatcher[str, str], prev_hwm: int | None, length: int) -> None:
    assert not b.is_gating(LOG) and LOG not in b.blocking_streams()
    assert set(b.blocking_streams()) <= GATED
    hwm = b.high_water_mark_ns
    if b.window is None or hwm is None:
        return
    start = b.window[0]
    # No window outlives its timeout: it was closed (or skipped) when the HWM got there.
    assert hwm < start + round(b.timeout_factor * b.batch_length_ns)
    if prev_hwm is not None:
        assert hwm >= prev_hwm
        assert hwm <= max(prev_hwm, start + HOLD_BATCHES * max(length, b.batch_length_ns))


def check_batches(batches: list[Batch[str, str]], msgs: list[tuple[str, int, str]]) -> None:
    delivered = [item for x in batches for v in x.messages.values() for _, item in v]
    assert Counter(delivered) == Counter(m[2] for m in msgs)
    for x in batches:
        assert x.message_count > 0
        length = x.window_end_ns - x.window_start_ns
        for ts, _ in x.stream(LOG):
            assert ts < x.window_end_ns or ts > x.window_end_ns + HOLD_BATCHES * length
    for a, nxt in itertools.pairwise(batches):
        assert nxt.window_start_ns >= a.window_end_ns > a.window_start_ns
        assert nxt.sequence == a.sequence + 1


def new(c: Case) -> RateAwareMessageBatcher[str, str]:
    return RateAwareMessageBatcher(
        c.batch_ms * 1_000_000, gated=GATED, start_ns=T0 if c.anchored else None
    )


@settings(max_examples=200, deadline=None)
@given(cases)
def test_property_invariants_hold_over_random_traffic(c: Case) -> None:
    msgs = make_traffic(c)
    b = new(c)
    batches = drive(b, c, msgs, check=True)
    batches += b.flush()
    assert b.buffered_count == 0
    check_batches(batches, msgs)


@settings(max_examples=100, deadline=None)
@given(cases)
def test_property_snapshot_anywhere_resumes_identically(c: Case) -> None:
    msgs = make_traffic(c)
    reference = drive(new(c), c, msgs, check=False)

    n_polls = -(-len(msgs) // c.chunk)
    cut = int(c.cut * n_polls)
    first = new(c)
    head = drive(first, c, msgs, check=False, polls=range(cut))
    state = json.loads(json.dumps(first.snapshot()))
    second = RateAwareMessageBatcher.restore(state, gated=GATED)
    tail = drive(second, c, msgs, check=False, polls=range(cut, n_polls))
    assert head + tail == reference
    assert second.snapshot() == json.loads(json.dumps(reference_state(c, msgs)))


def reference_state(c: Case, msgs: list[tuple[str, int, str]]) -> dict[str, object]:
    b = new(c)
    drive(b, c, msgs, check=False)
    return b.snapshot()
