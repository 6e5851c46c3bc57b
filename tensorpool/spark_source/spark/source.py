"""``spark.read`` / ``spark.readStream`` ``.format("tensorpool")``: the readers.

Where things run (pyspark 4.3, measured):

* ``DataSource.schema()`` runs at ``load()``: options are validated there, so a bad option fails
  ``load()`` with the option's name in the message.
* Batch: ``reader()`` and ``partitions()`` run in a short-lived planner process. The snapshot
  (layouts + ring windows) is taken in ``partitions()`` and travels inside the partitions.
* Streaming: ``initialOffset``/``latestOffset``/``partitions``/``commit`` run in one long-lived
  Python process on the Spark driver. That process holds the query's rings, one
  :class:`~tensorpool.spark_source.rings.port.RingSource` (opened lazily, never in ``__init__``).
* ``read()`` runs in executor Python workers, which build a *fresh* reader from the options and
  get everything else from the pickled partition. Mappings are cached per worker process.

Data loss (frames overwritten before they were read) is detected twice: at planning (a seq the
stream published is no longer in the ring; see :mod:`~tensorpool.spark_source.plan.offsets` for
how relay streams with seq gaps are counted), and at reading (the producer overwrote a planned
frame before the executor copied it, or a replayed batch finds fewer frames than it had).
``failOnDataLoss=true`` fails the query at either point with a message naming the stream, the
count and the fixes. ``false`` skips the frames,
logs a warning and counts them in the offsets (``lost`` for planned loss, ``lostLate`` for read
loss, reported by executors through a small spool socket -- or, for streams read over Flight
(#18), counted by the serving host and collected from it -- and folded into the next offset),
so ``query.lastProgress["sources"][i]["endOffset"]`` shows the running totals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql.datasource import (
    DataSourceReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tensorpool.spark_source.options import (
    EARLIEST,
    IS_LATE,
    LATE_FLAG,
    LATEST,
    Opt,
    SourceOptions,
    reject,
)
from tensorpool.spark_source.plan.margin import describe as describe_margin
from tensorpool.spark_source.plan.margin import now_for, safe_earliest
from tensorpool.spark_source.plan.offsets import (
    OVERWRITTEN,
    REGIONS_GONE,
    Loss,
    Range,
    RingState,
    loss_message,
    possible_loss_message,
    split_ranges,
    to_runs,
)
from tensorpool.spark_source.rings import mapped_rings, spool, stream_meta, timestamps
from tensorpool.spark_source.rings.hosts import (
    BATCH,
    PlanOrigin,
    check_origin,
)
from tensorpool.spark_source.rings.port import PartitionRead, snapshot
from tensorpool.spark_source.spark.loss_text import batch_loss_message, explicit_start_hint

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


def schema_ddl(include_meta: bool, include_stream_meta: bool = False) -> str:
    ddl = SCHEMA_DDL if include_meta else SCHEMA_DDL_NO_META
    return ddl + ", metadata map<string,string>" if include_stream_meta else ddl


def struct_type(
    include_meta: bool, include_stream_meta: bool = False, include_late: bool = False
) -> StructType:
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
    if include_stream_meta:  # includeStreamMetadata (#16.4), last like Kafka's headers
        fields.append(StructField(stream_meta.COLUMN, MapType(StringType(), StringType())))
    if include_late:  # lateFrames=flag (#17): route late frames with a filter
        fields.append(StructField(IS_LATE, BooleanType()))
    return StructType(fields)


def arrow_schema(
    include_meta: bool, include_stream_meta: bool = False, include_late: bool = False
) -> pa.Schema:
    """The exact Arrow schema Spark expects back (it compares with ``equals``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(
        struct_type(include_meta, include_stream_meta, include_late), timezone="UTC"
    )


def flags_late(opts: SourceOptions) -> bool:
    """``lateFrames=flag`` (#17): the schema has the ``is_late`` column."""
    return opts.policy is not None and opts.policy.late == LATE_FLAG


def _check_user_schema(
    schema: StructType,
    include_meta: bool,
    include_stream_meta: bool = False,
    include_late: bool = False,
) -> None:
    want = struct_type(include_meta, include_stream_meta, include_late)
    check_fixed_schema(schema, want, schema_ddl(include_meta, include_stream_meta))


def check_fixed_schema(schema: StructType, want: StructType, ddl: str) -> None:
    """A ``.schema(...)`` given by the user must be the source's own (``ddl``)."""
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in want]:
        reject(
            "schema",
            f"the tensorpool source has a fixed schema ({ddl}); "
            "do not pass .schema(...), select columns after load() instead",
        )


# --- partitions and the executor read path -------------------------------------------------------
@dataclass
class FramePartition(InputPartition):
    """Frames of one stream epoch: all an executor needs (picklable).

    ``runs`` are the planned seqs (``(k, 2)`` int64 runs ``[a, b)`` within ``[first, end)``,
    one run for a normal stream); None reads every committed seq of ``[first, end)``.
    """

    region: mapped_rings.RegionSpec | None  # None: the epoch's regions are unknown/gone -> all lost
    stream_id: int
    epoch: int
    first: int
    end: int
    fail_on_data_loss: bool
    include_meta: bool
    spool_dir: str | None  # the spool address executors report read-time loss to (streaming)
    runs: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: includeStreamMetadata (#16.4): the stream epoch's metadata versions; None: no column
    stream_meta: stream_meta.Versions | None = field(default=None, compare=False, repr=False)
    #: where and when the read was planned (#16.3: a task on another host says so)
    origin: PlanOrigin | None = field(default=None, compare=False, repr=False)
    #: a batch read from 'earliest' (#16.1): frames overwritten before the task read them are
    #: older than the ring's oldest frame at read time -- outside 'earliest', not loss
    from_earliest: bool = field(default=False, compare=False)
    #: lateFrames=flag (#17): frames below this seq get is_late=true; None: no such column
    late_to: int | None = field(default=None, compare=False)
    #: how the task reads the frames: mapped here, or served by ``tensorpool serve`` (#18)
    reader: PartitionRead | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.value = (self.stream_id, self.epoch, self.first, self.end)

    def loss_recorder(self) -> LossRecorder:
        """Where this partition's undelivered frames go (a batch read's loss names its plan's
        origin, #16.3)."""
        where = f"seq {self.first}..{self.end - 1}"
        if self.origin is not None and self.origin.kind == BATCH:
            return LossRecorder(self, where, batch_loss_message(self.origin))
        return LossRecorder(self, where)


class LossRecorder:
    """Frames one partition failed to deliver: fail at the first, or count, log and spool them.

    ``part`` is any partition with ``stream_id``, ``epoch``, ``region``, ``fail_on_data_loss``
    and ``spool_dir`` (the plain and the pulse readers' partitions); ``where`` names the part
    of the stream in messages; ``message`` renders the loss for the exception.
    """

    def __init__(
        self,
        part: Any,
        where: str,
        message: Callable[[Sequence[Loss]], str] = loss_message,
    ) -> None:
        self.part = part
        self.where = where
        self.message = message
        self.count = 0
        self.reasons: dict[str, int] = {}
        #: #18: a Flight read whose server counts this loss for the driver (not spooled too)
        self.server_counted = False

    def counted_by_server(self) -> None:
        self.server_counted = True

    def __call__(self, seq: int, reason: str) -> None:
        self.count += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        p = self.part
        if p.fail_on_data_loss:
            nslots = p.region.nslots if p.region is not None else 0
            kind = REGIONS_GONE if reason == mapped_rings.REGION_UNAVAILABLE else OVERWRITTEN
            raise TensorPoolDataLossError(
                self.message([Loss(p.stream_id, p.epoch, seq, None, kind, nslots)])
                + f" ({self.where}; detected while reading: {reason})"
            )

    def add_range(self, first: int, end: int, reason: str) -> None:
        """Frames ``[first, end)`` not delivered, reported as one range by a server (#18):
        counted without a call per frame (fails at the first with failOnDataLoss)."""
        if end <= first:
            return
        self(first, reason)
        self.count += end - first - 1
        self.reasons[reason] += end - first - 1

    def report(self) -> None:
        p = self.part
        if not self.count or p.fail_on_data_loss:
            return
        log.warning(
            "tensorpool: stream %d epoch %d: %d frame(s) of %s were overwritten before this "
            "task read them (skipped, failOnDataLoss=false): %s",
            p.stream_id,
            p.epoch,
            self.count,
            self.where,
            self.reasons,
        )
        if p.spool_dir is not None and not self.server_counted:
            spool.report(p.spool_dir, p.stream_id, p.epoch, self.count)


class AgedOut:
    """``on_loss`` of a batch read from ``earliest`` (#16.1): overwritten frames are skipped.

    ``earliest`` means "from the oldest frame the ring still holds". The plan fixes the range
    once per DataFrame, past the frames the producer overwrites within ``earliestMarginMs``; a
    frame overwritten anyway before a task read it (tasks started late, or a later action of
    the DataFrame) was older than the ring's oldest frame at read time. An action returns the
    planned frames still in the ring -- a suffix of the plan, all of it while the ring holds
    them. Anything else (regions gone) is loss as usual.
    """

    def __init__(self, rec: LossRecorder) -> None:
        self.rec = rec
        self.count = 0
        self.first: int | None = None

    def __call__(self, seq: int, reason: str) -> None:
        if reason in mapped_rings.OVERRUN_REASONS:
            self.count += 1
            self.first = seq if self.first is None else min(self.first, seq)
            return
        self.rec(seq, reason)

    def report(self) -> None:
        if self.count:
            p = self.rec.part
            log.warning(
                "tensorpool: stream %d epoch %d: %d planned frame(s) from seq %d were "
                "overwritten before this task read them; 'earliest' reads from the oldest frame "
                "still in the ring (cache() the DataFrame to keep its rows, raise "
                "earliestMarginMs or give the ring more slots to keep them longer)",
                p.stream_id,
                p.epoch,
                self.count,
                self.first,
            )


def read_partition(partition: InputPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, FramePartition):
        return  # Spark's placeholder partition of an empty batch read
    if partition.late_to is not None:  # lateFrames=flag (#17): is_late from the offsets
        yield from _with_is_late(partition, schema)
        return
    # #16.3: a task that cannot see the planned SHM (another host or mount namespace) fails
    # naming both hosts, whatever failOnDataLoss says: it is a deployment error, not loss
    check_origin(partition.stream_id, partition.origin)
    rec = partition.loss_recorder()
    aged = AgedOut(rec) if partition.from_earliest else None
    on_loss: Callable[[int, str], None] = rec if aged is None else aged
    try:
        runs = partition.runs
        if partition.region is None:
            seqs = (
                range(partition.first, partition.end)
                if runs is None
                else (s for a, b in runs.tolist() for s in range(a, b))
            )
            for seq in seqs:
                rec(seq, mapped_rings.REGION_UNAVAILABLE)
            return
        assert partition.reader is not None
        versions = partition.stream_meta  # #16.4: the column is added to the full read
        batches = partition.reader.read(
            partition, on_loss, schema if versions is None else arrow_schema(True)
        )
        if versions is not None:
            drop = () if partition.include_meta else ("meta_version", "dtype", "shape", "strides")
            batches = stream_meta.add_metadata_column(batches, versions, schema, drop)
        yield from batches
    finally:
        if aged is not None:
            aged.report()
        rec.report()


def _with_is_late(partition: FramePartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The frames with ``is_late = seq < lateTo`` (the boundary the plan recorded, so a replay
    flags exactly the same frames)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    late_to = partition.late_to
    base = schema.remove(schema.get_field_index(IS_LATE))
    for b in read_partition(replace(partition, late_to=None), base):
        flag = pc.less(b.column("seq"), pa.scalar(late_to, pa.int64()))
        yield pa.RecordBatch.from_arrays([*b.columns, flag], schema=schema)


# --- batch ---------------------------------------------------------------------------------------
def earliest_start(sid: int, st: RingState, opts: SourceOptions, clock_domain: int) -> int:
    """Where ``earliest`` starts on ``st``: past the frames the producer overwrites within
    ``earliestMarginMs`` (#16.1; :mod:`~tensorpool.spark_source.plan.margin`)."""
    margin_ms = opts.earliest_margin_ms
    choice = safe_earliest(st, now_for(clock_domain), margin_ms * 1_000_000)
    if choice.capped:
        log.warning("%s", describe_margin(sid, margin_ms, choice))
    elif choice.skipped:
        log.info("%s", describe_margin(sid, margin_ms, choice))
    return choice.seq


class TensorPoolBatchReader(DataSourceReader):
    """A consistent snapshot: frames committed in each ring when ``partitions()`` ran."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._schema = arrow_schema(opts.include_tensor_metadata, opts.include_stream_metadata)

    def partitions(self) -> list[InputPartition]:
        snap = snapshot(self.opts)  # streams="*" / a range (#16.4): those announced now
        opts = snap.opts
        ranges: list[Range] = []
        losses: list[Loss] = []
        possible: list[Loss] = []
        hints: list[str] = []  # #16.3: these were gone before the read, not "fell behind"
        from_earliest: set[int] = set()
        for sid in opts.streams:
            spec, st = snap.specs[sid], snap.states[sid]
            starting = timestamps.starting_for(opts, sid, spec)  # or *ByTimestamp (#16.4)
            if starting == EARLIEST:  # past what the producer overwrites before tasks read
                first = earliest_start(sid, st, opts, spec.clock_domain)
                from_earliest.add(sid)
            else:
                first = _resolve_batch(starting, st, sid, Opt.startingOffsets)
            ending = timestamps.ending_for(opts, sid, spec)
            end = max(first, _resolve_batch(ending, st, sid, Opt.endingOffsets))
            # The snapshot reads exactly the frames committed in [first, end) now. Seqs of the
            # range missing from the ring were lost if they were ever published: certain for a
            # normal (gap-free) stream, unknowable for a relay's sparse seqs (logged only).
            # "earliest" asks for what the ring holds: nothing before it is this read's loss.
            if starting != EARLIEST:
                cnt, lo, hi = st.maybe_overwritten(first, end)
                if cnt and st.gapped:
                    possible.append(
                        Loss(sid, st.epoch, lo, None, OVERWRITTEN, st.nslots, hi, at_most=cnt)
                    )
                elif cnt:
                    losses.append(Loss(sid, st.epoch, lo, cnt, OVERWRITTEN, st.nslots, hi))
                    hints.append(explicit_start_hint(sid, first, st.oldest, st.nslots))
            present = st.present(first, end)
            ranges.append(Range(sid, st.epoch, first, end, len(present), to_runs(present)))
        if possible:
            log.warning("%s", possible_loss_message(possible))
        if losses:
            message = loss_message(losses, " ".join(hints))
            if opts.fail_on_data_loss:
                raise TensorPoolDataLossError(message)
            log.warning("tensorpool: batch read skipped lost frames: %s", message)
        origins = {sid: snap.origin(spec) for sid, spec in snap.specs.items()}
        return [
            FramePartition(
                snap.specs[r.stream_id],
                r.stream_id,
                r.epoch,
                r.first,
                r.end,
                opts.fail_on_data_loss,
                opts.include_tensor_metadata,
                None,
                r.runs,
                stream_meta.for_partition(snap.meta, r.stream_id, r.epoch),
                origins[r.stream_id],
                r.stream_id in from_earliest,
                reader=snap.reader_for(r.stream_id),
            )
            for r in split_ranges(ranges, opts.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self._schema)


def _resolve_batch(spec: str | tuple[int, int], st: RingState, sid: int, name: Opt) -> int:
    if spec == EARLIEST:
        return st.oldest
    if spec == LATEST:
        return st.head
    epoch, seq = spec  # type: ignore[misc]
    if epoch != st.epoch:
        reject(
            name,
            f"stream {sid} asks for epoch {epoch} but the stream is at epoch "
            f"{st.epoch}; frames of other epochs are no longer in the ring",
        )
    return min(seq, st.head)


__all__ = [
    "FORMAT",
    "SCHEMA_DDL",
    "SCHEMA_DDL_NO_META",
    "FramePartition",
    "TensorPoolBatchReader",
    "TensorPoolDataLossError",
    "arrow_schema",
    "read_partition",
]
