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

Option names appear as strings only in this package (a test scans the rest for them); other
code names an option as ``Opt.<name>``.
"""

from tensorpool.spark_source.options.build import parse_sink_options, parse_source_options
from tensorpool.spark_source.options.errors import TensorPoolOptionError, reject
from tensorpool.spark_source.options.fields import parse_hosts
from tensorpool.spark_source.options.table import Opt
from tensorpool.spark_source.options.values import (
    BATCHING_PULSE,
    DEFAULT_EARLIEST_MARGIN_MS,
    DEFAULT_EMERGENCY,
    DEFAULT_HIGH_WATER,
    DEFAULT_MAX_BATCH_MEMORY,
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    DEFAULT_STALE_STREAM_TIMEOUT_MS,
    DEFAULT_TARGET_MS,
    EARLIEST,
    IS_LATE,
    LATE_DROP,
    LATE_FLAG,
    LATEST,
    MAX_SEQ,
    MAX_STREAM_ID,
    ON_STALE_WARN,
    TIMESTAMP_EARLIEST,
    TIMESTAMP_LATEST,
    TIMESTAMP_STRATEGY_LATEST,
    Connection,
    FlightAccess,
    OffsetSpec,
    PolicyOptions,
    RemoteHosts,
    SinkOptions,
    SourceOptions,
)

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
