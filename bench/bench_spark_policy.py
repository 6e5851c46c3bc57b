"""Cost of the Spark source's event-time and admission policies, and adaptive sizing (#17).

Run: ``.venv/bin/python -m bench.bench_spark_policy`` (planning only, ~20 s) or with
``--spark`` (adds the real-Spark runs, ~4 min on 2 cores). Prints markdown tables.

1. **Planning cost per micro-batch** (sans-IO, the driver's work in ``latestOffset``): the
   planner on ring scans of 2 streams x 1 kHz and 16 streams x 100 Hz (a 100 ms trigger:
   100 / 10 new frames per stream per batch), plain against every policy on (``alignEventTime``,
   ``lateFrames=flag``, ``maxLagMs``, ``maxFramesPerSecond``, ``maxJitterMs``), same run,
   interleaved, median of 5 rounds.
2. **Per micro-batch in Spark** (``--spark``): producers publishing 4 KiB frames at those rates
   in this process, a ``readStream`` query (default trigger, ``noop`` sink), plain and with the
   policies, alternated; median ``triggerExecution`` and ``latestOffset`` of the batches with
   rows.
3. **Adaptive sizing under a step change** (``--spark``): one stream at 250 Hz whose frames grow
   from 4 KiB to 64 KiB halfway; ``maxBytesPerTrigger=auto``, ``targetBatchLatencyMs=1000``, a
   ``foreachBatch`` that touches every payload byte; batch latency (``triggerExecution``)
   against the target before and after the step, and ``maxFramesPerTrigger=250`` (one second
   of frames) as the baseline in the same run, after a warm-up query.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Final

import numpy as np

from tensorpool.spark_source.options import PolicyOptions
from tensorpool.spark_source.plan.offsets import Limits, RingState, StreamPos
from tensorpool.spark_source.plan.planner import StreamPlanner
from tensorpool.spark_source.plan.policy import SourcePolicy

MS: Final = 1_000_000
KIB: Final = 1024
#: the step run: frames at this rate grow from 4 KiB to 64 KiB (1 -> 16 MB/s)
STEP_HZ: Final = 250
TARGET_MS: Final = 1000
ROOT: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICY_OPTS: Final = {
    "alignEventTime": "true",
    "maxEventTimeSkewMs": "200",
    "idleStreamTimeoutMs": "5000",
    "lateFrames": "flag",
    "maxLagMs": "30000",
    "maxFramesPerSecond": "100000",
    "maxBurstFrames": "100000",
    "maxJitterMs": "1000",
}


# --- 1. planning cost ----------------------------------------------------------------------------
class Rings:
    """Ring scans of ``n`` dense streams at ``hz``: every trigger adds ``hz * dt`` frames."""

    def __init__(self, n: int, hz: int, nslots: int = 4096) -> None:
        self.n, self.hz, self.nslots = n, hz, nslots
        self.slot_seq = [np.full(nslots, -1, np.int64) for _ in range(n)]
        self.stamps = [np.zeros(nslots, np.int64) for _ in range(n)]
        self.lens = np.full(nslots, 4 * KIB, np.int64)
        self.head = 0
        self.t0 = time.time_ns()

    def advance(self, k: int) -> dict[int, RingState | None]:
        for s in range(self.head, self.head + k):
            for i in range(self.n):
                self.slot_seq[i][s % self.nslots] = s
                self.stamps[i][s % self.nslots] = self.t0 + s * (1_000_000_000 // self.hz)
        self.head += k
        return {
            i + 1: RingState.from_slots(1, self.slot_seq[i], self.slot_seq[i] >= 0, self.lens, st)
            for i, st in enumerate(self.stamps)
        }


def plan_cost(n: int, hz: int, policy: bool, batches: int) -> float:
    """Median µs per micro-batch of planning (ring states prepared outside the timing)."""
    rings = Rings(n, hz)
    streams = tuple(range(1, n + 1))
    planner = StreamPlanner(streams)
    pos = {s: StreamPos(1, 0) for s in streams}
    pol = SourcePolicy(
        PolicyOptions(
            align=True,
            skew_ms=200,
            late="flag",
            max_lag_ms=30_000,
            max_fps=1e5,
            max_burst=100_000,
            max_jitter_ms=1000,
        )
    )
    per = hz // 10  # a 100 ms trigger
    times: list[float] = []
    now = 0
    for _ in range(batches):
        states = rings.advance(per)
        now += 100 * MS
        t = time.perf_counter_ns()
        if policy:
            pol.begin(pos, states, {}, now, rings.t0 + rings.head * (1_000_000_000 // hz))
            plan = planner.plan(pos, states, pol.limits(Limits()), admit=pol.admit, align=pol.align)
            pol.finish(pos, plan.end, plan.runs, states)
            pol.report(streams)
        else:
            plan = planner.plan(pos, states, Limits())
        times.append((time.perf_counter_ns() - t) / 1000)
        pos = plan.end
    return statistics.median(times)


def run_planning(rounds: int, batches: int) -> list[tuple[str, float, float]]:
    rows = []
    for label, n, hz in (("2 x 1 kHz", 2, 1000), ("16 x 100 Hz", 16, 100)):
        plain, pol = [], []
        for _ in range(rounds):
            plain.append(plan_cost(n, hz, False, batches))
            pol.append(plan_cost(n, hz, True, batches))
        rows.append((label, statistics.median(plain), statistics.median(pol)))
    return rows


# --- 2./3. real Spark ----------------------------------------------------------------------------
class Publisher:
    """One thread publishing on ``n`` streams at ``hz`` each (4 KiB frames, or ``big`` bytes
    after ``step()``); all Producer calls happen in the thread."""

    def __init__(self, md: str, shm: str, first: int, n: int, frame_bytes: int) -> None:
        self.args = (md, shm, first, n, frame_bytes)
        self.cmds: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.ready: queue.Queue[int] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.get(timeout=60)

    def _run(self) -> None:
        from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
        from tensorpool.client.settings import ClientSettings
        from tensorpool.transport.config import TransportConfig
        from tensorpool.transport.context import AeronContext

        md, shm, first, n, frame_bytes = self.args
        stride = StreamConfig.for_frame_bytes(first, frame_bytes).pools[0].stride_bytes
        s = ClientSettings(
            transport=TransportConfig(aeron_dir=md), shm_base_dir=shm, announce_period_ns=2 * 10**8
        )
        with AeronContext(s.transport) as ctx:
            ctx.start()
            ps = [
                Producer(
                    ctx,
                    StreamConfig(sid, header_nslots=4096, pools=(PoolConfig(1, stride),)),
                    s,
                    instance_id=f"bench-policy-{sid}",
                )
                for sid in range(first, first + n)
            ]
            for p in ps:
                p.do_work()
            self.ready.put(0)
            hz, size, t0, i = 0.0, 4 * KIB, 0.0, 0
            frame = np.zeros(size, np.uint8)
            while True:
                try:
                    cmd, arg = self.cmds.get_nowait()
                    if cmd == "stop":
                        break
                    if cmd == "rate":
                        hz, t0, i = float(arg), time.monotonic(), 0
                    elif cmd == "size":
                        frame = np.zeros(int(arg), np.uint8)
                except queue.Empty:
                    pass
                if not hz:
                    for p in ps:
                        p.do_work()
                    time.sleep(0.01)
                    continue
                due = t0 + i / hz
                now = time.monotonic()
                if now < due:
                    for p in ps:
                        p.do_work()
                    time.sleep(min(0.001, due - now))
                    continue
                for p in ps:
                    p.offer(frame)
                i += 1
            for p in ps:
                p.close()

    def send(self, cmd: str, arg: Any = None) -> None:
        self.cmds.put((cmd, arg))

    def stop(self) -> None:
        self.send("stop")
        self.thread.join(30)


def _spark() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
    )
    from pyspark.sql import SparkSession

    import tensorpool.spark_source as tps

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tps.register(spark)
    return spark


def _progress(q: Any) -> list[dict[str, Any]]:
    return [p for p in q.recentProgress if p["numInputRows"] > 0]


def run_batches(spark: Any, md: str, shm: str, work: str, seconds: float) -> list[tuple]:
    rows = []
    for label, first, n, hz in (("2 x 1 kHz", 700, 2, 1000), ("16 x 100 Hz", 720, 16, 100)):
        pub = Publisher(md, shm, first, n, 4 * KIB)
        pub.send("rate", hz)
        res: dict[str, list[tuple[float, float]]] = {"plain": [], "policies": []}
        try:
            for rnd in range(2):
                for kind in ("plain", "policies"):
                    opts = {
                        "streams": ",".join(str(s) for s in range(first, first + n)),
                        "aeronDir": md,
                        "shmBaseDir": shm,
                        "includeTensorMetadata": "false",
                        **(POLICY_OPTS if kind == "policies" else {}),
                    }
                    q = (
                        spark.readStream.format("tensorpool")
                        .options(**opts)
                        .load()
                        .writeStream.format("noop")
                        .option("checkpointLocation", f"{work}/ck-{first}-{kind}-{rnd}")
                        .start()
                    )
                    time.sleep(seconds)
                    q.stop()
                    for p in _progress(q)[2:]:  # the first batches pay worker start-up
                        d = p["durationMs"]
                        res[kind].append((d["triggerExecution"], d.get("latestOffset", 0)))
        finally:
            pub.stop()
        for kind in ("plain", "policies"):
            trig = [t for t, _ in res[kind]]
            lo = [x for _, x in res[kind]]
            rows.append(
                (
                    label,
                    kind,
                    len(trig),
                    statistics.median(trig) if trig else float("nan"),
                    statistics.median(lo) if lo else float("nan"),
                )
            )
    return rows


def _touch_rate(df: Any, batch_id: int) -> None:
    df.toArrow()


def _touch(df: Any, batch_id: int) -> None:
    """A sink whose cost grows with the bytes: every payload byte is summed."""
    import pyarrow.compute as pc

    tbl = df.select("payload").toArrow()
    total = 0
    for chunk in tbl.column("payload").chunks:
        data = chunk.buffers()[2]
        if data is not None:
            total += int(np.frombuffer(data, np.uint8).sum(dtype=np.uint64))
    pc.sum(pc.binary_length(tbl.column("payload")))


def run_step(
    spark: Any, md: str, shm: str, work: str, seconds: float, baseline_first: bool = False
) -> list[tuple]:
    rows = []
    warm = spark.readStream.format("rate").load().writeStream.foreachBatch(_touch_rate).start()
    time.sleep(8)  # JIT, Python workers: neither measured run pays the cold start
    warm.stop()
    auto = {"maxBytesPerTrigger": "auto", "targetBatchLatencyMs": str(TARGET_MS)}
    runs = [
        (f"auto, target {TARGET_MS} ms", auto),
        ("maxFramesPerTrigger=250", {"maxFramesPerTrigger": "250"}),
    ]
    for kind, extra in runs[::-1] if baseline_first else runs:
        extra = {**extra, "includeTensorMetadata": "false", "failOnDataLoss": "false"}
        sid = 760 if kind.startswith("auto") else 761
        pub = Publisher(md, shm, sid, 1, 64 * KIB)
        q = (
            spark.readStream.format("tensorpool")
            .options(streams=str(sid), aeronDir=md, shmBaseDir=shm, **extra)
            .load()
            .writeStream.foreachBatch(_touch)
            .option("checkpointLocation", f"{work}/ck-step-{sid}")
            .start()
        )
        try:
            deadline = time.monotonic() + 90  # the first (empty) batch starts the workers
            while not q.recentProgress and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)
            pub.send("rate", STEP_HZ)
            time.sleep(seconds)
            n_before = len(q.recentProgress)
            pub.send("size", 64 * KIB)
            time.sleep(seconds)
        finally:
            q.stop()
            pub.stop()
        prog = q.recentProgress
        for phase, ps in (("4 KiB", prog[2:n_before]), ("64 KiB", prog[n_before + 2 :])):
            lat = [p["durationMs"]["triggerExecution"] for p in ps if p["numInputRows"] > 0]
            rowsn = [p["numInputRows"] for p in ps if p["numInputRows"] > 0]
            if not lat:
                continue
            rows.append(
                (
                    kind,
                    phase,
                    len(lat),
                    statistics.median(lat),
                    float(np.percentile(lat, 90)),
                    statistics.median(rowsn),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spark", action="store_true", help="also the real-Spark runs (~4 min)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--skip-batches", action="store_true", help="with --spark: only the step run")
    ap.add_argument("--baseline-first", action="store_true", help="step run: baseline first")
    a = ap.parse_args(argv)
    print(f"load: {os.getloadavg()}")
    print("\n### Planning cost per micro-batch (driver, µs, median)\n")
    print("| streams | plain | all policies | added |")
    print("| --- | ---: | ---: | ---: |")
    for label, plain, pol in run_planning(a.rounds, a.batches):
        print(f"| {label} | {plain:.0f} | {pol:.0f} | {pol - plain:+.0f} µs |")
    if not a.spark:
        return 0
    from tensorpool.transport.mediadriver import MediaDriverProcess

    spark = _spark()
    with (
        MediaDriverProcess() as md,
        tempfile.TemporaryDirectory(prefix="tp-bench-policy-", dir="/dev/shm") as shm,
        tempfile.TemporaryDirectory(prefix="tp-bench-policy-") as work,
    ):
        if not a.skip_batches:
            print("\n### Per micro-batch in Spark (ms, median of batches with rows)\n")
            print("| streams | source | batches | triggerExecution | latestOffset |")
            print("| --- | --- | ---: | ---: | ---: |")
            for label, kind, nb, trig, lo in run_batches(spark, md.dir, shm, work, a.seconds):
                print(f"| {label} | {kind} | {nb} | {trig:.0f} | {lo:.0f} |")
            print(f"\nload: {os.getloadavg()}")
        print(f"\n### Adaptive sizing: batch latency under a frame-size step ({STEP_HZ} Hz)\n")
        print("| sizing | frames | batches | median ms | p90 ms | median rows/batch |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for kind, phase, nb, med, p90, rows in run_step(
            spark, md.dir, shm, work, a.seconds, a.baseline_first
        ):
            print(f"| {kind} | {phase} | {nb} | {med:.0f} | {p90:.0f} | {rows:.0f} |")
        print(f"\nload: {os.getloadavg()}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
