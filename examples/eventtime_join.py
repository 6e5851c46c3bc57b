"""Seed 004 §7 in Spark: two live streams -> admission -> aligned event time -> watermark ->
windowed stream-stream join on a key -> aggregation -> checkpoint -> sink (#17).

The tensorpool source does what only it can know (per-stream admission by rate and lag, event
time aligned by the minimum rule so one stream's lead does not make Spark drop the other's rows
as late); Spark does the rest (watermark, join, aggregation, exactly-once checkpointed sink).

Run it against two producers (e.g. ``tensorpool produce``) on streams 1 and 2::

    python examples/eventtime_join.py --streams 1,2 --out /tmp/join-out --checkpoint /tmp/join-ck

Stop it at any time and start it again with the same ``--checkpoint``: it resumes from the
checkpointed offsets and join/aggregation state, and the parquet sink's log keeps every window
exactly once.

The backlog case (``--backlog``, #27.1): the first stream starts ``latest``, the second
``earliest`` with seconds of frames waiting, and ``maxFramesPerTrigger`` caps each micro-batch.
The minimum rule bounds the first stream by what the second *delivers* each micro-batch (not
by the newest frame in its ring), so the first waits in its ring while the second catches up
and none of the second's rows reaches Spark behind its watermark::

    python examples/eventtime_join.py --streams 1,2 --backlog --out /tmp/join-out \
        --checkpoint /tmp/join-ck
"""

from __future__ import annotations

import argparse
from typing import Any

#: event-time window of the join and the aggregation
WINDOW = "500 milliseconds"
#: how late a row may be for Spark's state (the source aligns the streams, so this is small)
WATERMARK = "1 second"
#: rows join when their keys match: here the frame's seq modulo KEYS
KEYS = 4


def source_options(streams: tuple[int, int], backlog: bool = False, **extra: str) -> dict[str, str]:
    """The source options of the pipeline: admission and aligned event time. ``backlog``:
    the second stream starts from its earliest frame behind the first (see the module doc)."""
    opts = {
        "streams": f"{streams[0]},{streams[1]}",
        "startingOffsets": "earliest",
        "maxFramesPerSecond": "5000",  # per stream, token bucket across triggers
        "maxBurstFrames": "1000",
        "maxLagMs": "60000",  # frames older than this at admission are shed (shedLag)
        "alignEventTime": "true",  # the minimum rule over the two streams
        "maxEventTimeSkewMs": "200",
        "idleStreamTimeoutMs": "30000",
        "includeTensorMetadata": "false",
    }
    if backlog:
        opts["startingOffsets"] = f'{{"{streams[0]}": "latest", "{streams[1]}": "earliest"}}'
        opts["maxFramesPerTrigger"] = "150"
    opts.update(extra)
    return opts


def build(spark: Any, streams: tuple[int, int], opts: dict[str, str]) -> Any:
    """The joined, aggregated streaming DataFrame: per window, the number of joined pairs."""
    from pyspark.sql import functions as F

    frames = (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .select("stream_id", "seq", "timestamp")
        .withColumn("key", F.col("seq") % KEYS)
    )

    def side(sid: int, name: str) -> Any:
        return (
            frames.where(F.col("stream_id") == sid)
            .select(
                F.col("key").alias(f"{name}_key"),
                F.col("timestamp").alias(f"{name}_ts"),
                F.window("timestamp", WINDOW).alias(f"{name}_window"),
            )
            .withWatermark(f"{name}_ts", WATERMARK)
        )

    left, right = side(streams[0], "l"), side(streams[1], "r")
    joined = left.join(
        right,
        (F.col("l_key") == F.col("r_key")) & (F.col("l_window") == F.col("r_window")),
    )
    return (
        joined.groupBy(F.window("l_ts", WINDOW).alias("window"))  # on the watermarked column
        .agg(F.count("*").alias("pairs"))
        .select(F.col("window.start").alias("window_start"), "pairs")
    )


def start(spark: Any, df: Any, out: str, checkpoint: str, trigger: str = "500 milliseconds") -> Any:
    """Append finished windows to parquet under ``out``; state and offsets in ``checkpoint``."""
    return (
        df.writeStream.format("parquet")
        .outputMode("append")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger)
        .start()
    )


def main() -> None:
    from pyspark.sql import SparkSession

    import tensorpool.spark_source as tps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,2")
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--backlog", action="store_true", help="second stream from its earliest")
    a = ap.parse_args()
    s1, s2 = (int(x) for x in a.streams.split(","))
    spark = SparkSession.builder.appName("tensorpool-eventtime-join").getOrCreate()
    tps.register(spark)
    opts = source_options((s1, s2), a.backlog)
    q = start(spark, build(spark, (s1, s2), opts), a.out, a.checkpoint)
    q.awaitTermination()


if __name__ == "__main__":
    main()
