"""``format("tensorpool")``: the Spark ``DataSource`` and ``register``.

The entry point that picks a reader or writer for the options: the plain readers of
:mod:`~tensorpool.spark_source.spark.source`, the pulse-window reader of
:mod:`~tensorpool.spark_source.spark.pulse` (``batching=pulse``) or the sink. It lives in its
own module so the imports go one way (#14.1): ``datasource`` → ``pulse`` → ``source``; ``source``
imports neither. The sink is imported when a write is planned, so a read never loads the
producer side.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructField, StructType

from tensorpool.spark_source.options import (
    BATCHING_PULSE,
    parse_sink_options,
    parse_source_options,
    reject,
)
from tensorpool.spark_source.rings.layout_hint import payload_metadata
from tensorpool.spark_source.spark.pulse import PulseStreamReader, pulse_schema_ddl
from tensorpool.spark_source.spark.source import (
    FORMAT,
    TensorPoolBatchReader,
    _check_user_schema,
    flags_late,
    struct_type,
)
from tensorpool.spark_source.spark.stream import TensorPoolStreamReader

__all__ = ["TensorPoolDataSource", "register"]


class TensorPoolDataSource(DataSource):
    """``format("tensorpool")``: live tensor streams from tensorpool SHM rings."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str | StructType:
        opts = parse_source_options(self.options)
        if opts.batching == BATCHING_PULSE:
            return pulse_schema_ddl(opts.include_tensor_metadata)
        # #16.4 includeStreamMetadata adds a column; #16.6 one fixed layout -> payload metadata
        schema = struct_type(
            opts.include_tensor_metadata, opts.include_stream_metadata, flags_late(opts)
        )
        hint = payload_metadata(opts)
        if hint is None:
            return schema
        return StructType(
            [
                StructField(f.name, f.dataType, metadata=hint) if f.name == "payload" else f
                for f in schema.fields
            ]
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_source_options(self.options, streaming=False)
        _check_user_schema(schema, opts.include_tensor_metadata, opts.include_stream_metadata)
        return TensorPoolBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_source_options(self.options, streaming=True)
        if opts.batching == BATCHING_PULSE:
            return PulseStreamReader.for_schema(opts, schema)
        _check_user_schema(
            schema, opts.include_tensor_metadata, opts.include_stream_metadata, flags_late(opts)
        )
        return TensorPoolStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from tensorpool.spark_source.spark.sink import TensorPoolBatchWriter

        if overwrite:
            reject("mode", "a tensor stream cannot be overwritten; use mode('append')")
        return TensorPoolBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from tensorpool.spark_source.spark.sink import TensorPoolStreamWriter

        if overwrite:
            reject("outputMode", "only 'append' is supported")
        return TensorPoolStreamWriter(parse_sink_options(self.options), schema)


def register(spark: Any) -> None:
    """Make ``format("tensorpool")`` available in ``spark`` (call once per session)."""
    spark.dataSource.register(TensorPoolDataSource)
