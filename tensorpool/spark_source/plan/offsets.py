"""Offsets, admission control and loss accounting of the Spark source (sans-IO).

Offset model
------------
A source offset is, per stream, ``{"epoch", "seq", "frames", "lost", "lostLate"}``:

* ``epoch``/``seq`` -- a position in the stream's seq space: everything below ``seq`` in
  ``epoch`` has been planned. A batch ``[start, end)`` of one epoch reads *every frame
  committed in the ring with a seq in* ``[start.seq, end.seq)`` -- no more, no fewer. That
  definition needs no knowledge of which seqs exist: a normal producer publishes 0, 1, 2, ...;
  a relay (rate limiter, bridge) keeps its source's numbers, so its seqs have gaps. Because a
  single writer publishes in seq order, no frame can join a range after it was planned (the
  plan's ``end.seq`` never passes the highest committed seq + 1).
* ``frames`` -- cumulative count of frames admitted (planned to be read) since the query
  started. ``end.frames - start.frames`` is how many frames the batch had, so a replay in a new
  process (no memory of the plan) reads what is still in the ring and counts the rest as lost.
  Offsets written before this field existed decode with ``frames=None``: such a batch is read
  as "whatever is in the range", without that check.
* ``lost`` -- cumulative count of frames known, at planning, to have been published and
  overwritten before they were read (and unread frames of an epoch that ended). Informational:
  it does not define what a batch reads.
* ``lostLate`` -- cumulative count of planned frames that were gone when the executor read
  them (only with ``failOnDataLoss=false``); folded into the next offset.
* #17 (:mod:`.policy`; written only when non-zero): the cumulative counters ``late``,
  ``shedLag``, ``shedMemory`` (frames the source's policies flagged or left out on purpose,
  never loss), the batch's boundaries ``skipTo`` (frames of ``[start.seq, skipTo)`` are not
  read) and ``lateTo`` (frames below it get ``is_late``), and ``eventNs`` (the stream's
  watermark). Every policy decision is a seq prefix, so these make a replay exact.

Keys are written in that fixed order, streams by ascending id: Spark stores offsets verbatim
and compares them as text.

Planning
--------
The ring scan (:class:`RingState`: the seq held by every slot) is the authority for what is
readable. A plan takes, per stream, the committed seqs at or after ``start.seq`` in order and
admits the first ``n`` (``maxFramesPerTrigger``/``maxBytesPerTrigger`` count frames and
bytes, never seq span); ``end.seq`` is the last admitted seq + 1 (or the ring's head when
everything was admitted). Partitions carry the admitted seqs as compact runs ``[a, b)``: one
run for a normal stream (the executors' vectorized path), many for a relay.

Loss is found from the scan too: a seq ``s`` missing from the ring can only have been
overwritten if its slot (``s & (nslots-1)``) now holds a newer seq (slots only move forward).
How many of those candidates were really published:

* **dense stream** (the ring's committed seqs form one gap-free run): every seq was published,
  so every candidate is a lost frame -- exact.
* **sparse stream** (the ring shows gaps): the descriptors the driver received since it
  attached (:class:`DescriptorFeed`) say exactly which seqs were published, so the count is
  exact where that record is complete. Where it is not -- seqs published before the reader
  attached (after a restart), or descriptors dropped by the bounded intake -- the count is
  *unknown*: the plan reports it as a ``possible`` loss with an upper bound (the number of
  candidates), logs it, and does not add it to ``lost`` nor fail the query on it.

Descriptor intake: one queue per stream; each plan drains a stream's queue only as far as the
planned range reaches (the admitted frames' descriptors plus those of frames lost within the
range), so descriptors of later frames stay queued for the next trigger.

An epoch change (the Kafka analogue: a topic deleted and recreated) is planned as a one-off
*transition* batch that ends at the first readable frame of the new epoch and reads nothing for
that stream; unread frames of the old epoch count as ``lost``. If the reader never saw how far
the old epoch got (it restarted after the change), that number is unknown: with
``failOnDataLoss=true`` the query fails, otherwise it moves on and the unknown count is logged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

import numpy as np

MAX_SEQ: Final = 2**63 - 1
_NO_RUNS: Final = np.empty((0, 2), np.int64)


class OffsetError(ValueError):
    """A checkpointed or user-supplied offset document is malformed."""


@dataclass(frozen=True, slots=True)
class StreamPos:
    """Per-stream offset: position ``seq`` in ``epoch``, frames admitted, loss counters."""

    epoch: int
    seq: int
    lost: int = 0
    lost_late: int = 0
    frames: int | None = 0  # None: an offset written before the field existed
    #: #17 (:mod:`.policy`), written only when non-zero so plain queries' offsets are unchanged:
    #: cumulative counters of late frames and frames shed for lag / the memory emergency ...
    late: int = 0
    shed_lag: int = 0
    shed_memory: int = 0
    #: ... this batch's boundaries: frames of ``[start.seq, skip_to)`` are not delivered (shed
    #: or late-dropped), frames below ``late_to`` are delivered with ``is_late`` ...
    skip_to: int = 0
    late_to: int = 0
    #: ... and the stream's watermark: highest event time delivered (ns, wall clock)
    event_ns: int = 0

    def to_json(self) -> dict[str, int]:
        if self.frames is None:
            out = {
                "epoch": self.epoch,
                "seq": self.seq,
                "lost": self.lost,
                "lostLate": self.lost_late,
            }
        else:
            out = {
                "epoch": self.epoch,
                "seq": self.seq,
                "frames": self.frames,
                "lost": self.lost,
                "lostLate": self.lost_late,
            }
        for key, value in (
            ("late", self.late),
            ("shedLag", self.shed_lag),
            ("shedMemory", self.shed_memory),
            ("skipTo", self.skip_to),
            ("lateTo", self.late_to),
            ("eventNs", self.event_ns),
        ):
            if value:
                out[key] = value
        return out


Offsets = dict[int, StreamPos]
#: the optional #17 fields, in StreamPos order
_POLICY_KEYS: Final = ("late", "shedLag", "shedMemory", "skipTo", "lateTo", "eventNs")


def encode_offsets(offsets: Mapping[int, StreamPos]) -> dict[str, dict[str, int]]:
    """The JSON-ready dict, streams in ascending id order (stable text for Spark)."""
    return {str(sid): offsets[sid].to_json() for sid in sorted(offsets)}


def _int_field(doc: Mapping[str, Any], key: str, sid: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise OffsetError(f"stream {sid}: {key} must be an integer >= 0, got {value!r}")
    return value


def decode_offsets(doc: object, streams: Sequence[int] | None = None) -> Offsets:
    """Parse an offset dict; with ``streams``, every one must be present (and nothing else)."""
    if not isinstance(doc, Mapping):
        raise OffsetError(f"offset must be a JSON object, got {type(doc).__name__}")
    out: Offsets = {}
    for key, value in doc.items():
        try:
            sid = int(key)
        except (TypeError, ValueError):
            raise OffsetError(f"offset key {key!r} is not a stream id") from None
        if not isinstance(value, Mapping):
            raise OffsetError(f"stream {key}: expected an object, got {value!r}")
        out[sid] = StreamPos(
            _int_field(value, "epoch", key),
            _int_field(value, "seq", key),
            _int_field(value, "lost", key, 0),
            _int_field(value, "lostLate", key, 0),
            _int_field(value, "frames", key) if "frames" in value else None,
            *(_int_field(value, k, key, 0) for k in _POLICY_KEYS),
        )
    if streams is not None and set(out) != set(streams):
        raise OffsetError(
            f"offset streams {sorted(out)} differ from the query's streams {sorted(streams)}; "
            "a checkpoint cannot be reused with another 'streams' option"
        )
    return out


def grow_offsets(offsets: Mapping[int, StreamPos], streams: Sequence[int]) -> Offsets:
    """A discovering query's offset over its grown stream set (#16.4).

    With ``streams="*"`` or a range, an offset (a checkpointed one included) may lack streams
    discovered after it was written: they have not started (:data:`NOT_STARTED`) and begin
    where a stream that appears later does, at its earliest frame. Streams of the offset
    that are not in ``streams`` are kept (the caller attaches them).
    """
    out = dict(offsets)
    for sid in streams:
        if sid not in out:
            out[sid] = StreamPos(NOT_STARTED, 0)
    return out


# --- seq runs ------------------------------------------------------------------------------------
def to_runs(seqs: np.ndarray) -> np.ndarray:
    """Sorted unique seqs -> ``(k, 2)`` int64 runs ``[a, b)`` (one run for a dense range)."""
    n = len(seqs)
    if n == 0:
        return _NO_RUNS
    seqs = np.asarray(seqs, np.int64)
    breaks = np.flatnonzero(np.diff(seqs) != 1) + 1
    starts = seqs[np.concatenate(([0], breaks))]
    ends = seqs[np.concatenate((breaks - 1, [n - 1]))] + 1
    return np.stack([starts, ends], axis=1)


def runs_count(runs: np.ndarray) -> int:
    return int((runs[:, 1] - runs[:, 0]).sum()) if len(runs) else 0


def runs_seqs(runs: np.ndarray) -> np.ndarray:
    if not len(runs):
        return np.empty(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs.tolist()])


def iter_seq_chunks(runs: np.ndarray, step: int) -> Iterator[np.ndarray]:
    """The seqs of ``runs`` in order, ``step`` at a time (a long dense run is sliced lazily)."""
    pending: list[np.ndarray] = []
    have = 0
    for a, b in runs.tolist():
        while a < b:
            k = min(b - a, step - have)
            pending.append(np.arange(a, a + k, dtype=np.int64))
            have += k
            a += k
            if have == step:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


def _cut_runs(runs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``runs`` after its first ``n`` frames."""
    lens = runs[:, 1] - runs[:, 0]
    cum = np.cumsum(lens)
    i = int(np.searchsorted(cum, n))  # run holding frame n-1 (or the cut is a run boundary)
    if i >= len(runs):
        return runs, _NO_RUNS
    before = int(cum[i] - lens[i])
    inside = n - before
    if inside == 0:
        return runs[:i], runs[i:]
    a, b = int(runs[i, 0]), int(runs[i, 1])
    head = np.concatenate([runs[:i], [[a, a + inside]]]).astype(np.int64)
    tail = runs[i:].copy()
    tail[0, 0] = a + inside
    if a + inside == b:
        tail = tail[1:]
    return head, tail


# --- what the driver sees of a ring --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RingState:
    """One scan of a stream's header ring: committed frames lie in ``[oldest, head)``.

    ``slot_seq`` is the seq each slot holds (committed or being written; -1 empty), ``seqs``
    the committed seqs sorted when they do *not* form one gap-free run (None when they do),
    ``lens`` each slot's ``values_len_bytes``. States built without ``slot_seq`` describe a
    dense ring holding exactly ``[oldest, head)`` (used by tests and old callers).
    """

    epoch: int
    oldest: int
    head: int
    nslots: int
    slot_seq: np.ndarray | None = field(default=None, compare=False, repr=False)
    seqs: np.ndarray | None = field(default=None, compare=False, repr=False)
    lens: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: each slot's ``timestamp_ns`` (the start margin's rate forecast, #16.1), None if not scanned
    stamps: np.ndarray | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_slots(
        cls,
        epoch: int,
        slot_seq: np.ndarray,
        committed: np.ndarray,
        lens: np.ndarray | None = None,
        stamps: np.ndarray | None = None,
    ) -> RingState:
        """Build from per-slot seqs and committed flags (what :meth:`MappedStream.scan` reads)."""
        nslots = len(slot_seq)
        slot_seq = np.asarray(slot_seq, np.int64)
        c = slot_seq[np.asarray(committed, bool)]
        if c.size == 0:
            return cls(epoch, 0, 0, nslots, slot_seq, None, lens, stamps)
        oldest, last = int(c.min()), int(c.max())
        seqs = None if last - oldest + 1 == c.size else np.sort(c)
        return cls(epoch, oldest, last + 1, nslots, slot_seq, seqs, lens, stamps)

    @property
    def empty(self) -> bool:
        return self.head <= self.oldest

    @property
    def gapped(self) -> bool:
        """The committed seqs have holes: evidence of a sparse (relay) stream."""
        return self.seqs is not None

    def present(self, lo: int, hi: int) -> np.ndarray:
        """Committed seqs in ``[lo, hi)``, ascending."""
        if self.seqs is None:
            a, b = max(lo, self.oldest), min(hi, self.head)
            return np.arange(a, max(a, b), dtype=np.int64)
        s = self.seqs
        return s[np.searchsorted(s, lo) : np.searchsorted(s, hi)]

    def lens_of(self, seqs: np.ndarray) -> np.ndarray | None:
        if self.lens is None:
            return None
        return self.lens[np.asarray(seqs, np.int64) & (self.nslots - 1)].astype(np.int64)

    def maybe_overwritten(self, lo: int, hi: int) -> tuple[int, int, int]:
        """Seqs in ``[lo, hi)`` absent from the ring whose slot holds a newer seq.

        Only those can have been published and overwritten (a seq whose slot holds an older
        frame, or none, was never written). Returns ``(count, first, last)``; for a dense
        stream every one of them is a lost frame. Computed per slot in O(nslots).
        """
        if hi <= lo or self.empty:
            return 0, lo, lo
        if self.slot_seq is None:
            top = min(hi, self.oldest)
            return (top - lo, lo, top - 1) if top > lo else (0, lo, lo)
        n = self.nslots
        i = np.arange(n, dtype=np.int64)
        top = np.minimum(self.slot_seq, hi)
        f = lo + ((i - lo) % n)  # first seq >= lo that maps to slot i
        cnt = np.where(top > f, (top - f + n - 1) // n, 0)
        total = int(cnt.sum())
        if not total:
            return 0, lo, lo
        has = cnt > 0
        return total, int(f[has].min()), int((f + (cnt - 1) * n)[has].max())


@dataclass(frozen=True, slots=True)
class Loss:
    """Frames a plan found gone (reason ``overwritten`` or ``epoch_change``)."""

    stream_id: int
    epoch: int
    first_seq: int
    count: int | None  # None: unknown (see at_most)
    reason: str
    nslots: int = 0
    last_seq: int | None = None  # highest seq concerned, when known
    at_most: int | None = None  # upper bound of an unknown count (sparse streams)


#: Placeholder epoch of a stream that was not announced when the query started (real epochs
#: start at 1).
NOT_STARTED: Final = 0
OVERWRITTEN: Final = "overwritten"
EPOCH_CHANGE: Final = "epoch_change"
REGIONS_GONE: Final = "region_unavailable"


def _describe(ls: Loss) -> str:
    n = "an unknown number of" if ls.count is None else f"{ls.count}"
    slots = f" ({ls.nslots} slots)" if ls.nslots else ""
    if ls.at_most is not None:
        last = ls.last_seq if ls.last_seq is not None else ls.first_seq
        return (
            f"stream {ls.stream_id}: an unknown number (at most {ls.at_most}) of frame(s) of "
            f"epoch {ls.epoch} within seq {ls.first_seq}..{last} may have been overwritten in "
            f"the ring{slots} before the query read them (a sparse stream: the reader has no "
            "record of which of these seqs were published -- they predate it, or its descriptor "
            "intake overflowed)"
        )
    if ls.reason == EPOCH_CHANGE:
        return (
            f"stream {ls.stream_id}: {n} frame(s) of epoch {ls.epoch} from seq {ls.first_seq} "
            "were never read: the producer restarted (new epoch) before the query caught up"
        )
    if ls.reason == REGIONS_GONE:
        what = "" if ls.count is None else f"{ls.count} "
        return (
            f"stream {ls.stream_id}: {what}frames of epoch {ls.epoch} from seq {ls.first_seq} "
            "could not be read: that epoch's regions are gone (the producer exited or "
            "restarted before the query read them)"
        )
    if ls.count is None:
        return (
            f"stream {ls.stream_id}: frame {ls.first_seq} of epoch {ls.epoch} (and maybe "
            f"more) was overwritten in the ring{slots} after it was planned, before a task "
            "read it"
        )
    last = ls.last_seq if ls.last_seq is not None else ls.first_seq + ls.count - 1
    return (
        f"stream {ls.stream_id}: {n} frame(s) lost (epoch {ls.epoch}, seq "
        f"{ls.first_seq}..{last}) -- overwritten in the ring{slots} before the query read them"
    )


#: Why frames were lost, when a streaming query read slower than the producer wrote.
FELL_BEHIND_HINT: Final = (
    "The query fell behind the producer. Give the ring more slots (header_nslots), put "
    "a rate limiter with a deeper ring in front of the stream, trigger more often or raise "
    "maxFramesPerTrigger/maxBytesPerTrigger, or set failOnDataLoss=false to skip lost frames "
    "(they are then counted in the offsets' 'lost'/'lostLate' fields)."
)
#: Why frames were lost when their epoch's regions are gone (#16.3: not "fell behind").
REGIONS_GONE_HINT: Final = (
    "The producer exited or restarted: frames of an ended epoch cannot be read any more. Keep "
    "the producer running until the query has read its frames, or set failOnDataLoss=false to "
    "skip them (they are then counted in the offsets' 'lost'/'lostLate' fields)."
)


def loss_message(losses: Sequence[Loss], hint: str | None = None) -> str:
    """What was lost and what to change: the text users see when a query fails.

    ``hint`` says why and what to do; by default: the producer exited (every loss is of gone
    regions) or the query fell behind (#16.3: callers that know better pass their own).
    """
    if hint is None:
        gone = bool(losses) and all(ls.reason == REGIONS_GONE for ls in losses)
        hint = REGIONS_GONE_HINT if gone else FELL_BEHIND_HINT
    return "tensorpool data loss: " + "; ".join(_describe(ls) for ls in losses) + ". " + hint


def possible_loss_message(losses: Sequence[Loss]) -> str:
    """Loss that may have happened but cannot be counted (logged, never fails a query)."""
    return "tensorpool possible data loss (not counted in 'lost'): " + "; ".join(
        _describe(ls) for ls in losses
    )


# --- admission control ---------------------------------------------------------------------------
def split_budget(budget: int, wants: Sequence[int]) -> list[int]:
    """Share ``budget`` among streams in proportion to what each wants (largest remainder).

    Proportional, as Kafka's source splits ``maxOffsetsPerTrigger`` by lag: the stream with the
    deepest backlog is the one closest to losing frames. Ties go to the lower stream id, so the
    split is deterministic.
    """
    total = sum(wants)
    if total <= budget:
        return list(wants)
    if budget <= 0:
        return [0] * len(wants)
    shares = [budget * w // total for w in wants]
    left = budget - sum(shares)
    order = sorted(range(len(wants)), key=lambda i: (-(budget * wants[i] % total), i))
    for i in order:
        if left <= 0:
            break
        if shares[i] < wants[i]:
            shares[i] += 1
            left -= 1
    return shares


@dataclass(frozen=True, slots=True)
class Limits:
    """Admission limits for one micro-batch (None = unlimited)."""

    max_frames: int | None = None
    max_bytes: int | None = None


#: sizes(stream_id, epoch, seqs) -> byte size of each frame; used when a RingState has no lens
SizeFn = Callable[[int, int, np.ndarray], Sequence[int]]


@dataclass(frozen=True, slots=True)
class Cut:
    """What the source's policies (#17, :mod:`.policy`) decided for one stream's pending
    frames. Every part is a prefix of them, so the offsets record it as seq boundaries."""

    skip: int = 0  # leading frames not delivered: shed (lag, memory) or late and dropped
    flag: int = 0  # frames after those delivered with is_late
    cap: int | None = None  # most frames to deliver after ``skip`` (alignment, rate); None: all
    shed_lag: int = 0
    shed_memory: int = 0
    late: int = 0  # late frames among ``skip`` and ``flag``


#: admit(ready streams) -> Cut per stream id (streams left out: no cut)
AdmitFn = Callable[[Sequence["_Ready"]], Mapping[int, Cut]]
#: align(views, counts) -> per stream id, the most frames of its view it may deliver given
#: what every stream delivers (``counts``, after every other cap); see :meth:`StreamPlanner.plan`
AlignFn = Callable[[Sequence["_Ready"], Sequence[int]], Mapping[int, int]]


# --- descriptor intake ---------------------------------------------------------------------------
class DescriptorFeed(Protocol):
    """Per-stream queues of received ``FrameDescriptor`` s (the driver's attachment)."""

    def pending(self, stream_id: int) -> int:
        """Descriptors of ``stream_id`` waiting to be taken."""
        ...

    def take(
        self, stream_id: int, max_items: int
    ) -> tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int, int, int]]]:
        """Up to ``max_items`` oldest ``(epoch, seq)``, and ``(epoch, lo, hi, count)``: seq
        spans and numbers of descriptors the queue dropped (overflow) since the previous take
        (they precede the returned ones)."""
        ...


class _Ledger:
    """What one epoch of one stream is known to have published (sparse-stream loss counts).

    ``known`` holds published seqs at or above the planning position (from descriptors and
    from ring scans). The record is *complete* (every published seq is in it) over
    ``[lo, hi]`` minus ``holes`` (intervals whose descriptors the intake dropped).
    """

    __slots__ = ("desc_hi", "described", "hi", "holes", "known", "lo", "new", "started")

    def __init__(self) -> None:
        self.started = False
        self.described = False
        self.lo = 0
        self.hi = -1
        self.desc_hi = -1
        self.holes: list[tuple[int, int]] = []
        self.known = np.empty(0, np.int64)
        self.new: list[int] = []

    def anchor(self, lo: int, hi: int) -> None:
        """Coverage starts here: at ``lo`` when the query begins reading the epoch at ``lo``
        (nothing missing before that is its concern), at the ring head after a restart."""
        # Never move the start of coverage up: Spark calls initialOffset more than once
        # (pyspark 4.3 calls it twice on a fresh query, and logs the first result), and the
        # record has been complete since the first anchor.
        self.lo = min(self.lo, lo) if (self.described or self.started) else lo
        self.hi = max(self.hi, hi)
        self.started = True

    def describe(self, seq: int) -> None:
        self.new.append(seq)
        if not self.described:
            self.described = True
            if not self.started:
                self.lo = seq
        if seq > self.desc_hi:
            self.desc_hi = seq
        if seq > self.hi:
            self.hi = seq

    def dropped(self, lo: int, hi: int) -> None:
        if not self.described:
            self.described = True
            if not self.started:
                self.lo = lo
        self.holes.append((lo, hi))
        self.desc_hi = max(self.desc_hi, hi)
        self.hi = max(self.hi, hi)

    def add_known(self, seqs: np.ndarray) -> None:
        if len(seqs):
            self.known = np.union1d(self.known, seqs)

    def _settle(self) -> np.ndarray:
        if self.new:
            self.known = np.union1d(self.known, np.asarray(self.new, np.int64))
            self.new = []
        return self.known

    def known_in(self, lo: int, hi: int) -> np.ndarray:
        k = self._settle()
        return k[np.searchsorted(k, lo) : np.searchsorted(k, hi)]

    def uncovered(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Parts of ``[lo, hi)`` where the record is incomplete."""
        out: list[tuple[int, int]] = []
        if lo < self.lo:
            out.append((lo, min(hi, self.lo)))
        a, b = max(lo, self.lo), min(hi, self.hi + 1)
        for h0, h1 in self.holes:
            x, y = max(a, h0), min(b, h1 + 1)
            if x < y:
                out.append((x, y))
        if hi > self.hi + 1:
            out.append((max(lo, self.hi + 1), hi))
        return out

    def retire(self, below: int) -> None:
        """Forget what lies below the planning position."""
        k = self._settle()
        self.known = k[np.searchsorted(k, below) :]
        self.holes = [h for h in self.holes if h[1] >= below]


@dataclass(slots=True)
class Plan:
    end: Offsets
    losses: list[Loss]
    unknown_epoch_loss: list[Loss]
    frames: int  # frames admitted (to read) in this plan
    possible: list[Loss] = field(default_factory=list)  # sparse, uncounted (upper bounds)
    runs: dict[int, np.ndarray] = field(default_factory=dict)  # admitted seqs per stream
    drained: dict[int, int] = field(default_factory=dict)  # descriptors taken per stream
    dropped: dict[int, int] = field(default_factory=dict)  # descriptors the intake dropped


@dataclass(slots=True)
class _Ready:
    sid: int
    state: RingState
    first: int
    head: int
    present: np.ndarray


class StreamPlanner:
    """Per-query driver state: turns ``(start, ring states, limits)`` into the next end offset.

    Remembers, per stream, the highest head seen in each epoch (to size the loss when an epoch
    ends before it was fully read), the ``Trigger.AvailableNow`` target, the published-seq
    ledgers of sparse streams and the runs of the last few plans (for ``partitions``).
    """

    REMEMBER: Final = 16

    def __init__(self, streams: Sequence[int], start_at: Mapping[int, str] | None = None) -> None:
        self.streams = tuple(sorted(streams))
        self._seen: dict[int, tuple[int, int]] = {}  # stream -> (epoch, highest head seen)
        self.target: dict[int, tuple[int, int]] | None = None
        # where a stream that was not there when the query started begins ("earliest"/"latest")
        self.start_at = dict(start_at or {})
        self._ledgers: dict[int, dict[int, _Ledger]] = {}
        self._sparse: set[tuple[int, int]] = set()
        self._planned: OrderedDict[tuple[int, int, int, int], np.ndarray] = OrderedDict()
        self.intake_dropped = 0

    def observe(self, stream_id: int, state: RingState) -> None:
        """Remember the highest head of the newest epoch (older epochs are never re-entered)."""
        prev = self._seen.get(stream_id)
        if (
            prev is None
            or state.epoch > prev[0]
            or (state.epoch == prev[0] and state.head > prev[1])
        ):
            self._seen[stream_id] = (state.epoch, state.head)
        if state.gapped:
            self._sparse.add((stream_id, state.epoch))

    def seen_head(self, stream_id: int, epoch: int) -> int | None:
        prev = self._seen.get(stream_id)
        return prev[1] if prev is not None and prev[0] == epoch else None

    def is_sparse(self, stream_id: int, epoch: int) -> bool:
        return (stream_id, epoch) in self._sparse

    def set_target(self, states: Mapping[int, RingState | None]) -> None:
        """``prepareForTriggerAvailableNow``: never plan past what exists right now."""
        self.target = {sid: (st.epoch, st.head) for sid, st in states.items() if st is not None}

    def add_streams(self, streams: Sequence[int]) -> None:
        """Plan these streams too (discovered, #16.4); a start offset that lacks one gives it
        :data:`NOT_STARTED` (:func:`grow_offsets`), so it begins at its earliest frame unless
        ``start_at`` says otherwise."""
        self.streams = tuple(sorted({*self.streams, *streams}))

    # --- ledgers ---------------------------------------------------------------------------------
    def _ledger(self, sid: int, epoch: int) -> _Ledger:
        per = self._ledgers.setdefault(sid, {})
        led = per.get(epoch)
        if led is None:
            led = per[epoch] = _Ledger()
        return led

    def begin(self, stream_id: int, state: RingState, first: int) -> None:
        """The query starts reading ``state.epoch`` at ``first`` (initial offset, a stream that
        appeared, a new epoch): what the ring holds from there is the baseline."""
        self.observe(stream_id, state)
        led = self._ledger(stream_id, state.epoch)
        led.anchor(first, max(first, state.head) - 1)
        if state.gapped:
            led.add_known(state.present(first, state.head))

    def absorb(
        self,
        stream_id: int,
        items: Sequence[tuple[int, int]],
        drops: Sequence[tuple[int, int, int, int]],
    ) -> None:
        """Fold taken descriptors (and overflow holes, which precede them) into the ledgers."""
        per = self._ledgers.setdefault(stream_id, {})
        floor = min(per) if per else 0
        for epoch, lo, hi, _n in drops:
            if epoch >= floor:
                self._ledger(stream_id, epoch).dropped(lo, hi)
        for epoch, seq in items:
            if epoch >= floor:
                self._ledger(stream_id, epoch).describe(seq)

    def _fill(
        self, feed: DescriptorFeed | None, sid: int, epoch: int, upto: int, chunk: int, plan: Plan
    ) -> None:
        """Take descriptors until those of every seq below ``upto`` are in (or none are left).

        Starts with the admitted count and doubles: when nothing was lost in the range that
        is exactly the admitted frames' descriptors; later ones stay queued.
        """
        if feed is None:
            return
        k = max(1, chunk)
        while feed.pending(sid) > 0:
            per = self._ledgers.get(sid, {})
            led = per.get(epoch)
            if (led is not None and led.desc_hi >= upto - 1) or any(e > epoch for e in per):
                return
            items, drops = feed.take(sid, k)
            if drops:
                n = sum(d[3] for d in drops)
                plan.dropped[sid] = plan.dropped.get(sid, 0) + n
                self.intake_dropped += n
            self.absorb(sid, items, drops)
            plan.drained[sid] = plan.drained.get(sid, 0) + len(items)
            if not items:
                return
            k *= 2

    def planned_runs(self, stream_id: int, epoch: int, first: int, end: int) -> np.ndarray | None:
        """The seqs a recent plan of this process admitted for ``[first, end)``, if any."""
        return self._planned.get((stream_id, epoch, first, end))

    def _remember(self, key: tuple[int, int, int, int], runs: np.ndarray) -> None:
        self._planned[key] = runs
        self._planned.move_to_end(key)
        while len(self._planned) > self.REMEMBER:
            self._planned.popitem(last=False)

    def _classify(
        self, sid: int, st: RingState, a: int, b: int, admitted: np.ndarray, plan: Plan
    ) -> int:
        """Count frames of ``[a, b)`` that were published and are gone; returns the exact count."""
        if not self.is_sparse(sid, st.epoch):
            cnt, lo, hi = st.maybe_overwritten(a, b)
            if cnt:
                plan.losses.append(Loss(sid, st.epoch, lo, cnt, OVERWRITTEN, st.nslots, hi))
            return cnt
        led = self._ledger(sid, st.epoch)
        gone = np.setdiff1d(led.known_in(a, b), admitted, assume_unique=True)
        if len(gone):
            plan.losses.append(
                Loss(sid, st.epoch, int(gone[0]), len(gone), OVERWRITTEN, st.nslots, int(gone[-1]))
            )
        total, plo, phi = 0, None, None
        for u0, u1 in led.uncovered(a, b):
            cnt, lo, hi = st.maybe_overwritten(u0, u1)
            cnt -= int(np.count_nonzero((gone >= u0) & (gone < u1)))
            if cnt > 0:
                total += cnt
                plo = lo if plo is None else min(plo, lo)
                phi = hi if phi is None else max(phi, hi)
        if total:
            plan.possible.append(
                Loss(sid, st.epoch, plo or a, None, OVERWRITTEN, st.nslots, phi, at_most=total)
            )
        return len(gone)

    # --- planning --------------------------------------------------------------------------------
    def plan(
        self,
        start: Mapping[int, StreamPos],
        states: Mapping[int, RingState | None],
        limits: Limits,
        sizes: SizeFn | None = None,
        late: Mapping[int, int] | None = None,
        feed: DescriptorFeed | None = None,
        admit: AdmitFn | None = None,
        align: AlignFn | None = None,
    ) -> Plan:
        """The next end offset. ``admit`` cuts each stream's pending frames (#17); ``align``
        then caps them by what every stream will deliver once the per-trigger limits are
        applied (#27.1, the minimum rule): caps only ever shrink, so the loop ends, and at its
        end every admitted frame is within what ``align`` allows for the final counts."""
        plan = Plan({}, [], [], 0)
        end = plan.end
        ready: list[_Ready] = []
        for sid in self.streams:
            pos = start[sid]
            add_late = (late or {}).get(sid, 0)
            base = pos.frames or 0
            st = states.get(sid)
            # the old epoch's head must be read before a new epoch's scan replaces it
            old_head = self.seen_head(sid, pos.epoch)
            if st is not None:
                self.observe(sid, st)
            stay = replace(pos, lost_late=pos.lost_late + add_late, frames=base)
            if st is None or st.epoch < pos.epoch:
                # Not mapped (producer gone / not yet announced) or an older incarnation still
                # announcing: nothing new for this stream.
                end[sid] = stay
                continue
            head = st.head
            tgt = None if self.target is None else self.target.get(sid)
            if tgt is not None:
                if st.epoch > tgt[0]:
                    # Data after the AvailableNow target lives in a newer epoch: stop here.
                    if pos.epoch >= tgt[0]:
                        end[sid] = stay
                        continue
                elif st.epoch == tgt[0]:
                    head = min(head, tgt[1])
            if pos.epoch == NOT_STARTED:
                # The stream was not announced when the query started: it begins now, where
                # startingOffsets says, and nothing before that point counts as lost.
                first = st.oldest if self.start_at.get(sid, "earliest") == "earliest" else st.head
                first = min(first, head)
                self.begin(sid, st, first)
                end[sid] = replace(
                    pos, epoch=st.epoch, seq=first, lost_late=pos.lost_late + add_late, frames=base
                )
                continue
            if st.epoch > pos.epoch:
                lost = self._transition(sid, pos, st, old_head, feed, plan)
                first = min(st.head if st.empty else st.oldest, head)
                # frames of the new epoch already gone when we first saw it
                cnt, lo, hi = st.maybe_overwritten(0, first)
                if cnt and st.gapped:
                    plan.possible.append(
                        Loss(sid, st.epoch, lo, None, OVERWRITTEN, st.nslots, hi, at_most=cnt)
                    )
                elif cnt:
                    plan.losses.append(Loss(sid, st.epoch, lo, cnt, OVERWRITTEN, st.nslots, hi))
                    lost += cnt
                self.begin(sid, st, first)
                self._ledgers[sid] = {
                    e: v for e, v in self._ledgers.get(sid, {}).items() if e >= st.epoch
                }
                end[sid] = replace(
                    pos,
                    epoch=st.epoch,
                    seq=first,
                    lost=pos.lost + lost,
                    lost_late=pos.lost_late + add_late,
                    frames=base,
                )
                continue
            led = self._ledger(sid, st.epoch)
            if not led.started:
                # First plan of this process for a checkpointed position (a restart): the
                # descriptor record is complete only for frames published from now on.
                led.anchor(st.head, st.head - 1)
                if st.gapped:
                    led.add_known(st.present(pos.seq, st.head))
            ready.append(_Ready(sid, st, pos.seq, head, st.present(pos.seq, head)))
            end[sid] = stay

        # #17: the source's policies cut each stream's pending frames (prefixes, see Cut)
        cuts = admit(ready) if admit is not None and ready else {}
        no_cut = Cut()
        views = list(ready)
        if cuts:
            views = []
            for r in ready:
                c = cuts.get(r.sid, no_cut)
                stop = None if c.cap is None else c.skip + c.cap
                views.append(_Ready(r.sid, r.state, r.first, r.head, r.present[c.skip : stop]))
        wants = self._shares(views, limits, sizes)
        while align is not None and views:
            caps = align(views, wants)
            shrunk = False
            for i, v in enumerate(views):
                k = caps.get(v.sid)
                if k is not None and k < len(v.present):
                    views[i] = replace(v, present=v.present[:k])
                    shrunk = True
            if not shrunk:
                break
            wants = self._shares(views, limits, sizes)
        for r, n in zip(ready, wants, strict=True):
            sid, st, present = r.sid, r.state, r.present
            c = cuts.get(sid, no_cut)
            used = c.skip + n  # frames of present consumed: skipped, then delivered
            if used >= len(present):
                end_seq = max(r.head, r.first)
            else:
                end_seq = int(present[used - 1]) + 1 if used else r.first
            admitted = present[c.skip : used]
            lost = 0
            if end_seq > r.first:
                self._fill(feed, sid, st.epoch, end_seq, used, plan)
                lost = self._classify(sid, st, r.first, end_seq, present[:used], plan)
            led = self._ledger(sid, st.epoch)
            led.retire(end_seq)
            if self.is_sparse(sid, st.epoch):
                led.add_known(present[used:])
            runs = to_runs(admitted)
            plan.runs[sid] = runs
            first = int(present[c.skip - 1]) + 1 if c.skip else r.first
            self._remember((sid, st.epoch, first, end_seq), runs)
            e = end[sid]
            if end_seq == r.first:
                plan.frames += n
                continue  # nothing consumed: the stream's offset stays as it was
            flagged = min(c.flag, n)
            end[sid] = replace(
                e,
                epoch=st.epoch,
                seq=end_seq,
                lost=e.lost + lost,
                frames=(e.frames or 0) + n,
                late=e.late + c.late - (c.flag - flagged),
                shed_lag=e.shed_lag + c.shed_lag,
                shed_memory=e.shed_memory + c.shed_memory,
                skip_to=first if c.skip else 0,
                late_to=int(present[c.skip + flagged - 1]) + 1 if flagged else 0,
            )
            plan.frames += n
        return plan

    def _transition(
        self,
        sid: int,
        pos: StreamPos,
        st: RingState,
        old_head: int | None,
        feed: DescriptorFeed | None,
        plan: Plan,
    ) -> int:
        """Account for the unread rest of ``pos.epoch`` when ``st.epoch`` replaced it."""
        if old_head is None:
            plan.unknown_epoch_loss.append(Loss(sid, pos.epoch, pos.seq, None, EPOCH_CHANGE))
            return 0
        if old_head <= pos.seq:
            return 0
        if not self.is_sparse(sid, pos.epoch):
            lost = old_head - pos.seq
            plan.losses.append(Loss(sid, pos.epoch, pos.seq, lost, EPOCH_CHANGE))
            return lost
        self._fill(feed, sid, pos.epoch, old_head, 1, plan)
        led = self._ledger(sid, pos.epoch)
        known = led.known_in(pos.seq, old_head)
        if len(known):
            plan.losses.append(Loss(sid, pos.epoch, int(known[0]), len(known), EPOCH_CHANGE))
        holes = led.uncovered(pos.seq, old_head)
        if holes:
            span = sum(b - a for a, b in holes)
            plan.possible.append(
                Loss(sid, pos.epoch, holes[0][0], None, EPOCH_CHANGE, 0, holes[-1][1] - 1, span)
            )
        return len(known)

    def _shares(self, views: list[_Ready], limits: Limits, sizes: SizeFn | None) -> list[int]:
        """Frames each stream delivers under ``maxFramesPerTrigger`` and the byte budget."""
        wants = [len(v.present) for v in views]
        if limits.max_frames is not None:
            wants = split_budget(limits.max_frames, wants)
        if limits.max_bytes is not None and any(wants):
            wants = self._cut_bytes(views, wants, limits.max_bytes, sizes)
        return wants

    @staticmethod
    def _cut_bytes(
        ready: list[_Ready], wants: list[int], max_bytes: int, sizes: SizeFn | None
    ) -> list[int]:
        per_stream: list[np.ndarray] = []
        for r, n in zip(ready, wants, strict=True):
            seqs = r.present[:n]
            lens = r.state.lens_of(seqs)
            if lens is None:
                lens = (
                    np.asarray(sizes(r.sid, r.state.epoch, seqs), np.int64)
                    if sizes is not None
                    else np.zeros(len(seqs), np.int64)
                )
            per_stream.append(lens)
        totals = [int(s.sum()) for s in per_stream]
        shares = split_budget(max_bytes, totals)
        out: list[int] = []
        for sz, share in zip(per_stream, shares, strict=True):
            out.append(int(np.searchsorted(np.cumsum(sz), share, side="right")))
        if not any(out):
            # Progress guarantee (as Spark's file sources do with maxBytes): a frame larger
            # than the whole budget is admitted alone rather than stalling the query.
            for i, n in enumerate(wants):
                if n:
                    out[i] = 1
                    break
        return out


# --- partition planning --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Range:
    """Frames of one stream epoch: all committed seqs in ``[first, end)``, or exactly ``runs``.

    ``expect`` is how many frames the plan admitted (None: unknown, an old offset).
    """

    stream_id: int
    epoch: int
    first: int
    end: int  # exclusive
    expect: int | None = None
    runs: np.ndarray | None = field(default=None, compare=False)

    @property
    def count(self) -> int:
        return self.end - self.first if self.runs is None else runs_count(self.runs)


def batch_ranges(start: Mapping[int, StreamPos], end: Mapping[int, StreamPos]) -> list[Range]:
    """Seq ranges a batch ``[start, end)`` covers, per stream (deterministic: replays match)."""
    out = []
    for sid in sorted(end):
        e = end[sid]
        s = start.get(sid)
        if s is None or s.epoch != e.epoch:
            continue  # epoch transition batch: nothing to read for this stream
        expect = None if e.frames is None else e.frames - (s.frames or 0)
        first = max(s.seq, e.skip_to)  # #17: frames below skip_to were shed / late-dropped
        if e.seq > first and expect != 0:
            out.append(Range(sid, e.epoch, first, e.seq, expect))
    return out


def split_ranges(ranges: Sequence[Range], min_partitions: int | None) -> list[Range]:
    """One piece per range, or more so that there are at least ``min_partitions`` pieces.

    Pieces are handed out to ranges in proportion to their frame count (each range at least
    one), then each range is cut into nearly equal consecutive chunks of frames.
    """
    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return []
    want = len(ranges) if min_partitions is None else max(min_partitions, len(ranges))
    extra = split_budget(want - len(ranges), [r.count - 1 for r in ranges])
    pieces: list[Range] = []
    for r, more in zip(ranges, extra, strict=True):
        k = min(r.count, 1 + more)
        base, rem = divmod(r.count, k)
        if r.runs is None:
            at = r.first
            for i in range(k):
                n = base + (1 if i < rem else 0)
                pieces.append(Range(r.stream_id, r.epoch, at, at + n))
                at += n
            continue
        rest = r.runs
        for i in range(k):
            n = base + (1 if i < rem else 0)
            part, rest = _cut_runs(rest, n)
            pieces.append(Range(r.stream_id, r.epoch, int(part[0, 0]), int(part[-1, 1]), n, part))
    return pieces


__all__ = [
    "EPOCH_CHANGE",
    "FELL_BEHIND_HINT",
    "NOT_STARTED",
    "OVERWRITTEN",
    "REGIONS_GONE",
    "REGIONS_GONE_HINT",
    "AdmitFn",
    "Cut",
    "DescriptorFeed",
    "Limits",
    "Loss",
    "OffsetError",
    "Offsets",
    "Plan",
    "Range",
    "RingState",
    "StreamPlanner",
    "StreamPos",
    "batch_ranges",
    "decode_offsets",
    "encode_offsets",
    "grow_offsets",
    "iter_seq_chunks",
    "loss_message",
    "possible_loss_message",
    "runs_count",
    "runs_seqs",
    "split_budget",
    "split_ranges",
    "to_runs",
]
