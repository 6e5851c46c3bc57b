"""One mapping's data path: source consumer -> rate gate -> destination producer.

A :class:`MappingRelay` owns the source :class:`~tensorpool.client.Consumer` (attached as
CONSUMER of the source stream), the destination :class:`~tensorpool.client.Producer`
(attached as the destination's exclusive PRODUCER, §3) and the mapping's
:class:`~tensorpool.ratelimiter.gate.RateGate`. Per duty cycle (:meth:`MappingRelay.do_work`):

1. drain the source (every descriptor waiting in the log): each one the consumer accepts
   (epoch, sequence and seqlock checks are the consumer's, Wire Spec §10.2.1) is *offered*
   to the gate. Unlimited mode
   publishes it on the spot from the zero-copy view; otherwise it becomes the pending frame.
   A consumer remap (new source epoch, or a remap of the same epoch) is a remap boundary:
   the pending frame is dropped and the timer reset before any frame of the new mapping is
   offered (§4, §7);
2. drive the destination producer (lease keepalive, hellos); a new destination epoch is a
   remap boundary too;
3. if the gate says the slot is open, publish the pending frame.

Holding the pending frame (``hold``):

* ``descriptor`` keeps only the source descriptor fields and copies the payload straight from
  source SHM when the slot opens: one copy per *published* frame. Between slots the agent
  sleeps (:mod:`tensorpool.ratelimiter.idle`) and, when it wakes, drains the descriptors that
  queued up, so the frame it publishes is at most about one source period old. The
  frame can only be gone if the source wrote a whole ring's worth of frames we have not seen;
  that publish then fails (``source_overwritten``), the slot stays open and the next frame to
  arrive goes out at once.
* ``copy`` copies every offered frame into a held buffer (one copy per *source* frame) and
  publishes from it; nothing can overwrite it. This is the costly alternative, kept to be
  measured against (``bench/bench_ratelimiter.py``) and for sources that need it.
* ``auto`` (default) is ``descriptor`` until :data:`AUTO_SWITCH_LOSSES` held frames in a row
  were overwritten in the source ring before their slot opened (a ring too shallow for the
  hold time); from then on, after each drain that leaves a frame waiting for a closed slot,
  that one frame is copied (once per wait, not per source frame). A source remap starts over.

Re-materialization (§5), for the frame chosen: validate the source slot again (epoch,
seqlock, header: :meth:`~tensorpool.client.Consumer.reread`); claim the destination slot
for the *source* seq in the smallest pool whose stride holds the source's ``values_len_bytes``
(no fit: ``no_pool_fits``); copy the payload; confirm the source slot did not change during
the copy (§5.1 seqlock re-check; else ``source_torn`` and the claim is abandoned
uncommitted); write the header with the source ``timestamp_ns``,
``meta_version`` and ``values_len_bytes`` (kept as is, #14.3: also 0 for an empty payload with
non-zero dims, or more than the tensor extent, whose extra bytes are zeroed) and the
destination's pool/slot; commit; publish the descriptor. Nothing
here waits: a destination without a lease (``dest_not_attached``) drops the frame at once.

Sequence identity (§4): destination seq = source seq, so gaps stay gaps. A destination seq
must not go backwards within an epoch (Wire Spec §15.2), so when a *restarted* source (new
epoch, seq from 0) would go below the destination's next seq, the relay gives up the
destination lease and attaches again: the driver opens a new destination epoch (a remap
for destination consumers) and numbering continues from the source's seq. The frame that
triggered it is dropped (``dest_seq_regression``) as an in-flight frame of the old mapping.
The rollover does not wait (#14.3, §5 "MUST NOT block"): the detach goes out without
waiting for its answer and the new attach completes in later duty cycles, so the other
mappings (and their leases' keepalives) are served throughout; frame handling never waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import numpy as np

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer
from tensorpool.counters import LATE_REASONS, DropCounters
from tensorpool.ratelimiter.config import MappingConfig
from tensorpool.ratelimiter.gate import RateGate
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs.generated.wire import Dtype, MajorOrder

log = logging.getLogger(__name__)

__all__ = ["AUTO_SWITCH_LOSSES", "MappingRelay", "Pending", "RelayStats"]

#: Wait between attempts to reattach as the destination's producer after a failed rollover.
REATTACH_RETRY_NS: Final = 1_000_000_000
#: Consumer polls per duty cycle at most (x ``poll_limit`` frames) when draining the log.
MAX_POLL_ROUNDS: Final = 64
#: Held frames lost in a row to a source ring overwrite before ``auto`` starts copying (a held
#: frame read back intact resets the count; frames that never waited say nothing about it).
AUTO_SWITCH_LOSSES: Final = 3

# Stable drop reasons (RateLimiter §5, §7); the gate adds "superseded" and "discarded_on_reset".
SOURCE_NOT_MAPPED: Final = "source_not_mapped"
SOURCE_OVERWRITTEN: Final = "source_overwritten"
SOURCE_INVALID: Final = "source_invalid"
SOURCE_TORN: Final = "source_torn"
NO_POOL_FITS: Final = "no_pool_fits"
DEST_NOT_ATTACHED: Final = "dest_not_attached"
DEST_SEQ_REGRESSION: Final = "dest_seq_regression"


class Pending(NamedTuple):
    """What the gate holds for a frame: its descriptor fields, plus a copy in ``copy`` mode."""

    epoch: int
    seq: int
    header_index: int
    held: HeldFrame | None
    waited: bool
    """Offered while its slot was closed: only such frames tell whether holding is safe."""


class HeldFrame(NamedTuple):
    layout: TensorLayout
    timestamp_ns: int
    meta_version: int
    nbytes: int


@dataclass(slots=True)
class RelayStats:
    published: int = 0
    published_bytes: int = 0
    copies: int = 0
    """Payload copies made (published frames, plus held copies in ``copy`` mode)."""
    source_remaps: int = 0
    dest_epochs: int = 0
    dest_rollovers: int = 0
    hold_switches: int = 0
    drops: DropCounters = field(default_factory=DropCounters)


class MappingRelay:
    """The data path of one mapping (use from the agent's thread only)."""

    def __init__(
        self,
        mapping: MappingConfig,
        consumer: Consumer,
        open_dest: Callable[[], Producer],
        *,
        hold: str = "auto",
        clock: Callable[[], int],
        poll_limit: int = 256,
        on_dest_epoch: Callable[[MappingRelay], object] | None = None,
    ) -> None:
        self.mapping = mapping
        self.consumer = consumer
        self._open_dest = open_dest
        self.producer: Producer | None = open_dest()
        self.gate: RateGate[Pending] = RateGate(
            mapping.max_rate_hz, name=f"ratelimiter.{mapping.source_stream_id}"
        )
        self.hold = hold
        self._copy_each = hold == "copy"  # copy every offered frame (the costly alternative)
        self._guard = False  # auto fallback: copy the frame that has to wait, once per wait
        self._guarded: tuple[int, int, HeldFrame] | None = None  # (epoch, seq, copy)
        self._last_offered: Pending | None = None
        self._losses = 0
        self._clock = clock
        self._poll_limit = poll_limit
        self._on_dest_epoch = on_dest_epoch
        self.stats = RelayStats()
        self._remaps = consumer.stats.remaps
        self._source_epoch: int | None = None
        self._gen = 0  # bumps at every source remap
        self._gen_at_publish = 0
        self._dest_epoch = 0
        self._rollover_due = False
        self._retry_dest_ns = 0
        self._held_u8 = np.empty(0, np.uint8)
        self._now = 0
        self._on_frame_bound = self._on_frame
        self._check_dest(clock())

    # --- duty cycle -------------------------------------------------------------------------
    def do_work(self, now: int) -> int:
        self._now = now
        # Drain every descriptor waiting in the log before asking the gate, so the frame
        # published when a slot opens is the newest one available (bounded: never starve).
        if self.gate.rate_hz and not self._copy_each:
            work = self._intake_batches()  # descriptor hold: no payload read at intake
        else:
            poll, handler, limit = self.consumer.poll, self._on_frame_bound, self._poll_limit
            work = n = poll(handler, limit)
            rounds = 1
            while n == limit and rounds < MAX_POLL_ROUNDS:
                n = poll(handler, limit)
                work += n
                rounds += 1
        if self.consumer.stats.remaps != self._remaps:
            self._source_remapped(now)
        if self._rollover_due:
            self._rollover(now)
            work += 1
        elif self.producer is None and now >= self._retry_dest_ns:
            self._reopen_dest(now)
            work += 1
        work += self._check_dest(now)
        gate = self.gate
        if gate.has_pending:
            item = gate.poll(now)
            if item is not None:
                work += 1
                if self._publish_pending(item):
                    gate.published(now)
            elif self._guard:
                self._guard_pending()
        return work

    @property
    def source_epoch(self) -> int | None:
        return self._source_epoch

    @property
    def dest_epoch(self) -> int:
        """The destination epoch (0 while not attached)."""
        return self._dest_epoch

    @property
    def copying(self) -> bool:
        """True when pending frames are held as copies (``copy``, or ``auto`` after a switch)."""
        return self._copy_each or self._guard

    # --- source side ------------------------------------------------------------------------
    def _source_remapped(self, now: int) -> None:
        """§4/§7: a source remap drops the pending frame and resets the rate timer."""
        self._remaps = self.consumer.stats.remaps
        self._source_epoch = self.consumer.epoch
        self._gen += 1
        self.stats.source_remaps += 1
        self.gate.reset(now)
        self._losses = 0
        self._guard = False
        self._guarded = None
        self._last_offered = None

    def _intake_batches(self) -> int:
        """The rate-limited intake on the consumer's batch path (#15): each accepted frame is
        offered to the gate as its descriptor fields, as :meth:`_on_frame` does, but the
        slots of a whole drain are validated with a few numpy operations, not ~10 Python
        calls per frame. The payload is read only when a frame is published."""
        consumer = self.consumer
        gate = self.gate
        limit = self._poll_limit
        now = self._now
        work = 0
        for _ in range(MAX_POLL_ROUNDS):
            batch = consumer.poll_batch(limit)
            n = len(batch)
            if not n:
                break
            if batch.confirm():
                if consumer.stats.remaps != self._remaps:
                    self._source_remapped(now)
                epoch = batch.epoch
                item = None
                for k in np.flatnonzero(batch.valid).tolist():
                    item = Pending(
                        epoch,
                        int(batch.seqs[k]),
                        int(batch.header_index[k]),
                        None,
                        not gate.is_open(now),
                    )
                    gate.offer(item, now)
                if item is not None:
                    self._last_offered = item
            work += n
            if n < limit:
                break
        return work

    def _on_frame(self, frame: Frame) -> None:
        # Runs inside Consumer.poll for every accepted descriptor.
        if self.consumer.stats.remaps != self._remaps:
            self._source_remapped(self._now)
        gate = self.gate
        if not gate.rate_hz:  # unlimited: publish from the zero-copy view right away
            gate.stats.offered += 1
            view = frame.array if frame.values_len_bytes else None
            if self._remat(
                frame.seq,
                frame.layout,
                view,
                frame.timestamp_ns,
                frame.meta_version,
                frame.values_len_bytes,
                frame.is_current,
            ):
                gate.published(self._now)
            return
        held = None
        if self._copy_each:
            held = self._hold_copy(
                frame.layout,
                frame.array,
                frame.values_len_bytes,
                frame.timestamp_ns,
                frame.meta_version,
                frame.is_current,
            )
            if held is None:
                self.gate.discard_pending()  # its held bytes were overwritten by this copy
                return
        now = self._now
        item = Pending(frame.epoch, frame.seq, frame.header_index, held, not gate.is_open(now))
        self._last_offered = item
        gate.offer(item, now)

    def _hold_copy(
        self,
        layout: TensorLayout,
        src: np.ndarray | None,
        nbytes: int,
        timestamp_ns: int,
        meta_version: int,
        confirm: Callable[[], bool],
    ) -> HeldFrame | None:
        """Copy a frame into the held buffer; None (counted) if it changed during the copy."""
        if nbytes and src is not None:
            extent = layout.extent_bytes
            if self._held_u8.size < extent:
                self._held_u8 = np.empty(max(extent, 2 * self._held_u8.size), np.uint8)
            np.copyto(layout.view(self._held_u8, 0), src)
            self.stats.copies += 1
            if not confirm():
                self.stats.drops.increment(SOURCE_TORN)
                return None
        return HeldFrame(layout, timestamp_ns, meta_version, nbytes)

    def _guard_pending(self) -> None:
        """``auto`` after a switch: the pending frame must wait for its slot, so copy it now,
        once (not every frame that passes by: only the newest one after a drain)."""
        item = self._last_offered
        guarded = self._guarded
        if item is None or (
            guarded is not None and guarded[0] == item.epoch and guarded[1] == item.seq
        ):
            return
        consumer = self.consumer
        read = consumer.reread(item.epoch, item.seq, item.header_index)
        if read is None:
            self.gate.discard_pending()
            self._count_lost(consumer.epoch != item.epoch, consumer.last_read_drop_reason)
            return
        held = self._hold_copy(
            read.layout,
            read.array,
            read.values_len_bytes,
            read.timestamp_ns,
            read.meta_version,
            lambda: consumer.confirm(read),
        )
        if held is None:
            self.gate.discard_pending()
            self._guarded = None
            return
        self._guarded = (item.epoch, item.seq, held)

    def _publish_pending(self, item: Pending) -> bool:
        held = item.held
        guarded = self._guarded
        if held is None and guarded is not None:
            if guarded[0] == item.epoch and guarded[1] == item.seq:
                held = guarded[2]
            self._guarded = None
        if held is not None:
            view = layout_view(held.layout, self._held_u8) if held.nbytes else None
            return self._remat(
                item.seq,
                held.layout,
                view,
                held.timestamp_ns,
                held.meta_version,
                held.nbytes,
                _always,
            )
        consumer = self.consumer
        read = consumer.reread(item.epoch, item.seq, item.header_index)
        if read is None:
            self._count_lost(consumer.epoch != item.epoch, consumer.last_read_drop_reason)
            return False
        if item.waited:
            self._losses = 0
        return self._remat(
            item.seq,
            read.layout,
            read.array,
            read.timestamp_ns,
            read.meta_version,
            read.values_len_bytes,
            lambda: consumer.confirm(read),
        )

    def _count_lost(self, unmapped: bool, reason: str | None) -> None:
        drops = self.stats.drops
        if unmapped:
            drops.increment(SOURCE_NOT_MAPPED)
            return
        if reason not in LATE_REASONS:
            drops.increment(SOURCE_INVALID)
            return
        drops.increment(SOURCE_OVERWRITTEN)
        self._losses += 1
        if self.hold == "auto" and not self._guard and self._losses >= AUTO_SWITCH_LOSSES:
            self._guard = True
            self.stats.hold_switches += 1
            log.warning(
                "stream %d: %d pending frames overwritten in the source ring before their slot "
                "opened; holding copies from now on",
                self.mapping.source_stream_id,
                self._losses,
            )

    # --- destination side -------------------------------------------------------------------
    def _remat(
        self,
        seq: int,
        layout: TensorLayout,
        src: np.ndarray | None,
        timestamp_ns: int,
        meta_version: int,
        values_len: int,
        confirm: Callable[[], bool],
    ) -> bool:
        """§5 steps 2-6 for one frame; False (counted) when it is dropped."""
        drops = self.stats.drops
        producer = self.producer
        if producer is None or not producer.attached:
            drops.increment(DEST_NOT_ATTACHED)
            return False
        if seq < producer.next_seq:
            drops.increment(DEST_SEQ_REGRESSION)
            if self._gen != self._gen_at_publish:
                self._rollover_due = True  # a restarted source: new destination epoch
            return False
        extent = layout.extent_bytes
        if values_len == extent:
            claim = producer.claim(layout=layout, seq=seq)
        else:
            # #14.3: the source's values_len_bytes is kept (Wire §8.2 allows 0 with non-zero
            # dims, or more than the extent): claim the payload length as raw bytes, so the
            # pool is the smallest that holds it (§5 step 2), and write the tensor into it
            claim = producer.claim(layout=raw_layout(values_len), seq=seq)
        if claim is None:
            drops.increment(NO_POOL_FITS if producer.attached else DEST_NOT_ATTACHED)
            return False
        if src is not None:
            if values_len == extent:
                np.copyto(claim.array, src)
            else:  # bytes past the extent are not described by the header: zeros, not stale
                raw = claim.array
                np.copyto(layout.view(raw, 0), src)
                raw[extent:] = 0
                claim.layout = layout
            self.stats.copies += 1
        elif values_len != extent:
            claim.layout = layout  # an empty payload: the header still carries the dims
        if not confirm():
            drops.increment(SOURCE_TORN)
            return False  # the claim stays uncommitted; readers of that slot drop it
        if (
            producer.commit(
                claim,
                timestamp_ns=timestamp_ns,
                meta_version=meta_version,
                values_len_bytes=values_len,
            )
            is None
        ):
            drops.increment(DEST_NOT_ATTACHED)
            return False
        stats = self.stats
        stats.published += 1
        stats.published_bytes += values_len
        self._gen_at_publish = self._gen
        return True

    def _check_dest(self, now: int) -> int:
        producer = self.producer
        if producer is None:
            return 0
        work = producer.do_work(now)
        epoch = producer.epoch if producer.attached else 0
        if epoch != self._dest_epoch:
            self._dest_epoch = epoch
            if epoch:
                self.stats.dest_epochs += 1
                self.gate.reset(now)  # a destination remap: the next frame goes out at once
                log.info(
                    "mapping %d -> %d: destination epoch %d",
                    self.mapping.source_stream_id,
                    self.mapping.dest_stream_id,
                    epoch,
                )
            if self._on_dest_epoch is not None:
                self._on_dest_epoch(self)
            work += 1
        return work

    def _rollover(self, now: int) -> None:
        """Give up the destination epoch and attach again (the driver opens a new one).

        Asynchronous (#14.3, RateLimiter §5 "MUST NOT block"): the detach is sent without
        waiting for its response, and ``open_dest`` returns a producer whose attach is still
        in flight; later duty cycles (:meth:`_check_dest`) see it attach. Meanwhile this
        mapping's frames drop as ``dest_not_attached`` and every other mapping is served.
        """
        self._rollover_due = False
        self.stats.dest_rollovers += 1
        old = self.producer
        self.producer = None
        if old is not None:
            old.close(detach_timeout_ns=0)
        self._dest_epoch = 0
        if self._on_dest_epoch is not None:
            self._on_dest_epoch(self)
        self._gen_at_publish = self._gen
        self._reopen_dest(now)

    def _reopen_dest(self, now: int) -> None:
        try:
            self.producer = self._open_dest()
        except Exception as exc:  # AttachError, driver gone: frames drop until a retry works
            self._retry_dest_ns = now + REATTACH_RETRY_NS
            log.error(
                "stream %d: cannot reattach as producer (retry in %.0f s): %s",
                self.mapping.dest_stream_id,
                REATTACH_RETRY_NS / 1e9,
                exc,
            )
            return
        self._check_dest(now)

    def close(self) -> None:
        self.consumer.close()
        if self.producer is not None:
            self.producer.close()
            self.producer = None


def _always() -> bool:
    return True


_RAW_LAYOUTS: dict[int, TensorLayout] = {}


def raw_layout(nbytes: int) -> TensorLayout:
    """``nbytes`` plain bytes: the claim for a payload whose length is not the extent."""
    layout = _RAW_LAYOUTS.get(nbytes)
    if layout is None:
        if len(_RAW_LAYOUTS) >= 64:
            _RAW_LAYOUTS.clear()
        layout = _RAW_LAYOUTS[nbytes] = TensorLayout(
            int(Dtype.UINT8), int(MajorOrder.ROW), (nbytes,)
        )
    return layout


def layout_view(layout: TensorLayout, buf: np.ndarray) -> np.ndarray:
    """``layout`` over the start of ``buf`` (the held copy)."""
    return layout.view(buf, 0)
