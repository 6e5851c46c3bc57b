"""FrameProgress policy, sans-IO (issue #29 point 2; Wire §10.2.2, §10.1.2).

Producer: :class:`ProgressThrottle` (opt-in gate, STARTED/PROGRESS/COMPLETE, interval and byte
delta, consumer hints within floors). Consumer: :class:`ProgressTracker` (the drop rules).
"""

from __future__ import annotations

import pytest

from tensorpool.client.progress_core import (
    PROGRESS_BAD_STATE,
    PROGRESS_EPOCH_MISMATCH,
    PROGRESS_HEADER_INDEX_MISMATCH,
    PROGRESS_LATE,
    PROGRESS_REGRESSED,
    ProgressRequest,
    ProgressSettings,
    ProgressThrottle,
    ProgressTracker,
)
from tensorpool.counters import DropCounters
from tensorpool.specs.generated.wire import FrameProgressState

US = 1000
MB = 1 << 20


def _throttle(**kw: object) -> ProgressThrottle:
    t = ProgressThrottle(ProgressSettings(**kw))  # type: ignore[arg-type]
    t.on_hello(7, True, None, None)
    return t


# --- producer ---------------------------------------------------------------------------------
def test_s10_2_2_nothing_published_until_a_consumer_asks_for_progress() -> None:
    t = ProgressThrottle(ProgressSettings())
    assert not t.active
    assert t.start(0, 0, MB, 0) is None
    assert t.update(0, MB, 10**9) is None and t.complete(0, MB) is None
    t.on_hello(7, False, None, None)
    assert not t.active
    t.on_hello(7, True, None, None)
    assert t.active and t.interested == 1
    t.on_hello(7, False, None, None)  # the same consumer says hello again without progress
    assert not t.active


def test_s10_1_3_progress_interest_lasts_while_the_consumer_sends_qos() -> None:
    """#29: a consumer's progress interest (and its finer hints) is dropped when neither a
    hello nor a QosConsumer came from it for the stale window (§10.1.3), as its per-consumer
    stream is: a consumer killed with SIGKILL never says hello without supportsProgress."""
    stale = 500 * 10**6
    t = ProgressThrottle(ProgressSettings(interval_us=250, min_interval_us=50), stale_ns=stale)
    t.on_hello(7, True, 100, None, 0)
    t.on_hello(8, True, None, None, 0)
    t.on_qos(9, stale)  # QoS of a consumer that never asked: no interest made up
    for now in range(stale // 2, 3 * stale, stale // 2):
        t.on_qos(7, now)  # 7 stays alive; 8 went silent
        t.forget_stale(now)
        assert t.interested == (2 if now <= stale else 1), now
    assert t.interval_ns == 100 * US and t.forgotten_stale == 1
    assert t.forget_stale(3 * stale - stale // 2 + stale) == 0  # exactly the window: kept
    assert t.forget_stale(3 * stale - stale // 2 + stale + 1) == 1
    assert not t.active and t.interval_ns == 250 * US  # back to the producer's own policy


def test_s10_2_2_always_on_publishes_without_any_hello() -> None:
    t = ProgressThrottle(ProgressSettings(only_when_requested=False))
    assert t.active and t.start(0, 0, MB, 0) == 0


def test_s10_2_2_started_then_progress_by_delta_and_interval_then_complete() -> None:
    t = _throttle(interval_us=250, bytes_delta=65_536)
    assert t.start(5, 5, MB, 0) == 0  # STARTED, 0 bytes
    assert t.update(5, 1000, 300 * US) is None  # below the delta
    assert t.update(5, 70_000, 100 * US + 300 * US) == 70_000  # delta and interval both met
    assert t.update(5, 200_000, 450 * US) is None  # delta met, inside the interval
    assert t.flush(600 * US) is None  # still inside
    assert t.flush(650 * US) == 200_000  # the latest held-back count once the interval passed
    assert t.flush(10**9) is None  # nothing new
    assert t.complete(5, MB) == MB
    assert t.update(5, MB, 10**9) is None  # the frame is closed


def test_s10_2_2_last_bytes_of_a_frame_qualify_below_the_delta() -> None:
    t = _throttle(interval_us=0, bytes_delta=65_536)
    t.start(1, 1, 100_000, 0)
    assert t.update(1, 70_000, 1) == 70_000
    assert t.update(1, 100_000, 2) == 100_000  # 30_000 < delta, but the frame is full


def test_s10_2_2_filled_must_not_regress_nor_exceed_the_frame() -> None:
    t = _throttle(interval_us=0, bytes_delta=1)
    t.start(1, 1, 1000, 0)
    t.update(1, 500, 1)
    with pytest.raises(ValueError, match="went backwards"):
        t.update(1, 400, 2)
    with pytest.raises(ValueError, match="exceed"):
        t.update(1, 1001, 2)


def test_s10_1_2_hints_take_the_smallest_offered_within_the_producer_floors() -> None:
    t = ProgressThrottle(ProgressSettings(interval_us=250, bytes_delta=65_536, min_interval_us=50))
    t.on_hello(1, True, None, None)
    assert (t.interval_ns, t.bytes_delta) == (250 * US, 65_536)  # no hints: producer defaults
    t.on_hello(2, True, 100, 4096)
    t.on_hello(3, True, 200, 1024)
    assert (t.interval_ns, t.bytes_delta) == (100 * US, 1024)
    t.on_hello(4, True, 10, None)  # below the floor
    assert t.interval_ns == 50 * US
    t.on_hello(4, False, None, None)
    t.on_hello(2, False, None, None)
    assert (t.interval_ns, t.bytes_delta) == (200 * US, 1024)


def test_settings_out_of_range_are_refused_with_one_line() -> None:
    with pytest.raises(ValueError, match="interval_us"):
        ProgressSettings(interval_us=-1)
    with pytest.raises(ValueError, match="min_bytes_delta"):
        ProgressSettings(min_bytes_delta=0)
    with pytest.raises(ValueError, match="bytes_delta"):
        ProgressRequest(bytes_delta=2**32)


# --- consumer ---------------------------------------------------------------------------------
def _track(tr: ProgressTracker, frame: int, filled: int, state: int, **kw: int):
    args = {"epoch": 3, "header_index": frame & 7} | kw
    return tr.on_progress(
        9,
        args["epoch"],
        frame,
        args["header_index"],
        filled,
        state,
        mapped_epoch=3,
        mask=7,
        last_seq=kw.get("last_seq", 10),
    )


def test_s10_2_2_accepted_sequence_started_progress_complete() -> None:
    tr = ProgressTracker(DropCounters())
    got = [
        _track(tr, 11, 0, 1),
        _track(tr, 11, 100, 2),
        _track(tr, 11, 100, 2),  # no advance is not a regression (non-decreasing)
        _track(tr, 11, 300, 3),
    ]
    assert [g.state for g in got] == [  # type: ignore[union-attr]
        FrameProgressState.STARTED,
        FrameProgressState.PROGRESS,
        FrameProgressState.PROGRESS,
        FrameProgressState.COMPLETE,
    ]
    assert tr.counters.total() == 0


@pytest.mark.parametrize(
    ("frame", "filled", "state", "kw", "reason"),
    [
        (11, 0, 1, {"epoch": 2}, PROGRESS_EPOCH_MISMATCH),
        (11, 0, 1, {"header_index": 4}, PROGRESS_HEADER_INDEX_MISMATCH),
        (11, 0, 0, {}, PROGRESS_BAD_STATE),
        (11, 0, 9, {}, PROGRESS_BAD_STATE),
        (10, 0, 2, {}, PROGRESS_LATE),
    ],
)
def test_s10_2_2_progress_drops_with_a_named_reason(
    frame: int, filled: int, state: int, kw: dict[str, int], reason: str
) -> None:
    tr = ProgressTracker(DropCounters())
    assert _track(tr, frame, filled, state, **kw) is None
    assert tr.counters.snapshot() == {reason: 1}


def test_s10_2_2_complete_after_its_descriptor_is_ignored_without_a_count() -> None:
    """COMPLETE and the descriptor travel on different streams: one taken after the frame is
    no loss (the descriptor said it all), unlike a PROGRESS that late."""
    tr = ProgressTracker(DropCounters())
    assert _track(tr, 10, 300, 3) is None
    assert tr.counters.total() == 0
    assert _track(tr, 10, 300, 2) is None
    assert tr.counters.snapshot() == {PROGRESS_LATE: 1}


def test_s10_2_2_bytes_or_state_going_backwards_within_a_frame_is_dropped() -> None:
    tr = ProgressTracker(DropCounters())
    assert _track(tr, 12, 500, 2) is not None
    assert _track(tr, 12, 400, 2) is None  # bytes regress
    assert _track(tr, 12, 600, 1) is None  # state regresses (STARTED after PROGRESS)
    assert _track(tr, 12, 900, 3) is not None
    assert _track(tr, 12, 900, 2) is None  # PROGRESS after COMPLETE
    assert tr.counters.snapshot() == {PROGRESS_REGRESSED: 3}
    tr.forget()  # a new mapping: the old frame ids mean nothing
    assert _track(tr, 12, 0, 1) is not None


def test_s10_2_2_a_cancelled_claim_gets_no_more_progress() -> None:
    """Lease lost or epoch replaced mid-claim: the held-back count is not sent afterwards."""
    t = _throttle(interval_us=250, bytes_delta=1)
    t.start(3, 3, 1000, 0)
    assert t.update(3, 500, 10 * US) is None  # held back by the interval
    t.cancel()
    assert t.flush(10**9) is None and t.complete(3, 1000) is None
