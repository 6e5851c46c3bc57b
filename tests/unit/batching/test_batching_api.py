"""RateAwareMessageBatcher API: validation, host controls, lifecycle details (seed 000)."""

from __future__ import annotations

import numpy as np
import pytest
from batching_helpers import T0, S, at, converged, delivered, feed_each, merge, pulses

from tensorpool.batching import (
    MAX_ORIGIN_OFFSET_BATCHES,
    RATE_CHANGE_CONFIRMATIONS,
    CloseReason,
    RateAwareMessageBatcher,
)

DET, MON, LOG = "det", "mon", "log"


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"batch_length_ns": 0, "gated": ()}, ValueError, "batch_length_ns must be > 0"),
        ({"batch_length_ns": 1.0, "gated": ()}, TypeError, "batch_length_ns must be an integer"),
        ({"batch_length_ns": S, "gated": (), "timeout_factor": 0}, ValueError, "timeout_factor"),
        ({"batch_length_ns": S, "gated": (), "timeout_factor": 3.5}, ValueError, "timeout_factor"),
        ({"batch_length_ns": S, "gated": (), "timeout_factor": "1"}, TypeError, "timeout_factor"),
        ({"batch_length_ns": S, "gated": "det"}, TypeError, "not a string"),
        ({"batch_length_ns": S, "gated": 5}, TypeError, "gated must be"),
        ({"batch_length_ns": S, "gated": (), "start_ns": 1.5}, TypeError, "start_ns"),
    ],
)
def test_constructor_rejects_bad_configuration(
    kwargs: dict[str, object], exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        RateAwareMessageBatcher(**kwargs)  # type: ignore[arg-type]


def test_offer_requires_integer_nanoseconds() -> None:
    """Time is always passed in as integer ns: floats and bools are refused, numpy ints work."""
    b = RateAwareMessageBatcher(S, gated={DET}, start_ns=T0)
    with pytest.raises(TypeError, match="timestamp_ns must be an integer"):
        b.offer(DET, 1.7e18, "x")
    with pytest.raises(TypeError, match="got a bool"):
        b.offer(DET, True, "x")
    b.offer(DET, np.int64(T0 + 5), "np")
    with pytest.raises(TypeError):
        b.offer(["unhashable"], T0, "x")  # type: ignore[arg-type]
    assert delivered(b.flush()) == ["np"]


def test_set_batch_length_rejects_bad_values() -> None:
    b = RateAwareMessageBatcher(S, gated={DET})
    with pytest.raises(ValueError):
        b.set_batch_length(-1)
    with pytest.raises(TypeError):
        b.set_batch_length(0.5)  # type: ignore[arg-type]


def test_gated_policy_forms() -> None:
    """A collection or a predicate decides, once per stream, which streams may gate."""
    b_set = RateAwareMessageBatcher(S, gated=frozenset({DET}), start_ns=T0)
    b_pred = RateAwareMessageBatcher(S, gated=lambda sid: sid.startswith("d"), start_ns=T0)
    # A perfectly periodic log still never gates when the policy says it is not gated.
    traffic = merge(pulses(DET, 14, 0, 4), pulses(LOG, 2, 0, 4))
    for b in (b_set, b_pred):
        feed_each(b, traffic)
        assert b.is_gating(DET) and not b.is_gating(LOG)
        assert b.estimator_of(LOG) is None and b.estimator_of(DET) is not None


def test_first_window_waits_for_two_agreeing_messages() -> None:
    b = RateAwareMessageBatcher(S, gated={DET})
    assert b.feed([(LOG, T0 + 400 * S, "outlier")]) == []
    assert b.window is None and b.buffered_count == 1
    b.feed([(DET, at(0), "a")])
    assert b.window is None
    b.feed([(DET, at(0.5), "b")])
    assert b.window == (at(0), at(1))
    out = b.feed([(DET, at(1.3), "c")]) + b.flush()
    assert sorted(delivered(out)) == ["a", "b", "c", "outlier"]
    # The outlier never steered the windows: it rode along with the next real traffic.
    assert [x.window_start_ns for x in out] == [at(0), at(1)]
    assert out[1].items(LOG) == ["outlier"] and out[1].items(DET) == ["c"]


def test_flush_delivers_a_lone_bootstrap_message() -> None:
    b = RateAwareMessageBatcher(S, gated={DET})
    b.offer(DET, T0, "only")
    (batch,) = b.flush()
    assert batch.reason is CloseReason.FLUSH and batch.items(DET) == ["only"]
    assert b.buffered_count == 0 and b.flush() == []


def test_tick_times_out_without_messages() -> None:
    """tick(now) moves the logical clock like a message would (same clamp)."""
    b = RateAwareMessageBatcher(S, gated={DET}, start_ns=T0)
    assert b.tick(T0 + 10 * S) == 0  # empty window: skipped, nothing emitted
    assert b.high_water_mark_ns == T0 + 3 * S
    b = RateAwareMessageBatcher(S, gated={DET}, start_ns=T0)
    b.offer(DET, at(0.1), "a")
    assert b.tick(at(1.1)) == 0
    assert b.tick(at(1.2)) == 1
    (batch,) = b.take()
    assert batch.reason is CloseReason.TIMEOUT and batch.items(DET) == ["a"]
    assert RateAwareMessageBatcher(S, gated={DET}).tick(T0) == 0  # no window yet


def test_tick_past_window_end_closes_a_satisfied_window() -> None:
    b, _ = converged({DET: 14})
    for m in pulses(DET, 14, 2, 3):
        b.offer(*m)  # satisfied, kept open for late parts of the last pulse
    assert b.take() == []
    assert b.tick(at(2.99)) == 0
    assert b.tick(at(3.0)) == 1
    assert b.take()[0].reason is CloseReason.SLOT_GATE


def test_settle_closes_a_satisfied_window() -> None:
    b, _ = converged({DET: 14})
    for m in pulses(DET, 14, 2, 3):
        b.offer(*m)
    assert b.settle() == 1 and b.settle() == 0
    assert len(b.take()[0].stream(DET)) == 14
    assert RateAwareMessageBatcher(S, gated={DET}).settle() == 0


def test_custom_timeout_factor() -> None:
    b = RateAwareMessageBatcher(S, gated={DET}, timeout_factor=2.0, start_ns=T0)
    b.offer(DET, at(0.5), "a")
    assert b.offer(LOG, at(1.9), "l") == 0
    assert b.offer(LOG, at(2.0), "l2") == 1
    assert b.timeout_factor == 2.0


def test_flush_delivers_overflow_and_held_messages_in_their_windows() -> None:
    b, _ = converged({DET: 14, MON: 5}, gated={DET, MON})
    feed_each(b, pulses(DET, 14, 2, 3.15))  # mon silent: det overflows (HWM < 3.2 s)
    b.offer(LOG, at(3.1), "held")
    out = b.flush()
    assert [(x.window_start_ns, x.reason) for x in out] == [
        (at(2), CloseReason.FLUSH),
        (at(3), CloseReason.FLUSH),
    ]
    assert "held" in out[1].items(LOG) and len(out[1].stream(DET)) == 3
    assert b.buffered_count == 0


def test_rate_change_is_adopted_after_confirmations() -> None:
    """14 Hz -> 7 Hz: one noisy estimate cannot re-grid, repeated ones do."""
    b, _ = converged({DET: 14})
    t = 2
    while b.grid_of(DET).rate_hz == 14 and t < 40:  # type: ignore[union-attr]
        feed_each(b, pulses(DET, 7, t, t + 1))
        b.tick(at(t + 1.2))  # slots 1, 3, ... stay empty at 14 Hz: the timeout closes
        assert [x.reason for x in b.take()] == [CloseReason.TIMEOUT]
        t += 1
    assert b.grid_of(DET).rate_hz == 7  # type: ignore[union-attr]
    assert b.stats["rate_changes"] == 1
    assert t - 2 >= RATE_CHANGE_CONFIRMATIONS
    (batch,) = feed_each(b, pulses(DET, 7, t, t + 1))
    assert batch.reason is CloseReason.SLOT_GATE and len(batch.stream(DET)) == 7


def test_grid_dropped_when_stream_clock_jumps() -> None:
    """A gated stream whose stamps stop landing on the window's slots is demoted."""
    b, _ = converged({DET: 14, MON: 5})
    det = pulses(DET, 14, 2, 8)
    mon = pulses(MON, 5, 2, 8)
    jumped = [(MON, ts - 7 * S - S // 3, item) for _, ts, item in mon]  # clock reset
    # Arrival order is real time, i.e. the unjumped stamps.
    arrival = sorted(
        [(m[1], m) for m in det] + [(m[1], j) for m, j in zip(mon, jumped, strict=True)]
    )
    batches = feed_each(b, [m for _, m in arrival])
    assert not b.is_gating(MON) and b.stats["grids_dropped"] == 1
    assert batches[0].reason is CloseReason.TIMEOUT  # mon still gated, nothing on its slots
    assert all(x.reason is CloseReason.SLOT_GATE for x in batches[1:])
    assert [len(x.stream(DET)) for x in batches] == [14] * 6
    assert sorted(delivered(batches + b.flush())) == sorted(m[2] for m in det + jumped)


def test_old_grid_origin_is_reanchored_on_a_window_pulse() -> None:
    """After MAX_ORIGIN_OFFSET_BATCHES windows the origin moves to a recent real pulse."""
    ms = S // 1000
    b = RateAwareMessageBatcher(ms, gated={DET}, start_ns=T0)
    n = MAX_ORIGIN_OFFSET_BATCHES + 20
    traffic = [(DET, T0 + i * ms // 2, f"d{i}") for i in range(2 * n)]  # 2 kHz, 2 slots
    batches = feed_each(b, traffic)
    grid = b.grid_of(DET)
    assert grid is not None and grid.rate_hz == 2000
    assert grid.origin_ns > T0 + MAX_ORIGIN_OFFSET_BATCHES * ms
    assert all(x.reason is CloseReason.SLOT_GATE for x in batches[3:])
    assert b.stats["grids_built"] == 2  # the first grid, then the re-anchored one


def test_batch_helpers() -> None:
    b, warm = converged({DET: 14})
    batch = warm[1]
    assert batch.message_count == 14 == len(batch.stream(DET)) == len(batch.items(DET))
    assert batch.stream("nope") == [] and batch.items("nope") == []
    assert batch.sequence == 1 and b.streams == (DET,)


def test_package_is_host_agnostic() -> None:
    """Importing tensorpool.batching pulls in no transport, SHM or client module."""
    import subprocess
    import sys

    code = (
        "import sys, tensorpool.batching\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyaeron', 'numpy', 'pyspark')"
        " or m.startswith(('tensorpool.shm', 'tensorpool.transport', 'tensorpool.client',"
        " 'tensorpool.driver', 'tensorpool.specs'))]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
