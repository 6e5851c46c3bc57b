"""What one ``do_get`` reads and what it reports lost: the server's rules, sans-IO.

Inputs are the decoded :class:`~tensorpool.spark_source.rings.flight_protocol.Ticket`, the
served stream's current epoch and a fresh ring scan; the output is a :class:`GetPlan`. Nothing
here touches files, Flight or clocks, so each rule is a unit test.

* A ticket names at most as many frames as the ring of its stream holds (``nslots``, the
  largest this server has seen announced for it): a plan names frames it found together in one
  ring, so anything wider was not planned from this server and is refused (:class:`BadTicket`).
  Every frame a ticket can make the server count as lost is thus one that ring could hold: a
  client cannot inflate the loss counters or the ledger beyond that per call, nor name a ring
  the server has not seen (nothing is read or counted: :class:`NotAnnounced`, which the server
  answers "try again", as a restarted server learns its rings at the next announce), nor an
  epoch newer than the one announced now (refused).
* A ticket for an older epoch than the one announced now (or while nothing is announced) reads
  nothing: its regions are gone as far as this server knows, and every frame is lost
  (``regions_gone``), as a local read of an unmappable epoch reports it.
* Frames below the ring's oldest committed seq were overwritten: one loss range, however wide
  (a ticket "far outside the ring" costs one line of metadata, not a loop over its seqs).
* A ticket whose range ends past the ring's head asks for frames that were never published:
  the client did not plan it from this server's scans, so it is refused (:class:`BadTicket`).
* The rest is read with the seqlock, exactly as a local read (the agent calls
  :func:`~tensorpool.spark_source.rings.mapped_rings.read_range` with the clipped range and runs).
* Frames a ticket with a loss key did not get are counted in the :class:`LossLedger` until that
  query's driver takes them (its ``lostLate``; a task on another host cannot reach the driver).
  Each record and each non-empty take is also one journal line (:func:`journal_record`,
  :func:`journal_take`); :meth:`LossLedger.replay` rebuilds the ledger from them after a
  restart (the server's journal file: :mod:`tensorpool.serve.journal`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from tensorpool.counters import Reason
from tensorpool.spark_source.plan.offsets import RingState
from tensorpool.spark_source.rings.flight_protocol import LOSS_KEY, Ticket
from tensorpool.spark_source.rings.mapped_rings import REGION_UNAVAILABLE

#: the reason given for frames that were below the ring's oldest frame when the ticket came
OVERWRITTEN_REASON: Final = Reason.SEQ_MISMATCH


class BadTicket(ValueError):
    """A well-formed ticket this server cannot honour (the message says why)."""


class NotAnnounced(LookupError):
    """The ticket's stream (one this server serves) has not been announced to it yet: a
    restarted server learns the ring at the driver's next announce, so the client is told to
    try again (Flight's UNAVAILABLE), not that its ticket is bad: a read resumed across a
    restart of ``serve`` failed the task, and with it a local query (#30 soak)."""


@dataclass(slots=True)
class GetPlan:
    """Loss ranges to report first, then ``[first, end)`` (or ``runs``) to read."""

    lost: list[tuple[int, int, str]] = field(default_factory=list)
    first: int = 0
    end: int = 0
    runs: np.ndarray | None = None

    @property
    def reads(self) -> bool:
        return self.end > self.first and (self.runs is None or len(self.runs) > 0)


def plan_get(
    ticket: Ticket, epoch: int | None, st: RingState | None, nslots: int | None
) -> GetPlan:
    """The plan for ``ticket`` given the stream's current ``epoch`` and ring ``st``, and the
    most slots a ring of the stream has had here (``nslots``; None: never announced here)."""
    sid = ticket.stream_id
    if nslots is None:
        raise NotAnnounced(f"stream {sid} has not been announced to this server yet; retry")
    if ticket.frames > nslots:
        raise BadTicket(
            f"the ticket names {ticket.frames} frames of stream {sid}, whose ring holds "
            f"{nslots}; plan tickets from this server's scan"
        )
    if epoch is not None and ticket.epoch > epoch:
        raise BadTicket(
            f"stream {sid} epoch {ticket.epoch} was never announced (the epoch now is {epoch})"
        )
    runs = ticket.runs_array()
    if epoch is None or st is None or ticket.epoch != epoch:
        return GetPlan(lost=_all(ticket, runs, REGION_UNAVAILABLE))
    if ticket.end > st.head:
        raise BadTicket(
            f"stream {ticket.stream_id} epoch {epoch}: the ticket reads up to seq "
            f"{ticket.end - 1} but the newest frame is seq {st.head - 1}; plan tickets from "
            "this server's scan"
        )
    oldest = st.oldest if not st.empty else st.head
    if runs is None:
        lost = [(ticket.first, min(ticket.end, oldest), OVERWRITTEN_REASON)]
        first = max(ticket.first, oldest)
        return GetPlan(
            lost=[r for r in lost if r[1] > r[0]], first=first, end=max(first, ticket.end)
        )
    lost = [
        (int(a), int(min(b, oldest)), OVERWRITTEN_REASON) for a, b in runs.tolist() if a < oldest
    ]
    kept = runs[runs[:, 1] > oldest].copy()
    if len(kept):
        kept[:, 0] = np.maximum(kept[:, 0], oldest)
    first = max(ticket.first, oldest)
    return GetPlan(lost=lost, first=first, end=max(first, ticket.end), runs=kept)


#: (loss key, stream, epoch) entries the ledger holds at most: ~100 bytes each, so a client
#: inventing keys or epochs costs at most this much memory (the oldest entries go, counted)
LEDGER_MAX_ENTRIES: Final = 4096
#: an entry no driver took for this long is dropped (its query is gone); longer than any
#: sensible trigger interval, since a query collects at its next trigger
LEDGER_TTL_NS: Final = 6 * 3600 * 10**9


class LossLedger:
    """Read-time loss per query, kept until the query's driver takes it (sans-IO, not
    thread-safe: the server holds a lock around it).

    Keyed by (loss key, stream, epoch). The client names only the key (a random secret of its
    query); the counts are the frames this server itself found missing. Bounded: at most
    ``max_entries`` entries, least recently updated evicted first (``loss_ledger_evicted``,
    ``loss_ledger_evicted_frames``); an entry untouched for ``ttl_ns`` expires
    (``loss_ledger_expired``).
    """

    def __init__(
        self,
        counters: Counter[str] | None = None,
        max_entries: int = LEDGER_MAX_ENTRIES,
        ttl_ns: int = LEDGER_TTL_NS,
    ) -> None:
        self.counters: Counter[str] = Counter() if counters is None else counters
        self.max_entries = max_entries
        self.ttl_ns = ttl_ns
        # least recently updated first: both eviction and expiry pop from the front
        self._entries: OrderedDict[tuple[str, int, int], tuple[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, key: str, stream_id: int, epoch: int, frames: int, now_ns: int) -> None:
        """``frames`` of ``stream_id`` epoch ``epoch`` were not delivered to a ``key`` reader."""
        if frames <= 0:
            return
        self._expire(now_ns)
        k = (key, stream_id, epoch)
        had = self._entries.pop(k, None)
        if had is None and len(self._entries) >= self.max_entries:
            _, (lost, _) = self._entries.popitem(last=False)
            self.counters["loss_ledger_evicted"] += 1
            self.counters["loss_ledger_evicted_frames"] += lost
        self._entries[k] = ((0 if had is None else had[0]) + frames, now_ns)
        self.counters["loss_ledger_frames"] += frames

    def take(self, key: str, now_ns: int) -> list[tuple[int, int, int]]:
        """``(stream, epoch, frames)`` recorded for ``key``, forgotten as they are returned
        (an unknown key gets an empty list)."""
        self._expire(now_ns)
        out = [(sid, ep, n) for (k, sid, ep), (n, _) in self._entries.items() if k == key]
        for sid, ep, _ in out:
            del self._entries[(key, sid, ep)]
        self.counters["loss_ledger_taken"] += len(out)
        return out

    def entries(self) -> list[tuple[str, int, int, int, int]]:
        """``(key, stream, epoch, frames, updated_ns)``, least recently updated first: replayed
        as records in this order they rebuild this ledger (the journal's compaction)."""
        return [(k, sid, ep, n, at) for (k, sid, ep), (n, at) in self._entries.items()]

    def replay(self, journal: bytes, now_ns: int) -> Counter[str]:
        """Apply the journal's records and takes in order, at their own times (so eviction and
        expiry fall as they did), then expire at ``now_ns``. A line that is not a record or a
        take is skipped: ``loss_journal_truncated`` for an unfinished last line (a process
        killed mid-write), ``loss_journal_bad_line`` for any other. Returns what was replayed
        and skipped; the ledger's own counters count only the expiry at ``now_ns`` (the rest
        was counted by the process that wrote the journal)."""
        out: Counter[str] = Counter()
        live, self.counters = self.counters, Counter()
        try:
            lines = journal.split(b"\n")
            if lines[-1]:
                out["loss_journal_truncated"] += 1
            for line in lines[:-1]:
                ev = _journal_event(line)
                if ev is None:
                    out["loss_journal_bad_line"] += 1
                elif len(ev) == 6:
                    self.record(*ev[1:])
                    out["loss_journal_replayed_records"] += 1
                else:
                    self.take(*ev[1:])
                    out["loss_journal_replayed_takes"] += 1
        finally:
            self.counters = live
        self._expire(now_ns)
        return out

    def _expire(self, now_ns: int) -> None:
        e = self._entries
        while e:
            k, (_, at) = next(iter(e.items()))
            if now_ns - at < self.ttl_ns:
                return
            del e[k]
            self.counters["loss_ledger_expired"] += 1


def journal_record(key: str, stream_id: int, epoch: int, frames: int, now_ns: int) -> bytes:
    """The journal line of :meth:`LossLedger.record` (a loss key is 32 hex digits: no
    separator can occur in one)."""
    return f"r {key} {stream_id} {epoch} {frames} {now_ns}\n".encode()


def journal_take(key: str, now_ns: int) -> bytes:
    """The journal line of a :meth:`LossLedger.take` that returned something."""
    return f"t {key} {now_ns}\n".encode()


def _journal_event(
    line: bytes,
) -> tuple[str, str, int, int, int, int] | tuple[str, str, int] | None:
    parts = line.decode("ascii", "replace").split(" ")
    if len(parts) not in (3, 6) or LOSS_KEY.fullmatch(parts[1]) is None:
        return None
    if not all(p.isdigit() and len(p) <= 20 for p in parts[2:]):
        return None
    nums = [int(p) for p in parts[2:]]
    if parts[0] == "r" and len(parts) == 6 and nums[2] > 0:
        return ("r", parts[1], nums[0], nums[1], nums[2], nums[3])
    if parts[0] == "t" and len(parts) == 3:
        return ("t", parts[1], nums[0])
    return None


def _all(ticket: Ticket, runs: np.ndarray | None, reason: str) -> list[tuple[int, int, str]]:
    if runs is None:
        return [(ticket.first, ticket.end, reason)] if ticket.end > ticket.first else []
    return [(int(a), int(b), reason) for a, b in runs.tolist()]


__all__ = [
    "LEDGER_MAX_ENTRIES",
    "LEDGER_TTL_NS",
    "OVERWRITTEN_REASON",
    "BadTicket",
    "GetPlan",
    "LossLedger",
    "NotAnnounced",
    "journal_record",
    "journal_take",
    "plan_get",
]
