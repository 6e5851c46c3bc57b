"""Where a streaming micro-batch's time goes: tensorpool against Spark's ``rate`` source (#16.5).

Run: ``.venv/bin/python -m bench.bench_spark_latency`` (about 2 min on 2 cores; also
``python -m bench.bench_spark --latency-breakdown``). Prints one markdown table.

Setup: one standalone media driver, a producer thread publishing ``--frame-bytes`` frames at
``--hz`` (bench.bench_spark.ProducerThread), ``local[2]`` Spark configured like
``tensorpool demo``. In the same session, alternating for ``--rounds`` rounds, two streaming
queries with the same trigger (default: Spark's default trigger, i.e. the next micro-batch starts
as soon as the previous one ends) and a ``foreachBatch`` that collects the rows:

* **rate** -- Spark's built-in ``rate`` source at the same rows/s: the engine's own cost of a
  micro-batch with a JVM source (its offsets advance once per second, so its batches come in a
  1 s rhythm and its rows' timestamps are nominal: no latency column for it);
* **tick** -- a trivial Python streaming source (:class:`TickSource`): the same rows/s by the
  clock, 4 KiB zero payloads, nominal ``timestamp_ns``: what any Python data source pays per
  micro-batch (source runner round trips, a Python worker per task, Arrow), and its latency;
* **tensorpool** -- ``format("tensorpool")`` on the producer's stream.

Per source, over the micro-batches that had rows: the median of each phase Spark reports in
``query.recentProgress[i]["durationMs"]`` (``latestOffset``, ``queryPlanning``, ``getBatch``,
``walCommit``, ``addBatch`` = running the batch including the ``foreachBatch`` function,
``commitOffsets``, ``triggerExecution`` = the whole micro-batch), the time inside the
``foreachBatch`` function (``collect``: job, tasks, Python worker read, Arrow, rows to the
driver), and for tensorpool the end-to-end latency (CLOCK_MONOTONIC when the rows are in the
function minus the frame's ``timestamp_ns``).

Then the source's *own* cost, without Spark: the stream reader's driver-side methods
(``latestOffset`` + ``partitions``) and the executor-side ``read`` (ring -> Arrow) called
directly in this process on the same stream, per micro-batch of the same size.

``--checkpoint`` picks where the checkpoints live (``shm`` = /dev/shm, ``tmp`` = the temp dir):
Spark writes an offsets and a commits file per micro-batch (``walCommit``/``commitOffsets``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

PHASES: Final = (
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "walCommit",
    "addBatch",
    "commitOffsets",
)
ROOT: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STREAM: Final = 991


class TickReader(DataSourceStreamReader):
    """A trivial Python streaming source: ``hz`` rows/s by the clock, 4 KiB zero payloads.

    ``timestamp_ns`` is each row's nominal time (CLOCK_MONOTONIC, system-wide), so its latency
    is measured like tensorpool's: what any Python data source pays, with no I/O of its own.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.hz = float(options["hz"])
        self.t0 = int(options["t0"])
        self.nbytes = int(options.get("bytes", "4096"))

    def _now(self) -> dict:
        return {"seq": int((time.monotonic_ns() - self.t0) * self.hz / 1e9)}

    def initialOffset(self) -> dict:
        return self._now()

    def latestOffset(self) -> dict:
        return self._now()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition((start["seq"], end["seq"]))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        a, b = partition.value  # type: ignore[attr-defined]
        seqs = list(range(a, b))
        stamps = [self.t0 + int(s * 1e9 / self.hz) for s in seqs]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(seqs, pa.int64()),
                pa.array(stamps, pa.int64()),
                pa.array([bytes(self.nbytes)] * len(seqs), pa.binary()),
            ],
            names=["seq", "timestamp_ns", "payload"],
        )

    def commit(self, end: dict) -> None:
        return None


class TickSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tick"

    def schema(self) -> str:
        return "seq long, timestamp_ns long, payload binary"

    def streamReader(self, schema: Any) -> TickReader:
        return TickReader(dict(self.options))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[int(q * (len(s) - 1))]


def run_query(
    spark: Any, source: str, opts: dict[str, str], seconds: float, ckpt: str, trigger: str
) -> dict[str, Any]:
    """One streaming query for ``seconds``; per-batch phases, collect time and latency."""
    lat_ms: list[float] = []
    collect_ms: list[float] = []
    stopping = False

    def sink(df: Any, batch_id: int) -> None:
        t0 = time.monotonic_ns()
        try:
            rows = df.collect()
        except Exception:
            if stopping:  # q.stop() interrupted the batch
                return
            raise
        now = time.monotonic_ns()
        if rows:
            collect_ms.append((now - t0) / 1e6)
        if source != "rate":
            lat_ms.extend((now - r.timestamp_ns) / 1e6 for r in rows)

    reader = spark.readStream.format(source).options(**opts).load()
    if source in ("tensorpool", "tick"):
        reader = reader.select("seq", "timestamp_ns", "payload")
    q = (
        reader.writeStream.foreachBatch(sink)
        .trigger(processingTime=trigger)
        .option("checkpointLocation", ckpt)
        .start()
    )
    try:
        time.sleep(3.0)  # query start and the first (empty) micro-batches
        first = len(q.recentProgress)
        lat_ms.clear()
        collect_ms.clear()
        time.sleep(seconds)
        progress = q.recentProgress[first:]
    finally:
        stopping = True
        deadline = time.monotonic() + 20  # let a running micro-batch end (bounded)
        while q.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.05)
        q.stop()
    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    out: dict[str, Any] = {"source": source, "batches": len(batches)}
    for key in (*PHASES, "triggerExecution"):
        out[key] = _median([float(p["durationMs"].get(key, 0)) for p in batches])
    out["collect"] = _median(collect_ms)
    out["rows"] = _median([float(p["numInputRows"]) for p in batches])
    out["p50"] = _median(lat_ms)
    out["p90"] = _pct(lat_ms, 0.9)
    return out


def source_own_cost(md_dir: str, shm: str, prod: Any, hz: float, frames: int) -> dict[str, float]:
    """The tensorpool reader's own work per micro-batch, called directly (no Spark)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tensorpool.spark_source.options import parse_source_options
    from tensorpool.spark_source.spark.stream import TensorPoolStreamReader

    opts = parse_source_options(
        {"streams": str(STREAM + 1), "aeronDir": md_dir, "shmBaseDir": shm}, streaming=True
    )
    reader = TensorPoolStreamReader(opts)
    plan_ms: list[float] = []
    read_ms: list[float] = []
    try:
        start = reader.initialOffset()
        prod.cmds.put(("rate", (frames, hz)))
        deadline = time.monotonic() + frames / hz + 5
        while time.monotonic() < deadline:
            time.sleep(0.1)
            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            parts = reader.partitions(start, end) if end != start else []
            t1 = time.perf_counter()
            n = sum(b.num_rows for p in parts for b in reader.read(p))
            t2 = time.perf_counter()
            if n:
                plan_ms.append((t1 - t0) * 1e3)
                read_ms.append((t2 - t1) * 1e3)
            start = end
            if not prod.done.empty():
                prod.done.get()
                break
        # with no new frames, Spark's default trigger asks every pollingDelay (10 ms)
        start = reader.latestOffset(start, ReadAllAvailable())
        idle_ms: list[float] = []
        for _ in range(200):
            t0 = time.perf_counter()
            reader.latestOffset(start, ReadAllAvailable())
            idle_ms.append((time.perf_counter() - t0) * 1e3)
    finally:
        reader.stop()
    return {
        "plan": _median(plan_ms),
        "read": _median(read_ms),
        "n": len(plan_ms),
        "idle": _median(idle_ms),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=12.0, help="measured seconds per query")
    ap.add_argument("--rounds", type=int, default=2, help="rate/tensorpool alternations")
    ap.add_argument(
        "--warmup", type=float, default=6.0, help="seconds of each query first (not reported)"
    )
    ap.add_argument("--hz", type=float, default=10.0, help="frames (rows) per second")
    ap.add_argument("--frame-bytes", type=int, default=4096)
    ap.add_argument("--trigger", default="0 seconds", help="processingTime of both queries")
    ap.add_argument("--checkpoint", choices=("shm", "tmp"), default="shm")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark conf KEY=VALUE")
    a = ap.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
    )
    import logging

    logging.basicConfig(level=logging.WARNING)
    from pyspark.sql import SparkSession

    import bench.bench_spark_latency as me  # the importable copy: classes pickle by reference
    import tensorpool.spark_source as tps
    from bench.bench_spark import ProducerThread
    from tensorpool.transport.mediadriver import MediaDriverProcess

    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    shm = tempfile.mkdtemp(prefix="tp-bench-lat-", dir=shm_root)
    ck_root = tempfile.mkdtemp(
        prefix="tp-bench-lat-ck-", dir=shm_root if a.checkpoint == "shm" else None
    )
    results: list[dict[str, Any]] = []
    own: dict[str, float] = {}
    load0 = os.getloadavg()
    try:
        with MediaDriverProcess() as md:
            prod = ProducerThread(md.dir, shm, STREAM, 1024, a.frame_bytes)
            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config(map=dict(kv.split("=", 1) for kv in a.conf))
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            tps.register(spark)
            spark.dataSource.register(me.TickSource)
            try:
                # one steady stream through every query (each starts at latest)
                n = int(a.hz * 10 * (a.rounds + 1) * (a.seconds + 10))  # stopped at the end
                prod.cmds.put(("rate", (n, a.hz)))
                for i in range(a.rounds + 1):
                    secs = a.warmup if i == 0 else a.seconds  # round 0: JIT, workers
                    results.append(
                        run_query(
                            spark,
                            "rate",
                            {"rowsPerSecond": str(max(1, round(a.hz)))},
                            secs,
                            os.path.join(ck_root, f"rate-{i}"),
                            a.trigger,
                        )
                    )
                    results.append(
                        run_query(
                            spark,
                            "tick",
                            {"hz": str(a.hz), "t0": str(time.monotonic_ns())},
                            secs,
                            os.path.join(ck_root, f"tick-{i}"),
                            a.trigger,
                        )
                    )
                    results.append(
                        run_query(
                            spark,
                            "tensorpool",
                            {"streams": str(STREAM), "aeronDir": md.dir, "shmBaseDir": shm},
                            secs,
                            os.path.join(ck_root, f"tp-{i}"),
                            a.trigger,
                        )
                    )
                spark.stop()
                own_prod = ProducerThread(md.dir, shm, STREAM + 1, 1024, a.frame_bytes)
                try:
                    own = source_own_cost(md.dir, shm, own_prod, a.hz, int(5 * a.hz))
                finally:
                    own_prod.stop()
            finally:
                prod.stop()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(ck_root, ignore_errors=True)
    print(
        f"\ntrigger processingTime={a.trigger!r}, {a.hz:g} rows/s, {a.frame_bytes} B frames, "
        f"checkpoint on {a.checkpoint}, conf {a.conf}, {a.seconds:g} s per query, load "
        f"{load0[0]:.1f} -> "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    cols = ("triggerExecution", *PHASES, "collect")
    print(
        "| source | batches | rows/batch | " + " | ".join(cols) + " | latency p50 | latency p90 |"
    )
    print("| --- |" + " ---: |" * (len(cols) + 4))
    for r in results[3:]:  # after the warm-up round
        lat = f"{r['p50']:.0f} | {r['p90']:.0f}" if r["source"] != "rate" else "— | —"
        print(
            f"| {r['source']} | {r['batches']} | {r['rows']:.0f} | "
            + " | ".join(f"{r[c]:.0f}" for c in cols)
            + f" | {lat} |"
        )
    if own:
        print(
            f"\ntensorpool's own work per micro-batch (no Spark, median of {own['n']:.0f}): "
            f"latestOffset + partitions {own['plan']:.2f} ms, read -> Arrow {own['read']:.2f} ms; "
            f"latestOffset without new frames {own['idle']:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
