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

Data loss (frames overwritten before they were read) is detected twice: at planning (a seq the
stream published is no longer in the ring; see :mod:`~tensorpool.spark_source.offsets` for
how relay streams with seq gaps are counted), and at reading (the producer overwrote a planned
frame before the executor copied it, or a replayed batch finds fewer frames than it had).
``failOnDataLoss=true`` fails the query at either point with a message naming the stream, the
count and the fixes. ``false`` skips the frames,
logs a warning and counts them in the offsets (``lost`` for planned loss, ``lostLate`` for read
loss, reported by executors through a small spool socket and folded into the next offset),
so ``query.lastProgress["sources"][i]["endOffset"]`` shows the running totals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql.datasource import (
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

from tensorpool.spark_source import mapped_rings, spool
from tensorpool.spark_source.attach import (
    AnnounceProbe,
    Attachment,
    StreamsNotAttached,
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
    possible_loss_message,
    runs_count,
    split_ranges,
    to_runs,
)
from tensorpool.spark_source.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    TensorPoolOptionError,
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
    """Frames of one stream epoch: all an executor needs (picklable).

    ``runs`` are the planned seqs (``(k, 2)`` int64 runs ``[a, b)`` within ``[first, end)``,
    one run for a normal stream); None reads every committed seq of ``[first, end)``.
    """

    region: mapped_rings.RegionSpec | None  # None: the epoch's regions are unknown/gone -> all lost
    stream_id: int
    epoch: int
    first: int
    end: int
    base_dirs: tuple[str, ...]
    fail_on_data_loss: bool
    include_meta: bool
    spool_dir: str | None  # the spool address executors report read-time loss to (streaming)
    runs: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.value = (self.stream_id, self.epoch, self.first, self.end)


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
        if p.spool_dir is not None:
            spool.report(p.spool_dir, p.stream_id, p.epoch, self.count)


def read_partition(partition: InputPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, FramePartition):
        return  # Spark's placeholder partition of an empty batch read
    rec = LossRecorder(partition, f"seq {partition.first}..{partition.end - 1}")
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
        yield from mapped_rings.read_range(
            partition.region,
            partition.base_dirs,
            partition.first,
            partition.end,
            include_meta=partition.include_meta,
            on_loss=rec,
            schema=schema,
            runs=runs,
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
                mapped_rings.mapped(mapped_rings.RegionSpec.from_layout(layout), conn.base_dirs)

            with AnnounceProbe(opts.streams, _settings(opts), map_layout=validate) as probe:
                layouts = probe.wait_for_layouts(timeout)
        ranges: list[Range] = []
        specs: dict[int, mapped_rings.RegionSpec] = {}
        losses: list[Loss] = []
        possible: list[Loss] = []
        for sid in opts.streams:
            spec = mapped_rings.RegionSpec.from_layout(layouts[sid])
            specs[sid] = spec
            st = mapped_rings.mapped(spec, conn.base_dirs).scan()
            starting = opts.starting.for_stream(sid)
            first = _resolve_batch(starting, st, sid, "startingOffsets")
            end = max(first, _resolve_batch(opts.ending.for_stream(sid), st, sid, "endingOffsets"))
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
            present = st.present(first, end)
            ranges.append(Range(sid, st.epoch, first, end, len(present), to_runs(present)))
        if possible:
            log.warning("%s", possible_loss_message(possible))
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
                r.runs,
            )
            for r in split_ranges(ranges, opts.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self._schema)


def scan_streams[T](
    att: Attachment,
    opts: SourceOptions,
    specs: dict[tuple[int, int], mapped_rings.RegionSpec],
    scan: Callable[[mapped_rings.MappedStream], T],
) -> dict[int, T | None]:
    """``scan`` of every stream's mapped ring (None: not announced / not mappable right now).

    Records each stream epoch's RegionSpec in ``specs`` (partitions need it later).
    """
    layouts = att.layouts()
    out: dict[int, T | None] = {}
    for sid in opts.streams:
        layout = layouts.get(sid)
        if layout is None:
            out[sid] = None
            continue
        spec = mapped_rings.RegionSpec.from_layout(layout)
        specs[(sid, spec.epoch)] = spec
        try:
            out[sid] = scan(mapped_rings.mapped(spec, opts.connection.base_dirs))
        except Exception as exc:  # regions vanished between announce and map
            log.warning("tensorpool: stream %d epoch %d not mappable: %s", sid, spec.epoch, exc)
            out[sid] = None
    return out


def attach_query(opts: SourceOptions, **kw: Any) -> Attachment:
    """The streaming reader's attachment, waiting up to ``attachTimeoutMs`` for the layouts.

    A stream that does not appear in time is not an error: it may come later (producer not
    started yet, or restarting) and is picked up when it appears; until then it has no data.
    """
    att = open_attachment(opts.streams, _settings(opts), driver=opts.connection.driver, **kw)
    try:
        att.wait_for_layouts(opts.connection.attach_timeout_ms / 1000)
    except StreamsNotAttached as exc:
        log.warning("tensorpool: %s; continuing without them for now", exc)
    except BaseException:
        att.close()
        raise
    return att


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
        self._specs: dict[tuple[int, int], mapped_rings.RegionSpec] = {}
        self._states: dict[int, RingState | None] = {}
        self._spool: str | None = None
        self._late_extra: dict[int, int] = {}  # loss found by partitions() (replays)

    # --- driver-side plumbing -------------------------------------------------------------------
    def _attach(self) -> Attachment:
        att = self._att
        if att is None:
            opts = self.opts
            att = self._att = attach_query(opts)
            start_at = {
                sid: spec
                for sid in opts.streams
                if isinstance(spec := opts.starting.for_stream(sid), str)
            }
            self._planner = StreamPlanner(opts.streams, start_at)
            self._spool = spool.make_spool(opts.connection.shm_base_dir)
        return att

    def _scan(self) -> dict[int, RingState | None]:
        states = scan_streams(
            self._attach(), self.opts, self._specs, mapped_rings.MappedStream.scan
        )
        self._states = states
        return states

    # --- Spark API ------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        states = self._scan()
        planner = self._planner
        assert planner is not None
        start: dict[int, StreamPos] = {}
        for sid in self.opts.streams:
            spec = self.opts.starting.for_stream(sid)
            st = states.get(sid)
            if isinstance(spec, tuple):
                # An explicit position: whatever is missing after it is the query's loss.
                start[sid] = StreamPos(spec[0], spec[1])
            elif st is None:
                start[sid] = StreamPos(NOT_STARTED, 0)  # begins when the stream appears
            else:
                start[sid] = StreamPos(st.epoch, st.oldest if spec == EARLIEST else st.head)
                planner.begin(sid, st, start[sid].seq)
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
        if isinstance(limit, ReadAllAvailable):
            limits = Limits()
        elif isinstance(limit, ReadMaxRows):
            limits = Limits(limit.max_rows, opts.max_bytes_per_trigger)
        elif isinstance(limit, ReadMaxBytes):
            limits = Limits(opts.max_frames_per_trigger, limit.max_bytes)
        else:
            limits = Limits(opts.max_frames_per_trigger, opts.max_bytes_per_trigger)
        feed = att if att.intakes else None
        late, spooled = spool.collect(self._spool, opts.streams)
        for sid, n in self._late_extra.items():
            late[sid] = late.get(sid, 0) + n
        self._late_extra = {}
        plan = self._planner.plan(begin, states, limits, late=late, feed=feed)
        spool.forget(spooled)  # recorded in this plan's lostLate
        for sid, n in plan.dropped.items():
            log.warning(
                "tensorpool: stream %d: the descriptor intake overflowed (%d descriptor(s) "
                "dropped, oldest first); frames stay readable from the ring, but loss within "
                "those seqs of a sparse stream can only be bounded, not counted",
                sid,
                n,
            )
        if plan.possible:
            log.warning("%s", possible_loss_message(plan.possible))
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
        planner = self._planner
        assert planner is not None
        ranges: list[Range] = []
        losses: list[Loss] = []
        for r in batch_ranges(begin, finish):
            sid, epoch = r.stream_id, r.epoch
            spec = self._specs.get((sid, epoch))
            runs = planner.planned_runs(sid, epoch, r.first, r.end)
            if runs is None:
                # Not planned by this process (a replay after a restart): the batch is every
                # frame committed in its range; those still in the ring are exactly the ones
                # it had, and end.frames - start.frames says how many are gone.
                runs = self._replay_runs(r, spec, losses)
                if runs is None:
                    continue
            ranges.append(Range(sid, epoch, r.first, r.end, runs_count(runs), runs))
        if losses:
            message = loss_message(losses) + " (found when planning the batch's partitions)"
            if opts.fail_on_data_loss:
                raise TensorPoolDataLossError(message)
            log.warning("%s [skipped: failOnDataLoss=false]", message)
            for ls in losses:
                self._late_extra[ls.stream_id] = self._late_extra.get(ls.stream_id, 0) + (
                    ls.count or 0
                )
        return [
            FramePartition(
                self._specs[(p.stream_id, p.epoch)],
                p.stream_id,
                p.epoch,
                p.first,
                p.end,
                opts.connection.base_dirs,
                opts.fail_on_data_loss,
                opts.include_tensor_metadata,
                self._spool,
                p.runs,
            )
            for p in split_ranges(ranges, opts.min_partitions)
        ]

    def _replay_runs(
        self, r: Range, spec: mapped_rings.RegionSpec | None, losses: list[Loss]
    ) -> np.ndarray | None:
        """The frames of a logged batch still in the ring; what is gone goes to ``losses``."""
        sid, epoch = r.stream_id, r.epoch
        if spec is None:
            log.warning(
                "tensorpool: stream %d epoch %d is not announced any more; frames %d..%d "
                "of this batch cannot be read",
                sid,
                epoch,
                r.first,
                r.end - 1,
            )
            n = r.expect if r.expect is not None else None
            losses.append(Loss(sid, epoch, r.first, n, REGIONS_GONE, 0, r.end - 1))
            return None
        try:
            st = mapped_rings.mapped(spec, self.opts.connection.base_dirs).scan()
        except Exception as exc:  # regions vanished since the announce
            log.warning("tensorpool: stream %d epoch %d not mappable: %s", sid, epoch, exc)
            losses.append(Loss(sid, epoch, r.first, r.expect, REGIONS_GONE, 0, r.end - 1))
            return None
        present = st.present(r.first, r.end)
        if r.expect is not None and len(present) < r.expect:
            gone = r.expect - len(present)
            losses.append(Loss(sid, epoch, r.first, gone, OVERWRITTEN, st.nslots, r.end - 1))
        elif r.expect is not None and len(present) > r.expect:
            log.warning(
                "tensorpool: stream %d epoch %d: the ring holds %d frames in seq %d..%d but the "
                "logged batch had %d; reading what is there",
                sid,
                epoch,
                len(present),
                r.first,
                r.end - 1,
                r.expect,
            )
        return to_runs(present)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self._schema)

    def commit(self, end: dict) -> None:
        log.debug("tensorpool: committed %s", end)

    def stop(self) -> None:
        att, self._att = self._att, None
        if att is not None:
            att.close()
        spool.remove_spool(self._spool)
        self._spool = None


__all__ = [
    "FORMAT",
    "SCHEMA_DDL",
    "SCHEMA_DDL_NO_META",
    "FramePartition",
    "TensorPoolBatchReader",
    "TensorPoolDataLossError",
    "TensorPoolStreamReader",
    "arrow_schema",
    "read_partition",
]
