"""Frames into Spark: the tensorpool source against the API ceiling and Parquet (GitHub issue 6).

Run: ``.venv/bin/python -m bench.bench_spark`` (about 4 min on 2 cores: JVM start, data
preparation, 12 configurations x 4 runs; ``--quick --repeat 1`` takes about 90 s). Prints one
markdown table and the target check.

Setup: one standalone Aeron media driver, a standalone producer in this process (a thread keeps
it announcing), ``local[2]`` Spark. For each frame size (4 KiB, 1 MiB) the ring is filled once
with distinct random frames (so nothing compresses or deduplicates), and the same frames are
written to Parquet on local disk. Each source gets one warm-up run, then ``--repeat`` (3)
measured runs interleaved with the other sources; the table keeps each source's best run (the
host is shared, so load from elsewhere only ever makes a run slower). Runs are timed from the
action's start to its end, sink ``noop``; for streaming the table also gives the engine's own
time inside micro-batches (the sum of ``triggerExecution``, i.e. without query start/stop):

* **tensorpool** -- ``spark.read`` / ``readStream`` ``.format("tensorpool")``, ``minPartitions=2``;
  streaming uses ``Trigger.AvailableNow`` with ``maxFramesPerTrigger`` = frames/4 (4 batches).
* **(a) API ceiling** -- a trivial Python data source with the same schema, the same Arrow batch
  shape (rows per batch) and the same partitions/micro-batches, yielding a pre-built
  ``RecordBatch`` (built once per worker): what the Python Data Source API can move here.
* **(b) Parquet** -- ``spark.read.parquet`` / ``readStream.parquet`` (``maxFilesPerTrigger=1``,
  4 files) of the same frames and columns, snappy, warm page cache: what users do today.

Also per source: the median run (best-of favours a source whose runs vary most; on a shared
host the median is the steadier statistic), and the median CPU time per frame of Spark's JVM and
of its Python worker processes (read from /proc; barely moved by other load, and it says which
side the work is on). For 1 MiB frames, the per-query cost: the same batch reads of only 16
frames (planning, Python worker round trips, task start), which a 512-frame query still pays.
``--per-query`` runs only that (best and median of ``--repeat`` rounds, at least 5, with CPU),
beside the pre-#15 plan that opened a fresh announce probe per ``schema()`` and ``partitions()``.

Latency: a producer thread publishes 4 KiB frames at 200 Hz while a streaming query (default
trigger) collects ``timestamp_ns`` in ``foreachBatch``; latency = CLOCK_MONOTONIC when the
micro-batch's rows are in the user's hands minus the frame's ``timestamp_ns`` (same host clock).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final

import numpy as np
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tensorpool.spark_source.spark.datasource import TensorPoolDataSource
from tensorpool.spark_source.spark.source import SCHEMA_DDL, TensorPoolBatchReader

KIB: Final = 1024
MIB: Final = 1024 * 1024
TINY: Final = 16  # frames in the per-query-cost reads
ROOT: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --- (a): the API-ceiling data source (imported by reference in the workers) -------------------
_BATCHES: dict[tuple[int, int], Any] = {}


def _prebuilt(rows: int, frame_bytes: int) -> Any:
    """One RecordBatch of the tensorpool schema, built once per worker process."""
    key = (rows, frame_bytes)
    batch = _BATCHES.get(key)
    if batch is None:
        import pyarrow as pa

        from tensorpool.spark_source.spark.source import arrow_schema

        schema = arrow_schema(True)
        data = np.full(rows * frame_bytes, 7, np.uint8)
        offs = np.arange(rows + 1, dtype=np.int32) * frame_bytes
        shape_offs = pa.array(np.arange(rows + 1, dtype=np.int32))
        ints = np.arange(rows, dtype=np.int64)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(rows, 1, np.int32)),
                pa.array(np.full(rows, 1, np.int64)),
                pa.array(ints),
                pa.array(ints, pa.timestamp("us", tz="UTC")),
                pa.array(ints),
                pa.array(np.zeros(rows, np.int32)),
                pa.array(["uint8"] * rows, pa.string()),
                pa.ListArray.from_arrays(
                    shape_offs, pa.array(np.full(rows, frame_bytes, np.int32))
                ),
                pa.ListArray.from_arrays(shape_offs, pa.array(np.ones(rows, np.int32))),
                pa.Array.from_buffers(
                    pa.binary(), rows, [None, pa.py_buffer(offs), pa.py_buffer(data)]
                ),
            ],
            schema=schema,
        )
        _BATCHES[key] = batch
    return batch


def _emit(count: int, frame_bytes: int) -> Iterator[Any]:
    from tensorpool.spark_source.rings.mapped_rings import rows_per_batch

    step = rows_per_batch(frame_bytes)
    full = _prebuilt(step, frame_bytes)
    while count > 0:
        n = min(step, count)
        yield full if n == step else full.slice(0, n)
        count -= n


def _split(total: int, parts: int) -> list[int]:
    base, rem = divmod(total, parts)
    return [base + (1 if i < rem else 0) for i in range(parts) if base or i < rem]


class ApiReader(DataSourceReader):
    def __init__(self, opts: dict[str, str]) -> None:
        self.frames = int(opts["frames"])
        self.frame_bytes = int(opts["frame_bytes"])
        self.parts = int(opts.get("partitions", "2"))

    def partitions(self) -> list[Any]:
        return [InputPartition(n) for n in _split(self.frames, self.parts)]

    def read(self, partition: Any) -> Iterator[Any]:
        return _emit(partition.value, self.frame_bytes)


class ApiStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: dict[str, str]) -> None:
        self.frames = int(opts["frames"])
        self.frame_bytes = int(opts["frame_bytes"])
        self.parts = int(opts.get("partitions", "2"))
        self.per_trigger = int(opts["per_trigger"])

    def initialOffset(self) -> dict:
        return {"n": 0}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def latestOffset(self, start: dict, limit: Any) -> dict:
        cap = self.frames if isinstance(limit, ReadAllAvailable) else limit.max_rows
        return {"n": min(self.frames, start["n"] + cap)}

    def partitions(self, start: dict, end: dict) -> list[Any]:
        return [InputPartition(n) for n in _split(end["n"] - start["n"], self.parts)]

    def read(self, partition: Any) -> Iterator[Any]:
        return _emit(partition.value, self.frame_bytes)


class ApiSource(DataSource):
    """Pre-built Arrow batches of the tensorpool schema: the API's ceiling on this host."""

    @classmethod
    def name(cls) -> str:
        return "bench_arrow"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> Any:
        return ApiReader(dict(self.options))

    def streamReader(self, schema: Any) -> Any:
        return ApiStreamReader(dict(self.options))


# --- the per-query baseline: the pre-#15 plan (a fresh announce probe per schema/plan) --------
class _FreshProbes:
    """While active, this process's plans open a one-shot announce probe (the pre-#15 path)."""

    def __enter__(self) -> None:
        import tensorpool.spark_source.rings.layout_hint as hint
        import tensorpool.spark_source.spark.source as src
        from tensorpool.spark_source.rings.probe import AnnounceProbe

        def fresh(settings: Any, *, map_layout: Any, **_: Any) -> Any:
            return AnnounceProbe((), settings, map_layout=map_layout)

        self.saved = (src.shared_probe, hint.shared_probe)
        src.shared_probe = hint.shared_probe = fresh  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        import tensorpool.spark_source.rings.layout_hint as hint
        import tensorpool.spark_source.spark.source as src

        src.shared_probe, hint.shared_probe = self.saved


class FreshReader(TensorPoolBatchReader):
    def partitions(self) -> list[Any]:
        with _FreshProbes():
            return super().partitions()


class FreshProbeSource(TensorPoolDataSource):
    """``format("tensorpool_fresh_probe")``: tensorpool with a fresh probe per schema/plan."""

    @classmethod
    def name(cls) -> str:
        return "tensorpool_fresh_probe"

    def schema(self) -> Any:
        with _FreshProbes():
            return super().schema()

    def reader(self, schema: Any) -> Any:
        return FreshReader(super().reader(schema).opts)  # type: ignore[attr-defined]


# --- the producer, owned by one thread --------------------------------------------------------
class ProducerThread:
    """All Producer calls happen in this thread; the main thread sends it commands."""

    def __init__(
        self, aeron_dir: str, shm: str, stream: int, nslots: int, frame_bytes: int
    ) -> None:
        self.args = (aeron_dir, shm, stream, nslots, frame_bytes)
        self.cmds: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.done: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.epoch = self.done.get(timeout=60)

    def _run(self) -> None:
        from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
        from tensorpool.client.settings import ClientSettings
        from tensorpool.transport.config import TransportConfig
        from tensorpool.transport.context import AeronContext

        aeron_dir, shm, stream, nslots, frame_bytes = self.args
        s = ClientSettings(
            transport=TransportConfig(aeron_dir=aeron_dir),
            shm_base_dir=shm,
            announce_period_ns=200_000_000,
        )
        stride = StreamConfig.for_frame_bytes(stream, frame_bytes).pools[0].stride_bytes
        cfg = StreamConfig(stream, header_nslots=nslots, pools=(PoolConfig(1, stride),))
        with AeronContext(s.transport) as ctx:
            ctx.start()
            p = Producer(ctx, cfg, s, instance_id=f"bench-{stream}")
            p.do_work()
            self.done.put(p.epoch)
            while True:
                try:
                    cmd, arg = self.cmds.get(timeout=0.05)
                except queue.Empty:
                    p.do_work()
                    continue
                if cmd == "stop":
                    break
                if cmd == "fill":  # arg: uint8 array (n, frame_bytes)
                    for i in range(arg.shape[0]):
                        p.offer(arg[i])
                        if i & 255 == 255:
                            p.do_work()
                    self.done.put(p.next_seq)
                elif cmd == "rate":  # arg: (n, hz)
                    n, hz = arg
                    frame = np.zeros(frame_bytes, np.uint8)
                    t0 = time.monotonic()
                    for i in range(n):
                        if not self.cmds.empty():  # a command (stop) ends the run early
                            break
                        while time.monotonic() < t0 + i / hz:
                            p.do_work()
                            time.sleep(0.0005)
                        p.offer(frame)
                    self.done.put(p.next_seq)
            p.close()

    def call(self, cmd: str, arg: Any = None, timeout: float = 300) -> Any:
        self.cmds.put((cmd, arg))
        return self.done.get(timeout=timeout)

    def stop(self) -> None:
        self.cmds.put(("stop", None))
        self.thread.join(30)


# --- measurements -------------------------------------------------------------------------------
def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class CpuMeter:
    """CPU seconds used by Spark's JVM and by its child processes (the Python workers).

    The host is shared, so wall time moves with other load; CPU time per frame barely does and
    says where the work is (JVM vs Python worker). Read from /proc (Linux); a Python process that
    exits is still counted once its parent has reaped it (cutime/cstime).
    """

    def __init__(self, spark: Any) -> None:
        self.jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> tuple[float, float]:
        """(JVM, Python processes under it) CPU seconds so far."""
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        jvm = 0.0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2 :].split()
            parent[int(d)] = int(fields[1])
            # own (utime, stime) and reaped children's (cutime, cstime): the Python processes
            # of a streaming query's driver side exit when it stops
            own = int(fields[11]) + int(fields[12])
            cpu[int(d)] = (own + int(fields[13]) + int(fields[14])) / self.tick
            if int(d) == self.jvm:
                jvm = own / self.tick
        py = cpu.get(self.jvm, 0.0) - jvm
        for pid, used in cpu.items():
            if pid == self.jvm:
                continue
            q = parent.get(pid, 0)
            while q > 1 and q != self.jvm:
                q = parent.get(q, 0)
            if q == self.jvm:
                py += used
        return jvm, py


def write_parquet(frames: np.ndarray, path: str, files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tensorpool.spark_source.spark.source import arrow_schema

    n, size = frames.shape
    os.makedirs(path)
    ints = np.arange(n, dtype=np.int64)
    offs = (np.arange(n + 1, dtype=np.int64) * size).astype(np.int32)
    shape_offs = pa.array(np.arange(n + 1, dtype=np.int32))
    table = pa.Table.from_arrays(
        [
            pa.array(np.full(n, 1, np.int32)),
            pa.array(np.full(n, 1, np.int64)),
            pa.array(ints),
            pa.array(ints, pa.timestamp("us", tz="UTC")),
            pa.array(ints),
            pa.array(np.zeros(n, np.int32)),
            pa.array(["uint8"] * n, pa.string()),
            pa.ListArray.from_arrays(shape_offs, pa.array(np.full(n, size, np.int32))),
            pa.ListArray.from_arrays(shape_offs, pa.array(np.ones(n, np.int32))),
            pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(frames.reshape(-1))]
            ),
        ],
        schema=arrow_schema(True),
    )
    per = -(-n // files)
    for i in range(files):
        pq.write_table(table.slice(i * per, per), os.path.join(path, f"part-{i}.parquet"))


def tp_options(stream: int, md_dir: str, shm: str, **extra: str) -> dict[str, str]:
    """The tensorpool source's options in every batch read here (2 partitions, the whole ring)."""
    return {
        "streams": str(stream),
        "aeronDir": md_dir,
        "shmBaseDir": shm,
        "minPartitions": "2",
        "startingOffsets": "earliest",
        **extra,
    }


def run_size(
    spark: Any,
    md_dir: str,
    shm: str,
    work: str,
    size: int,
    frames: int,
    repeat: int,
    meter: CpuMeter,
    fixed: dict[str, float] | None = None,
) -> list[dict]:
    stream = 900 + size.bit_length()
    prod = ProducerThread(md_dir, shm, stream, frames, size)
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, (frames, size), dtype=np.uint8)
    head = prod.call("fill", data)
    pq_dir = os.path.join(work, f"pq-{size}")
    write_parquet(data, pq_dir, 4)
    pq_tiny = os.path.join(work, f"pq-tiny-{size}")
    write_parquet(data[:TINY], pq_tiny, 1)
    del data
    tp = tp_options(stream, md_dir, shm)
    api = {"frames": str(frames), "frame_bytes": str(size), "partitions": "2"}
    per_trigger = frames // 4

    def batch_tp() -> None:
        spark.read.format("tensorpool").options(**tp).load().write.format("noop").mode(
            "overwrite"
        ).save()

    def batch_api() -> None:
        spark.read.format("bench_arrow").options(**api).load().write.format("noop").mode(
            "overwrite"
        ).save()

    def batch_pq() -> None:
        spark.read.parquet(pq_dir).write.format("noop").mode("overwrite").save()

    if fixed is not None:  # per-query cost: the same three reads of only TINY frames
        first = head - frames
        end = json.dumps({str(stream): {"epoch": prod.epoch, "seq": first + TINY}})
        tiny = (
            (
                "tensorpool",
                lambda: (
                    spark.read.format("tensorpool")
                    .options(**tp, endingOffsets=end)
                    .load()
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                ),
            ),
            (
                "(a) API ceiling",
                lambda: (
                    spark.read.format("bench_arrow")
                    .options(**{**api, "frames": str(TINY)})
                    .load()
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                ),
            ),
            (
                "(b) Parquet",
                lambda: spark.read.parquet(pq_tiny).write.format("noop").mode("overwrite").save(),
            ),
        )
        for _, fn in tiny:
            fn()
        for _ in range(max(3, repeat)):
            for name, fn in tiny:
                secs = timed(fn)
                fixed[name] = min(fixed.get(name, secs), secs)

    engine: list[float] = []

    def stream(reader: Any) -> Callable[[], None]:
        def go() -> None:
            q = (
                reader()
                .writeStream.format("noop")
                .trigger(availableNow=True)
                .option("checkpointLocation", os.path.join(work, f"ck-{uuid.uuid4().hex}"))
                .start()
            )
            q.awaitTermination()
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            # the engine's own time spent in micro-batches (without query start/stop)
            engine.append(
                sum(pr["durationMs"].get("triggerExecution", 0) for pr in q.recentProgress) / 1e3
            )

        return go

    stream_tp = stream(
        lambda: (
            spark.readStream.format("tensorpool")
            .options(**tp, maxFramesPerTrigger=str(per_trigger))
            .load()
        )
    )
    stream_api = stream(
        lambda: (
            spark.readStream.format("bench_arrow")
            .options(**api, per_trigger=str(per_trigger))
            .load()
        )
    )
    schema = spark.read.parquet(pq_dir).schema
    stream_pq = stream(
        lambda: spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(pq_dir)
    )
    rows = []
    for mode, runs in (
        (
            "batch",
            (("tensorpool", batch_tp), ("(a) API ceiling", batch_api), ("(b) Parquet", batch_pq)),
        ),
        (
            "streaming",
            (
                ("tensorpool", stream_tp),
                ("(a) API ceiling", stream_api),
                ("(b) Parquet", stream_pq),
            ),
        ),
    ):
        for _, fn in runs:
            fn()  # warm-up (JIT, worker start, page cache)
        got: dict[str, list[tuple[float, float, float, float]]] = {}
        for _ in range(repeat):  # interleaved, best of `repeat`: other load on the host is noise
            for name, fn in runs:
                j0, p0 = meter.sample()
                secs = timed(fn)
                j1, p1 = meter.sample()
                busy = engine[-1] if mode == "streaming" else secs
                got.setdefault(name, []).append((secs, busy, j1 - j0, p1 - p0))
        for name, _ in runs:
            v = got[name]
            secs = min(x[0] for x in v)
            busy = min(x[1] for x in v)
            rows.append(
                {
                    "size": size,
                    "mode": mode,
                    "source": name,
                    "frames": frames,
                    "secs": secs,
                    "fps": frames / secs,
                    "median_fps": frames / statistics.median(x[0] for x in v),
                    "mbps": frames * size / secs / 1e6,
                    "busy_fps": frames / busy,
                    "cpu_jvm_ms": statistics.median(x[2] for x in v) / frames * 1e3,
                    "cpu_py_ms": statistics.median(x[3] for x in v) / frames * 1e3,
                }
            )
            r = rows[-1]
            print(
                f"  {mode:9s} {size:>8d} B {name:16s} {r['fps']:10.0f} frames/s wall (median "
                f"{r['median_fps']:.0f}), {r['busy_fps']:10.0f} in micro-batches, CPU ms/frame "
                f"JVM {r['cpu_jvm_ms']:.3f} Python {r['cpu_py_ms']:.3f}",
                flush=True,
            )
    prod.stop()
    shutil.rmtree(pq_dir, ignore_errors=True)
    return rows


def run_per_query(
    spark: Any, md_dir: str, shm: str, work: str, repeat: int, meter: CpuMeter
) -> dict[str, list[tuple[float, float]]]:
    """#15: batch reads of TINY x 1 MiB frames, the sources interleaved ``repeat`` times after
    one warm-up each: (wall s, JVM + Python CPU s) per query."""
    stream = 990
    prod = ProducerThread(md_dir, shm, stream, 64, MIB)
    data = np.random.default_rng(15).integers(0, 256, (TINY, MIB), dtype=np.uint8)
    head = prod.call("fill", data)
    pq_tiny = os.path.join(work, "pq-per-query")
    write_parquet(data, pq_tiny, 1)
    end = json.dumps({str(stream): {"epoch": prod.epoch, "seq": head}})
    tp = tp_options(stream, md_dir, shm, endingOffsets=end)
    tp_meta = {**tp, "includeStreamMetadata": "true"}
    api = {"frames": str(TINY), "frame_bytes": str(MIB), "partitions": "2"}

    def noop(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    sources: dict[str, Callable[[], None]] = {
        "tensorpool": lambda: noop(spark.read.format("tensorpool").options(**tp).load()),
        "tensorpool, fresh probe per query (before #15)": lambda: noop(
            spark.read.format("tensorpool_fresh_probe").options(**tp).load()
        ),
        "tensorpool + includeStreamMetadata": lambda: noop(
            spark.read.format("tensorpool").options(**tp_meta).load()
        ),
        "tensorpool + includeStreamMetadata, fresh probe (before)": lambda: noop(
            spark.read.format("tensorpool_fresh_probe").options(**tp_meta).load()
        ),
        "(a) API ceiling": lambda: noop(spark.read.format("bench_arrow").options(**api).load()),
        "(b) Parquet": lambda: noop(spark.read.parquet(pq_tiny)),
    }
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in sources}
    try:
        for fn in sources.values():
            fn()
        for _ in range(repeat):
            for name, fn in sources.items():
                c0 = sum(meter.sample())
                secs = timed(fn)
                out[name].append((secs, sum(meter.sample()) - c0))
    finally:
        prod.stop()
    return out


def run_latency(
    spark: Any, md_dir: str, shm: str, work: str, seconds: float, hz: float
) -> list[int]:
    stream = 990
    prod = ProducerThread(md_dir, shm, stream, 4096, 4 * KIB)
    lat: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        stamps = [r.timestamp_ns for r in df.select("timestamp_ns").collect()]
        now = time.monotonic_ns()
        lat.extend(now - t for t in stamps)

    q = (
        spark.readStream.format("tensorpool")
        .options(streams=str(stream), aeronDir=md_dir, shmBaseDir=shm)
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", os.path.join(work, "ck-latency"))
        .start()
    )
    try:
        time.sleep(3)  # first micro-batches (empty) pay the worker start-up
        prod.call("rate", (int(seconds * hz), hz), timeout=seconds + 60)
        time.sleep(2)
    finally:
        q.stop()
        prod.stop()
    return lat


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--latency-breakdown" in args:  # where a micro-batch's time goes (#16.5)
        from bench.bench_spark_latency import main as breakdown

        return breakdown([x for x in args if x != "--latency-breakdown"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="half the data, shorter latency run")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per source (best kept)")
    ap.add_argument(
        "--per-query",
        action="store_true",
        help=f"only the per-query cost ({TINY} x 1 MiB batch reads, --repeat rounds, at least 5)",
    )
    a = ap.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
    )
    import logging

    logging.basicConfig(level=logging.WARNING)
    from pyspark.sql import SparkSession

    import bench.bench_spark as me  # the importable copy: classes pickle by reference
    import tensorpool.spark_source as tps
    from tensorpool.transport.mediadriver import MediaDriverProcess

    t_start = time.monotonic()
    work = tempfile.mkdtemp(prefix="tp-bench-spark-")
    shm = tempfile.mkdtemp(
        prefix="tp-bench-spark-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    scale = 2 if a.quick else 1
    try:
        with MediaDriverProcess() as md:
            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.memory", "2g")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            tps.register(spark)
            spark.dataSource.register(me.ApiSource)
            meter = CpuMeter(spark)
            if a.per_query:
                spark.dataSource.register(me.FreshProbeSource)
                load0 = os.getloadavg()
                per = run_per_query(spark, md.dir, shm, work, max(5, a.repeat), meter)
                spark.stop()
                print(
                    f"\n| batch read of {TINY} x 1 MiB | best s | median s | median CPU s "
                    "JVM + Python | median / (a) |"
                )
                print("| --- | ---: | ---: | ---: | ---: |")
                ceiling = statistics.median(w for w, _ in per["(a) API ceiling"])
                for name, runs in per.items():
                    walls = [w for w, _ in runs]
                    med = statistics.median(walls)
                    print(
                        f"| {name} | {min(walls):.3f} | {med:.3f} | "
                        f"{statistics.median(c for _, c in runs):.3f} | {ceiling / med:.2f} |"
                    )
                load1 = os.getloadavg()
                print(
                    f"\n{max(5, a.repeat)} rounds; load average (1/5/15 min) at start, end: "
                    + "; ".join("/".join(f"{x:.1f}" for x in la) for la in (load0, load1))
                )
                return 0
            fixed: dict[str, float] = {}
            loads = [os.getloadavg()]
            rows = []
            rows += run_size(spark, md.dir, shm, work, 4 * KIB, 65536 // scale, a.repeat, meter)
            loads.append(os.getloadavg())
            rows += run_size(spark, md.dir, shm, work, MIB, 512 // scale, a.repeat, meter, fixed)
            loads.append(os.getloadavg())
            lat = run_latency(spark, md.dir, shm, work, 4.0 / scale, 200.0)
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    print()
    print(
        "| frame | mode | source | frames | s | frames/s | MB/s | tensorpool / this "
        "| median frames/s | tensorpool / this | CPU ms/frame JVM + Python "
        "| frames/s in micro-batches | tensorpool / this |"
    )
    print(
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    checks = []
    for r in rows:
        ours = next(
            x
            for x in rows
            if x["size"] == r["size"] and x["mode"] == r["mode"] and x["source"] == "tensorpool"
        )
        ratio = ours["fps"] / r["fps"]
        med_ratio = ours["median_fps"] / r["median_fps"]
        busy_ratio = ours["busy_fps"] / r["busy_fps"]
        label = "4 KiB" if r["size"] == 4 * KIB else "1 MiB"
        mine = r is ours
        streaming = r["mode"] == "streaming"
        print(
            f"| {label} | {r['mode']} | {r['source']} | {r['frames']} | {r['secs']:.2f} | "
            f"{r['fps']:,.0f} | {r['mbps']:,.0f} | {'—' if mine else f'{ratio:.2f}'} | "
            f"{r['median_fps']:,.0f} | {'—' if mine else f'{med_ratio:.2f}'} | "
            f"{r['cpu_jvm_ms']:.3f} + {r['cpu_py_ms']:.3f} | "
            + (
                f"{r['busy_fps']:,.0f} | {'—' if mine else f'{busy_ratio:.2f}'} |"
                if streaming
                else "| |"
            )
        )
        what = f"{label} {r['mode']}" + (" (micro-batch time)" if streaming else "")
        judged = busy_ratio if streaming else ratio
        med = med_ratio if not streaming else None
        if r["source"].startswith("(a)"):
            checks.append((f"{what}: >= 80% of the API ceiling", judged >= 0.8, judged, med))
        elif r["source"].startswith("(b)"):
            checks.append((f"{what}: faster than Parquet", judged > 1.0, judged, med))
    print()
    if fixed:
        print(
            f"Per-query cost (batch read of {TINY} x 1 MiB frames, best of "
            f"{max(3, a.repeat)}): " + ", ".join(f"{k} {v:.2f} s" for k, v in fixed.items())
        )
    if lat:
        lat_ms = sorted(x / 1e6 for x in lat)
        p50 = statistics.median(lat_ms)
        p90 = lat_ms[int(0.9 * (len(lat_ms) - 1))]
        print(
            f"End-to-end latency producer -> micro-batch in foreachBatch (4 KiB, 200 Hz, default "
            f"trigger): p50 {p50:.0f} ms, p90 {p90:.0f} ms, max {lat_ms[-1]:.0f} ms over "
            f"{len(lat_ms)} frames"
        )
    print()
    for text, ok, ratio, med in checks:
        extra = "" if med is None else f"; of medians {med:.2f}"
        print(f"- [{'x' if ok else ' '}] {text} (ratio of best runs {ratio:.2f}{extra})")
    print(
        "\nload average (1/5/15 min) at start, after 4 KiB, after 1 MiB: "
        + "; ".join("/".join(f"{x:.1f}" for x in la) for la in loads)
    )
    print(f"total {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
