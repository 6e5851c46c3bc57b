"""A Spark data source for tensorpool streams: ``spark.readStream.format("tensorpool")``.

Usage::

    import tensorpool.spark_source as tps
    tps.register(spark)
    df = (spark.readStream.format("tensorpool")
          .option("streams", "1,2").option("aeronDir", "/dev/shm/aeron-me")
          .option("maxFramesPerTrigger", 1000).load())

Built on PySpark's Python Data Source API (pyspark >= 4.2): a batch reader (a consistent
snapshot of the rings), a micro-batch stream reader (offsets per stream in the checkpoint,
replay after a crash, admission control, ``Trigger.AvailableNow``, Kafka-style
``failOnDataLoss``) and a sink that publishes rows as frames. User documentation:
``docs/spark.md``.

Four layers, each importing only the ones before it (#27.2; ``tests/unit/test_layering.py``
checks it, ``TYPE_CHECKING`` imports included):

1. options -- what the user asked for, validated (fails ``load()`` naming the option):

   * :mod:`.options` -- source, sink and admission-policy options from one table:
     :mod:`.options.table` -- a row per option (the only place an option's name is spelled);
     :mod:`.options.parse` -- the generic parser that walks it; :mod:`.options.rules` -- the
     rules between options; :mod:`.options.fields` -- values that are more than a number
     (streams, offsets, ``hosts``, durations, directories); :mod:`.options.build` -- the parsed
     objects, built; :mod:`.options.values` -- those objects (``SourceOptions``, ``hosts``'
     ``RemoteHosts`` / ``FlightAccess``) and the options' constants; :mod:`.options.errors` --
     :class:`TensorPoolOptionError` and ``reject``, the one way to fail a query for an option;
     :mod:`.options.policy` -- the admission policy's options, the one part planning reads.
   * :mod:`.convert` -- rows / pandas / Arrow columns back to numpy (a user helper that
     imports nothing of the package; also the dtype tables the readers and the sink share).

2. :mod:`.plan` -- what each trigger may read, from ring states alone: no pyspark, pyarrow,
   pyaeron or transport import, transitively:

   * :mod:`.plan.trigger` -- one trigger of the micro-batch reader as a pure step (health,
     the min-frames hold, policy, planner, gate, in that order); :mod:`.plan.offsets` -- the
     offset model and its codec, seq runs, ring states, loss accounting; :mod:`.plan.planner`
     -- the per-stream planner (admission, sparse streams' ledgers, epoch transitions);
     :mod:`.plan.policy` -- the admission policy over the planner;
     :mod:`.plan.admission` -- token buckets, lag, jitter; :mod:`.plan.eventtime` -- event-time
     alignment and late frames; :mod:`.plan.sizing` -- byte budgets and the memory bound;
     :mod:`.plan.margin` -- where ``earliest`` starts on a live ring; :mod:`.plan.health` --
     stale streams and the min-frames hold; :mod:`.plan.progress` -- reading the source's
     metrics out of a query's progress; :mod:`.plan.pulse` -- ``batching=pulse``'s offsets and
     window planner.

3. :mod:`.rings` -- the rings, attached, scanned and read into Arrow:

   * :mod:`.rings.port` -- :class:`~.rings.port.RingSource`, the one seam the adapters talk
     to (scan, read a partition, read-time loss, close), and the one choice between its two
     implementations: :mod:`.rings.local` (rings mapped here) and :mod:`.rings.remote`;
     :mod:`.rings.attach` -- the control-plane seam: standalone announces or SHM-driver
     leases, a Consumer per stream; :mod:`.rings.probe` -- batch plans' announce probes, one
     kept per process; :mod:`.rings.lifecycle` -- exit hooks and the parent watch;
     :mod:`.rings.discovery` -- ``streams=*`` discovery; :mod:`.rings.mapped_rings` --
     mapped rings: driver-side scans, executor-side seqlock reads into Arrow;
     :mod:`.rings.remote` -- streams on other hosts: scans and reads through
     ``tensorpool serve`` (Arrow Flight); :mod:`.rings.flight_protocol` -- that protocol's
     one definition (tickets, scans, loss ledger), shared with :mod:`tensorpool.serve`;
     :mod:`.rings.spool` -- read-time losses reported back from tasks; :mod:`.rings.hosts` --
     which host planned a read and whether a task sees the same files;
     :mod:`.rings.stream_meta` -- per-stream metadata columns; :mod:`.rings.timestamps` --
     ``startingOffsetsByTimestamp``; :mod:`.rings.layout_hint` -- the tensor layout in the
     schema's metadata.

4. :mod:`.spark` -- the pyspark adapters:

   * :mod:`.spark.datasource` -- the ``DataSource`` (``format("tensorpool")``) and ``register``;
     :mod:`.spark.source` -- the schema, the partitions and their read, the batch reader;
     :mod:`.spark.stream` -- the micro-batch reader and the base it shares with the pulse
     reader; :mod:`.spark.pulse` --
     ``batching=pulse``: one micro-batch = one pulse-aligned window across streams
     (:class:`~tensorpool.batching.RateAwareMessageBatcher` state in the offsets);
     :mod:`.spark.sink` / :mod:`.spark.publisher` -- the write path; :mod:`.spark.loss_text` --
     the data-loss messages.

Nothing is imported here until a name is first used (``pyspark`` only with the Spark classes),
so importing a planning module does not load the Spark or Arrow side, and :mod:`.convert`
works in plain pandas / Arrow code.
"""

from __future__ import annotations

from tensorpool.lazy import lazy_exports

_LAZY = {
    "TensorPoolOptionError": "tensorpool.spark_source.options",
    "column_to_numpy": "tensorpool.spark_source.convert",
    "stack": "tensorpool.spark_source.convert",
    "tensor_layout": "tensorpool.spark_source.convert",
    "to_numpy": "tensorpool.spark_source.convert",
    "view": "tensorpool.spark_source.convert",
    "TensorPoolDataSource": "tensorpool.spark_source.spark.datasource",
    "TensorPoolDataLossError": "tensorpool.spark_source.spark.source",
    "SCHEMA_DDL": "tensorpool.spark_source.spark.source",
    "register": "tensorpool.spark_source.spark.datasource",
    "lost_frames": "tensorpool.spark_source.plan.progress",
    "stream_health": "tensorpool.spark_source.plan.progress",
    "stream_lag": "tensorpool.spark_source.plan.progress",
    "shed_frames": "tensorpool.spark_source.plan.progress",  # #17
    "source_watermark": "tensorpool.spark_source.plan.progress",  # #17
    "TensorPoolStaleStreamError": "tensorpool.spark_source.plan.health",
    "TensorPoolWrongHostError": "tensorpool.spark_source.rings.hosts",
    "stop_publisher": "tensorpool.spark_source.spark.sink",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "SCHEMA_DDL",
    "TensorPoolDataLossError",
    "TensorPoolDataSource",
    "TensorPoolOptionError",
    "TensorPoolStaleStreamError",
    "TensorPoolWrongHostError",
    "column_to_numpy",
    "lost_frames",
    "register",
    "shed_frames",
    "source_watermark",
    "stack",
    "stop_publisher",
    "stream_health",
    "stream_lag",
    "tensor_layout",
    "to_numpy",
    "view",
]
