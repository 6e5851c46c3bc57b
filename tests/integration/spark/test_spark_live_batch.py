"""#16.1 reading a live stream with default options, and #16.3 naming the wrong host.

Real local SparkSession, real media driver, real producers: ``tensorpool produce`` (the command
of the issue) and spark_roles.py; the wrong-host test runs a second real SparkSession whose
executors see another mount namespace (spark_ns_reader.py).
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import BatchLog, source_options, start_query, wait_query

import tensorpool.spark_source as tps
from tensorpool.shm.region import HEADER_RING_FILENAME
from tensorpool.shm.ring import HeaderRingView

pytestmark = pytest.mark.spark

NS_READER = str(Path(__file__).with_name("spark_ns_reader.py"))


def ring_head(shm: str, nslots: int) -> int:
    """The next seq of the (only) ring under ``shm`` (0 before it exists)."""
    paths = glob.glob(os.path.join(shm, "*", "*", "epoch-*", HEADER_RING_FILENAME))
    if not paths:
        return 0
    with open(paths[0], "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        view = HeaderRingView(mm, nslots)
        head = view.head_seq() + 1
        del view
        return head
    finally:
        mm.close()


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture
def live(spark_media_driver: Any, tmp_shm: str) -> Iterator[Callable[..., subprocess.Popen]]:
    """``tensorpool produce`` at a rate (stopped at teardown)."""
    procs: list[subprocess.Popen] = []

    def start(stream: int, rate: int, nslots: int) -> subprocess.Popen:
        p = subprocess.Popen(
            [
                *(sys.executable, "-m", "tensorpool", "produce", "--stream-id", str(stream)),
                *("--rate", str(rate), "--nslots", str(nslots), "--quiet"),
                *("--aeron-dir", spark_media_driver.dir, "--shm-base-dir", tmp_shm),
            ],
            stdout=subprocess.DEVNULL,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _seqs(df: Any) -> list[tuple[int, int]]:
    return sorted((r.epoch, r.seq) for r in df.select("epoch", "seq").collect())


def test_batch_read_of_a_full_live_ring_works_with_defaults(
    spark, spark_media_driver, tmp_shm, live
):
    """#16.1 acceptance: ``load().count()`` on ``produce --rate 100 --nslots 1024`` once the ring
    is full succeeds with default options: ``earliest`` skips the frames the producer
    overwrites within earliestMarginMs instead of planning the oldest (gone in ~10 ms)."""
    p = live(41, 100, 1024)
    wait_for(lambda: ring_head(tmp_shm, 1024) > 1100)
    assert p.poll() is None
    opts = source_options(spark_media_driver, tmp_shm, streams="41")
    df = spark.read.format("tensorpool").options(**opts).load()
    seqs = [s for _, s in _seqs(df)]
    assert 0 < len(seqs) < 1024  # the newest part of the ring
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    # a second action reads the same plan: all of it while the ring holds it, else the
    # planned frames still there (how long it holds them depends on this host's load)
    assert 0 < df.count() <= len(seqs)


def test_two_actions_on_one_dataframe_return_the_same_rows(
    spark, spark_media_driver, tmp_shm, live
):
    """#16.1: a batch DataFrame is one snapshot planned at its first action; later actions
    read exactly those frames although the producer keeps publishing (a new read sees more)."""
    live(42, 100, 4096)
    wait_for(lambda: ring_head(tmp_shm, 4096) > 100)
    opts = source_options(spark_media_driver, tmp_shm, streams="42")
    df = spark.read.format("tensorpool").options(**opts).load()
    first = _seqs(df)
    head = ring_head(tmp_shm, 4096)
    wait_for(lambda: ring_head(tmp_shm, 4096) > head + 20)
    assert _seqs(df) == first
    assert df.count() == len(first)
    fresh = _seqs(spark.read.format("tensorpool").options(**opts).load())
    assert len(fresh) > len(first) and fresh[: len(first)] == first


def test_later_actions_after_overwrite_snapshot_semantics(
    spark, spark_media_driver, tmp_shm, producers
):
    """#16.1/#16.3: once the ring moved past part of a snapshot, a later action of a DataFrame
    from 'earliest' returns the planned frames still in the ring (a suffix); one from an
    explicit start fails saying the DataFrame is a snapshot and to .cache() it -- not "the
    query fell behind"; a cached DataFrame keeps all its rows."""
    p = producers("--stream-id", "43", "--shape", "16", "--nslots", "64")
    p.produce(64)
    opts = source_options(spark_media_driver, tmp_shm, streams="43")
    start = json.dumps({"43": {"epoch": p.epoch, "seq": 0}})
    pinned = spark.read.format("tensorpool").options(**opts, startingOffsets=start).load()
    df = spark.read.format("tensorpool").options(**opts).load()
    cached = spark.read.format("tensorpool").options(**opts).load().cache()
    assert pinned.count() == df.count() == cached.count() == 64
    p.produce(32)  # seqs 0..31 overwritten
    with pytest.raises(Exception) as err:
        pinned.count()
    text = str(err.value)
    assert "TensorPoolDataLossError" in text and ".cache()" in text and "snapshot" in text
    assert "fell behind" not in text
    assert [s for _, s in _seqs(df)] == list(range(32, 64))
    assert [s for _, s in _seqs(cached)] == list(range(64))


def test_explicit_old_starting_offset_does_not_say_fell_behind(
    spark, spark_media_driver, tmp_shm, producers
):
    """#16.3: startingOffsets JSON older than the ring: the message says the frames were gone
    before the read started."""
    p = producers("--stream-id", "44", "--shape", "16", "--nslots", "16")
    p.produce(40)
    start = json.dumps({"44": {"epoch": p.epoch, "seq": 2}})
    opts = source_options(spark_media_driver, tmp_shm, streams="44", startingOffsets=start)
    with pytest.raises(Exception) as err:
        spark.read.format("tensorpool").options(**opts).load().count()
    text = str(err.value)
    assert "startingOffsets asked for stream 44 from seq 2" in text
    assert "fell behind" not in text


def test_streaming_earliest_on_a_full_live_ring_starts_cleanly(
    spark, spark_media_driver, tmp_shm, live, tmp_path
):
    """#16.1: readStream startingOffsets=earliest (failOnDataLoss=true) on a full, live ring
    starts without loss: past the frames the producer overwrites within the margin.

    The margin (5 s) must cover the time from choosing the start to planning and reading the
    first batch. On a loaded host a new query's first batch can take 15 s or more (its Python
    workers start) -- longer than this ring's 10 s, after which frames are gone whatever the
    start was. So the producer pauses once batch 0 is planned (its offsets logged) until the
    batch is done: the test checks the start, not the host's speed. Without the margin the
    oldest frame is overwritten ~10 ms after the start is chosen, long before the pause, and
    the batch reads fewer frames than it planned."""
    producer = live(45, 100, 1024)
    wait_for(lambda: ring_head(tmp_shm, 1024) > 1100)
    opts = source_options(
        spark_media_driver,
        tmp_shm,
        streams="45",
        startingOffsets="earliest",
        staleStreamTimeoutMs=600_000,  # the pause is no stale stream
        maxFramesPerTrigger=200,  # the oldest frames first; 600 KB each
    )
    sink = BatchLog()
    ck = tmp_path / "ck"
    q = start_query(spark, opts, sink, str(ck))
    try:
        wait_for(lambda: (ck / "offsets" / "0").exists() or q.exception() is not None)
        producer.send_signal(signal.SIGSTOP)
        try:
            wait_query(lambda: q.lastProgress is not None, q)  # batch 0 done (and committed)
            progress = q.lastProgress
        finally:
            q.stop()
            producer.send_signal(signal.SIGCONT)
        assert q.exception() is None
        seqs = [s for _, s in sink.batches[0]]
        assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing lost
        assert tps.lost_frames(progress).get(45, {}).get("total", 0) == 0
        # every planned frame was read: none aged out before the pause (an 'earliest' read
        # skips those silently; without the margin 10 or more of the oldest would have)
        planned = json.loads(progress["sources"][0]["endOffset"])["45"]["frames"]
        assert len(seqs) == planned == 200
    finally:
        q.stop()


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "--uts", "true"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="unprivileged user+mount namespaces needed")
@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_executor_that_cannot_see_the_shm_names_the_hosts(
    spark_media_driver, tmp_shm, producers, fail_on_data_loss
):
    """#16.3: executors in another mount namespace (their own empty shmBaseDir, another host
    name) fail naming the planning host, this host and the directory, and what to do --
    with failOnDataLoss=false too (it is not data loss: no silent empty result)."""
    p = producers("--stream-id", "46", "--shape", "16", "--nslots", "64")
    p.produce(10)
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)
    out = subprocess.run(
        [
            sys.executable,
            NS_READER,
            spark_media_driver.dir,
            tmp_shm,
            "46",
            fail_on_data_loss,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stderr[-3000:]
    result = json.loads(lines[-1])
    assert result.get("error") == "TensorPoolWrongHostError", result
    text = result["message"]
    assert "executor-elsewhere" in text and os.uname().nodename in text
    assert tmp_shm in text and "another mount namespace" in text
    assert "Run the Spark executors on" in text
    assert "fell behind" not in text and "regions are gone" not in text
