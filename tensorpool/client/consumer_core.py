"""The consumer's protocol rules, sans-IO: decoded messages and ``now_ns`` in, actions out.

:class:`ConsumerCore` decides; :class:`~tensorpool.client.consumer.Consumer` (the agent) owns
the Aeron subscriptions, the mappings and the clock, and executes what the core returns. The
shape is the driver's (``driver/core.py`` + ``driver/actions.py``, see docs/architecture.md):
no Aeron, mmap, file or clock inside, so every rule below has a unit test in
``tests/unit/client/test_consumer_core.py``.

Announces (Wire §10.1.1, §15.1, §15.14, §15.21; Driver Model §2.3, §4.9)
    :meth:`ConsumerCore.on_announce` filters through
    :class:`~tensorpool.client.announce.AnnounceTracker` and answers ``None`` (ignored and
    counted), :class:`CheckMapping` (same epoch: the agent re-validates the live mapping --
    truncation, superblock ``magic``/``epoch`` (§15.1 "on every announce"), ``pid`` (§15.14),
    activity -- and reports with :meth:`~ConsumerCore.on_mapping_checked`) or :class:`MapEpoch`
    (a newer epoch). For :class:`MapEpoch` the agent maps and validates the *new* regions while
    the current mapping keeps serving frames, then reports :meth:`~ConsumerCore.on_mapped` (and
    only then swaps) or :meth:`~ConsumerCore.on_map_failed` (the current mapping stays): a
    bogus announce costs no frame (#14 section 2).

Descriptors (Wire §10.2.1, §15.2, §15.4, §11) -- the hot path
    :meth:`~ConsumerCore.on_descriptor` returns a small int: ``READ`` (read the slot), ``SKIP``
    (dropped and counted, or another stream's), or ``CHECK``: the seq is not the next one (the
    first since the join, a gap, a regression), so before it may move any counter the agent
    passes what the ring holds to :meth:`~ConsumerCore.on_slot_check`. The common case
    (``seq == last + 1``) costs a few compares and no allocation. Rules:

    * epoch filter: a descriptor whose epoch is not the mapped one is dropped (§10.2.1);
    * join: descriptors of frames committed before the mapping (queued in the Aeron log while
      the consumer was unmapped) are ``before_join``, not gaps: counting starts at the ring's
      head at join time (§15.4 counts what *this* consumer missed);
    * revoke (issue #28 point 4): a producer revocation, real or forged, unmaps at once; the
      frames of the revoked epoch after the last one seen are lost *to the revoke*, whether
      they arrive as the mismatched epoch after a real revoke moved us to a new epoch, or
      below the join head after a forged one was contradicted and the same epoch mapped again.
      They are ``revoked`` drops and count in ``drops_gap`` (QoS), one per descriptor at a
      rising seq, until the first frame of the next mapping is accepted;
    * plausibility: a descriptor for a frame the ring has never held (its slot holds an older
      seq: descriptors follow the commit, §10.2.1) is ``seq_implausible`` and changes nothing;
      a gap is counted only for plausible seqs, so a forged ``seq = 2**62`` cannot push
      ``drops_gap`` to 4.6e18;
    * regression (§15.2): a lower or repeated seq forces a remap only when the ring proves it
      (the slot of the last seen frame went backwards); otherwise it is a stale or forged
      descriptor, dropped as ``seq_stale`` -- a forged ``seq = 0`` no longer costs a remap;
    * ``max_outstanding_seq_gap`` resync (§15.4) and the local rate grid of ``RATE_LIMITED``
      mode (§11), which is the rate limiter's :class:`~tensorpool.client.rate_gate.RateGate`.

Lease (Driver Model §2.3, §4.9, §10)
    :meth:`~ConsumerCore.on_lease_event` maps on ``Attached``, unmaps on ``LeaseLost``, and on
    ``ProducerRevoked`` unmaps and waits for the epoch-bumped announce (the revoked epoch is
    never mapped again).

Cadence
    :meth:`~ConsumerCore.tick` returns the announce-timeout unmap, ``ConsumerHello`` (after
    each mapping, until sent; a RATE_LIMITED consumer without a stream of its own every QoS
    period, to ask again) and ``QosConsumer`` (every ``qos_period_ns``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from tensorpool.client.announce import CLOCK_MONOTONIC, AnnounceTracker, StreamLayout, Verdict
from tensorpool.client.lease import Attached, LeaseLost, ProducerRevoked
from tensorpool.client.rate_gate import RateGate
from tensorpool.counters import LATE_REASONS, DropCounters

MODE_STREAM: Final = 1
MODE_RATE_LIMITED: Final = 2
DEFAULT_MAX_OUTSTANDING_SEQ_GAP: Final = 256

# --- descriptor verdicts (plain ints: the hot path compares them) -----------------------------
READ: Final = 0
SKIP: Final = 1
CHECK: Final = 2
REMAP: Final = 3

# --- reasons the consumer adds on top of the slot reader's --------------------------------------
NOT_MAPPED: Final = "not_mapped"
EPOCH_MISMATCH: Final = "epoch_mismatch"
SEQ_REGRESSION: Final = "seq_regression"
SEQ_STALE: Final = "seq_stale"
SEQ_IMPLAUSIBLE: Final = "seq_implausible"
BEFORE_JOIN: Final = "before_join"
REVOKED: Final = "revoked"
RESYNC: Final = "resync"
RATE_LIMITED: Final = "rate_limited"
AFTER_HANDLER_ERROR: Final = "after_handler_error"
# mapping re-validation outcomes (control counters), see CheckMapping
SUPERBLOCK_MAGIC_CHANGED: Final = "superblock_magic_changed"
SUPERBLOCK_EPOCH_CHANGED: Final = "superblock_epoch_changed"
SUPERBLOCK_PID_CHANGED: Final = "superblock_pid_changed"
ACTIVITY_STALE: Final = "superblock_activity_stale"

_MAX_SEGMENTS: Final = 4096
_NO_SEQ: Final = -2  # "no seq seen since the join": last + 1 never equals a real (u64) seq
_SEC: Final = 1_000_000_000
_NOTHING: Final[tuple[()]] = ()


# --- actions ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MapEpoch:
    """Map and validate ``layout``'s regions *beside* the current mapping, then report
    ``on_mapped`` (and swap) or ``on_map_failed`` (keep the current mapping)."""

    layout: StreamLayout


@dataclass(frozen=True, slots=True)
class CheckMapping:
    """Re-validate the live mapping of ``epoch`` and report ``on_mapping_checked``: file
    truncated (#13.4), superblock ``magic`` or ``epoch`` changed (§15.1, §15.14 recreation),
    ``pid`` changed (§15.14 single writer), activity stale (§15.1)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Unmap:
    """Close the current mapping (the core already forgot it)."""

    reason: str


@dataclass(frozen=True, slots=True)
class DriverSilent:
    """No announce for a freshness window in driver mode: tell the lease machine (§10)."""


@dataclass(frozen=True, slots=True)
class SendHello:
    """``ConsumerHello`` (§10.1.2); the agent calls ``hello_sent`` when the offer succeeded."""

    stream_id: int
    consumer_id: int
    mode: int
    max_rate_hz: int


@dataclass(frozen=True, slots=True)
class SendQos:
    """``QosConsumer`` (§10.4.1), field names as the encoder's keywords."""

    stream_id: int
    consumer_id: int
    epoch: int
    last_seq_seen: int
    drops_gap: int
    drops_late: int
    mode: int


type Action = MapEpoch | CheckMapping | Unmap | DriverSilent | SendHello | SendQos


class AnnounceLike(Protocol):
    """What the core reads from a ``ShmPoolAnnounce`` (the decoder flyweight is fine)."""

    @property
    def stream_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def announce_timestamp_ns(self) -> int: ...
    @property
    def announce_clock_domain_raw(self) -> int: ...
    @property
    def header_slot_bytes(self) -> int: ...


@dataclass(slots=True)
class ConsumerStats:
    """Frames delivered and what was missed (``drops_late`` is the sum of the late reasons in
    ``drops``; ``control`` counts refused control-plane messages)."""

    frames: int = 0
    bytes: int = 0
    descriptors: int = 0
    """``FrameDescriptor`` messages received (a per-consumer stream carries fewer, §10.1.3)."""
    drops_gap: int = 0
    remaps: int = 0
    wake_sems_removed: int = 0
    """Dead consumers' wake semaphore files swept when this one made its own (wakeup.py)."""
    drops: DropCounters = field(default_factory=DropCounters)
    control: DropCounters = field(default_factory=DropCounters)
    progress: DropCounters = field(default_factory=DropCounters)
    """Refused ``FrameProgress`` messages and prefix reads (§10.2.2): never frame drops."""


class ConsumerCore:
    """One consumer's decisions for one stream (use from one thread)."""

    __slots__ = (
        "_announced_since_ns",
        "_driver_mode",
        "_gate",
        "_hello_due",
        "_join_floor",
        "_lapping",
        "_local_gate",
        "_max_gap_cfg",
        "_newest_announce_ns",
        "_next_hello_ns",
        "_next_qos_ns",
        "_qos_period_ns",
        "_rate_tolerance_ns",
        "_revoked_epoch",
        "_revoked_next",
        "_ring_head_seen",
        "_seg_base",
        "_tracker",
        "announce_producer_id",
        "announce_received_ns",
        "consumer_id",
        "drops",
        "epoch",
        "first_seq",
        "head_seq",
        "last_seq",
        "layout",
        "mapped",
        "mask",
        "max_gap",
        "max_rate_hz",
        "meta_version",
        "mode",
        "per_consumer",
        "resyncs",
        "segments",
        "stats",
        "stream_id",
    )

    def __init__(
        self,
        stream_id: int,
        consumer_id: int,
        *,
        freshness_ns: int,
        qos_period_ns: int,
        mode: int = MODE_STREAM,
        max_rate_hz: int = 0,
        max_outstanding_seq_gap: int = DEFAULT_MAX_OUTSTANDING_SEQ_GAP,
        driver_mode: bool = False,
        realtime_clock: Callable[[], int],
    ) -> None:
        """``realtime_clock``: the agent's realtime clock (ns), which REALTIME_SYNCED announces
        are aged against; the core has no clock of its own."""
        if mode not in (MODE_STREAM, MODE_RATE_LIMITED):
            raise ValueError(f"mode must be STREAM or RATE_LIMITED, got {mode}")
        if max_rate_hz < 0:
            raise ValueError("max_rate_hz must be >= 0")
        if max_outstanding_seq_gap < 1:
            raise ValueError("max_outstanding_seq_gap must be >= 1")
        self.stream_id = stream_id
        self.consumer_id = consumer_id
        self.mode = mode
        self.max_rate_hz = max_rate_hz
        self.stats = ConsumerStats()
        self.drops = self.stats.drops
        self._tracker = AnnounceTracker(stream_id, freshness_ns, realtime_clock=realtime_clock)
        self._qos_period_ns = qos_period_ns
        self._next_qos_ns = 0
        self._hello_due = True
        self._next_hello_ns = 0
        self._driver_mode = driver_mode
        # §11: frames above max_rate_hz are dropped locally on the rate limiter's grid. Frames
        # a little early for their slot still count (jitter): up to a quarter period.
        limited = mode == MODE_RATE_LIMITED and max_rate_hz > 0
        self._local_gate: RateGate[object] | None = (
            RateGate(max_rate_hz, name="consumer.rate") if limited else None
        )
        self._gate = self._local_gate
        self.per_consumer = False
        """On a descriptor stream of its own (§10.1.3): the producer applies the rate."""
        self._rate_tolerance_ns = (_SEC // max_rate_hz) // 4 if limited else 0
        self._max_gap_cfg = max_outstanding_seq_gap
        self.max_gap = max_outstanding_seq_gap
        self.layout: StreamLayout | None = None
        self.mapped = False
        self.epoch = -1
        self.mask = 0
        self.last_seq = _NO_SEQ
        self.head_seq = -1
        # per-mapping accounting (soak ledger, #30.3): the first seq taken since the mapping,
        # and one closed record per earlier mapping (see segment_records)
        self.first_seq = -1
        self.segments: list[dict[str, object]] = []
        self._seg_base: tuple[int, int, dict[str, int]] = (0, 0, {})
        self._join_floor = 0
        self._ring_head_seen = -1
        self._lapping = False
        # the epoch whose producer was revoked while we read it, and its first seq not yet
        # counted as lost to the revoke (-1: none pending; see on_lease_event)
        self._revoked_epoch = -1
        self._revoked_next = 0
        self.resyncs = 0
        self.meta_version: int | None = None
        # (epoch, driver time of the announce that made us map it): a producer revocation
        # older than that concerns an earlier epoch (Driver Model §4.9)
        self._announced_since_ns: tuple[int, int] = (-1, 0)
        self._newest_announce_ns = 0  # newest MONOTONIC announce stamp seen (driver clock)
        # The last accepted announce (MAP or REFRESH): when it arrived (the caller's clock) and
        # the producer it names (0: a driver announcing a stream with no producer lease).
        # Read-only health information (Spark progress, #16.2); no rule depends on it.
        self.announce_received_ns = 0
        self.announce_producer_id: int | None = None

    # --- announces ------------------------------------------------------------------------------
    def on_announce(
        self,
        dec: AnnounceLike,
        join_time_ns: int | None,
        now_ns: int,
        *,
        lease_held: bool = True,
    ) -> MapEpoch | CheckMapping | None:
        """Decide about one ``ShmPoolAnnounce`` (may raise the decoder's ``CodecError``)."""
        if dec.stream_id != self.stream_id:
            return None
        if self._driver_mode and not lease_held:
            # Driver Model §2.3: the lease is the licence to map; announces only refresh or
            # move an attached consumer to the epoch the driver bumped.
            self.stats.control.increment("announce_without_lease")
            return None
        if dec.announce_clock_domain_raw == CLOCK_MONOTONIC:  # same host, same clock as now_ns
            stamp = min(dec.announce_timestamp_ns, now_ns)  # a stamp from the future is forged
            self._newest_announce_ns = max(self._newest_announce_ns, stamp)
        decision = self._tracker.on_announce(
            dec.stream_id,
            dec.epoch,
            dec.announce_timestamp_ns,
            dec.announce_clock_domain_raw,
            dec.header_slot_bytes,
            join_time_ns,
            now_ns,
        )
        if decision.verdict is Verdict.IGNORE:
            self.stats.control.increment(decision.reason)
            return None
        self.announce_received_ns = now_ns
        self.announce_producer_id = int(getattr(dec, "producer_id", 0) or 0)
        if decision.verdict is Verdict.REFRESH:
            return CheckMapping(self.epoch)
        if decision.reason:  # a MAP with a story (a contradicted revoke)
            self.stats.control.increment(decision.reason)
        self._announced_since_ns = (dec.epoch, dec.announce_timestamp_ns)
        return MapEpoch(StreamLayout.from_announce(dec))

    def on_mapping_checked(self, problem: str | None) -> Unmap | None:
        """The agent re-validated the live mapping after a same-epoch announce."""
        if problem is None or not self.mapped:
            return None
        self.stats.control.increment(problem)
        # §15.14: a foreign writer (pid changed) means "unmap and wait for a new epoch"; a
        # recreated or truncated file maps again on the next valid announce of any epoch.
        return self._unmap(problem, await_newer=problem == SUPERBLOCK_PID_CHANGED)

    def on_mapped(self, layout: StreamLayout, head_seq: int, now_ns: int) -> None:
        """The agent mapped and validated ``layout``'s regions (and now swaps to them).

        ``head_seq``: the newest committed seq in the new ring at that moment (-1 if none);
        descriptors of frames before it were queued before this consumer joined.
        """
        if self.first_seq >= 0 or self.stats.frames != self._seg_base[0]:
            if len(self.segments) >= _MAX_SEGMENTS:  # bounded in a months-long process
                del self.segments[0]
            self.segments.append(self._segment())
        self._seg_base = (self.stats.frames, self.stats.drops_gap, self.drops.snapshot())
        self.first_seq = -1
        self.layout = layout
        self.epoch = layout.epoch
        self.mapped = True
        self.mask = layout.header_nslots - 1
        self.last_seq = _NO_SEQ
        self.head_seq = head_seq
        self._join_floor = max(head_seq, 0)
        self._ring_head_seen = -1
        self._lapping = False
        # more than nslots-1 behind the head means overwritten for sure: skip without reading
        self.max_gap = max(1, min(self._max_gap_cfg, layout.header_nslots - 1))
        self._tracker.on_mapped(layout.epoch, now_ns)
        if self._gate is not None:
            self._gate.reset(now_ns)  # remap boundary: the next frame is eligible at once
        self.stats.remaps += 1
        self._hello_due = True

    def on_map_failed(self, reason: str) -> None:
        """Mapping a newer epoch failed: counted; the current mapping (if any) stays."""
        self.stats.control.increment(reason)

    def unmapped(self, reason: str) -> None:
        """The agent dropped the mapping on its own (close, truncation found elsewhere)."""
        if self.mapped:
            self._unmap(reason)

    def _unmap(self, reason: str, *, await_newer: bool = False, revoked_at_ns: int = 0) -> Unmap:
        self.mapped = False
        self._tracker.on_unmapped(await_newer=await_newer, revoked_at_ns=revoked_at_ns)
        return Unmap(reason)

    # --- descriptors (hot path) -----------------------------------------------------------------
    def on_descriptor(self, stream_id: int, epoch: int, seq: int, now_ns: int) -> int:
        """``READ``, ``SKIP`` or ``CHECK`` for one ``FrameDescriptor`` (``now_ns`` is only
        used in ``RATE_LIMITED`` mode)."""
        if stream_id != self.stream_id:
            return SKIP
        if not self.mapped:
            if not self._lost_to_revoke(epoch, seq):
                self.drops.increment(NOT_MAPPED)
            return SKIP
        if epoch != self.epoch:  # §10.2.1: not the mapped regions' epoch
            if not self._lost_to_revoke(epoch, seq):
                self.drops.increment(EPOCH_MISMATCH)
            return SKIP
        if seq != self.last_seq + 1:
            return CHECK
        # _accept inlined: this is the per-frame path (one call fewer per frame)
        self.last_seq = seq
        if seq > self.head_seq:
            self.head_seq = seq
        elif self.head_seq - seq > self.max_gap:
            return self._resync()
        if self._gate is not None:
            return self._rate(now_ns)
        return READ

    def accept_run(self, first_seq: int, n: int, ring_head: int = -1) -> int:
        """Take descriptors ``first_seq .. first_seq+n-1`` of the mapped epoch in one call
        (the batch path), as :meth:`on_descriptor` would one by one when each continues
        :attr:`last_seq`: the leading ones more than ``max_gap`` behind the known head are
        resync drops (§15.4, counted per frame), the rest ``READ``. Returns how many leading
        descriptors were skipped, or -1 (nothing changed) when the run needs decisions one by
        one: not mapped, not continuing :attr:`last_seq`, or a rate grid applies.

        ``ring_head``: the producer's position read from the ring when it is at least half a
        ring past ``first_seq`` (:meth:`BatchReader.lapped_head`), else -1. Frames a full ring
        behind it are overwritten already: resync drops, never read. Beyond that, a batch is
        used before it is confirmed, so a frame the producer overwrites in the meantime costs
        the caller's work and still drops; a 4 KiB batch consumer behind a faster producer
        spent most of its time on such frames and accepted 3-7x fewer. So while the consumer
        is *being lapped* (the last batch lost rows to overwrites, see :meth:`note_batch`)
        and the producer keeps moving at least a quarter ring per batch, it is assumed to
        move as far in this batch as since the last one, and the frames within that distance
        of being overwritten are resync drops too; the newest quarter of the ring is always
        read. A burst that ends (the producer stops) loses nothing it still holds: no rows
        were lost, or it moved too little, and only the overwritten frames are skipped."""
        if not self.mapped or n <= 0 or first_seq != self.last_seq + 1 or self._gate is not None:
            return -1
        last = first_seq + n - 1
        head = self.head_seq
        gap = self.max_gap
        if ring_head >= 0:
            seen = self._ring_head_seen
            self._ring_head_seen = ring_head
            head = max(head, ring_head)
            if seen >= 0:
                nslots = self.mask + 1
                moved = ring_head - seen
                if moved < nslots >> 2:
                    self._lapping = False
                elif self._lapping:
                    gap = min(gap, max(nslots >> 2, nslots - 1 - moved))
        else:
            self._ring_head_seen = -1
            self._lapping = False
        skipped = min(n, max(0, head - gap - first_seq))
        if skipped:
            self.stats.drops_gap += skipped
            self.resyncs += skipped
            self.drops.increment(RESYNC, skipped)
        self.last_seq = last
        self.head_seq = max(head, last)
        return skipped

    def note_batch(self, lost: bool) -> None:
        """A batch was confirmed; ``lost``: some of its rows were overwritten before (or
        while) they were read. Turns on :meth:`accept_run`'s lapped prediction."""
        if lost:
            self._lapping = True

    def on_slot_check(self, seq: int, slot_seq: int, last_slot_seq: int, now_ns: int) -> int:
        """Decide a ``CHECK``ed descriptor from what the ring holds now (a hint, not a read):
        ``slot_seq`` is the seq in the slot of ``seq`` (``seq & mask``), ``last_slot_seq`` the
        one in the slot of :attr:`last_seq` (anything when no seq was seen yet).
        Returns ``READ``, ``SKIP`` or ``REMAP`` (the core already unmapped: close the regions).
        """
        last = self.last_seq
        if last == _NO_SEQ:  # the first descriptor since the join
            if seq < self._join_floor:
                if not self._lost_to_revoke(self.epoch, seq):
                    self.drops.increment(BEFORE_JOIN)
                return SKIP
            if slot_seq < seq:
                self.drops.increment(SEQ_IMPLAUSIBLE)
                return SKIP
            self._revoked_epoch = -1  # the revoked epoch's queued descriptors came before
            if self.first_seq < 0:
                self.first_seq = seq
        elif seq > last:
            if slot_seq < seq:  # the ring never held it: no gap to count
                self.drops.increment(SEQ_IMPLAUSIBLE)
                return SKIP
            if self.per_consumer:  # the producer skipped them for our rate (§11): not lost
                self.drops.increment(RATE_LIMITED, seq - last - 1)
            else:
                self.stats.drops_gap += seq - last - 1
        elif last_slot_seq < last:
            # §15.2: the ring itself went back (the slot of our last frame now holds an older
            # seq): the stream was recreated under us, remap.
            self.drops.increment(SEQ_REGRESSION)
            self._unmap(SEQ_REGRESSION)
            return REMAP
        else:
            # the ring still holds our last frame or newer: a stale or replayed descriptor
            self.drops.increment(SEQ_STALE)
            return SKIP
        return self._accept(seq, now_ns)

    def _accept(self, seq: int, now_ns: int) -> int:
        self.last_seq = seq
        if seq > self.head_seq:
            self.head_seq = seq
        elif self.head_seq - seq > self.max_gap:
            return self._resync()
        if self._gate is not None:
            return self._rate(now_ns)
        return READ

    def _lost_to_revoke(self, epoch: int, seq: int) -> bool:
        """Count a skipped descriptor of the revoked epoch as lost to the revoke (a gap, so in
        QoS ``drops_gap``), once per seq: a replayed one falls back to its usual reason."""
        if epoch != self._revoked_epoch or seq < self._revoked_next:
            return False
        self._revoked_next = seq + 1
        self.stats.drops_gap += 1
        self.drops.increment(REVOKED)
        return True

    def _resync(self) -> int:
        # §15.4 resync: so far behind that the slot is surely reused; skip without reading
        self.stats.drops_gap += 1
        self.resyncs += 1
        self.drops.increment(RESYNC)
        return SKIP

    def _rate(self, now_ns: int) -> int:
        # §11: at most one frame per slot of the RateGate grid (early by <= the tolerance ok)
        if self._gate.take(now_ns, self._rate_tolerance_ns):  # type: ignore[union-attr]
            return READ
        self.drops.increment(RATE_LIMITED)
        return SKIP

    def on_read_miss(self, seq: int, slot_seq: int, reason: str) -> None:
        """The slot read of an accepted ``seq`` failed with ``reason`` (``seq_mismatch`` or
        ``not_committed``) and the slot holds ``slot_seq``.

        A slot ahead of ``seq`` teaches how far the producer got (§15.4 resync). A slot
        *behind* it means the frame was never written: the descriptor was forged (a plausible
        ``last + 1``); it is re-counted as ``seq_implausible`` rather than late, and the seq is
        forgotten so the real descriptor with that seq is still read.
        """
        if slot_seq >= seq:
            if slot_seq > self.head_seq:
                self.head_seq = slot_seq
            return
        # the batch path reports misses after the whole batch was accepted: the seq is
        # re-counted all the same, and forgotten only if it is still the last one seen
        if self.last_seq == seq:
            self.last_seq = seq - 1 if seq > 0 else _NO_SEQ
        self.drops.increment(reason, -1)
        self.drops.increment(SEQ_IMPLAUSIBLE)

    def _segment(self) -> dict[str, object]:
        frames, gap, drops = self._seg_base
        now = self.drops.snapshot()
        return {
            "epoch": self.epoch,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq if self.first_seq >= 0 else -1,
            "delivered": self.stats.frames - frames,
            "drops_gap": self.stats.drops_gap - gap,
            "drops": {k: v - drops.get(k, 0) for k, v in now.items() if v != drops.get(k, 0)},
        }

    def segment_records(self) -> list[dict[str, object]]:
        """Per mapping: epoch, first and last seq taken, frames delivered and the drops counted
        over it; every seq from first to last is delivered or under a seq-level reason (the
        soak's ledger checks it, tensorpool/soak/ledger.py). The current mapping comes last."""
        return [*self.segments, self._segment()]

    @property
    def drops_gap(self) -> int:
        return self.stats.drops_gap

    @property
    def drops_late(self) -> int:
        return self.drops.sum_of(LATE_REASONS)

    @property
    def newest_announce_ns(self) -> int:
        """The newest announce stamp seen (the announcer's MONOTONIC clock; 0: none yet)."""
        return self._newest_announce_ns

    # --- lease ----------------------------------------------------------------------------------
    def on_lease_event(self, event: object) -> MapEpoch | Unmap | None:
        """React to a ``DriverClient`` event (Driver Model §2.3, §4.9)."""
        if isinstance(event, Attached):
            return MapEpoch(event.layout)
        if isinstance(event, LeaseLost):
            self.stats.control.increment("lease_lost")
            return self._unmap(event.reason) if self.mapped else None
        if isinstance(event, ProducerRevoked):
            epoch, since_ns = self._announced_since_ns
            revoked_at = event.timestamp_ns or self._newest_announce_ns
            if event.timestamp_ns and event.timestamp_ns <= since_ns and epoch >= self.epoch:
                # The revoke and the bumped announce travel on different subscriptions, so
                # the new epoch may be mapped before the old producer's revoke is read: that
                # revoke is about an older epoch and must not unmap the new one.
                self.stats.control.increment("producer_revoked_older_epoch")
                return None
            if revoked_at > self._newest_announce_ns + self._tracker.freshness_ns:
                # Stamped beyond anything the driver's clock can have reached: forged (a
                # real revoke falls between two announces of the driver).
                self.stats.control.increment("producer_revoke_implausible")
                return None
            self.stats.control.increment("producer_revoked")
            # §4.9: the revoked epoch is dead; remap only on the epoch-bumped announce -- or
            # on an announce of the same epoch stamped after the revoke, which the driver never
            # sends after a real one (AnnounceTracker: the revoke was forged)
            if self.mapped:
                # what the producer commits to this epoch from here on is lost to the revoke
                self._revoked_epoch = self.epoch
                self._revoked_next = self.last_seq + 1 if self.last_seq >= 0 else self._join_floor
                return self._unmap("producer_revoked", await_newer=True, revoked_at_ns=revoked_at)
            self._tracker.on_unmapped(await_newer=True, revoked_at_ns=revoked_at)
        return None

    # --- metadata and config --------------------------------------------------------------------
    def accept_meta_version(self, version: int) -> bool:
        """§10.3.2: a ``DataSourceMeta`` replaces the current one unless it is older."""
        if self.meta_version is None or version >= self.meta_version:
            self.meta_version = version
            return True
        return False

    # --- cadence --------------------------------------------------------------------------------
    def tick(self, now_ns: int) -> tuple[Action, ...] | list[Action]:
        """Timers: announce timeout (§15.21), pending hello, QoS period. Usually empty."""
        out: list[Action] | None = None
        decision = self._tracker.tick(now_ns)
        if decision is not None:
            self.stats.control.increment(decision.reason)
            self.mapped = False
            out = [Unmap(decision.reason)]
            if self._driver_mode:  # the driver went quiet: it may have crashed (§10)
                out.append(DriverSilent())
        if self._local_gate is not None and not self.per_consumer and now_ns >= self._next_hello_ns:
            # a RATE_LIMITED consumer without a stream of its own asks again every QoS period
            # (declined for now: range exhausted, no lease yet, released); on its own stream
            # it says nothing more, its QoS keeps the stream (§10.1.3)
            self._next_hello_ns = now_ns + self._qos_period_ns
            self._hello_due = True
        if self._hello_due:
            out = out if out is not None else []
            out.append(SendHello(self.stream_id, self.consumer_id, self.mode, self.max_rate_hz))
        if now_ns >= self._next_qos_ns:
            self._next_qos_ns = now_ns + self._qos_period_ns
            out = out if out is not None else []
            out.append(
                SendQos(
                    self.stream_id,
                    self.consumer_id,
                    max(self.epoch, 0),
                    max(self.last_seq, 0),
                    self.stats.drops_gap,
                    self.drops_late,
                    self.mode,
                )
            )
        return _NOTHING if out is None else out

    def hello_sent(self) -> None:
        self._hello_due = False

    def on_consumer_config(self, assigned: bool) -> None:
        """The producer (or driver) gave this consumer a descriptor stream of its own, or
        declined (§10.1.3). On its own stream the producer admits frames at our rate, so the
        local grid is off (a second grid, anchored elsewhere, would drop admitted frames on
        arrival jitter) and seq gaps are the frames it skipped, not losses."""
        self.per_consumer = assigned
        self._gate = None if assigned else self._local_gate
        if self._gate is not None:
            self._gate.reset(0)
