"""Pulse-aligned micro-batches (``batching=pulse``): one closed window per micro-batch.

Model
-----
The ordinary stream reader cuts micro-batches at "whatever was committed when the trigger
fired". With ``batching=pulse`` the cut is made by a
:class:`~tensorpool.batching.RateAwareMessageBatcher` instead: every committed frame is fed
to it as ``(stream_id, timestamp_ns, (epoch, seq))`` (the timestamp from the slot header), and
each window the batcher closes becomes exactly one micro-batch holding that window's frames of
every selected stream plus ``window_start`` / ``window_end`` columns.

Spark needs offsets it can replay in another process, and compares them as text. So the
driver keeps *no* state of its own between triggers: an offset carries everything.

* ``"window"`` -- the window this micro-batch delivers (``index`` = the batcher's batch
  ``sequence``, ``start_ns``/``end_ns`` in the frames' clock domain, the close ``reason``);
  ``null`` in the initial offset.
* per stream (key = stream id, as in the ordinary source's offsets, so
  :func:`tensorpool.spark_source.lost_frames` reads the loss counters unchanged): ``epoch`` and
  ``seq`` -- the next frame to *feed* to the batcher --, the cumulative ``lost`` / ``lostLate``
  counters, and ``frames``: the window's frames as runs ``[epoch, first, end)``.
* ``"batcher"`` -- :meth:`~tensorpool.batching.RateAwareMessageBatcher.snapshot` after the
  feed, with the windows that closed together with this one but are not delivered yet in its
  ``closed`` list (``null`` = a fresh batcher).

``partitions(start, end)`` reads only ``end``'s runs, so a replay reads the same frames.
``latestOffset(start)`` restores the batcher from ``start``, delivers the next queued window if
there is one, and otherwise re-scans every ring from ``start``'s positions and feeds the frames
in timestamp order, one at a time, until a window closes (or, input exhausted, ``settle()``
says the input is drained). No window closed: ``start`` is returned unchanged and Spark runs no
batch; the frames fed in vain are fed again, from the same state, at the next trigger. Output is
thus a pure function of ``start`` and the rings: a restarted query continues exactly where the
checkpointed batcher state left off.

Loss: frames of a stream overwritten before they were fed (``seq`` below the oldest frame still
committed) are counted at planning; frames of a window overwritten before an executor read them
are found by the seqlock read. Both follow ``failOnDataLoss`` like the ordinary source.

The planning (:class:`PulsePlanner`, :class:`PulseOffset`, :func:`to_runs`) is sans-IO: it takes
ring scans (:class:`StreamScan`, arrays of committed ``seq``/``timestamp_ns``) and returns
offsets and losses, and is tested without Spark or shared memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from tensorpool.client.announce import CLOCK_MONOTONIC
from tensorpool.spark_source.options import Opt, SourceOptions, reject
from tensorpool.spark_source.plan.pulse import (
    PulseOffset,
    PulseOffsetError,
    PulsePlanner,
    StreamScan,
    pulse_loss_message,
)
from tensorpool.spark_source.rings import mapped_rings
from tensorpool.spark_source.spark.source import (
    FramePartition,
    LossRecorder,
    TensorPoolDataLossError,
    arrow_schema,
    check_fixed_schema,
    read_partition,
    schema_ddl,
    struct_type,
)
from tensorpool.spark_source.spark.stream import RingStreamReader

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("tensorpool.spark_source.spark.pulse")

WINDOW_DDL: Final = (
    "window_start timestamp, window_end timestamp, window_start_ns long, window_end_ns long"
)


# --- schema --------------------------------------------------------------------------------------
def pulse_schema_ddl(include_meta: bool) -> str:
    return f"{schema_ddl(include_meta)}, {WINDOW_DDL}"


def pulse_struct_type(include_meta: bool) -> StructType:
    """The ordinary columns, then the window: wall-clock timestamps and the raw nanoseconds."""
    return StructType(
        [
            *struct_type(include_meta).fields,
            StructField("window_start", TimestampType()),
            StructField("window_end", TimestampType()),
            StructField("window_start_ns", LongType()),
            StructField("window_end_ns", LongType()),
        ]
    )


def pulse_arrow_schema(include_meta: bool) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(pulse_struct_type(include_meta), timezone="UTC")


# --- partitions and the executor read path -------------------------------------------------------
@dataclass
class PulsePartition(FramePartition):
    """One stream's frames (one epoch) of one window: the window's runs (``runs`` within
    ``[first, end)``) read like any planned partition -- mapped here or over Flight, by the
    partition's ``reader`` -- plus the window they belong to (picklable)."""

    window_index: int = 0
    window_start_ns: int = 0
    window_end_ns: int = 0
    wall_offset_ns: int = 0

    def __post_init__(self) -> None:
        self.value = (self.window_index, self.stream_id, self.epoch)

    def loss_recorder(self) -> LossRecorder:
        return LossRecorder(self, f"window {self.window_index}", pulse_loss_message)


def read_pulse_partition(
    part: InputPartition, base_schema: pa.Schema, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The partition's frames as Arrow batches with the window columns appended."""
    import pyarrow as pa

    if not isinstance(part, PulsePartition):
        return
    ws_us = (part.window_start_ns + part.wall_offset_ns) // 1000
    we_us = (part.window_end_ns + part.wall_offset_ns) // 1000
    ts_type = pa.timestamp("us", tz="UTC")
    for batch in read_partition(part, base_schema):
        n = batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [
                *batch.columns,
                pa.array(np.full(n, ws_us, np.int64), ts_type),
                pa.array(np.full(n, we_us, np.int64), ts_type),
                pa.array(np.full(n, part.window_start_ns, np.int64)),
                pa.array(np.full(n, part.window_end_ns, np.int64)),
            ],
            schema=schema,
        )


# --- the stream reader ---------------------------------------------------------------------------
class PulseStreamReader(RingStreamReader):
    """Micro-batch reader whose every micro-batch is one closed window of the batcher.

    ``Trigger.AvailableNow``: ``prepareForTriggerAvailableNow`` records each ring's head; the
    query then delivers, one per micro-batch, the windows that close with the frames committed
    up to those heads, and stops. The trailing incomplete window is *not* flushed: its frames
    stay unfed and are delivered by a later run, in the window they belong to.
    """

    SPOOL_KIND = "pulse"
    DESCRIPTORS = False  # windows are cut from the slots' timestamps

    def __init__(self, opts: SourceOptions) -> None:
        super().__init__(opts)
        self._base_schema = arrow_schema(opts.include_tensor_metadata)
        self._schema = pulse_arrow_schema(opts.include_tensor_metadata)
        self._planner = PulsePlanner(opts.streams, opts.gated_streams, opts.batch_length_ns)
        self._target: dict[int, tuple[int, int]] | None = None
        self._heads: dict[tuple[int, int], int] = {}  # (stream, epoch) -> highest head seen
        self._clock_domain = CLOCK_MONOTONIC  # of the streams' timestamps (from the announces)

    @classmethod
    def for_schema(cls, opts: SourceOptions, schema: StructType) -> PulseStreamReader:
        meta = opts.include_tensor_metadata
        check_fixed_schema(schema, pulse_struct_type(meta), pulse_schema_ddl(meta))
        return cls(opts)

    # --- driver-side plumbing -------------------------------------------------------------------
    def _scan(self) -> dict[int, StreamScan | None]:
        """The committed frames of every ring with their stamps (:meth:`StreamScan.from_state`
        of the rings' scans)."""
        out: dict[int, StreamScan | None] = {}
        for sid, st in self._scan_rings().items():
            out[sid] = sc = None if st is None else StreamScan.from_state(st)
            if sc is not None:
                key = (sid, sc.epoch)
                self._heads[key] = max(self._heads.get(key, 0), sc.head)
        # Windows are cut on the gated streams' clock: convert with theirs.
        domains = {sid: spec.clock_domain for (sid, _epoch), spec in self._specs.items()}
        for sid in (*self.opts.gated_streams, *self.opts.streams):
            if sid in domains:
                self._clock_domain = domains[sid]
                break
        return out

    def _decode(self, doc: dict) -> PulseOffset:
        try:
            return PulseOffset.from_json(doc, self.opts.streams)
        except PulseOffsetError as exc:
            reject(Opt.batching, f"checkpointed offset unusable: {exc}")

    # --- Spark API ------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return self._planner.initial(self._scan(), self.opts.starting.for_stream).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {
            sid: (sc.epoch, sc.head) for sid, sc in self._scan().items() if sc is not None
        }

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._decode(start)
        scans = self._scan()
        late, spooled = self._late_losses()
        adv = self._planner.advance(
            begin,
            scans,
            target=self._target,
            late=late,
            wall_offset_ns=mapped_rings.wall_clock_offset_ns(self._clock_domain),
            heads=self._heads,
        )
        if adv.losses and self.opts.fail_on_data_loss:
            raise TensorPoolDataLossError(pulse_loss_message(adv.losses))
        if adv.offset is None:
            return start  # no window closed: Spark runs no batch
        if adv.losses:
            log.warning("%s [skipped: failOnDataLoss=false]", pulse_loss_message(adv.losses))
        self._losses_recorded(spooled)  # now in the offset's lostLate
        return adv.offset.to_json()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        fin = self._decode(end)
        window = fin.window
        if window is None:
            return []
        att = self._att
        if att is None:
            self._scan()  # a restarted query plans the logged batch before asking for offsets
            att = self._attach()
        opts = self.opts
        out: list[InputPartition] = []
        for sid in sorted(fin.streams):
            by_epoch: dict[int, list[tuple[int, int]]] = {}
            for epoch, first, stop in fin.streams[sid].frames:
                by_epoch.setdefault(epoch, []).append((first, stop))
            for epoch, runs in sorted(by_epoch.items()):
                spec = self._specs.get((sid, epoch))
                if spec is None:
                    log.warning(
                        "tensorpool: stream %d epoch %d is not announced any more; its frames "
                        "of window %d cannot be read",
                        sid,
                        epoch,
                        window.index,
                    )
                out.append(
                    PulsePartition(
                        spec,
                        sid,
                        epoch,
                        runs[0][0],
                        runs[-1][1],
                        opts.fail_on_data_loss,
                        opts.include_tensor_metadata,
                        self._spool,
                        np.asarray(runs, np.int64),
                        origin=None if spec is None else att.origin(spec),
                        reader=att.reader_for(sid),
                        window_index=window.index,
                        window_start_ns=window.start_ns,
                        window_end_ns=window.end_ns,
                        wall_offset_ns=window.wall_offset_ns,
                    )
                )
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_pulse_partition(partition, self._base_schema, self._schema)

    def commit(self, end: dict) -> None:
        log.debug("tensorpool: committed window %s", end.get("window"))


__all__ = [
    "WINDOW_DDL",
    "PulsePartition",
    "PulseStreamReader",
    "pulse_arrow_schema",
    "pulse_schema_ddl",
    "pulse_struct_type",
    "read_pulse_partition",
]
