"""``spark.read`` / ``spark.readStream`` ``.format("tensorpool")``: the readers.

Where things run (pyspark 4.3, measured):

* ``DataSource.schema()`` runs at ``load()``: options are validated there, so a bad option fails
  ``load()`` with the option's name in the message.
* Batch: ``reader()`` and ``partitions()`` run in a short-lived planner process. The snapshot
  (layouts + ring windows) is taken in ``partitions()`` and travels inside the partitions.
* Streaming: ``initialOffset``/``latestOffset``/``partitions``/``commit`` run in one long-lived
  Python process on the Spark driver. That process holds the control-plane
  :class:`~tensorpool.spark_source.attach.Attachment` (opened lazily, never in ``__init__``).
* ``read()`` runs in executor Python workers, which build a *fresh* reader from the options and
  get everything else from the pickled partition. Mappings are cached per worker process.

Data loss (frames overwritten before they were read) is detected twice: at planning, exactly
(the ring no longer holds the start of the range), and at reading (the producer overwrote a
planned frame before the executor copied it). ``failOnDataLoss=true`` fails the query at either
point with a message naming the stream, the count and the fixes. ``false`` skips the frames,
logs a warning and counts them in the offsets (``lost`` for planned loss, ``lostLate`` for read
loss, reported by executors through a small spool directory and folded into the next offset),
so ``query.lastProgress["sources"][i]["endOffset"]`` shows the running totals.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tensorpool.spark_source import ring
from tensorpool.spark_source.attach import (
    AnnounceProbe,
    AttachError,
    Attachment,
    open_attachment,
)
from tensorpool.spark_source.offsets import (
    NOT_STARTED,
    OVERWRITTEN,
    REGIONS_GONE,
    Limits,
    Loss,
    Range,
    RingState,
    StreamPlanner,
    StreamPos,
    batch_ranges,
    decode_offsets,
    encode_offsets,
    loss_message,
    split_ranges,
)
from tensorpool.spark_source.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    TensorPoolOptionError,
    parse_sink_options,
    parse_source_options,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("tensorpool.spark_source")

FORMAT = "tensorpool"
SCHEMA_DDL = (
    "stream_id int, epoch long, seq long, timestamp timestamp, timestamp_ns long, "
    "meta_version int, dtype string, shape array<int>, strides array<int>, payload binary"
)
SCHEMA_DDL_NO_META = (
    "stream_id int, epoch long, seq long, timestamp timestamp, timestamp_ns long, payload binary"
)


class TensorPoolDataLossError(RuntimeError):
    """Frames were overwritten before they were read and ``failOnDataLoss`` is true."""


def schema_ddl(include_meta: bool) -> str:
    return SCHEMA_DDL if include_meta else SCHEMA_DDL_NO_META


def struct_type(include_meta: bool) -> StructType:
    """The schema as a StructType (built by hand: DDL parsing needs a live SparkContext)."""
    fields = [
        StructField("stream_id", IntegerType()),
        StructField("epoch", LongType()),
        StructField("seq", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestamp_ns", LongType()),
    ]
    if include_meta:
        fields += [
            StructField("meta_version", IntegerType()),
            StructField("dtype", StringType()),
            StructField("shape", ArrayType(IntegerType())),
            StructField("strides", ArrayType(IntegerType())),
        ]
    fields.append(StructField("payload", BinaryType()))
    return StructType(fields)


def arrow_schema(include_meta: bool) -> pa.Schema:
    """The exact Arrow schema Spark expects back (it compares with ``equals``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct_type(include_meta), timezone="UTC")


def _check_user_schema(schema: StructType, include_meta: bool) -> None:
    want = struct_type(include_meta)
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in want]:
        raise TensorPoolOptionError(
            f"schema: the tensorpool source has a fixed schema ({schema_ddl(include_meta)}); "
            "do not pass .schema(...), select columns after load() instead"
        )


# --- partitions and the executor read path -------------------------------------------------------
@dataclass
class FramePartition(InputPartition):
    """Frames ``[first, end)`` of one stream epoch: all an executor needs (picklable)."""

    region: ring.RegionSpec | None  # None: the epoch's regions are unknown/gone -> all lost
    stream_id: int
    epoch: int
    first: int
    end: int
    base_dirs: tuple[str, ...]
    fail_on_data_loss: bool
    include_meta: bool
    spool_dir: str | None  # where executors report read-time loss (streaming only)

    def __post_init__(self) -> None:
        self.value = (self.stream_id, self.epoch, self.first, self.end)


class _LossRecorder:
    """Collects frames one partition failed to deliver; fails fast when asked to."""

    def __init__(self, part: FramePartition) -> None:
        self.part = part
        self.count = 0
        self.first_seq = -1
        self.reasons: dict[str, int] = {}

    def __call__(self, seq: int, reason: str) -> None:
        if self.count == 0:
            self.first_seq = seq
        self.count += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if self.part.fail_on_data_loss:
            p = self.part
            nslots = p.region.nslots if p.region is not None else 0
            kind = REGIONS_GONE if reason == ring.REGION_UNAVAILABLE else OVERWRITTEN
            raise TensorPoolDataLossError(
                loss_message([Loss(p.stream_id, p.epoch, seq, None, kind, nslots)])
                + f" (detected while reading: {reason})"
            )

    def report(self) -> None:
        if not self.count or self.part.fail_on_data_loss:
            return
        p = self.part
        log.warning(
            "tensorpool: stream %d epoch %d: %d frame(s) of seq %d..%d were overwritten "
            "before this task read them (skipped, failOnDataLoss=false): %s",
            p.stream_id,
            p.epoch,
            self.count,
            p.first,
            p.end - 1,
            self.reasons,
        )
        if p.spool_dir is None:
            return
        record = {"stream": p.stream_id, "epoch": p.epoch, "count": self.count}
        name = f"{p.stream_id}-{p.epoch}-{p.first}-{os.getpid()}-{uuid.uuid4().hex}.json"
        try:
            fd, tmp = tempfile.mkstemp(dir=p.spool_dir, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(tmp, os.path.join(p.spool_dir, name))
        except OSError as exc:  # the spool vanished (query stopped): the log line remains
            log.warning("tensorpool: could not report loss to %s: %s", p.spool_dir, exc)


def read_partition(partition: InputPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, FramePartition):
        return  # Spark's placeholder partition of an empty batch read
    rec = _LossRecorder(partition)
    try:
        if partition.region is None:
            for seq in range(partition.first, partition.end):
                rec(seq, ring.REGION_UNAVAILABLE)
            return
        yield from ring.read_range(
            partition.region,
            partition.base_dirs,
            partition.first,
            partition.end,
            include_meta=partition.include_meta,
            on_loss=rec,
            schema=schema,
        )
    finally:
        rec.report()


# --- batch ---------------------------------------------------------------------------------------
def _settings(opts: SourceOptions) -> Any:
    return opts.connection.client_settings(freshness_ms=opts.freshness_ms)


class TensorPoolBatchReader(DataSourceReader):
    """A consistent snapshot: frames committed in each ring when ``partitions()`` ran."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._schema = arrow_schema(opts.include_tensor_metadata)

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        conn = opts.connection
        timeout = conn.attach_timeout_ms / 1000
        if conn.driver:
            with open_attachment(
                opts.streams, _settings(opts), driver=True, background=False, intake_capacity=None
            ) as att:
                layouts = att.wait_for_layouts(timeout)
        else:

            def validate(layout: Any) -> None:
                ring.mapped(ring.RegionSpec.from_layout(layout), conn.base_dirs)

            with AnnounceProbe(opts.streams, _settings(opts), map_layout=validate) as probe:
                layouts = probe.wait_for_layouts(timeout)
        ranges: list[Range] = []
        specs: dict[int, ring.RegionSpec] = {}
        losses: list[Loss] = []
        for sid in opts.streams:
            spec = ring.RegionSpec.from_layout(layouts[sid])
            specs[sid] = spec
            st = ring.mapped(spec, conn.base_dirs).scan()
            first = _resolve_batch(opts.starting.for_stream(sid), st, sid, "startingOffsets")
            end = _resolve_batch(opts.ending.for_stream(sid), st, sid, "endingOffsets")
            if not st.empty and first < st.oldest and first < end:
                losses.append(
                    Loss(sid, st.epoch, first, st.oldest - first, "overwritten", st.nslots)
                )
                first = st.oldest
            ranges.append(Range(sid, st.epoch, first, max(first, end)))
        if losses:
            if opts.fail_on_data_loss:
                raise TensorPoolDataLossError(loss_message(losses))
            log.warning("tensorpool: batch read skipped lost frames: %s", loss_message(losses))
        return [
            FramePartition(
                specs[r.stream_id],
                r.stream_id,
                r.epoch,
                r.first,
                r.end,
                conn.base_dirs,
                opts.fail_on_data_loss,
                opts.include_tensor_metadata,
                None,
            )
            for r in split_ranges(ranges, opts.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self._schema)


def _resolve_batch(spec: str | tuple[int, int], st: RingState, sid: int, name: str) -> int:
    if spec == EARLIEST:
        return st.oldest
    if spec == LATEST:
        return st.head
    epoch, seq = spec  # type: ignore[misc]
    if epoch != st.epoch:
        raise TensorPoolOptionError(
            f"{name}: stream {sid} asks for epoch {epoch} but the stream is at epoch "
            f"{st.epoch}; frames of other epochs are no longer in the ring"
        )
    return min(seq, st.head)


# --- streaming -----------------------------------------------------------------------------------
class TensorPoolStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with offsets, admission control, AvailableNow and loss handling."""

    def __init__(self, opts: SourceOptions) -> None:
        # Runs on executors too (one per task): keep it free of I/O.
        self.opts = opts
        self._schema = arrow_schema(opts.include_tensor_metadata)
        self._att: Attachment | None = None
        self._planner: StreamPlanner | None = None
        self._specs: dict[tuple[int, int], ring.RegionSpec] = {}
        self._states: dict[int, RingState | None] = {}
        self._spool: str | None = None

    # --- driver-side plumbing -------------------------------------------------------------------
    def _attach(self) -> Attachment:
        att = self._att
        if att is None:
            opts = self.opts
            att = open_attachment(opts.streams, _settings(opts), driver=opts.connection.driver)
            try:
                att.wait_for_layouts(opts.connection.attach_timeout_ms / 1000)
            except AttachError as exc:
                # A stream may come later (producer not started yet, or restarting): it is
                # picked up when it appears; until then it simply has no new data.
                log.warning("tensorpool: %s; continuing without them for now", exc)
            except BaseException:
                att.close()
                raise
            self._att = att
            start_at = {
                sid: spec
                for sid in opts.streams
                if isinstance(spec := opts.starting.for_stream(sid), str)
            }
            self._planner = StreamPlanner(opts.streams, start_at)
            self._spool = _make_spool(opts.connection.shm_base_dir)
        return att

    def _scan(self) -> dict[int, RingState | None]:
        att = self._attach()
        layouts = att.layouts()
        states: dict[int, RingState | None] = {}
        for sid in self.opts.streams:
            layout = layouts.get(sid)
            if layout is None:
                states[sid] = None
                continue
            spec = ring.RegionSpec.from_layout(layout)
            self._specs[(sid, spec.epoch)] = spec
            try:
                states[sid] = ring.mapped(spec, self.opts.connection.base_dirs).scan()
            except Exception as exc:  # regions vanished between announce and map
                log.warning("tensorpool: stream %d epoch %d not mappable: %s", sid, spec.epoch, exc)
                states[sid] = None
        self._states = states
        return states

    def _sizes(self, sid: int, epoch: int, first: int, count: int) -> list[int]:
        spec = self._specs.get((sid, epoch))
        if spec is None:
            return [0] * count
        return ring.mapped(spec, self.opts.connection.base_dirs).sizes(first, count)

    def _collect_late(self) -> dict[int, int]:
        late: dict[int, int] = {}
        spool = self._spool
        if spool is None:
            return late
        try:
            names = os.listdir(spool)
        except FileNotFoundError:
            return late
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(spool, name)
            try:
                with open(path) as f:
                    rec = json.load(f)
                os.unlink(path)
                sid, n = int(rec["stream"]), int(rec["count"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if sid in self.opts.streams and n > 0:
                late[sid] = late.get(sid, 0) + n
        return late

    # --- Spark API ------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        states = self._scan()
        start: dict[int, StreamPos] = {}
        for sid in self.opts.streams:
            spec = self.opts.starting.for_stream(sid)
            st = states.get(sid)
            if isinstance(spec, tuple):
                start[sid] = StreamPos(spec[0], spec[1])
            elif st is None:
                start[sid] = StreamPos(NOT_STARTED, 0)  # begins when the stream appears
            elif spec == EARLIEST:
                start[sid] = StreamPos(st.epoch, st.oldest)
            else:
                start[sid] = StreamPos(st.epoch, st.head)
        return encode_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_frames_per_trigger is not None:
            return ReadMaxRows(self.opts.max_frames_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        states = self._scan()
        assert self._planner is not None
        self._planner.set_target(states)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self.opts
        begin = decode_offsets(start, opts.streams)
        states = self._scan()
        att = self._att
        assert att is not None and self._planner is not None
        intake = att.drain_intake()
        if intake.dropped:
            log.info("tensorpool: descriptor intake overflowed by %d", intake.dropped)
        if isinstance(limit, ReadAllAvailable):
            limits = Limits()
        elif isinstance(limit, ReadMaxRows):
            limits = Limits(limit.max_rows, opts.max_bytes_per_trigger)
        elif isinstance(limit, ReadMaxBytes):
            limits = Limits(opts.max_frames_per_trigger, limit.max_bytes)
        else:
            limits = Limits(opts.max_frames_per_trigger, opts.max_bytes_per_trigger)
        plan = self._planner.plan(begin, states, limits, self._sizes, self._collect_late())
        if plan.losses or plan.unknown_epoch_loss:
            message = loss_message([*plan.losses, *plan.unknown_epoch_loss])
            if opts.fail_on_data_loss:
                raise TensorPoolDataLossError(message)
            log.warning("%s [skipped: failOnDataLoss=false]", message)
        return encode_offsets(plan.end)

    def reportLatestOffset(self) -> dict | None:
        if not self._states:
            return None
        return {
            str(sid): {"epoch": st.epoch, "seq": st.head}
            for sid, st in sorted(self._states.items())
            if st is not None
        } or None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        opts = self.opts
        begin = decode_offsets(start, opts.streams)
        finish = decode_offsets(end, opts.streams)
        if self._att is None:
            self._scan()  # a restarted query plans the logged batch before asking for offsets
        pieces = split_ranges(batch_ranges(begin, finish), opts.min_partitions)
        out: list[InputPartition] = []
        for r in pieces:
            spec = self._specs.get((r.stream_id, r.epoch))
            if spec is None:
                log.warning(
                    "tensorpool: stream %d epoch %d is not announced any more; frames %d..%d "
                    "of this batch cannot be read",
                    r.stream_id,
                    r.epoch,
                    r.first,
                    r.end - 1,
                )
            out.append(
                FramePartition(
                    spec,
                    r.stream_id,
                    r.epoch,
                    r.first,
                    r.end,
                    opts.connection.base_dirs,
                    opts.fail_on_data_loss,
                    opts.include_tensor_metadata,
                    self._spool,
                )
            )
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self._schema)

    def commit(self, end: dict) -> None:
        log.debug("tensorpool: committed %s", end)

    def stop(self) -> None:
        att, self._att = self._att, None
        if att is not None:
            att.close()
        spool, self._spool = self._spool, None
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)


def _make_spool(shm_base_dir: str) -> str:
    """Per-reader directory where executors drop read-time loss reports (same host)."""
    root = os.path.join(shm_base_dir, ".spark-loss")
    os.makedirs(root, mode=0o700, exist_ok=True)
    for name in os.listdir(root):  # spools of readers that died without stop()
        pid = name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    path = os.path.join(root, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.mkdir(path, 0o700)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the data source -----------------------------------------------------------------------------
class TensorPoolDataSource(DataSource):
    """``format("tensorpool")``: live tensor streams from tensorpool SHM rings."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        opts = parse_source_options(self.options)
        return schema_ddl(opts.include_tensor_metadata)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_source_options(self.options, streaming=False)
        _check_user_schema(schema, opts.include_tensor_metadata)
        if opts.starting.default == LATEST or any(s == LATEST for _, s in opts.starting.per_stream):
            raise TensorPoolOptionError(
                "startingOffsets: 'latest' is not allowed for batch queries (the result would "
                "always be empty); use 'earliest' or JSON offsets"
            )
        return TensorPoolBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_source_options(self.options, streaming=True)
        _check_user_schema(schema, opts.include_tensor_metadata)
        return TensorPoolStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from tensorpool.spark_source.sink import TensorPoolBatchWriter

        if overwrite:
            raise TensorPoolOptionError(
                "mode: a tensor stream cannot be overwritten; use mode('append')"
            )
        return TensorPoolBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from tensorpool.spark_source.sink import TensorPoolStreamWriter

        if overwrite:
            raise TensorPoolOptionError("outputMode: only 'append' is supported")
        return TensorPoolStreamWriter(parse_sink_options(self.options), schema)


def register(spark: Any) -> None:
    """Make ``format("tensorpool")`` available in ``spark`` (call once per session)."""
    spark.dataSource.register(TensorPoolDataSource)


__all__ = [
    "FORMAT",
    "SCHEMA_DDL",
    "SCHEMA_DDL_NO_META",
    "FramePartition",
    "TensorPoolBatchReader",
    "TensorPoolDataLossError",
    "TensorPoolDataSource",
    "TensorPoolStreamReader",
    "arrow_schema",
    "read_partition",
    "register",
]
