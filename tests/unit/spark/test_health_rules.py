"""Health, stale streams and minFramesPerTrigger of the Spark source, sans-IO (issue #16).

A driven clock (plain ``now_ns`` integers) and hand-built ring states; the real-Spark tests are
in tests/integration/spark/test_spark_health.py.
"""

from __future__ import annotations

import json
import logging

import pytest

from tensorpool.spark_source.options import (
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    DEFAULT_STALE_STREAM_TIMEOUT_MS,
    TensorPoolOptionError,
    parse_source_options,
)
from tensorpool.spark_source.plan.health import (
    HealthMonitor,
    MinFramesGate,
    TensorPoolStaleStreamError,
    backlog,
    lag_of,
)
from tensorpool.spark_source.plan.offsets import NOT_STARTED, RingState, StreamPos
from tensorpool.spark_source.plan.progress import lost_frames, stream_health, stream_lag

MS = 1_000_000
LIVE = (True, 100)
DEAD = (False, None)


# --- stale streams ------------------------------------------------------------------------------
def test_stream_without_producer_fails_after_timeout_not_before() -> None:
    """#16.2: a stream id with no producer fails the query after staleStreamTimeoutMs."""
    mon = HealthMonitor(timeout_ms=1000, warn_only=False)
    mon.observe({1: DEAD}, [1], 0)
    mon.check(0, "control X")
    mon.observe({1: DEAD}, [1], 1000 * MS)
    mon.check(1000 * MS, "control X")  # exactly the timeout: not yet
    mon.observe({1: DEAD}, [1], 1001 * MS)
    with pytest.raises(TensorPoolStaleStreamError) as err:
        mon.check(1001 * MS, "control X")
    msg = str(err.value)
    assert "stream 1" in msg and "no producer has announced it since the query started" in msg
    assert "staleStreamTimeoutMs=1000" in msg and "control X" in msg
    assert "onStaleStream=warn" in msg


def test_killed_producer_fails_after_timeout_counted_from_its_last_sighting() -> None:
    """#16.2: the clock restarts at every live sighting; the message names the epoch."""
    mon = HealthMonitor(timeout_ms=1000, warn_only=False)
    mon.observe({1: LIVE}, [1], 0)
    mon.observe_ring(1, RingState(4, 0, 10, 16), 5, StreamPos(4, 10))
    mon.observe({1: LIVE}, [1], 5000 * MS)
    mon.observe({1: DEAD}, [1], 5500 * MS)
    mon.check(5500 * MS, "w")
    mon.observe({1: DEAD}, [1], 6001 * MS)
    with pytest.raises(TensorPoolStaleStreamError, match=r"producer \(epoch 4\) stopped"):
        mon.check(6001 * MS, "w")


def test_warn_mode_warns_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    """#16.2: onStaleStream=warn logs instead of failing, once until the producer is back."""
    mon = HealthMonitor(timeout_ms=10, warn_only=True)
    with caplog.at_level(logging.WARNING, "tensorpool.spark_source"):
        for t in (0, 20, 30, 40):
            mon.observe({2: DEAD}, [2], t * MS)
            mon.check(t * MS, "w")
        assert sum("stale stream" in r.message for r in caplog.records) == 1
        mon.observe({2: LIVE}, [2], 50 * MS)
        mon.check(50 * MS, "w")
        for t in (70, 80):
            mon.observe({2: DEAD}, [2], t * MS)
            mon.check(t * MS, "w")
    assert sum("stale stream" in r.message for r in caplog.records) == 2


def test_timeout_zero_never_fails() -> None:
    """#16.2: staleStreamTimeoutMs=0 disables the check (health is still reported)."""
    mon = HealthMonitor(timeout_ms=0, warn_only=False)
    mon.observe({1: DEAD}, [1], 0)
    mon.observe({1: DEAD}, [1], 10**15)
    mon.check(10**15, "w")
    assert mon.report([1], 10**15, 0)["1"]["noProducerMs"] == 10**15 // MS


def test_stream_joining_later_gets_its_own_clock() -> None:
    """#16.2: a stream first looked at later (discovery) gets the full timeout from then."""
    mon = HealthMonitor(timeout_ms=100, warn_only=False)
    mon.observe({1: LIVE}, [1], 0)
    mon.observe({1: LIVE, 2: DEAD}, [1, 2], 1000 * MS)
    mon.check(1050 * MS, "w")
    mon.observe({1: LIVE, 2: DEAD}, [1, 2], 1101 * MS)
    with pytest.raises(TensorPoolStaleStreamError, match="stream 2"):
        mon.check(1101 * MS, "w")


# --- the health report ----------------------------------------------------------------------------
def test_report_has_lag_newest_age_and_liveness() -> None:
    """#16.2: every stream appears with lag (frames after the planned end), ages and liveness."""
    mon = HealthMonitor(timeout_ms=1000, warn_only=False)
    mon.observe({1: (True, 250), 2: DEAD}, [1, 2], 10 * MS)
    mon.observe_ring(1, RingState(3, 100, 140, 64), 7_000 * MS, StreamPos(3, 128))
    mon.observe_ring(2, None, None, StreamPos(NOT_STARTED, 0))
    doc = mon.report([2, 1], 30 * MS, 7_004 * MS)
    assert list(doc) == ["1", "2"]
    assert doc["1"] == {
        "epoch": 3,
        "seq": 140,
        "lag": 12,
        "newestFrameAgeMs": 4,
        "live": True,
        "announceAgeMs": 250,
        "noProducerMs": 0,
    }
    assert doc["2"]["live"] is False and doc["2"]["lag"] is None
    assert doc["2"]["noProducerMs"] == 20


def test_dead_stream_keeps_last_head_and_growing_age() -> None:
    """#16.2: after its producer died the stream's last head, lag and an ageing newest frame
    stay visible (the ring is no longer scanned)."""
    mon = HealthMonitor(timeout_ms=0, warn_only=False)
    mon.observe({1: LIVE}, [1], 0)
    mon.observe_ring(1, RingState(3, 0, 50, 64), 1_000 * MS, StreamPos(3, 40))
    mon.observe({1: DEAD}, [1], 10 * MS)
    mon.observe_ring(1, None, None, StreamPos(3, 45))
    doc = mon.report([1], 10 * MS, 9_000 * MS)["1"]
    assert (doc["seq"], doc["lag"], doc["newestFrameAgeMs"], doc["live"]) == (50, 5, 8000, False)


def test_lag_of_epochs() -> None:
    st = RingState(5, 10, 30, 32)
    assert lag_of(st, StreamPos(5, 25)) == 5
    assert lag_of(st, StreamPos(4, 99)) == 20  # an older epoch: the whole new ring is unread
    assert lag_of(st, StreamPos(NOT_STARTED, 0)) == 20
    assert lag_of(st, StreamPos(6, 0)) == 0


def test_progress_helpers_read_latest_offset() -> None:
    """#16.2: tps.stream_health / stream_lag read the latestOffset, lost_frames is unchanged."""
    progress = {
        "sources": [
            {
                "description": "tensorpool",
                "endOffset": json.dumps(
                    {"1": {"epoch": 3, "seq": 9, "frames": 9, "lost": 2, "lostLate": 1}}
                ),
                "latestOffset": json.dumps(
                    {
                        "1": {
                            "epoch": 3,
                            "seq": 12,
                            "lag": 3,
                            "newestFrameAgeMs": 1,
                            "live": True,
                            "announceAgeMs": 5,
                            "noProducerMs": 0,
                        }
                    }
                ),
            },
            {"description": "rate", "endOffset": "5", "latestOffset": None},
        ]
    }
    assert stream_lag(progress) == {1: 3}
    assert stream_health(json.dumps(progress))[1]["live"] is True
    assert lost_frames(progress) == {1: {"lost": 2, "lostLate": 1, "total": 3}}


# --- minFramesPerTrigger / maxTriggerDelay --------------------------------------------------------
def test_gate_holds_until_min_frames_or_delay() -> None:
    """#16.4: fewer than minFramesPerTrigger frames wait at most maxTriggerDelay."""
    gate = MinFramesGate(min_frames=10, max_delay_ms=100)
    assert gate.hold(3, 0)  # the delay counts from the query start
    assert gate.hold(9, 99 * MS)
    assert not gate.hold(10, 99 * MS)  # enough frames
    assert not gate.hold(1, 100 * MS)  # delay passed: take what is there
    gate.admitted(1, 100 * MS)
    assert gate.hold(5, 150 * MS)  # the delay restarts at the last batch
    gate.admitted(0, 250 * MS)  # an empty plan does not restart it
    assert not gate.hold(1, 250 * MS)


def test_backlog_counts_frames_and_never_holds_bookkeeping() -> None:
    """#16.4: a stream that appeared or changed epoch needs its batch now (None)."""
    start = {1: StreamPos(3, 10), 2: StreamPos(7, 0)}
    assert backlog(start, {1: RingState(3, 0, 15, 16), 2: None}) == 5
    assert backlog(start, {1: RingState(3, 0, 15, 16), 2: RingState(8, 0, 1, 16)}) is None
    assert backlog({1: StreamPos(NOT_STARTED, 0)}, {1: RingState(1, 0, 1, 16)}) is None
    assert backlog({1: StreamPos(NOT_STARTED, 0)}, {1: None}) == 0


# --- options --------------------------------------------------------------------------------------
def test_option_defaults_and_parsing() -> None:
    opts = parse_source_options({"streams": "1"}, streaming=True)
    assert opts.stale_stream_timeout_ms == DEFAULT_STALE_STREAM_TIMEOUT_MS == 30_000
    assert opts.on_stale_stream == "fail"
    assert opts.min_frames_per_trigger is None
    assert opts.max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS
    opts = parse_source_options(
        {
            "streams": "1",
            "stalestreamtimeoutms": "500",
            "onstalestream": "WARN",
            "minframespertrigger": "100",
            "maxtriggerdelay": "2s",
        },
        streaming=True,
    )
    assert (opts.stale_stream_timeout_ms, opts.on_stale_stream) == (500, "warn")
    assert (opts.min_frames_per_trigger, opts.max_trigger_delay_ms) == (100, 2000)
    for raw, ms in (("250", 250), ("250ms", 250), ("15m", 900_000), ("1h", 3_600_000)):
        o = parse_source_options(
            {"streams": "1", "minFramesPerTrigger": "1", "maxTriggerDelay": raw}, streaming=True
        )
        assert o.max_trigger_delay_ms == ms


@pytest.mark.parametrize(
    ("extra", "name"),
    [
        ({"onStaleStream": "ignore"}, "onStaleStream"),
        ({"staleStreamTimeoutMs": "-1"}, "staleStreamTimeoutMs"),
        ({"maxTriggerDelay": "10s"}, "maxTriggerDelay"),  # without minFramesPerTrigger
        ({"minFramesPerTrigger": "5", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"minFramesPerTrigger": "0"}, "minFramesPerTrigger"),
        ({"minFramesPerTrigger": "50", "maxFramesPerTrigger": "10"}, "minFramesPerTrigger"),
        ({"minFramesPerTrigger": "5", "batching": "pulse"}, "minFramesPerTrigger"),
    ],
)
def test_bad_options_name_themselves(extra: dict[str, str], name: str) -> None:
    with pytest.raises(TensorPoolOptionError) as err:
        parse_source_options({"streams": "1", **extra}, streaming=True)
    assert str(err.value).startswith(f"{name}:")


def test_streaming_only_options_refused_in_batch() -> None:
    with pytest.raises(TensorPoolOptionError, match=r"^minFramesPerTrigger: is for streaming"):
        parse_source_options({"streams": "1", "minFramesPerTrigger": "5"}, streaming=False)
    with pytest.raises(TensorPoolOptionError, match=r"^staleStreamTimeoutMs: is for streaming"):
        parse_source_options({"streams": "1", "staleStreamTimeoutMs": "5"}, streaming=False)
