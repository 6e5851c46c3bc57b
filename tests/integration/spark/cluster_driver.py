"""The Spark side of the multi-host Flight test (#18.3): a ``local-cluster[2,1,1024]`` driver.

A separate process because a Python process holds one SparkContext and the suite's shared one
is ``local[2]``. ``local-cluster`` starts a master, a worker and two executor JVMs, each with
its own Python workers: a task runs in an executor chosen by Spark. Commands on stdin, events
on stdout (JSON lines):

* ``start {json}`` -- start a streaming query: ``{"options": {...}, "checkpoint": DIR,
  "fail_at": {"stream": S, "seq": Q}}`` (optional: the sink raises once, on the first batch
  holding that frame, after reporting it as ``attempt``);
* ``stop`` -- stop the query (``{"event": "stopped"}``);
* ``exit``.

Events: ``ready`` (executor count), ``batch`` / ``attempt`` (id, rows as [stream, seq], bad
payloads), ``failed`` (the query's exception, once).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from spark_helpers import check_payload  # noqa: E402

_LOCK = threading.Lock()


def emit(**kw: object) -> None:
    with _LOCK:
        print(json.dumps(kw), flush=True)


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import tensorpool.spark_source as tps

    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("tensorpool-serve-cluster")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.task.maxFailures", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tps.register(spark)
    deadline = time.monotonic() + 60
    while True:  # the executors register a moment after the driver
        n = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        if n >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # local-cluster's worker keeps each application's executor logs in $SPARK_HOME/work/<app>
    # (not configurable there): the test removes the one this run made
    home = os.environ.get("SPARK_HOME") or os.path.dirname(__import__("pyspark").__file__)
    app_dir = os.path.join(home, "work", spark.sparkContext.applicationId)
    emit(event="ready", executors=n, app_dir=app_dir)
    query: Any = None

    def watch(q: Any) -> None:
        while q.isActive:
            time.sleep(0.2)
        exc = q.exception()
        if exc is not None:
            emit(event="failed", message=str(exc)[:4000])

    for line in sys.stdin:
        cmd, _, rest = line.strip().partition(" ")
        if cmd == "start":
            spec = json.loads(rest)
            fail_at = spec.get("fail_at")

            def sink(df: Any, batch_id: int, fail_at: Any = fail_at) -> None:
                rows = df.select("stream_id", "seq", "payload").collect()
                got = sorted([r.stream_id, r.seq] for r in rows)
                bad = sum(not check_payload(r.payload, r.seq) for r in rows)
                if (
                    fail_at
                    and [fail_at["stream"], fail_at["seq"]] in got
                    and not fail_at.get("done")
                ):
                    fail_at["done"] = True
                    emit(event="attempt", id=batch_id, rows=got, bad=bad)
                    raise RuntimeError(f"simulated crash in batch {batch_id}")
                emit(event="batch", id=batch_id, rows=got, bad=bad)

            query = (
                spark.readStream.format("tensorpool")
                .options(**spec["options"])
                .load()
                .writeStream.foreachBatch(sink)
                .trigger(processingTime="300 milliseconds")
                .option("checkpointLocation", spec["checkpoint"])
                .start()
            )
            threading.Thread(target=watch, args=(query,), daemon=True).start()
            emit(event="started")
        elif cmd == "stop":
            if query is not None:
                query.stop()
            emit(event="stopped")
        elif cmd == "exit":
            break
    spark.stop()


if __name__ == "__main__":
    main()
