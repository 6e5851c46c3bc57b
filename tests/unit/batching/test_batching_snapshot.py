"""Snapshot / restore: a restored batcher re-cuts exactly the same windows (replay)."""

from __future__ import annotations

import json
import random

import pytest
from batching_helpers import T0, S, at, merge, pulses

from tensorpool.batching import SNAPSHOT_VERSION, Batch, RateAwareMessageBatcher

DET, MON, LOG = "det", "mon", "log"


def traffic() -> list[tuple[str, int, str]]:
    rng = random.Random(7)
    det = [(s, ts + rng.randint(-3_000_000, 3_000_000), i) for s, ts, i in pulses(DET, 14, 0, 12)]
    det = [m for m in det if rng.random() > 0.05]
    mon = pulses(MON, 5, 0.01, 12, 0.01)
    log = [(LOG, at(rng.uniform(0, 12)), f"log#{i}") for i in range(40)]
    silence = [m for m in merge(det, mon, log) if not at(6) <= m[1] < at(8.5)]
    silence.append((LOG, at(5) + 2 * 365 * 86_400 * S, "log-outlier"))
    return merge(silence)


def run(b: RateAwareMessageBatcher[str, str], msgs: list[tuple[str, int, str]]) -> list[Batch]:
    out: list[Batch] = []
    for m in msgs:
        b.offer(*m)
        out += b.take()
    return out


def fresh() -> RateAwareMessageBatcher[str, str]:
    return RateAwareMessageBatcher(S, gated={DET, MON}, start_ns=T0)


@pytest.mark.parametrize("cut", [0, 1, 37, 150, 200, 251, 333])
def test_snapshot_restore_through_json_replays_identically(cut: int) -> None:
    msgs = traffic()
    reference = run(fresh(), msgs)

    b = fresh()
    head = run(b, msgs[:cut])
    state = json.loads(json.dumps(b.snapshot(), sort_keys=True))
    restored = RateAwareMessageBatcher.restore(state, gated={DET, MON})
    assert restored.snapshot() == b.snapshot()
    tail = run(restored, msgs[cut:])
    assert head + tail == reference


def test_recut_a_known_window_from_the_same_messages() -> None:
    """Record the state before a window; restoring it and re-feeding gives the same batch."""
    msgs = traffic()
    b = fresh()
    checkpoints = []
    for i, m in enumerate(msgs):
        before = b.snapshot()
        if b.offer(*m):
            for batch in b.take():
                checkpoints.append((before, i, batch))
    assert len(checkpoints) > 5
    for before, i, batch in checkpoints[::3]:
        again = RateAwareMessageBatcher.restore(before, gated={DET, MON})
        again.offer(*msgs[i])
        assert batch in again.take()


def test_snapshot_restore_mid_bootstrap_and_with_pending_length_change() -> None:
    b = RateAwareMessageBatcher(S, gated={DET})
    b.offer(DET, T0, "a")
    state = b.snapshot()
    assert state["window_start_ns"] is None and state["boot"] == [[DET, T0, "a"]]
    again = RateAwareMessageBatcher.restore(state, gated={DET})
    again.offer(DET, T0 + S // 2, "b")
    assert again.window == (T0, T0 + S)
    again.set_batch_length(2 * S)
    third = RateAwareMessageBatcher.restore(again.snapshot(), gated={DET})
    assert third.pending_batch_length_ns == 2 * S
    assert [x.items(DET) for x in third.flush()] == [["a", "b"]]


def test_tuple_stream_ids_survive_json() -> None:
    sid = ("det", 3)
    b = RateAwareMessageBatcher(S, gated={sid}, start_ns=T0)
    for _, ts, item in pulses("x", 14, 0, 1.5):
        b.offer(sid, ts, item)
    state = json.loads(json.dumps(b.snapshot()))
    again = RateAwareMessageBatcher.restore(state, gated={sid})
    assert again.streams == (sid,) and again.snapshot() == b.snapshot()


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda s: s.update(version=99), "version"),
        (lambda s: s.pop("streams"), "missing key"),
        (lambda s: s.update(hwm_ns="x"), "hwm_ns"),
        (lambda s: s["streams"][0].update(grid=[1, 0, 1]), "rate_hz"),
        (lambda s: s["streams"][0].update(gated=True, estimator=None), "no estimator"),
        (lambda s: s["streams"].append(dict(s["streams"][0])), "listed twice"),
        (lambda s: s["overflow"].append([1.5, "det", "x"]), "overflow ts"),
        (lambda s: s["closed"].append({"sequence": 1}), "malformed batch"),
        (lambda s: s.update(window_start_ns=None), "without an active window"),
        (lambda s: s.update(window_start_ns=None, overflow=[], closed=[]), "without an active"),
    ],
)
def test_restore_rejects_malformed_snapshots(mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    b = fresh()
    run(b, traffic()[:50])
    state = json.loads(json.dumps(b.snapshot()))
    assert state["version"] == SNAPSHOT_VERSION
    mutate(state)
    with pytest.raises(ValueError, match=match):
        RateAwareMessageBatcher.restore(state, gated={DET, MON})


def test_restore_rejects_non_mapping() -> None:
    with pytest.raises(ValueError, match="mapping"):
        RateAwareMessageBatcher.restore([], gated={DET})  # type: ignore[arg-type]
