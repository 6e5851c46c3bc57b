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
loss, reported by executors through a small spool socket -- or, for streams read over Flight
(#18), counted by the serving host and collected from it -- and folded into the next offset),
so ``query.lastProgress["sources"][i]["endOffset"]`` shows the running totals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
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
    ReadMinRows,
    SupportsTriggerAvailableNow,
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

from tensorpool.spark_source import discovery, mapped_rings, spool, stream_meta, timestamps
from tensorpool.spark_source import remote as remote_io
from tensorpool.spark_source.attach import (
    AnnounceProbe,
    Attachment,
    StreamsNotAttached,
    open_attachment,
    shared_probe,
)
from tensorpool.spark_source.health import HealthMonitor, MinFramesGate, backlog
from tensorpool.spark_source.hosts import (
    BATCH,
    STREAM,
    PlanOrigin,
    check_origin,
)
from tensorpool.spark_source.loss_text import batch_loss_message, explicit_start_hint
from tensorpool.spark_source.margin import describe as describe_margin
from tensorpool.spark_source.margin import now_for, safe_earliest
from tensorpool.spark_source.offsets import (
    NOT_STARTED,
    OVERWRITTEN,
    REGIONS_GONE,
    Limits,
    Loss,
    OffsetError,
    Range,
    RingState,
    StreamPlanner,
    StreamPos,
    batch_ranges,
    decode_offsets,
    encode_offsets,
    grow_offsets,
    loss_message,
    possible_loss_message,
    runs_count,
    runs_seqs,
    split_ranges,
    to_runs,
)
from tensorpool.spark_source.options import (
    EARLIEST,
    IS_LATE,
    LATE_FLAG,
    LATEST,
    ON_STALE_WARN,
    Opt,
    SourceOptions,
    reject,
)
from tensorpool.spark_source.policy import SourcePolicy

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
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in want]:
        ddl = schema_ddl(include_meta, include_stream_meta)
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
    base_dirs: tuple[str, ...]
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
    #: a stream served by ``tensorpool serve`` on its host (#18): read locally or over Flight
    remote: remote_io.RemoteRead | None = field(default=None, compare=False, repr=False)

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
    origin = partition.origin
    where = f"seq {partition.first}..{partition.end - 1}"
    if origin is not None and origin.kind == BATCH:
        rec = LossRecorder(partition, where, batch_loss_message(origin))
    else:
        rec = LossRecorder(partition, where)
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
        if partition.remote is not None:  # #18: on the stream's host, or over Flight
            yield from remote_io.read_partition(partition, on_loss, schema)
            return
        versions = partition.stream_meta
        batches = mapped_rings.read_range(
            partition.region,
            partition.base_dirs,
            partition.first,
            partition.end,
            # the metadata column is chosen by each frame's meta_version (#16.4)
            include_meta=partition.include_meta or versions is not None,
            on_loss=on_loss,
            schema=schema if versions is None else arrow_schema(True),
            runs=runs,
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
def _settings(opts: SourceOptions) -> Any:
    return opts.connection.client_settings(freshness_ms=opts.freshness_ms)


def _validate(base_dirs: tuple[str, ...]) -> Callable[[Any], None]:
    """A probe's ``map_layout``: an announced layout counts once its regions map and validate
    (mapped anew if the files changed since this process mapped them)."""

    def validate(layout: Any) -> None:
        spec = mapped_rings.RegionSpec.from_layout(layout)
        mapped_rings.mapped(spec, base_dirs, revalidate=True)

    return validate


def _shared_probe(opts: SourceOptions) -> AbstractContextManager[AnnounceProbe]:
    """This process's announce probe for ``opts``' control channel, kept between plans (#15)."""
    base_dirs = opts.connection.base_dirs
    return shared_probe(
        _settings(opts),
        map_layout=_validate(base_dirs),
        is_current=mapped_rings.layout_still_mapped,
        scope=base_dirs,
    )


def plan_origin(spec: mapped_rings.RegionSpec, opts: SourceOptions, kind: str) -> PlanOrigin | None:
    """This planning host's view of ``spec``'s header ring (#16.3), None if it is not mapped."""
    try:
        m = mapped_rings.mapped(spec, opts.connection.base_dirs)
    except Exception:  # regions gone since the scan: the tasks report that as loss
        return None
    return PlanOrigin.of(m.regions[0].path, opts.connection.shm_base_dir, kind)


def earliest_start(sid: int, st: RingState, opts: SourceOptions, clock_domain: int) -> int:
    """Where ``earliest`` starts on ``st``: past the frames the producer overwrites within
    ``earliestMarginMs`` (#16.1; :mod:`~tensorpool.spark_source.margin`)."""
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
        # streams="*" / a range (#16.4): the streams announced now (one announce period)
        opts, conn = self.opts, self.opts.connection
        if opts.stream_pattern is not None and opts.remote is None and not conn.driver:
            with _shared_probe(opts) as probe:  # #15: a kept probe has heard the period already
                opts = discovery.discovered_from(probe, opts)
        else:
            opts = discovery.discovered_options(opts, _settings(opts))
        timeout = conn.attach_timeout_ms / 1000
        # #18: streams served by `tensorpool serve`: snapshots from their hosts, no Aeron here
        served = remote_io.snapshot(opts) if opts.remote is not None else None
        if served is not None:
            meta = None
        elif conn.driver:
            with open_attachment(
                opts.streams, _settings(opts), driver=True, background=False, intake_capacity=None
            ) as att:
                meta = stream_meta.watch(att.context, opts)
                layouts = att.wait_for_layouts(timeout)
                if meta is not None:
                    meta.wait(opts.streams, min(timeout, opts.freshness_ms / 1000))
        else:
            # #15: the process's shared probe, kept between plans (with its metadata tracker,
            # for includeStreamMetadata: subscribed before the hellos go out)
            with _shared_probe(opts) as probe:
                meta = probe.meta_tracker() if opts.include_stream_metadata else None
                layouts = probe.wait_for_layouts(timeout, opts.streams)
                if meta is not None:  # the layouts' epochs: a kept tracker may know older ones
                    meta.wait(
                        opts.streams,
                        min(timeout, opts.freshness_ms / 1000),
                        probe.hello,
                        epochs={sid: layout.epoch for sid, layout in layouts.items()},
                    )
        ranges: list[Range] = []
        specs: dict[int, mapped_rings.RegionSpec] = {}
        losses: list[Loss] = []
        possible: list[Loss] = []
        hints: list[str] = []  # #16.3: these were gone before the read, not "fell behind"
        from_earliest: set[int] = set()
        for sid in opts.streams:
            if served is not None:
                spec, st = served[sid].spec, served[sid].state
            else:
                spec = mapped_rings.RegionSpec.from_layout(layouts[sid])
                st = mapped_rings.mapped(spec, conn.base_dirs).scan()
            specs[sid] = spec
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
        origins = {
            sid: None if served is not None else plan_origin(spec, opts, BATCH)
            for sid, spec in specs.items()
        }
        remote_reads = {} if served is None else remote_io.batch_reads(opts, served)
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
                stream_meta.for_partition(meta, r.stream_id, r.epoch),
                origins[r.stream_id],
                r.stream_id in from_earliest,
                remote=remote_reads.get(r.stream_id),
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


# --- streaming -----------------------------------------------------------------------------------
class TensorPoolStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with offsets, admission control, AvailableNow and loss handling."""

    def __init__(self, opts: SourceOptions) -> None:
        # Runs on executors too (one per task): keep it free of I/O.
        self.opts = opts
        self._schema = arrow_schema(opts.include_tensor_metadata, opts.include_stream_metadata)
        self._att: Attachment | None = None
        self._meta: stream_meta.MetaTracker | None = None  # includeStreamMetadata (#16.4)
        self._meta_waited: set[int] = set()
        self._planner: StreamPlanner | None = None
        self._specs: dict[tuple[int, int], mapped_rings.RegionSpec] = {}
        self._states: dict[int, RingState | None] = {}
        self._spool: str | None = None
        self._late_extra: dict[int, int] = {}  # loss found by partitions() (replays)
        self._initial: dict | None = None  # initialOffset, resolved once (#16.1)
        self._health: HealthMonitor | None = None  # #16.2: liveness clocks, lag, ages
        self._gate: MinFramesGate | None = None  # #16.4: minFramesPerTrigger
        self._discovery: discovery.StreamDiscovery | None = None  # streams="*" / a range
        # #17: event time, admission, adaptive sizing (.policy); is_late with lateFrames=flag
        self._policy = SourcePolicy(opts.policy) if opts.policy is not None else None
        if flags_late(opts):
            self._schema = arrow_schema(
                opts.include_tensor_metadata, opts.include_stream_metadata, True
            )

    # --- driver-side plumbing -------------------------------------------------------------------
    def _attach(self) -> Attachment:
        att = self._att
        if att is None:
            opts = self.opts
            if opts.remote is not None:  # #18: heads from each host's server, no Aeron here
                att = self._att = remote_io.RemoteAttachment(opts.remote, opts.streams)  # type: ignore[assignment]
            else:
                att = self._att = attach_query(opts)
            if opts.stream_pattern is not None:
                opts = self._discover_initial(att)
            start_at = {
                sid: spec
                for sid in opts.streams
                if isinstance(spec := opts.starting.for_stream(sid), str)
            }
            self._planner = StreamPlanner(opts.streams, start_at)
            self._spool = spool.make_spool(opts.connection.shm_base_dir)
        return att

    # --- stream discovery (streams="*" / "lo-hi", #16.4) -----------------------------------------
    def _discover_initial(self, att: Attachment) -> SourceOptions:
        """Collect the announced streams for one announce period; attach them."""
        opts = self.opts
        assert opts.stream_pattern is not None
        ch = opts.connection
        disc = self._discovery = discovery.StreamDiscovery(
            att.context, ch.control_channel, ch.control_stream_id, opts.stream_pattern
        )
        att.add_poller(disc.poll)
        wait = discovery.announce_period_s(opts.freshness_ms) + discovery.WAIT_SLACK_S
        found = disc.wait(min(wait, ch.attach_timeout_ms / 1000), poll=False)
        self._grow(found, wait=True)
        return self.opts

    def _grow(self, sids: Iterable[int], *, wait: bool = False) -> None:
        """Add streams to the query (discovered, or named by a checkpointed offset)."""
        att = self._att
        assert att is not None
        new = tuple(sorted(set(sids) - set(self.opts.streams)))
        if not new:
            return
        att.add_streams(new)
        if self._planner is not None:
            self._planner.add_streams(new)
        self.opts = replace(self.opts, streams=tuple(sorted({*self.opts.streams, *new})))
        log.info("tensorpool: the query now reads stream(s) %s (added %s)", self.opts.streams, new)
        if wait:
            try:
                att.wait_for_layouts(self.opts.connection.attach_timeout_ms / 1000)
            except StreamsNotAttached as exc:
                log.warning("tensorpool: %s; continuing without them for now", exc)

    def _decode(self, doc: dict) -> dict[int, StreamPos]:
        """An offset of this query. A discovering query's set only grows: an offset may lack
        streams found since (they have not started) and a checkpoint may name streams not
        announced now (they are attached again)."""
        pattern = self.opts.stream_pattern
        if pattern is None:
            return decode_offsets(doc, self.opts.streams)
        self._attach()
        offsets = decode_offsets(doc)
        outside = sorted(s for s in offsets if not pattern[0] <= s <= pattern[1])
        if outside:
            raise OffsetError(
                f"offset streams {outside} are outside streams {pattern[0]}-{pattern[1]}; a "
                "checkpoint cannot be reused with another 'streams' option"
            )
        planner = self._planner
        if self._discovery is not None and (planner is None or planner.target is None):
            # (Trigger.AvailableNow: only the streams there when it started, as Kafka does)
            self._grow(self._discovery.found())
        self._grow(offsets, wait=True)
        return grow_offsets(offsets, self.opts.streams)

    def _scan(self) -> dict[int, RingState | None]:
        att = self._attach()
        if isinstance(att, remote_io.RemoteAttachment):  # #18
            states = remote_io.scan_streams(att, self._specs)
        else:
            states = scan_streams(att, self.opts, self._specs, mapped_rings.MappedStream.scan)
        self._states = states
        return states

    # --- Spark API ------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        # Spark asks more than once (planning batch 0, then running it) and must get the same
        # answer: resolved once, 'earliest'/'latest' would move with a live ring (#16.1)
        if self._initial is None:
            self._initial = self._initial_offset()
        return self._initial

    def _initial_offset(self) -> dict:
        states = self._scan()
        planner = self._planner
        assert planner is not None
        start: dict[int, StreamPos] = {}
        for sid in self.opts.streams:
            st = states.get(sid)
            region = None if st is None else self._specs.get((sid, st.epoch))
            spec = timestamps.starting_for(self.opts, sid, region)  # or *ByTimestamp (#16.4)
            if isinstance(spec, tuple):
                # An explicit position: whatever is missing after it is the query's loss.
                start[sid] = StreamPos(spec[0], spec[1])
            elif st is None:
                start[sid] = StreamPos(NOT_STARTED, 0)  # begins when the stream appears
            elif spec == EARLIEST:  # #16.1: past what the producer overwrites before the read
                domain = self._specs[(sid, st.epoch)].clock_domain
                start[sid] = StreamPos(st.epoch, earliest_start(sid, st, self.opts, domain))
                planner.begin(sid, st, start[sid].seq)
            else:
                start[sid] = StreamPos(st.epoch, st.head)
                planner.begin(sid, st, start[sid].seq)
        return encode_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_frames_per_trigger is not None:
            return ReadMaxRows(self.opts.max_frames_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        if self.opts.min_frames_per_trigger is not None:
            return ReadMinRows(self.opts.min_frames_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        states = self._scan()
        assert self._planner is not None
        self._planner.set_target(states)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._decode(start)  # a discovering query attaches new streams here
        opts = self.opts
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
        now = time.monotonic_ns()
        self._watch(now)  # #16.2: fails (or warns) on a stream with no live producer
        late, spooled = spool.collect(self._spool, opts.streams)
        remote_att = att if isinstance(att, remote_io.RemoteAttachment) else None  # #18
        if remote_att is not None and not opts.fail_on_data_loss:  # Flight reads' loss
            for sid, n in remote_att.collect_losses(opts.streams).items():
                late[sid] = late.get(sid, 0) + n
        if not late and not self._late_extra and self._hold(begin, states, limit, now):
            self._observe_rings(states, begin)
            return start  # the same offset: Spark runs no batch (minFramesPerTrigger)
        for sid, n in self._late_extra.items():
            late[sid] = late.get(sid, 0) + n
        self._late_extra = {}
        pol = self._policy
        if pol is not None:  # #17: lag, jitter, late, memory, alignment, rate; adaptive bytes
            pol.begin(begin, states, self._wall_shifts(states), now, time.time_ns())
            limits = pol.limits(limits)
        admit = None if pol is None else pol.admit
        align = pol.align if pol is not None and pol.p.align else None  # #27.1
        plan = self._planner.plan(
            begin, states, limits, late=late, feed=feed, admit=admit, align=align
        )
        if pol is not None:
            pol.finish(begin, plan.end, plan.runs, states)
        if self._gate is not None:
            self._gate.admitted(plan.frames, now)
        self._observe_rings(states, plan.end)
        spool.forget(spooled)  # recorded in this plan's lostLate
        if remote_att is not None:
            remote_att.forget_losses()
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
            lost = [*plan.losses, *plan.unknown_epoch_loss]
            message = loss_message(lost, self._explicit_start_hint(begin, lost, states))
            if opts.fail_on_data_loss:
                raise TensorPoolDataLossError(message)
            log.warning("%s [skipped: failOnDataLoss=false]", message)
        if opts.stream_pattern is not None:
            # a discovered stream enters the offset once it has begun (no empty batch before)
            for sid in [k for k, p in plan.end.items() if p.epoch == NOT_STARTED]:
                if str(sid) not in start:
                    del plan.end[sid]
        return encode_offsets(plan.end)

    def _explicit_start_hint(
        self,
        begin: dict[int, StreamPos],
        losses: Sequence[Loss],
        states: dict[int, RingState | None],
    ) -> str | None:
        """#16.3: loss right at a ``startingOffsets`` JSON position (nothing admitted yet) was
        gone before the query started: say so instead of "the query fell behind"."""
        hints = []
        for ls in losses:
            pos, spec, st = begin.get(ls.stream_id), None, states.get(ls.stream_id)
            if pos is not None and not pos.frames:
                spec = self.opts.starting.for_stream(ls.stream_id)
            if pos is None or st is None or spec != (pos.epoch, pos.seq):
                return None  # a loss of a running query: the default hint
            hints.append(explicit_start_hint(ls.stream_id, pos.seq, st.oldest, st.nslots))
        return " ".join(hints) or None

    def _wall_shifts(self, states: dict[int, RingState | None]) -> dict[int, int]:
        """Per stream: add to a frame's ``timestamp_ns`` for wall-clock time (#17)."""
        out = {}
        for sid, st in states.items():
            spec = None if st is None else self._specs.get((sid, st.epoch))
            if spec is not None:
                out[sid] = mapped_rings.wall_clock_offset_ns(spec.clock_domain)
        return out

    def _planned_bytes(self, ranges: Sequence[Range]) -> int:
        """Payload bytes of a batch's frames from the last scan (#17 adaptive sizing)."""
        total = 0
        for r in ranges:
            st = self._states.get(r.stream_id)
            if st is None or st.epoch != r.epoch or r.runs is None:
                continue
            lens = st.lens_of(runs_seqs(r.runs))
            total += 0 if lens is None else int(lens.sum())
        return total

    def reportLatestOffset(self) -> dict | None:
        """Per stream: the producer's head and health (progress ``latestOffset``; report only,
        Spark never compares or checkpoints it -- see :mod:`.health`)."""
        if self._health is None:
            return None
        report = self._health.report(self.opts.streams, time.monotonic_ns(), time.time_ns())
        if self._policy is not None:  # #17: watermarks, jitter, tokens, batch budget
            per, src = self._policy.report(self.opts.streams)
            for sid, entry in per.items():
                report.setdefault(str(sid), {}).update(entry)
            report["source"] = src
        return report

    # --- health and minFramesPerTrigger (#16.2, #16.4; the rules live in .health) ---------------
    def _watch(self, now_ns: int) -> None:
        opts, att = self.opts, self._att
        assert att is not None
        if self._health is None:
            warn = opts.on_stale_stream == ON_STALE_WARN
            self._health = HealthMonitor(opts.stale_stream_timeout_ms, warn)
        self._health.observe(att.liveness(now_ns), opts.streams, now_ns)
        ch = opts.connection
        self._health.check(
            now_ns,
            f"control {ch.control_channel} stream {ch.control_stream_id}, Aeron dir "
            f"{ch.aeron_dir or 'embedded'}, shmBaseDir {ch.shm_base_dir}"
            + (" (through the SHM driver)" if ch.driver else ""),
        )

    def _hold(
        self, begin: dict[int, StreamPos], states: dict[int, RingState | None], limit: Any, now: int
    ) -> bool:
        """Whether ``minFramesPerTrigger`` holds this trigger (never for ReadAllAvailable,
        AvailableNow, or a stream that appeared or changed epoch)."""
        opts = self.opts
        if opts.min_frames_per_trigger is None or isinstance(limit, ReadAllAvailable):
            return False
        assert self._planner is not None
        if self._planner.target is not None:
            return False  # AvailableNow must reach its target, not wait for frames
        if self._gate is None:
            self._gate = MinFramesGate(opts.min_frames_per_trigger, opts.max_trigger_delay_ms)
        available = backlog(begin, states)
        return available is not None and self._gate.hold(available, now)

    def _observe_rings(
        self, states: dict[int, RingState | None], end: dict[int, StreamPos]
    ) -> None:
        health = self._health
        assert health is not None
        for sid in self.opts.streams:
            st = states.get(sid)
            health.observe_ring(sid, st, self._newest_wall_ns(sid, st), end.get(sid))

    def _newest_wall_ns(self, sid: int, st: RingState | None) -> int | None:
        """Wall-clock time of the newest frame's ``timestamp_ns`` (health only: racy is fine)."""
        if st is None or st.empty:
            return None
        spec = self._specs.get((sid, st.epoch))
        if spec is None:
            return None
        try:
            m = mapped_rings.mapped(spec, self.opts.connection.base_dirs)
            ts = int(m.slots["timestamp_ns"][(st.head - 1) & m.mask])
        except Exception:  # regions vanished since the scan
            return None
        return ts + mapped_rings.wall_clock_offset_ns(spec.clock_domain)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        fresh = self._att is None
        begin = self._decode(start)
        finish = self._decode(end)
        opts = self.opts
        if fresh:
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
        att = self._att
        remote = att if isinstance(att, remote_io.RemoteAttachment) else None  # #18
        origins = {
            (r.stream_id, r.epoch): None
            if remote is not None
            else plan_origin(self._specs[(r.stream_id, r.epoch)], opts, STREAM)
            for r in ranges
        }
        # #16.1: the first batch from startingOffsets=earliest reads from the oldest frame
        # still in the ring when its tasks run (frames overwritten before are not loss)
        initial = decode_offsets(self._initial) if self._initial is not None else {}
        first_earliest = {
            sid
            for sid, pos in begin.items()
            if not pos.frames
            and initial.get(sid) == pos
            and self.opts.starting.for_stream(sid) == EARLIEST
        }
        if self._policy is not None:
            self._policy.planned(self._planned_bytes(ranges), time.monotonic_ns())
        flag = flags_late(opts)
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
                self._stream_meta(p.stream_id, p.epoch),
                origins[(p.stream_id, p.epoch)],
                p.stream_id in first_earliest,
                remote=None if remote is None else remote_io.remote_read_for(remote, p.stream_id),
                late_to=finish[p.stream_id].late_to if flag else None,
            )
            for p in split_ranges(ranges, opts.min_partitions)
        ]

    def _stream_meta(self, sid: int, epoch: int) -> stream_meta.Versions | None:
        """includeStreamMetadata (#16.4): the stream epoch's metadata versions seen so far
        (the first time a stream is planned, wait up to ``freshnessMs`` for its announce)."""
        if not self.opts.include_stream_metadata or self._att is None:
            return None
        meta = self._meta
        if meta is None:
            meta = self._meta = stream_meta.MetaTracker()
            ch = self.opts.connection
            self._att.add_poller(
                meta.subscribe(self._att.context, ch.metadata_channel, ch.metadata_stream_id)
            )
        if not meta.known(sid) and sid not in self._meta_waited:
            self._meta_waited.add(sid)
            meta.wait([sid], self.opts.freshness_ms / 1000, poll=False)
        return meta.versions_for(sid, epoch)

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
            att = self._att
            if isinstance(att, remote_io.RemoteAttachment):  # #18: the serving host's scan
                st = remote_io.scan_one(att, sid, epoch)
            else:
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
