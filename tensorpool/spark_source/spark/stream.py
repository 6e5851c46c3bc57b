"""``spark.readStream.format("tensorpool")``: the micro-batch reader (#27.2: split from
:mod:`.source`, which has the schema, the partitions, the executor read and the batch reader).

``initialOffset``/``latestOffset``/``partitions``/``commit`` run in one long-lived Python
process on the Spark driver, which holds the query's rings, a
:class:`~tensorpool.spark_source.rings.port.RingSource` (opened lazily, never in ``__init__``:
the reader is built on executors too). Each ``latestOffset`` is one
:class:`~tensorpool.spark_source.plan.trigger.Trigger` step over the rings' scans;
``partitions`` replays a logged batch exactly (see :mod:`tensorpool.spark_source.plan.offsets`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from pyspark.sql.datasource import (
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

from tensorpool.spark_source.options import (
    EARLIEST,
    ON_STALE_WARN,
    SourceOptions,
)
from tensorpool.spark_source.plan.health import HealthMonitor
from tensorpool.spark_source.plan.offsets import (
    NOT_STARTED,
    OVERWRITTEN,
    REGIONS_GONE,
    Limits,
    Loss,
    OffsetError,
    Range,
    RingState,
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
from tensorpool.spark_source.plan.planner import Plan, StreamPlanner
from tensorpool.spark_source.plan.policy import SourcePolicy
from tensorpool.spark_source.plan.trigger import Trigger, TriggerInput
from tensorpool.spark_source.rings import discovery, mapped_rings, spool, stream_meta, timestamps
from tensorpool.spark_source.rings.attach import StreamsNotAttached
from tensorpool.spark_source.rings.port import RingSource, open_rings
from tensorpool.spark_source.spark.loss_text import explicit_start_hint
from tensorpool.spark_source.spark.source import (
    FramePartition,
    TensorPoolDataLossError,
    arrow_schema,
    earliest_start,
    flags_late,
    read_partition,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("tensorpool.spark_source")


# --- streaming -----------------------------------------------------------------------------------
class RingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """What the plain and the pulse micro-batch readers share, the reader lifecycle once: the
    options; the query's rings (a :class:`~tensorpool.spark_source.rings.port.RingSource`,
    mapped here or served by ``tensorpool serve`` -- the readers never ask which) opened on
    the Spark driver at first use, with the spool executors report read-time loss to; the
    stream epochs' regions seen; read-time loss until an offset records it; release at
    ``stop``."""

    #: names the reader's spool (:func:`~tensorpool.spark_source.rings.spool.make_spool`)
    SPOOL_KIND = ""
    #: whether the rings keep the streams' received descriptors (:meth:`RingSource.feed`)
    DESCRIPTORS = True

    def __init__(self, opts: SourceOptions) -> None:
        # Runs on executors too (one per task): keep it free of I/O.
        self.opts = opts
        self._att: RingSource | None = None  # the rings, opened on the driver at first use
        self._specs: dict[tuple[int, int], mapped_rings.RegionSpec] = {}
        self._spool: str | None = None

    def _attach(self) -> RingSource:
        if self._att is None:
            # #18: with 'hosts', each host's server (no Aeron here)
            self._att = open_rings(self.opts, descriptors=self.DESCRIPTORS)
            self._spool = spool.make_spool(self.opts.connection.shm_base_dir, self.SPOOL_KIND)
        return self._att

    def _scan_rings(self) -> dict[int, RingState | None]:
        """Every stream's ring now; each stream epoch's region goes to ``_specs``."""
        return self._attach().scan(self.opts.streams, self._specs)

    def _late_losses(self) -> tuple[dict[int, int], list[str]]:
        """Read-time loss per stream no offset has recorded yet: spooled by tasks that read
        mapped rings, and (#18) counted by the servers for tasks that read over Flight. Pass
        the second value to :meth:`_losses_recorded` once an offset holds the counts."""
        late, spooled = spool.collect(self._spool, self.opts.streams)
        if not self.opts.fail_on_data_loss:
            for sid, n in self._attach().take_losses(self.opts.streams).items():
                late[sid] = late.get(sid, 0) + n
        return late, spooled

    def _losses_recorded(self, spooled: list[str]) -> None:
        spool.forget(spooled)
        self._attach().forget_losses()

    def stop(self) -> None:
        att, self._att = self._att, None
        if att is not None:
            att.close()
        spool.remove_spool(self._spool)
        self._spool = None


class TensorPoolStreamReader(RingStreamReader):
    """Micro-batch reader with offsets, admission control, AvailableNow and loss handling."""

    def __init__(self, opts: SourceOptions) -> None:
        super().__init__(opts)
        self._schema = arrow_schema(opts.include_tensor_metadata, opts.include_stream_metadata)
        self._meta: stream_meta.MetaTracker | None = None  # includeStreamMetadata (#16.4)
        self._meta_waited: set[int] = set()
        self._planner: StreamPlanner | None = None
        self._states: dict[int, RingState | None] = {}
        self._late_extra: dict[int, int] = {}  # loss found by partitions() (replays)
        self._initial: dict | None = None  # initialOffset, resolved once (#16.1)
        #: health (#16.2), minFramesPerTrigger (#16.4), policy and planner: from the first
        #: latestOffset on
        self._trigger: Trigger | None = None
        self._discovery: discovery.StreamDiscovery | None = None  # streams="*" / a range
        # #17: event time, admission, adaptive sizing (.policy); is_late with lateFrames=flag
        self._policy = SourcePolicy(opts.policy) if opts.policy is not None else None
        if flags_late(opts):
            self._schema = arrow_schema(
                opts.include_tensor_metadata, opts.include_stream_metadata, True
            )

    # --- driver-side plumbing -------------------------------------------------------------------
    def _attach(self) -> RingSource:
        att = self._att
        if att is None:
            att = super()._attach()
            opts = self.opts
            if opts.stream_pattern is not None:
                opts = self._discover_initial(att)
            start_at = {
                sid: spec
                for sid in opts.streams
                if isinstance(spec := opts.starting.for_stream(sid), str)
            }
            self._planner = StreamPlanner(opts.streams, start_at)
        return att

    # --- stream discovery (streams="*" / "lo-hi", #16.4) -----------------------------------------
    def _discover_initial(self, att: RingSource) -> SourceOptions:
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
        states = self._scan_rings()
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
        assert att is not None
        now = time.monotonic_ns()
        late, spooled = self._late_losses()
        for sid, n in self._late_extra.items():  # found by partitions() (a replay)
            late[sid] = late.get(sid, 0) + n
        step = self._trigger_state().step(
            opts.streams,
            TriggerInput(
                begin,
                states,
                self._limits(limit),
                isinstance(limit, ReadAllAvailable),
                late,
                att.liveness(now),
                {sid: self._newest_wall_ns(sid, states.get(sid)) for sid in opts.streams},
                self._wall_shifts(states),
                att.feed(),
                now,
                time.time_ns(),
            ),
        )
        plan = step.plan
        if plan is None:
            return start  # the same offset: Spark runs no batch (minFramesPerTrigger)
        self._late_extra = {}
        self._losses_recorded(spooled)  # in this plan's lostLate
        self._report_plan(plan, begin, states)
        if opts.stream_pattern is not None:
            # a discovered stream enters the offset once it has begun (no empty batch before)
            for sid in [k for k, p in plan.end.items() if p.epoch == NOT_STARTED]:
                if str(sid) not in start:
                    del plan.end[sid]
        return encode_offsets(plan.end)

    def _limits(self, limit: ReadLimit) -> Limits:
        """Spark's read limit with the options' per-trigger caps."""
        opts = self.opts
        if isinstance(limit, ReadAllAvailable):
            return Limits()
        if isinstance(limit, ReadMaxRows):
            return Limits(limit.max_rows, opts.max_bytes_per_trigger)
        if isinstance(limit, ReadMaxBytes):
            return Limits(opts.max_frames_per_trigger, limit.max_bytes)
        return Limits(opts.max_frames_per_trigger, opts.max_bytes_per_trigger)

    def _trigger_state(self) -> Trigger:
        trig = self._trigger
        if trig is None:
            opts, ch = self.opts, self.opts.connection
            assert self._planner is not None
            warn = opts.on_stale_stream == ON_STALE_WARN
            min_frames = opts.min_frames_per_trigger
            trig = self._trigger = Trigger(
                self._planner,
                HealthMonitor(opts.stale_stream_timeout_ms, warn),
                f"control {ch.control_channel} stream {ch.control_stream_id}, Aeron dir "
                f"{ch.aeron_dir or 'embedded'}, shmBaseDir {ch.shm_base_dir}"
                + (" (through the SHM driver)" if ch.driver else ""),
                None if min_frames is None else (min_frames, opts.max_trigger_delay_ms),
                self._policy,
            )
        return trig

    def _report_plan(
        self, plan: Plan, begin: dict[int, StreamPos], states: dict[int, RingState | None]
    ) -> None:
        """Log what the plan found; with ``failOnDataLoss``, fail on counted loss."""
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
            if self.opts.fail_on_data_loss:
                raise TensorPoolDataLossError(message)
            log.warning("%s [skipped: failOnDataLoss=false]", message)

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
        if self._trigger is None:
            return None
        report = self._trigger.health.report(self.opts.streams, time.monotonic_ns(), time.time_ns())
        if self._policy is not None:  # #17: watermarks, jitter, tokens, batch budget
            per, src = self._policy.report(self.opts.streams)
            for sid, entry in per.items():
                report.setdefault(str(sid), {}).update(entry)
            report["source"] = src
        return report

    def _newest_wall_ns(self, sid: int, st: RingState | None) -> int | None:
        """Wall-clock time of the newest frame's ``timestamp_ns`` in the scan (health only;
        a served stream's stamps arrive on this host's clock)."""
        spec = None if st is None else self._specs.get((sid, st.epoch))
        if st is None or st.empty or st.stamps is None or spec is None:
            return None
        ts = int(st.stamps[(st.head - 1) & (st.nslots - 1)])
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
        assert att is not None
        origins = {
            (r.stream_id, r.epoch): att.origin(self._specs[(r.stream_id, r.epoch)]) for r in ranges
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
                opts.fail_on_data_loss,
                opts.include_tensor_metadata,
                self._spool,
                p.runs,
                self._stream_meta(p.stream_id, p.epoch),
                origins[(p.stream_id, p.epoch)],
                p.stream_id in first_earliest,
                reader=att.reader_for(p.stream_id),
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
            assert self._att is not None
            st = self._att.scan_one(sid, spec)  # #18: or the serving host's scan
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


__all__ = ["RingStreamReader", "TensorPoolStreamReader"]
