"""Seed 000 acceptance tests: every scenario of the RateAwareMessageBatcher seed.

One test per seed scenario, named ``test_seed_<scenario>``; a few scenarios get a
second test for the other half of what the seed's sketch shows. Timestamps are
seconds after T0 converted to integer ns (see ``batching_helpers``).
"""

from __future__ import annotations

import pytest
from batching_helpers import (
    T0,
    S,
    at,
    close_points,
    converged,
    delivered,
    feed_each,
    merge,
    pulses,
)

from tensorpool.batching import (
    ABSENT_BATCHES_FOR_EVICTION,
    HOLD_BATCHES,
    MIN_DIFFS_FOR_GATE,
    Batch,
    CloseReason,
    RateAwareMessageBatcher,
)

DET, MON, LOG = "det", "mon", "log"
YEAR = 365 * 24 * 3600 * S


def span(batch: Batch[str, str]) -> tuple[float, float]:
    return (batch.window_start_ns - T0) / S, (batch.window_end_ns - T0) / S


def by_window(batches: list[Batch[str, str]]) -> dict[tuple[float, float], Batch[str, str]]:
    return {span(b): b for b in batches}


# 1 ---------------------------------------------------------------------------------


def test_seed_happy_path_14hz_slot_gate_close() -> None:
    """Steady 14 Hz: after the warm-up windows every batch closes exactly on slot 13."""
    b = RateAwareMessageBatcher(S, gated={DET}, start_ns=T0)
    msgs = pulses(DET, 14, 0, 5)
    points, batches = close_points(b, msgs)

    assert [span(x) for x in batches] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    # No grid until the rate has been estimated at two closes: the first two
    # windows can only close on timeout (HWM >= start + 1.2 s).
    assert [x.reason for x in batches[:2]] == [CloseReason.TIMEOUT] * 2
    assert msgs[points[0]][1] == at(1 + 3 / 14) > at(1.2)
    assert msgs[points[1]][1] == at(2 + 3 / 14) > at(2.2)
    for k, batch in enumerate(batches[2:], start=2):
        assert batch.reason is CloseReason.SLOT_GATE
        assert batch.items(DET) == [f"det#{i}" for i in range(14 * k, 14 * k + 14)]
        # ...and it closed on the poll that delivered the last pulse of its window.
        assert msgs[points[k]][2] == f"det#{14 * k + 13}"
    assert b.grid_of(DET) is not None and b.grid_of(DET).slots_per_batch == 14  # type: ignore[union-attr]


# 2 ---------------------------------------------------------------------------------


def test_seed_missing_pulse_still_closes() -> None:
    """Pulse 7 (slot 6) never arrives: slot 13 still closes the batch (a count would hang)."""
    b, _ = converged({DET: 14})
    window = pulses(DET, 14, 2, 3)
    del window[6]
    points, batches = close_points(b, window)

    assert points == [len(window) - 1]
    (batch,) = batches
    assert span(batch) == (2, 3)
    assert batch.reason is CloseReason.SLOT_GATE
    assert len(batch.stream(DET)) == 13 < b.grid_of(DET).slots_per_batch  # type: ignore[union-attr]


# 3 ---------------------------------------------------------------------------------


def test_seed_split_messages_no_premature_close() -> None:
    """A duplicate timestamp at slot 2 does not count twice: max slot 5 of 13 keeps waiting."""
    b, _ = converged({DET: 14})
    window = pulses(DET, 14, 2, 3)
    split = (DET, window[2][1], "det#split")
    partial = [*window[:3], split, *window[3:6]]  # 7 messages, slots 0..5

    assert feed_each(b, partial) == []
    assert b.blocking_streams() == (DET,)

    batches = feed_each(b, window[6:])
    (batch,) = batches
    assert batch.reason is CloseReason.SLOT_GATE
    assert len(batch.stream(DET)) == 15
    assert "det#split" in batch.items(DET)


def test_seed_split_messages_last_slot_parts_stay_together() -> None:
    """A split last pulse is not torn apart: all its parts land in the same batch."""
    b, _ = converged({DET: 14})
    window = pulses(DET, 14, 2, 3)
    last = window[-1]
    second_part = (DET, last[1], "det#last-part-2")

    # Message by message (offer): the satisfied window stays open for further parts
    # and closes when a message for the next window shows up.
    assert sum(b.offer(*m) for m in window) == 0
    assert b.offer(*second_part) == 0
    assert b.offer(*pulses(DET, 14, 3, 3.05)[0]) == 1
    (batch,) = b.take()
    assert batch.items(DET)[-2:] == [last[2], "det#last-part-2"]

    # In one poll (feed) the parts also stay together and the batch closes at once.
    b2, _ = converged({DET: 14})
    (batch2,) = b2.feed([*window, second_part])
    assert batch2.reason is CloseReason.SLOT_GATE
    assert len(batch2.stream(DET)) == 15


# 4 ---------------------------------------------------------------------------------


def test_seed_overflow_future_pulse_rerouted_to_next_window() -> None:
    """Gridded pulses past the last slot wait in overflow and open the next batch."""
    b, _ = converged({DET: 14, MON: 5})
    det_early = pulses(DET, 14, 2, 3.2)  # the whole window plus 3 pulses of the next one
    mon_late = pulses(MON, 5, 2, 3)  # the monitor lags behind
    before = b.stats["overflowed"]
    assert feed_each(b, det_early) == []
    assert b.stats["overflowed"] == before + 3
    assert b.blocking_streams() == (MON,)

    (first,) = feed_each(b, mon_late)
    assert span(first) == (2, 3)
    assert len(first.stream(DET)) == 14 and len(first.stream(MON)) == 5

    rest = merge(pulses(DET, 14, 3.2, 4), pulses(MON, 5, 3, 4))
    (second,) = feed_each(b, rest)
    assert span(second) == (3, 4)
    assert second.items(DET)[:3] == [m[2] for m in det_early[14:]]
    assert len(second.stream(DET)) == 14


def test_seed_overflow_only_gridded_streams_overflow() -> None:
    """A stray past the last slot proves the window is over; ungridded ones are held instead."""
    b, _ = converged({DET: 14}, gated={DET})
    window = pulses(DET, 14, 2, 3)[:-1]  # last pulse missing
    assert feed_each(b, window) == []
    before = b.stats
    # An ungated message ahead of the window goes to the hold-back path, not overflow.
    assert feed_each(b, [(LOG, at(3.01), "log-ahead")]) == []
    assert b.stats["overflowed"] == before["overflowed"]
    assert b.stats["held_future"] == before["held_future"] + 1

    nxt = pulses(DET, 14, 3, 4)
    (batch,) = b.feed([nxt[0]])  # slot 14: overflow -> gate satisfied -> close
    assert span(batch) == (2, 3) and len(batch.stream(DET)) == 13
    assert b.stats["overflowed"] == before["overflowed"] + 1
    (batch2,) = feed_each(b, nxt[1:])
    assert batch2.items(DET)[0] == nxt[0][2]
    assert batch2.items(LOG) == ["log-ahead"]


# 5 ---------------------------------------------------------------------------------


def test_seed_multi_stream_waits_for_all_gated_streams() -> None:
    """Closes only when det (slot 13) and mon (slot 4) have both filled their last slot."""
    b, _ = converged({DET: 14, MON: 5})
    assert feed_each(b, pulses(DET, 14, 2, 3)) == []
    assert b.blocking_streams() == (MON,)
    mon = pulses(MON, 5, 2, 3)
    assert feed_each(b, mon[:4]) == []
    (batch,) = b.feed([mon[4]])
    assert batch.reason is CloseReason.SLOT_GATE
    assert (len(batch.stream(DET)), len(batch.stream(MON))) == (14, 5)


# 6 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("phase_s", [0.04, 0.49 / 14, 0.7 / 14], ids=["40ms", "0.49P", "0.7P"])
def test_seed_phase_offset_grid_aligns_to_pulses(phase_s: float) -> None:
    """Pulses 0.04 s into the window: the origin is a real pulse and all 14 fit the window."""
    b, _ = converged({DET: 14}, phases={DET: phase_s})
    grid = b.grid_of(DET)
    assert grid is not None
    period = S / 14
    phase_err = (grid.origin_ns - T0 - round(phase_s * S)) % period
    assert min(phase_err, period - phase_err) < 10  # ns

    window = pulses(DET, 14, 2, 3, phase_s)
    assert len(window) == 14 and window[0][1] > at(2)
    points, (batch,) = close_points(b, window)
    assert points == [13]
    assert batch.items(DET) == [m[2] for m in window]
    assert b.stats["overflowed"] == 0


# 7 ---------------------------------------------------------------------------------


def test_seed_gap_recovery_window_jumps_past_silence() -> None:
    """Five silent batches: no placeholders, the window jumps to where traffic resumes."""
    b, warm = converged({DET: 14})
    assert [span(x) for x in warm] == [(-1, 0), (0, 1), (1, 2)]
    after = feed_each(b, pulses(DET, 14, 8, 10))

    assert [span(x) for x in after] == [(8, 9), (9, 10)]
    assert all(x.reason is CloseReason.SLOT_GATE for x in after)
    assert [len(x.stream(DET)) for x in after] == [14, 14]
    assert b.stats["gap_jumps"] >= 1
    assert all(x.message_count for x in warm + after)  # never an empty batch


# 8 ---------------------------------------------------------------------------------


def test_seed_timeout_fallback_hwm_past_threshold() -> None:
    """Partial det traffic; a later log moves the HWM past 1.2 batch lengths: timeout close."""
    b, _ = converged({DET: 14}, gated={DET})
    partial = pulses(DET, 14, 2, 2.4)  # slots 0..5: the gate stays open
    assert feed_each(b, partial) == []
    assert b.high_water_mark_ns < b.window[0] + round(1.2 * S)  # type: ignore[index,operator]

    (batch,) = b.feed([(LOG, at(3.5), "log@3.5")])  # HWM = start + 1.5 s
    assert batch.reason is CloseReason.TIMEOUT
    assert span(batch) == (2, 3)
    assert batch.items(DET) == [m[2] for m in partial]
    assert batch.stream(LOG) == []  # 3.5 s is ahead of the window: held for the next one
    (nxt,) = b.flush()
    assert nxt.items(LOG) == ["log@3.5"] and span(nxt) == (3, 4)


# 9 ---------------------------------------------------------------------------------


def test_seed_non_gated_ride_along_log_never_gates() -> None:
    """Logs bypass rate estimation and slots; det's slot gate closes every batch."""
    b, _ = converged({DET: 14}, gated={DET})
    logs = [(LOG, at(2 + 0.37 * i), f"log#{i}") for i in range(11)]  # irregular vs det
    traffic = merge(pulses(DET, 14, 2, 6), logs)
    for m in traffic:
        b.offer(*m)
        assert not b.is_gating(LOG) and LOG not in b.blocking_streams()
    batches = b.take()
    assert [span(x) for x in batches] == [(2, 3), (3, 4), (4, 5)]
    assert all(x.reason is CloseReason.SLOT_GATE for x in batches)
    batches += b.flush()
    seen = {}
    for batch in batches:
        for ts, item in batch.stream(LOG):
            seen[item] = ts
            assert batch.window_start_ns <= ts < batch.window_end_ns
    assert sorted(seen) == sorted(m[2] for m in logs)


# 10 --------------------------------------------------------------------------------


def test_seed_sub_hz_stream_rides_along_without_grid() -> None:
    """A 0.5 Hz gated monitor never gets a grid; det closes every batch; mon is delivered."""
    b = RateAwareMessageBatcher(S, gated={DET, MON}, start_ns=T0)
    mon = [(MON, at(2 * i), f"mon#{i}") for i in range(6)]
    traffic = merge(pulses(DET, 14, 0, 11), mon)
    for m in traffic:
        b.offer(*m)
    batches = b.take() + b.flush()

    assert not b.is_gating(MON) and b.grid_of(MON) is None
    assert b.estimator_of(MON).rate_hz() is None  # type: ignore[union-attr]
    # No slot routing, no overflow stashing for mon: the same det traffic alone
    # overflows exactly as often.
    alone = RateAwareMessageBatcher(S, gated={DET, MON}, start_ns=T0)
    for m in pulses(DET, 14, 0, 11):
        alone.offer(*m)
    assert b.stats["overflowed"] == alone.stats["overflowed"]
    assert all(x.reason is CloseReason.SLOT_GATE for x in batches[2:-1])
    located = {item: span(x) for x in batches for _, item in x.stream(MON)}
    assert located == {f"mon#{i}": (2 * i, 2 * i + 1) for i in range(6)}


# 11 --------------------------------------------------------------------------------


def test_seed_future_ungridded_held_for_next_window() -> None:
    """Ungridded messages stamped ahead of window.end wait and go out with the next batch."""
    b, _ = converged({DET: 14}, gated={DET, MON})
    window = pulses(DET, 14, 2, 3)
    traffic = [
        *window[:5],
        (LOG, at(2.5), "log-now"),
        # Ahead of window.end but short of start + 1.2 s (which would time the window out):
        (LOG, at(3.1), "log-ahead"),  # non-gated
        (MON, at(3.15), "mon-subhz-ahead"),  # gated but ungridded: same hold-back path
        *window[5:],
    ]
    held_before = b.stats["held_future"]
    (batch,) = feed_each(b, traffic)
    assert span(batch) == (2, 3)
    assert batch.items(LOG) == ["log-now"] and batch.stream(MON) == []
    assert b.stats["held_future"] == held_before + 2

    (nxt,) = b.flush()
    assert span(nxt) == (3, 4)
    assert nxt.items(LOG) == ["log-ahead"] and nxt.items(MON) == ["mon-subhz-ahead"]


def test_seed_future_ungridded_beyond_cap_falls_through() -> None:
    """Beyond end + 3 batch lengths a timestamp is implausible: it joins the active batch."""
    b, _ = converged({DET: 14}, gated={DET})
    window = pulses(DET, 14, 2, 3)
    too_far = (LOG, at(3 + HOLD_BATCHES + 0.5), "log-bad-epoch")
    for m in [*window, too_far]:
        b.offer(*m)
    (batch,) = b.take()
    assert span(batch) == (2, 3) and batch.reason is CloseReason.SLOT_GATE
    assert batch.items(LOG) == ["log-bad-epoch"]
    assert b.stats["far_fallthrough"] == 1 and b.buffered_count == 0
    # It moved the logical clock, but only as far as the cap (start + 3 batch lengths).
    assert b.high_water_mark_ns == at(2 + HOLD_BATCHES)


# 12 --------------------------------------------------------------------------------


def _broken_epoch_traffic() -> list[tuple[str, int, str]]:
    """Good det at 14 Hz and a 5 Hz monitor stamped 43 years early, in arrival order."""
    good = pulses(DET, 14, 0, 6)
    broken = [(MON, ts - 43 * YEAR, item) for _, ts, item in pulses(MON, 5, 0, 6)]
    # Arrival order follows the real (received) time, i.e. the unbroken timestamp.
    arrivals = [(ts, m) for ts, m in ((m[1], m) for m in good)]
    arrivals += [(m[1] + 43 * YEAR, m) for m in broken]
    arrivals.sort(key=lambda a: a[0])
    return [m for _, m in arrivals]


def test_seed_broken_stream_disjoint_epoch_rejected() -> None:
    """A monitor ~43 years off never gets a grid; det closes as usual; mon is still delivered."""
    traffic = _broken_epoch_traffic()
    b = RateAwareMessageBatcher(S, gated={DET, MON}, start_ns=T0)
    for m in traffic:
        b.offer(*m)
    batches = b.take()
    assert not b.is_gating(MON)
    assert b.stats["origins_refused"] >= 1
    det_batches = [x for x in batches if span(x)[0] >= 2]
    assert [span(x) for x in det_batches] == [(2, 3), (3, 4), (4, 5)]
    assert all(x.reason is CloseReason.SLOT_GATE and len(x.stream(DET)) == 14 for x in det_batches)
    batches += b.flush()
    assert sorted(delivered(batches)) == sorted(m[2] for m in traffic)


@pytest.mark.parametrize("broken_lead", [0, 1, 2, 3])
def test_seed_broken_stream_cannot_anchor_the_windows(broken_lead: int) -> None:
    """Without a host start time, broken messages arriving first do not capture the windows.

    ``broken_lead`` broken messages are moved to the front: with two or more they
    agree with each other and anchor a provisional first window, which the good
    stream's traffic then overrides.
    """
    traffic = _broken_epoch_traffic()
    for _ in range(broken_lead):
        nxt = next(i for i, m in enumerate(traffic) if m[0] == MON and i >= _)
        traffic.insert(_, traffic.pop(nxt))
    b = RateAwareMessageBatcher(S, gated={DET, MON})
    batches = feed_each(b, traffic)
    good = [x for x in batches if x.window_start_ns >= T0]
    assert len(good) >= 4
    assert all(x.reason is CloseReason.SLOT_GATE for x in good[2:])
    assert b.is_gating(DET) and not b.is_gating(MON)
    batches += b.flush()
    assert sorted(delivered(batches)) == sorted(m[2] for m in traffic)


# 13 --------------------------------------------------------------------------------


def test_seed_hwm_outlier_clamp_cannot_dos() -> None:
    """One log ~1 year ahead: HWM capped at start + 3 batches; a few closes later all is normal."""
    b, _ = converged({DET: 14}, gated={DET})
    start = b.window[0]  # type: ignore[index]
    window = pulses(DET, 14, 2, 3)
    feed_each(b, window[:4])
    closed = b.feed([(LOG, start + YEAR, "log-next-year")])
    assert b.high_water_mark_ns == start + HOLD_BATCHES * S
    assert b.stats["hwm_clamped"] == 1

    later = feed_each(b, pulses(DET, 14, 2.25, 10))
    batches = closed + later
    assert len(batches) <= 8  # not millions: bounded by the traffic
    # Self-heals: the last batches are ordinary slot-gate closes of 14 pulses.
    assert [span(x) for x in batches[-3:]] == [(7, 8), (8, 9), (9, 10)]
    assert all(x.reason is CloseReason.SLOT_GATE and len(x.stream(DET)) == 14 for x in batches[-3:])
    everything = delivered(batches + b.flush())
    assert everything.count("log-next-year") == 1
    assert len(everything) == 1 + len(pulses(DET, 14, 2, 10))


# 14 --------------------------------------------------------------------------------


def test_seed_stream_lifecycle_join_absent_evict_rejoin() -> None:
    """A new stream gates after convergence, is evicted after 5 absent batches, can rejoin."""
    b, _ = converged({DET: 14}, gated={DET, MON})
    # Join: mon appears at 2 s. It gates once it has MIN_DIFFS_FOR_GATE diffs and
    # their estimate has converged (the same rate at two closes).
    assert MIN_DIFFS_FOR_GATE == 4
    (first,) = feed_each(b, merge(pulses(DET, 14, 2, 3), pulses(MON, 5, 2, 3)))
    assert b.estimator_of(MON).diff_count == 4  # type: ignore[union-attr]
    assert not b.is_gating(MON) and first.reason is CloseReason.SLOT_GATE
    feed_each(b, merge(pulses(DET, 14, 3, 4), pulses(MON, 5, 3, 4)))
    assert b.is_gating(MON)
    # Absent: mon stops. Each batch now needs the timeout (mon gates but is silent),
    # and the fifth batch without mon evicts it.
    absent_batches: list[Batch[str, str]] = []
    det = iter(pulses(DET, 14, 4, 20))
    while MON in b.streams:
        absent_batches += b.feed([next(det)])
    assert len(absent_batches) == ABSENT_BATCHES_FOR_EVICTION == 5
    assert all(x.reason is CloseReason.TIMEOUT and x.stream(MON) == [] for x in absent_batches)
    assert b.stats["evictions"] == 1 and not b.is_gating(MON)
    t = (absent_batches[-1].window_end_ns - T0) // S + 1
    feed_each(b, [m for m in det if m[1] < at(t)])
    # Evicted: det's slot gate alone closes the batches again.
    again = feed_each(b, pulses(DET, 14, t, t + 2))
    assert again and all(x.reason is CloseReason.SLOT_GATE for x in again)
    t += 2
    # Rejoin: mon comes back and gates again after re-converging.
    feed_each(b, merge(pulses(DET, 14, t, t + 2), pulses(MON, 5, t, t + 2)))
    assert b.is_gating(MON)
    t += 2
    assert feed_each(b, pulses(DET, 14, t, t + 1)) == []  # waits for mon now
    assert b.blocking_streams() == (MON,)


# 15 --------------------------------------------------------------------------------


def test_seed_batch_length_change_grid_recomputes() -> None:
    """set_batch_length(2 s) applies at the next close: same origin, 14 -> 28 slots."""
    b, _ = converged({DET: 14})
    grid_before = b.grid_of(DET)
    assert grid_before is not None and grid_before.slots_per_batch == 14
    b.set_batch_length(2 * S)
    assert b.batch_length_ns == S  # the active window keeps its length

    (first,) = feed_each(b, pulses(DET, 14, 2, 3))
    assert span(first) == (2, 3) and len(first.stream(DET)) == 14
    grid_after = b.grid_of(DET)
    assert grid_after is not None
    assert grid_after.origin_ns == grid_before.origin_ns
    assert grid_after.slots_per_batch == 28
    assert b.batch_length_ns == 2 * S and b.window == (at(3), at(5))

    points, (second,) = close_points(b, pulses(DET, 14, 3, 5))
    assert span(second) == (3, 5) and second.reason is CloseReason.SLOT_GATE
    assert len(second.stream(DET)) == 28 and points == [27]


# 16 --------------------------------------------------------------------------------


def test_seed_jitter_tolerance_30ms_keeps_batch_continuity() -> None:
    """+-30 ms jitter (42 % of a 14 Hz period): each pulse rounds to its own slot."""
    import random

    rng = random.Random(2024)
    b, _ = converged({DET: 14})
    exact = pulses(DET, 14, 2, 32)
    jittered = [(sid, ts + rng.randint(-30_000_000, 30_000_000), item) for sid, ts, item in exact]
    batches = feed_each(b, jittered) + b.flush()
    windows = [span(x) for x in batches]
    assert windows == [(k, k + 1) for k in range(2, 32)]  # continuous, no gaps, no extras
    counts = [len(x.stream(DET)) for x in batches]
    assert sum(counts) == len(exact)
    assert all(13 <= c <= 15 for c in counts)  # at most an occasional +-1 slot drift
    assert sum(c == 14 for c in counts) >= 0.9 * len(counts)
    assert sum(x.reason is CloseReason.SLOT_GATE for x in batches) >= 0.9 * len(batches)


def test_seed_slots_per_batch_one_stray_delivered_next_window() -> None:
    """Contract departure 2: at 1 slot/batch a stray rounding to the next pulse goes next window."""
    b, _ = converged({MON: 1}, warm_s=7)
    grid = b.grid_of(MON)
    assert grid is not None and grid.slots_per_batch == 1
    start = b.window[0]  # type: ignore[index]
    stray = (MON, start + round(0.6 * S), "mon-stray")  # rounds to the pulse at start + 1 s
    batches = b.feed([stray])
    assert all(x.message_count for x in batches)  # no empty batch for the skipped window
    batches += feed_each(b, pulses(MON, 1, 8, 10))
    batches += b.flush()
    home = [x for x in batches if "mon-stray" in x.items(MON)]
    assert len(home) == 1
    assert home[0].window_start_ns == start + S  # next window, never lost
