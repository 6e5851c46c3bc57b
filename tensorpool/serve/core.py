"""What one ``do_get`` reads and what it reports lost: the server's rules, sans-IO.

Inputs are the decoded :class:`~tensorpool.spark_source.remote.Ticket`, the served stream's
current epoch and a fresh ring scan; the output is a :class:`GetPlan`. Nothing here touches
files, Flight or clocks, so each rule is a unit test.

* A ticket for another epoch than the one announced now reads nothing: its regions are gone as
  far as this server knows, and every frame is lost (``regions_gone``), as a local read of an
  unmappable epoch reports it.
* Frames below the ring's oldest committed seq were overwritten: one loss range, however wide
  (a ticket "far outside the ring" costs one line of metadata, not a loop over its seqs).
* A ticket whose range ends past the ring's head asks for frames that were never published:
  the client did not plan it from this server's scans, so it is refused (:class:`BadTicket`).
* The rest is read with the seqlock, exactly as a local read (the agent calls
  :func:`~tensorpool.spark_source.mapped_rings.read_range` with the clipped range and runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

from tensorpool.counters import Reason
from tensorpool.spark_source.mapped_rings import REGION_UNAVAILABLE
from tensorpool.spark_source.offsets import RingState
from tensorpool.spark_source.remote import Ticket

#: the reason given for frames that were below the ring's oldest frame when the ticket came
OVERWRITTEN_REASON: Final = Reason.SEQ_MISMATCH


class BadTicket(ValueError):
    """A well-formed ticket this server cannot honour (the message says why)."""


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


def plan_get(ticket: Ticket, epoch: int | None, st: RingState | None) -> GetPlan:
    """The plan for ``ticket`` given the stream's current ``epoch`` and ring ``st``."""
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


def _all(ticket: Ticket, runs: np.ndarray | None, reason: str) -> list[tuple[int, int, str]]:
    if runs is None:
        return [(ticket.first, ticket.end, reason)] if ticket.end > ticket.first else []
    return [(int(a), int(b), reason) for a, b in runs.tolist()]


__all__ = ["OVERWRITTEN_REASON", "BadTicket", "GetPlan", "plan_get"]
