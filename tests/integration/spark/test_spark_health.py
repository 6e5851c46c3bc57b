"""Health and lag in progress, stale streams, minFramesPerTrigger (issue #16.2, #16.4).

Real local SparkSession, real media driver, real producer processes (spark_roles.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from spark_helpers import BatchLog, source_options, start_query, wait_query

import tensorpool.spark_source as tps

pytestmark = pytest.mark.spark


@pytest.fixture
def quick_progress(spark: Any) -> Iterator[None]:
    """Progress reports for triggers without data every 200 ms (Spark's default: 10 s)."""
    key = "spark.sql.streaming.noDataProgressEventInterval"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "200ms")
    yield
    if old is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, old)


def _health(q: Any, sid: int) -> dict[str, Any]:
    return tps.stream_health(q.lastProgress).get(sid, {}) if q.lastProgress else {}


def _await_failure(q: Any, timeout: float = 120.0) -> str:
    with pytest.raises(Exception) as info:  # Spark wraps the Python error
        q.awaitTermination(timeout)
    return str(info.value)


def test_killed_producer_fails_the_query_with_health_in_progress(
    spark, spark_media_driver, tmp_shm, producers, tmp_path, quick_progress
):
    """#16.2: progress shows lag, newest frame age and liveness; after the producer is killed
    the query fails once the stream had no live producer for staleStreamTimeoutMs."""
    p = producers("--stream-id", "61", "--nslots", "64")
    p.produce(5)
    sink = BatchLog()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="61",
        startingOffsets="earliest",
        freshnessMs=1000,
        staleStreamTimeoutMs=2000,
    )
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: len(sink.frames()) == 5 and _health(q, 61).get("lag") == 0, q)
        h = _health(q, 61)
        assert h["live"] is True and h["seq"] == 5 and h["noProducerMs"] == 0
        assert h["newestFrameAgeMs"] is not None and h["newestFrameAgeMs"] >= 0
        assert h["announceAgeMs"] is not None
        end = json.loads(q.lastProgress["sources"][0]["endOffset"])
        assert set(end["61"]) == {"epoch", "seq", "frames", "lost", "lostLate"}  # offsets as before
        p.proc.kill()
        p.proc.wait()
        text = _await_failure(q)
    finally:
        with contextlib.suppress(Exception):
            q.stop()
    assert "stale stream" in text and "stream 61: no live producer" in text
    assert f"producer (epoch {p.epoch}) stopped announcing" in text
    assert "staleStreamTimeoutMs=2000" in text and "onStaleStream=warn" in text


def test_stream_without_producer_fails_the_query(spark, spark_media_driver, tmp_shm, tmp_path):
    """#16.2: a stream id nobody produces fails the query after staleStreamTimeoutMs."""
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="62",
        attachTimeoutMs=500,
        staleStreamTimeoutMs=1500,
    )
    q = start_query(spark, opts, BatchLog(), str(tmp_path / "ck"))
    try:
        text = _await_failure(q)
    finally:
        with contextlib.suppress(Exception):
            q.stop()
    assert "stream 62: no live producer" in text
    assert "no producer has announced it since the query started" in text
    assert spark_media_driver.dir in text


def test_stream_without_producer_only_warns_when_opted_out(
    spark, spark_media_driver, tmp_shm, producers, tmp_path, quick_progress
):
    """#16.2: onStaleStream=warn keeps the query running, health says the stream is not live,
    and frames are read once a producer appears."""
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="63",
        attachTimeoutMs=500,
        staleStreamTimeoutMs=500,
        onStaleStream="warn",
        startingOffsets="earliest",
    )
    sink = BatchLog()
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: _health(q, 63).get("noProducerMs", 0) > 1000, q)
        h = _health(q, 63)
        assert h["live"] is False and h["lag"] is None and q.isActive
        p = producers("--stream-id", "63", "--nslots", "64")
        p.produce(3)
        wait_query(lambda: len(sink.frames()) == 3, q)
        wait_query(lambda: _health(q, 63).get("live") is True, q)
    finally:
        q.stop()


def test_min_frames_per_trigger_holds_until_enough_frames(
    spark, spark_media_driver, tmp_shm, producers, tmp_path
):
    """#16.4: with minFramesPerTrigger a trigger waits for that many frames (maxTriggerDelay
    long); with a short maxTriggerDelay the few frames come after the delay."""
    p = producers("--stream-id", "64", "--nslots", "256")
    sink = BatchLog()
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="64",
        minFramesPerTrigger=10,
        maxTriggerDelay="10m",
    )
    q = start_query(spark, opts, sink, str(tmp_path / "ck"))
    try:
        wait_query(lambda: q.lastProgress is not None, q)
        p.produce(4)
        # many triggers pass (200 ms each) and none takes the 4 frames
        seen = q.lastProgress["batchId"] if q.lastProgress else -1
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            cur = _health(q, 64)
            if cur.get("seq") == 4 and cur.get("lag") == 4:
                break
            time.sleep(0.1)
        assert _health(q, 64)["lag"] == 4, "progress should show the 4 held frames as lag"
        assert not sink.frames(), f"4 < minFramesPerTrigger frames were read (batch {seen})"
        p.produce(6)
        wait_query(lambda: len(sink.frames()) == 10, q)
        sizes = [len(b) for b in sink.batches.values() if b]
        assert sizes == [10], sizes
    finally:
        q.stop()

    sink2 = BatchLog()
    opts2 = dict(opts, maxTriggerDelay="1s", startingOffsets="latest")
    q2 = start_query(spark, opts2, sink2, str(tmp_path / "ck2"))
    try:
        wait_query(lambda: q2.lastProgress is not None, q2)
        p.produce(3)
        wait_query(lambda: len(sink2.frames()) == 3, q2)
    finally:
        q2.stop()
