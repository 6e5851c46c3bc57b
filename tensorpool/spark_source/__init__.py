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
``docs/spark.md``. Module map:

* :mod:`.options`  -- option parsing and validation (fails ``load()`` naming the option);
* :mod:`.offsets`  -- offset model, admission control, loss accounting (sans-IO);
* :mod:`.attach`   -- the control-plane seam: standalone announces or SHM-driver leases;
* :mod:`.mapped_rings` -- mapped rings: driver-side scans, executor-side seqlock reads into Arrow;
* :mod:`.datasource` -- the ``DataSource`` (``format("tensorpool")``) and ``register``;
* :mod:`.source`   -- the batch and micro-batch readers;
* :mod:`.pulse`    -- ``batching=pulse``: one micro-batch = one pulse-aligned window across
  streams (:class:`~tensorpool.batching.RateAwareMessageBatcher` state in the offsets);
* :mod:`.sink` / :mod:`.publisher` -- the write path;
* :mod:`.convert`  -- rows / pandas / Arrow columns back to numpy.
* :mod:`.remote`   -- streams on other hosts (``hosts``): planning and reads through
  ``tensorpool serve`` (Arrow Flight), and that protocol's one definition.

``pyspark`` is imported only when the Spark classes are first used, so :mod:`.convert` works in
plain pandas / Arrow code.
"""

from __future__ import annotations

from typing import Any

from tensorpool.spark_source.convert import (
    column_to_numpy,
    stack,
    tensor_layout,
    to_numpy,
    view,
)
from tensorpool.spark_source.options import TensorPoolOptionError

_LAZY = {
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorpool.spark_source' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
