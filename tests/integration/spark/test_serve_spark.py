"""#18.2: the Spark source reads streams through ``tensorpool serve`` (``hosts`` option).

The suite's local SparkSession; one server on this host over real producers. The same frames
come back read over Flight (``preferLocalReads=false``) and read locally by a task that sees the
server's SHM (the default), for a batch read and for ``Trigger.AvailableNow`` with admission
limits and a checkpoint; loss found at planning follows ``failOnDataLoss`` as locally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from netports import free_port
from pyspark.sql.datasource import ReadAllAvailable
from spark_helpers import BatchLog, check_payload

import tensorpool.spark_source as tps
from tensorpool.spark_source.options import parse_source_options
from tensorpool.spark_source.rings import remote
from tensorpool.spark_source.spark.stream import TensorPoolStreamReader
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

flight = pytest.importorskip("pyarrow.flight")
pytestmark = pytest.mark.spark

S1, S2 = 185, 186


class Server:
    def __init__(self, md: MediaDriverProcess, shm: str, *sids: int) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "tensorpool", "serve", "--port", str(self.port)]
        cmd += ["--aeron-dir", md.dir, "--shm-base-dir", shm, "--attach-timeout", "20"]
        for sid in sids:
            cmd += ["--stream-id", str(sid)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            assert self.proc.stdout is not None
            assert "tensorpool serve: streams" in self.proc.stdout.readline()
        except BaseException:  # never leave the server behind
            stop_process(self.proc)
            raise
        self.address = f"127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        c = flight.FlightClient(f"grpc://{self.address}")
        try:
            (r,) = list(c.do_action(flight.Action("stats", b"")))
            return json.loads(r.body.to_pybytes())
        finally:
            c.close()


@pytest.fixture
def served(spark_media_driver: MediaDriverProcess, tmp_shm: str, producers: Any) -> Iterator[Any]:
    p1 = producers("--stream-id", str(S1), "--shape", "300", "--nslots", "64")
    p2 = producers("--stream-id", str(S2), "--shape", "50", "--dtype", "uint8", "--nslots", "16")
    srv = Server(spark_media_driver, tmp_shm, S1, S2)
    try:
        yield srv, p1, p2
    finally:
        stop_process(srv.proc)


def _opts(srv: Server, **extra: object) -> dict[str, str]:
    a = srv.address
    opts = {"hosts": a, "streams": f"{a}/{S1},{a}/{S2}"}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def _rows(df: Any, keep: list[Any] | None = None) -> list[tuple[int, int]]:
    rows = df.collect()
    assert all(check_payload(r.payload, r.seq) for r in rows)
    if keep is not None:
        keep += rows
    return sorted((r.stream_id, r.seq) for r in rows)


def test_18_2_batch_read_over_flight_and_locally(spark: Any, served: Any) -> None:
    """A batch read plans from the server's scans (no Aeron here) and reads the same frames
    over Flight and, on the stream's own host, locally (the server counts only the former)."""
    srv, p1, p2 = served
    p1.produce(40)
    p2.produce(30)  # ring of 16: seqs 14..29 remain
    want = [(S1, q) for q in range(40)] + [(S2, q) for q in range(14, 30)]
    gets = srv.stats().get("gets", 0)
    df = spark.read.format("tensorpool").options(**_opts(srv, preferLocalReads="false"))
    rows: list[Any] = []
    assert _rows(df.option("minPartitions", 3).load(), rows) == want
    r = next(r for r in rows if r.stream_id == S2)
    assert (r.dtype, r.shape, r.epoch) == ("uint8", [50], p2.epoch)
    assert tps.to_numpy(r).shape == (50,)
    over_flight = srv.stats()["gets"] - gets
    assert over_flight >= 3  # one do_get per partition
    assert _rows(spark.read.format("tensorpool").options(**_opts(srv)).load()) == want
    assert srv.stats()["gets"] == gets + over_flight  # read locally: no do_get
    bare = (
        spark.read.format("tensorpool")
        .options(**_opts(srv, preferLocalReads="false", includeTensorMetadata="false"))
        .load()
    )
    assert bare.columns == ["stream_id", "epoch", "seq", "timestamp", "timestamp_ns", "payload"]
    assert sorted((r.stream_id, r.seq) for r in bare.collect()) == want


def test_18_2_available_now_checkpoint_and_loss(spark: Any, served: Any, tmp_path: Any) -> None:
    """Trigger.AvailableNow with maxFramesPerTrigger over Flight: every frame once, in several
    batches. A start position already overwritten is skipped and counted with
    failOnDataLoss=false, as locally (checkpoint replay: test_serve_cluster.py)."""
    srv, p1, p2 = served
    p1.produce(40)
    p2.produce(10)
    opts = _opts(srv, preferLocalReads="false", maxFramesPerTrigger=16, startingOffsets="earliest")
    ckpt = str(tmp_path / f"ckpt-{uuid.uuid4().hex[:6]}")

    def run(o: dict[str, str], sink: BatchLog) -> Any:
        q = (
            spark.readStream.format("tensorpool")
            .options(**o)
            .load()
            .writeStream.foreachBatch(sink)
            .trigger(availableNow=True)
            .option("checkpointLocation", ckpt)
            .start()
        )
        with contextlib.suppress(Exception):  # a failed query: q.exception() says why
            q.awaitTermination(120)
        return q

    first = BatchLog()
    q = run(opts, first)
    assert q.exception() is None
    assert len(first.batches) >= 3
    got = sorted(f for b in first.batches.values() for f in b)
    assert got == sorted([(p1.epoch, q) for q in range(40)] + [(p2.epoch, q) for q in range(10)])
    assert first.bad == []
    # S2's ring of 16 moves past seq 0: an explicit start there is loss at planning, skipped
    # and counted with failOnDataLoss=false (the default fails: the same code as locally)
    p2.produce(40)
    start = json.dumps({str(S1): "latest", str(S2): {"epoch": p2.epoch, "seq": 0}})
    lossy = dict(opts, startingOffsets=start)
    ckpt = str(tmp_path / "ckpt-skip")
    skipped = BatchLog()
    q = run(dict(lossy, failOnDataLoss="false"), skipped)
    assert q.exception() is None
    seqs = sorted(s for b in skipped.batches.values() for _, s in b)
    assert seqs == list(range(34, 50))  # what the ring holds
    end = json.loads(q.lastProgress["sources"][0]["endOffset"])
    assert end[str(S2)]["lost"] == 34


def test_18_2_read_time_loss_reaches_the_driver_from_any_host(served: Any) -> None:
    """failOnDataLoss=false: frames overwritten between the plan and the read are counted in
    the next offset's lostLate, as locally -- also when the task cannot reach the driver's
    spool (it runs on another host): the server counts what its do_get could not deliver under
    the query's loss key and the driver collects it. Each loss is counted once: a Flight read's
    through the server only, a local read's (only where the spool is reachable) through the
    spool. (The Spark API driven by hand, as Spark's driver and a task would.)"""
    srv, _p1, p2 = served
    p2.produce(10)  # S2's ring holds 16
    opts = _opts(srv, preferLocalReads="false", failOnDataLoss="false", startingOffsets="latest")
    reader = TensorPoolStreamReader(parse_source_options(opts, streaming=True))
    elsewhere = "@tensorpool-spark-loss-on-another-host"
    try:
        start = reader.initialOffset()
        p2.produce(16)

        def round_trip(begin: dict, spool_dir: str | None, prefer_local: bool) -> dict:
            """The 16 frames in the ring planned, then overwritten before the task reads them
            (by 16 more: what the next round plans)."""
            end = reader.latestOffset(begin, ReadAllAvailable())
            assert end[str(S2)]["seq"] - begin[str(S2)]["seq"] == 16
            p2.produce(16)
            parts = reader.partitions(begin, end)
            planned.append(len(parts))
            for part in parts:
                part = dataclasses.replace(
                    part,
                    spool_dir=spool_dir or part.spool_dir,
                    reader=dataclasses.replace(part.reader, prefer_local=prefer_local),
                )
                assert [b.num_rows for b in reader.read(part) if b.num_rows] == []
            return end

        planned: list[int] = []
        reads, ledger = dict(remote.READS), srv.stats().get("loss_ledger_frames", 0)
        # another host, preferLocalReads=false: over Flight, counted by the server
        end = round_trip(start, elsewhere, False)
        # another host that could map the SHM: its loss could not reach the driver -> Flight
        end = round_trip(end, elsewhere, True)
        done = dict(remote.READS)
        assert done == {"flight": reads["flight"] + sum(planned), "local": reads["local"]}
        assert srv.stats()["loss_ledger_frames"] == ledger + 32
        # the driver's host, preferLocalReads=false: Flight, the server's count only (not twice)
        end = round_trip(end, None, False)
        assert srv.stats()["loss_ledger_frames"] == ledger + 48
        # the driver's host, reading locally: the spool
        end = round_trip(end, None, True)
        done = dict(remote.READS)
        assert done == {
            "flight": reads["flight"] + sum(planned[:3]),
            "local": reads["local"] + planned[3],
        }
        assert srv.stats()["loss_ledger_frames"] == ledger + 48
        nxt = reader.latestOffset(end, ReadAllAvailable())
        assert (nxt[str(S2)]["lostLate"], nxt[str(S2)]["lost"]) == (64, 0)
        assert nxt[str(S1)]["lostLate"] == 0
    finally:
        reader.stop()
