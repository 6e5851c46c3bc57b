"""Options of the ``tensorpool`` Spark format: one table, one parser, one error.

Spark hands a data source a case-insensitive string map. Everything a user can get wrong is
caught at ``load()`` / ``save()`` time by :func:`parse_source_options` or
:func:`parse_sink_options` and reported as a :class:`TensorPoolOptionError` whose message
starts with the offending option's name (in the spelling the docs use).

* :mod:`.table` -- the table: a row per option (type, default, bounds, source/sink,
  batch/streaming, local/remote, requires/excludes, docs anchor). ``docs/spark.md``'s option
  tables are checked against it by a test.
* :mod:`.parse` -- the generic parser that walks the table; :mod:`.rules` -- the rules
  between options; :mod:`.fields` -- values that are more than a number (streams, offsets,
  hosts, durations, directories); :mod:`.build` -- the parsed objects.
* :mod:`.values` -- those objects (frozen dataclasses of plain values, so they pickle into
  every executor task unchanged) and the options' constants.
* :mod:`.errors` -- the error and :func:`reject`, the one way code anywhere in the package
  fails a query for an option (also for what only the rings can tell, such as an epoch that
  is gone).

* :mod:`.policy` -- the admission policy's options, a leaf that :mod:`..plan` reads (planning
  reaches no transport or Arrow module, so this package's names load on first use).

Option names appear as strings only in this package (a test scans the rest for them); other
code names an option as ``Opt.<name>``.
"""

from __future__ import annotations

from tensorpool.lazy import lazy_exports

#: name -> defining module, imported on first use so that :mod:`.policy` loads alone
_LAZY = {
    "BATCHING_PULSE": "tensorpool.spark_source.options.values",
    "Connection": "tensorpool.spark_source.options.values",
    "DEFAULT_EARLIEST_MARGIN_MS": "tensorpool.spark_source.options.values",
    "DEFAULT_EMERGENCY": "tensorpool.spark_source.options.policy",
    "DEFAULT_HIGH_WATER": "tensorpool.spark_source.options.policy",
    "DEFAULT_MAX_BATCH_MEMORY": "tensorpool.spark_source.options.policy",
    "DEFAULT_MAX_TRIGGER_DELAY_MS": "tensorpool.spark_source.options.values",
    "DEFAULT_STALE_STREAM_TIMEOUT_MS": "tensorpool.spark_source.options.values",
    "DEFAULT_TARGET_MS": "tensorpool.spark_source.options.policy",
    "EARLIEST": "tensorpool.spark_source.options.values",
    "FlightAccess": "tensorpool.spark_source.options.values",
    "IS_LATE": "tensorpool.spark_source.options.policy",
    "LATEST": "tensorpool.spark_source.options.values",
    "LATE_DROP": "tensorpool.spark_source.options.policy",
    "LATE_FLAG": "tensorpool.spark_source.options.policy",
    "MAX_SEQ": "tensorpool.spark_source.options.values",
    "MAX_STREAM_ID": "tensorpool.spark_source.options.values",
    "ON_STALE_WARN": "tensorpool.spark_source.options.values",
    "OffsetSpec": "tensorpool.spark_source.options.values",
    "Opt": "tensorpool.spark_source.options.table",
    "PolicyOptions": "tensorpool.spark_source.options.policy",
    "RemoteHosts": "tensorpool.spark_source.options.values",
    "SinkOptions": "tensorpool.spark_source.options.values",
    "SourceOptions": "tensorpool.spark_source.options.values",
    "TIMESTAMP_EARLIEST": "tensorpool.spark_source.options.values",
    "TIMESTAMP_LATEST": "tensorpool.spark_source.options.values",
    "TIMESTAMP_STRATEGY_LATEST": "tensorpool.spark_source.options.values",
    "TensorPoolOptionError": "tensorpool.spark_source.options.errors",
    "parse_hosts": "tensorpool.spark_source.options.fields",
    "parse_sink_options": "tensorpool.spark_source.options.build",
    "parse_source_options": "tensorpool.spark_source.options.build",
    "reject": "tensorpool.spark_source.options.errors",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "BATCHING_PULSE",
    "DEFAULT_EARLIEST_MARGIN_MS",
    "DEFAULT_EMERGENCY",
    "DEFAULT_HIGH_WATER",
    "DEFAULT_MAX_BATCH_MEMORY",
    "DEFAULT_MAX_TRIGGER_DELAY_MS",
    "DEFAULT_STALE_STREAM_TIMEOUT_MS",
    "DEFAULT_TARGET_MS",
    "EARLIEST",
    "IS_LATE",
    "LATEST",
    "LATE_DROP",
    "LATE_FLAG",
    "MAX_SEQ",
    "MAX_STREAM_ID",
    "ON_STALE_WARN",
    "TIMESTAMP_EARLIEST",
    "TIMESTAMP_LATEST",
    "TIMESTAMP_STRATEGY_LATEST",
    "Connection",
    "FlightAccess",
    "OffsetSpec",
    "Opt",
    "PolicyOptions",
    "RemoteHosts",
    "SinkOptions",
    "SourceOptions",
    "TensorPoolOptionError",
    "parse_hosts",
    "parse_sink_options",
    "parse_source_options",
    "reject",
]
