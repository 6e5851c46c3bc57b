"""Exact frame accounting for the soak (issue #30 point 3), sans-IO.

Inputs are what the processes report: each producer the seq range it committed per epoch
(:class:`Published`), each consumer one :class:`Segment` per mapping (the consumer core's
accounting: first and last seq it took, frames delivered, and its drop counters over that
mapping). The rule checked, per segment:

    every seq from ``first_seq`` to ``last_seq`` is delivered or counted under a named,
    seq-level drop reason (``drops_gap``, the late reasons, ``rate_limited``, ...),

and, where the producer's report is complete (it was not killed with -9), no seq outside
what the producer committed in that epoch was delivered. A seq that is neither is
*unaccounted*: an :class:`Unaccounted` entry names the consumer, stream, epoch and seq range.

Seqs after a consumer's last seen seq in an epoch (it left, the epoch ended, the run
stopped) were never offered to it while it was attached as far as it can tell; they are
reported as ``tail`` counts, not as losses. Descriptor-level reasons (``not_mapped``,
``epoch_mismatch``, ``before_join``, ``seq_stale``, ``seq_implausible``, ...) count
descriptors, not seqs of the mapped range, so they are reported but never used to balance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Reasons that count descriptors rather than seqs of the mapped range (consumer_core.py);
#: ``resync`` is inside ``drops_gap`` already. tests/unit/soak checks the names exist.
DESCRIPTOR_REASONS: frozenset[str] = frozenset(
    {
        "not_mapped",
        "epoch_mismatch",
        "before_join",
        "seq_implausible",
        "seq_stale",
        "seq_regression",
        "resync",
        "after_handler_error",
    }
)


#: Drops lost to a producer's revoke (consumer_core.REVOKED; this module imports nothing).
REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class Published:
    """What one producer committed in one epoch: seqs ``first_seq..last_seq``. ``complete``:
    the range comes from the producer's final report (False: it was killed, the range is what
    its last progress line said and may be short)."""

    stream_id: int
    epoch: int
    first_seq: int
    last_seq: int
    complete: bool = True


@dataclass(frozen=True, slots=True)
class Segment:
    """One consumer mapping of one epoch: seqs ``first_seq..last_seq`` were taken
    (``first_seq`` -1: none), ``delivered`` frames handed to the application, ``drops_gap``
    and ``drops`` (reason -> count) counted over the mapping."""

    consumer: str
    stream_id: int
    epoch: int
    first_seq: int
    last_seq: int
    delivered: int
    drops_gap: int = 0
    drops: Mapping[str, int] = field(default_factory=dict)

    @property
    def counted(self) -> int:
        """Seqs of the range the consumer dropped under a named, seq-level reason."""
        # ``revoked`` seqs are in ``drops_gap`` too (consumer_core: a gap, for QoS), and they
        # are the revoked epoch's, after its last seen seq: not of this range (they are that
        # epoch's tail). Counted twice here, they were the 30-minute run's "overcounted".
        gap = self.drops_gap - self.drops.get(REVOKED, 0)
        return gap + sum(
            n for r, n in self.drops.items() if r not in DESCRIPTOR_REASONS and r != REVOKED
        )


@dataclass(frozen=True, slots=True)
class Unaccounted:
    consumer: str
    stream_id: int
    epoch: int
    first_seq: int
    last_seq: int
    frames: int
    why: str


@dataclass(slots=True)
class LedgerResult:
    unaccounted: list[Unaccounted] = field(default_factory=list)
    delivered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    overcounted: int = 0  # counted more than the range holds (a double count, not a loss)
    #: the segments that did, to find the cause: (consumer, stream, epoch, first, last, n,
    #: delivered, drops_gap, drops)
    overcounted_in: list[tuple[object, ...]] = field(default_factory=list)
    tail: int = 0
    unverified_segments: int = 0  # producer report incomplete: only the hole rule checked

    @property
    def unaccounted_frames(self) -> int:
        return sum(u.frames for u in self.unaccounted)


def reconcile(published: Iterable[Published], segments: Iterable[Segment]) -> LedgerResult:
    """Check every segment against the rule above; see the module docstring."""
    pub: dict[tuple[int, int], Published] = {}
    for p in published:
        old = pub.get((p.stream_id, p.epoch))
        if old is not None:  # two reports of one epoch (a progress line and a final one)
            p = Published(
                p.stream_id,
                p.epoch,
                min(old.first_seq, p.first_seq),
                max(old.last_seq, p.last_seq),
                old.complete or p.complete,
            )
        pub[(p.stream_id, p.epoch)] = p
    res = LedgerResult()
    last_seen: dict[tuple[str, int, int], int] = {}
    for s in segments:
        res.delivered += s.delivered
        if s.drops_gap:
            res.dropped["drops_gap"] = res.dropped.get("drops_gap", 0) + s.drops_gap
        for r, n in s.drops.items():
            if n and r != "resync":
                res.dropped[r] = res.dropped.get(r, 0) + n
        if s.first_seq < 0:
            if s.delivered:
                res.unaccounted.append(
                    Unaccounted(
                        s.consumer,
                        s.stream_id,
                        s.epoch,
                        -1,
                        -1,
                        s.delivered,
                        "delivered frames without a seq range",
                    )
                )
            continue
        key = (s.consumer, s.stream_id, s.epoch)
        last_seen[key] = max(last_seen.get(key, -1), s.last_seq)
        missing = (s.last_seq - s.first_seq + 1) - s.delivered - s.counted
        if missing > 0:
            res.unaccounted.append(
                Unaccounted(
                    s.consumer,
                    s.stream_id,
                    s.epoch,
                    s.first_seq,
                    s.last_seq,
                    missing,
                    f"neither delivered nor counted (delivered {s.delivered}, drops_gap "
                    f"{s.drops_gap}, drops {dict(s.drops)})",
                )
            )
        elif missing < 0:
            res.overcounted += -missing
            res.overcounted_in.append(
                (
                    s.consumer,
                    s.stream_id,
                    s.epoch,
                    s.first_seq,
                    s.last_seq,
                    -missing,
                    s.delivered,
                    s.drops_gap,
                    {r: n for r, n in s.drops.items() if n},
                )
            )
        p = pub.get((s.stream_id, s.epoch))
        if p is None or not p.complete:
            res.unverified_segments += 1
            if p is None:
                continue
        if s.last_seq > p.last_seq and p.complete:
            res.unaccounted.append(
                Unaccounted(
                    s.consumer,
                    s.stream_id,
                    s.epoch,
                    p.last_seq + 1,
                    s.last_seq,
                    s.last_seq - p.last_seq,
                    "taken but never published",
                )
            )
        if s.first_seq < p.first_seq:
            res.unaccounted.append(
                Unaccounted(
                    s.consumer,
                    s.stream_id,
                    s.epoch,
                    s.first_seq,
                    p.first_seq - 1,
                    p.first_seq - s.first_seq,
                    "taken but never published",
                )
            )
    for (_c, sid, ep), last in last_seen.items():
        p = pub.get((sid, ep))
        if p is not None and p.last_seq > last:
            res.tail += p.last_seq - last
    return res


def check_rate_limit(runs: Iterable[tuple[int, float]], max_rate_hz: float) -> int:
    """Frames a rate limiter published beyond its rule (RateLimiter §3: at most one frame per
    1/max_rate_hz slot), per run of the limiter: ``(published, seconds it ran)``, its own count
    (a restarted limiter may send at once: one extra frame each run).

    The limiter's own count, not what its consumer delivered in a time window: a consumer
    that lags at the window's start (a starved process, seconds behind) delivers frames
    published before it, and 22 such frames once counted as "over the rule" at load 28."""
    return sum(max(0, published - int(seconds * max_rate_hz) - 1) for published, seconds in runs)


def check_bridge(source_published: int, dest_delivered: int) -> int:
    """Frames a bridge's destination delivered that its source never published (the bridge
    forwards, never invents)."""
    return max(0, dest_delivered - source_published)


#: A query run's last batch: frames its executors found overwritten at read time were reported
#: to that run's reader, which records them in the *next* offset (``lostLate``); a stopped
#: query has none, and the restarted one's reader never got them. The executor's log line
#: names them; the ledger counts them under this name, apart from what the source counted.
UNREPORTED_AT_STOP = "spark_read_loss_unreported_at_stop"


@dataclass(frozen=True, slots=True)
class SparkBatch:
    """One micro-batch of the soak's Spark query for one stream: the source's offsets at its
    start and end (``lost``: the cumulative ``lost``, ``late``: the cumulative ``lostLate``)
    and the rows the sink got per epoch: epoch -> (rows, distinct seqs, min seq, max seq)."""

    batch_id: int
    stream_id: int
    start_epoch: int
    start_seq: int
    start_lost: int
    start_late: int
    end_epoch: int
    end_seq: int
    end_lost: int
    end_late: int
    rows: Mapping[int, tuple[int, int, int, int]]
    run: str = ""  # the query run that planned it (a restart from the checkpoint: a new one)


def spark_segments(
    batches: Iterable[SparkBatch], name: str = "spark"
) -> tuple[list[Segment], list[Unaccounted], int]:
    """The Spark query's batches as ledger segments (#30.3: Spark's rows plus its reported loss
    equal what was published in its range), rows no batch range explains, and how many batches
    crossed an epoch change.

    A batch ``[start, end)`` of one epoch delivers every seq committed in it, minus the frames
    the source counted lost: at planning (``lost``, in the batch's own end offset) or at
    reading (``lostLate``, reported through the next batch's offset). So each such batch is a
    segment ``start.seq .. end.seq - 1`` with ``delivered`` its distinct seqs and, counted, the
    loss ``lost`` grew by in it plus what ``lostLate`` grew by in the next batch. A seq twice
    in one batch, or a row outside its batch's range or epoch, is unaccounted. A batch across
    an epoch change is left out (its old epoch's end is not in the offsets) and only counted."""
    by_stream: dict[int, dict[int, SparkBatch]] = {}
    for b in batches:  # a replayed batch: the last report wins
        by_stream.setdefault(b.stream_id, {})[b.batch_id] = b
    segments: list[Segment] = []
    odd: list[Unaccounted] = []
    across = 0
    for sid, got in sorted(by_stream.items()):
        order = [got[k] for k in sorted(got)]
        for i, b in enumerate(order):
            if b.start_epoch != b.end_epoch:
                across += 1
                continue
            who = f"{name}#{b.batch_id}"
            for e, (count, distinct, lo, hi) in sorted(b.rows.items()):
                if count > distinct:
                    odd.append(Unaccounted(who, sid, e, lo, hi, count - distinct, "duplicate rows"))
                if e != b.end_epoch or lo < b.start_seq or hi >= b.end_seq:
                    odd.append(
                        Unaccounted(
                            who,
                            sid,
                            e,
                            lo,
                            hi,
                            distinct,
                            f"rows outside the batch's range (epoch {b.end_epoch} seq "
                            f"{b.start_seq}..{b.end_seq - 1})",
                        )
                    )
            if b.end_seq <= b.start_seq:
                continue  # empty batch
            last_of_run = i + 1 == len(order) or order[i + 1].run != b.run
            late = 0 if i + 1 == len(order) else order[i + 1].end_late - b.end_late
            distinct = b.rows.get(b.end_epoch, (0, 0, -1, -1))[1]
            drops = {"spark_lost": b.end_lost - b.start_lost, "spark_lost_late": late}
            if last_of_run:
                # its read-time loss went to a reader that is gone: the next offset is planned
                # by a new one (docs/reliability.md, "read-time loss at a stop")
                unreported = (b.end_seq - b.start_seq) - distinct - sum(drops.values())
                drops[UNREPORTED_AT_STOP] = max(0, unreported)
            segments.append(
                Segment(who, sid, b.end_epoch, b.start_seq, b.end_seq - 1, distinct, 0, drops)
            )
    return segments, odd, across
