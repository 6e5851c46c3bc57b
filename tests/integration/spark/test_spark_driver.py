"""The Spark source in driver mode: leases from the real SHM driver daemon, and process hygiene.

Real local SparkSession, real `tensorpool driver` daemon, real producer attached through it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import CONSUMER, ControlClient, DriverProcess, driver_toml, read_status
from spark_helpers import SHM_ROOT, ProducerProc, check_payload, source_options, start_query

from tensorpool.specs.generated import driver as drv
from tensorpool.transport.mediadriver import MediaDriverProcess

pytestmark = pytest.mark.spark

CONTROL = 1700  # a control stream of our own: no other test's driver answers our clients
REVOKED_DETACHED = int(drv.LeaseRevokeReason.DETACHED)


@pytest.fixture(scope="module")
def shm_driver(spark_media_driver: MediaDriverProcess) -> Iterator[tuple[DriverProcess, str]]:
    work = tempfile.mkdtemp(prefix="tp-spark-drv-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(
        driver_toml(
            base,
            spark_media_driver.dir,
            streams=range(10000, 10003),
            control_stream_id=CONTROL,
            # clients keep alive every 1 s (LeaseTimings default); 10 s leases survive a starved
            # producer on a loaded 2-core host (an expired producer lease bumps the epoch)
            policies={"lease_keepalive_interval_ms": 1000, "lease_expiry_grace_intervals": 10},
        )
    )
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log"))
    daemon.start().wait_ready()
    yield daemon, base
    daemon.stop()
    shutil.rmtree(work, ignore_errors=True)


def _consumers(base: str, stream: int) -> int | None:
    doc = read_status(base) or {}
    row = next((s for s in doc.get("streams", []) if s.get("stream_id") == stream), None)
    return None if row is None else row.get("consumer_count")


def test_driver_mode_reads_and_releases_the_lease_when_the_query_stops(
    spark, spark_media_driver, shm_driver
):
    """issue 6 §4, Driver Model §4.2/§4.9 driver mode (driver=true): the reader attaches as CONSUMER
    through the SHM driver (layout + lease), reads the frames of the driver's regions, and its
    lease is released when the query stops: Spark stops the source runner with SIGTERM, which
    ends it at once (#13.6), so the driver expires the lease (a reader whose ``stop()`` runs
    detaches it)."""
    _, base = shm_driver
    md = spark_media_driver
    producer = ProducerProc(
        md.dir,
        base,
        "--driver",
        "--stream-id",
        "10000",
        "--control-stream-id",
        str(CONTROL),
        "--shape",
        "64",
    )
    try:
        producer.produce(10)
        opts = source_options(md, base, streams="10000", driver="true", controlStreamId=CONTROL)
        rows = spark.read.format("tensorpool").options(**opts).load().collect()
        assert sorted(r.seq for r in rows) == list(range(10))
        assert all(check_payload(r.payload, r.seq) for r in rows)
        assert all(r.epoch == producer.epoch for r in rows)

        seen: list[int] = []
        with ControlClient(md.dir, stream_id=CONTROL) as watch:
            q = (
                spark.readStream.format("tensorpool")
                .options(**opts, startingOffsets="earliest")
                .load()
                .writeStream.foreachBatch(
                    lambda df, _bid: seen.extend(r.seq for r in df.select("seq").collect())
                )
                .trigger(processingTime="200 milliseconds")
                .start()
            )
            try:
                deadline = time.monotonic() + 90
                while len(seen) < 10 and time.monotonic() < deadline:
                    assert q.exception() is None
                    watch.pump(0.1)
                producer.produce(5)
                while len(seen) < 15 and time.monotonic() < deadline:
                    watch.pump(0.1)
                assert sorted(seen) == list(range(15))
                # the query's lease (the status file is rewritten every announce period)
                while _consumers(base, 10000) != 1 and time.monotonic() < deadline:
                    watch.pump(0.1)
                assert _consumers(base, 10000) == 1
                watch.pump(0.3)
                start = len(watch.messages)
            finally:
                q.stop()
            revoked = watch.wait_for(
                lambda m: m.kind == "revoked" and m["stream_id"] == 10000 and m["role"] == CONSUMER,
                timeout=60,  # keepalive 1 s x 10 intervals of grace
                start=start,
            )
            assert revoked["reason"] in (REVOKED_DETACHED, int(drv.LeaseRevokeReason.EXPIRED))
    finally:
        producer.close()


ATTACHED_CHILD = textwrap.dedent(
    """
    import logging, sys, time
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from tensorpool.spark_source.rings.attach import open_attachment
    from tensorpool.spark_source.options import parse_source_options
    opts = parse_source_options(dict(arg.split("=", 1) for arg in sys.argv[1:]), streaming=True)
    conn = opts.connection
    att = open_attachment(opts.streams, conn.client_settings(), driver=conn.driver)
    att.wait_for_layouts(20)
    print("attached", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_sigterm_ends_the_worker_and_the_driver_expires_its_lease(spark_media_driver, shm_driver):
    """issue 6 §4 process hygiene, #13.6: Spark ends its Python workers with SIGTERM (stop() is
    not always called). No Python handler runs (one kept workers alive for hours): the process
    ends at once, and the SHM driver expires its lease."""
    _, base = shm_driver
    md = spark_media_driver
    producer = ProducerProc(
        md.dir, base, "--driver", "--stream-id", "10001", "--control-stream-id", str(CONTROL)
    )
    try:
        opts = source_options(md, base, streams="10001", driver="true", controlStreamId=CONTROL)
        child = subprocess.Popen(
            [sys.executable, "-c", ATTACHED_CHILD, *(f"{k}={v}" for k, v in opts.items())],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "attached"
        with ControlClient(md.dir, stream_id=CONTROL) as watch:
            watch.pump(0.3)
            start = len(watch.messages)
            child.send_signal(signal.SIGTERM)
            _, err = child.communicate(timeout=30)
            revoked = watch.wait_for(
                lambda m: m.kind == "revoked" and m["stream_id"] == 10001 and m["role"] == CONSUMER,
                timeout=60,  # keepalive 1 s x 10 intervals of grace
                start=start,
            )
        assert child.returncode == -signal.SIGTERM, err
        assert revoked["reason"] == int(drv.LeaseRevokeReason.EXPIRED)
    finally:
        producer.close()


def test_pulse_batching_in_driver_mode(spark, spark_media_driver, shm_driver, tmp_path):
    """issue 8 p10 with driver=true: a 3 Hz and a 2 Hz stream whose producers attach through the
    SHM driver; the pulse reader gets its layouts from consumer leases, and with
    Trigger.AvailableNow every micro-batch is exactly one 1 s window holding frames of both
    streams, each frame delivered once."""
    from test_spark_pulse import WindowLog, _check_batch, _stamp

    _, base = shm_driver
    md = spark_media_driver
    hz = {10001: 3.0, 10002: 2.0}  # 4 s of pulses fit the profile's 16-slot rings
    procs = {
        sid: ProducerProc(
            md.dir,
            base,
            "--driver",
            "--stream-id",
            str(sid),
            "--control-stream-id",
            str(CONTROL),
            "--shape",
            "16",
        )
        for sid in hz
    }
    try:
        t0 = time.monotonic_ns()
        for sid, p in procs.items():
            _stamp(p, int(4 * hz[sid]), hz[sid], t0)  # 4 s of pulses: 3 windows close
        opts = source_options(
            md,
            base,
            streams="10001,10002",
            driver="true",
            controlStreamId=CONTROL,
            batching="pulse",
            batchLengthS="1",
            startingOffsets="earliest",
            includeTensorMetadata="false",
        )
        sink = WindowLog()
        q = start_query(spark, opts, sink, str(tmp_path / "ck"), availableNow=True)
        q.awaitTermination(180)
        assert q.exception() is None
        windows = [
            _check_batch(sink.batches[b], hz, t0) for b in sorted(sink.batches) if sink.batches[b]
        ]
        assert len(windows) >= 3 and windows[0][0] == t0
        assert [w[0] for w in windows] == sorted({w[0] for w in windows})
        for b in sink.batches.values():
            if b:
                assert {r[0] for r in b} == set(hz), "each window holds both streams"
        frames = sink.frames()
        assert len(frames) == len(set(frames)), "each frame delivered once"
        assert all(r[1] == procs[r[0]].epoch for b in sink.batches.values() for r in b)
        assert not sink.bad
    finally:
        for p in procs.values():
            p.close()
