"""The soak's Spark leg (issue #30.1): a streaming query with a checkpoint, as its own process.

``python -m tensorpool.commands.soak_spark --out FILE --checkpoint DIR ...`` starts a local[2]
SparkSession and one query over two tensorpool sources: ``--local`` streams read through the
shared memory, ``--flight`` streams read through ``tensorpool serve`` (``hosts`` with
``preferLocalReads=false``). Both skip lost frames and count them (``failOnDataLoss=false``).

For the soak's ledger it appends JSON lines to ``--out``: per micro-batch the rows it got per
(stream, epoch) (``{"batch": id, "rows": [[stream, epoch, count, distinct, min, max], ...]}``,
written by the ``foreachBatch`` sink) and the query's progress for that batch (``{"progress":
id, "offsets": [[start, end], ...]}``, the sources' offsets with their cumulative ``lost`` /
``lostLate``). A replayed batch writes its lines again; the reader keeps the last. On stdout
it prints ``{"frames": n}`` after each batch (the soak's recovery clock).

It stops cleanly on SIGTERM (the query, then the session and its JVM) and when the soak is
gone (:func:`tensorpool.transport.process.exit_with_parent`); the JVM also exits when this
process is killed, as its stdin (the gateway's pipe) closes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

#: Options of both sources. The soak judges the query's recovery itself (300 s after its own
#: faults, 30 s after the others'), so the query rides out the outages the soak causes instead
#: of failing at the sources' production defaults: a stream without a live producer for 30 s
#: (``staleStreamTimeoutMs``; a driver-mode producer's restart waits for the old lease and a
#: Python start, 20-40 s at load 40) and ``serve`` not answering for 15 s (``flightRetryMs``;
#: a restarted ``serve`` takes 10-20 s to start at that load) each failed the query of the
#: first 30-minute run with Spark, counted as crashes (docs/reliability.md).
SOURCE_OPTIONS: dict[str, str] = {
    "failOnDataLoss": "false",
    "attachTimeoutMs": "60000",
    "onStaleStream": "warn",
}
#: and of the one read through ``serve``
FLIGHT_OPTIONS: dict[str, str] = {**SOURCE_OPTIONS, "flightRetryMs": "60000"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tensorpool.commands.soak_spark")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--aeron-dir", required=True)
    p.add_argument("--shm-base-dir", required=True)
    p.add_argument("--local", default="", help="comma list of stream ids read from SHM")
    p.add_argument("--flight", default="", help="host:port/stream, read through serve")
    args = p.parse_args(argv)

    from tensorpool.transport.process import exit_with_parent

    exit_with_parent()  # SIGTERM to ourselves when the soak is gone

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    import tensorpool.spark_source as tps

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tensorpool-soak")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        # a soak shares a small host with ~25 other processes: start the JVM cheaply
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tps.register(spark)
    out = open(args.out, "a")  # noqa: SIM115 - open for the process's life
    lock = threading.Lock()

    def emit(doc: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(doc) + "\n")
            out.flush()

    class Offsets(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pr = event.progress
            emit(
                {
                    "progress": pr.batchId,
                    "run": str(pr.runId),  # a restart from the checkpoint is a new run
                    "offsets": [[s.startOffset, s.endOffset] for s in pr.sources],
                }
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Offsets())
    frames = []
    if args.local:
        frames.append(
            spark.readStream.format("tensorpool")
            .options(
                streams=args.local,
                aeronDir=args.aeron_dir,
                shmBaseDir=args.shm_base_dir,
                driver="true",
                **SOURCE_OPTIONS,
            )
            .load()
        )
    if args.flight:
        host = args.flight.rsplit("/", 1)[0]
        frames.append(
            spark.readStream.format("tensorpool")
            .options(streams=args.flight, hosts=host, preferLocalReads="false", **FLIGHT_OPTIONS)
            .load()
        )
    df = frames[0]
    for more in frames[1:]:
        df = df.unionByName(more)
    df = df.select("stream_id", "epoch", "seq")
    total = [0]

    def sink(batch: Any, batch_id: int) -> None:
        rows = (
            batch.groupBy("stream_id", "epoch")
            .agg(F.count("*"), F.countDistinct("seq"), F.min("seq"), F.max("seq"))
            .collect()
        )
        emit({"batch": batch_id, "rows": [list(r) for r in rows]})
        total[0] += sum(r[2] for r in rows)
        print(json.dumps({"frames": total[0], "batch": batch_id}), flush=True)

    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    # until here SIGTERM ends the process at once (the JVM follows: its stdin closes); from
    # here on it stops the query first, so the checkpoint is left between batches
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(json.dumps({"started": True}), flush=True)
    status = 0
    while not stop.wait(0.5):
        if not q.isActive:
            exc = q.exception()
            print(f"spark query ended: {exc}", file=sys.stderr, flush=True)
            # Spark's message ends with the query plan: repeat its first line last, so the
            # soak's crash record (the last lines of output) names the cause
            why = (str(exc).strip().splitlines() or ["no exception"])[0]
            print(f"spark query ended: {why[:500]}", file=sys.stderr, flush=True)
            status = 1
            break
    q.stop()
    spark.stop()
    out.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
