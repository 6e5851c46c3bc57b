"""Why frames were lost, said for the kind of read that lost them (#16.3).

:func:`~tensorpool.spark_source.plan.offsets.loss_message` lists what was lost; the hint after it
says why and what to do. "The query fell behind the producer" is true of a streaming query
whose reads trail the producer. It is not true of

* a batch read (``spark.read``): a DataFrame is one snapshot, planned at its first action; a
  frame gone when a task reads it was overwritten after planning (the tasks started late, or a
  later action re-read a snapshot the ring has moved past) -- :func:`batch_hint`;
* ``startingOffsets`` JSON older than the ring: those frames were gone before the query
  started -- :func:`explicit_start_hint`;
* a task on the wrong host: not loss at all (:mod:`~tensorpool.spark_source.rings.hosts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tensorpool.spark_source.plan.offsets import REGIONS_GONE, Loss, loss_message
from tensorpool.spark_source.rings.hosts import PlanOrigin


def batch_hint(origin: PlanOrigin | None) -> str:
    """A batch DataFrame's frames were overwritten between its planning and this read."""
    when = ""
    if origin is not None:
        stamp = time.strftime("%H:%M:%S", time.gmtime(origin.planned_at_ns / 1e9))
        when = f" (planned {origin.age_s():.1f} s ago, at {stamp} UTC)"
    return (
        f"A batch DataFrame is one snapshot{when}: Spark plans it at its first action and "
        "every later action reads the same frames again; the producer overwrote these after "
        "the plan, before a task read them. To run several actions on one snapshot call "
        ".cache() (or .persist()) before the first action; for newer frames read the stream "
        "again (spark.read...load()); give the ring more slots (header_nslots) to keep frames "
        "longer; start at 'earliest' to read whatever the ring still holds; or set "
        "failOnDataLoss=false to skip lost frames."
    )


def explicit_start_hint(stream_id: int, seq: int, oldest: int, nslots: int) -> str:
    """``startingOffsets`` named frames the ring no longer held when the read started."""
    return (
        f"startingOffsets asked for stream {stream_id} from seq {seq}, but the ring ({nslots} "
        f"slots) held frames from seq {oldest} on when the query started: the older ones were "
        "overwritten before it began. Start at a seq the ring still holds (or at 'earliest'), "
        "or set failOnDataLoss=false to skip them."
    )


def batch_loss_message(origin: PlanOrigin | None) -> Callable[[Sequence[Loss]], str]:
    """The message function of a batch partition's read-time loss."""

    def message(losses: Sequence[Loss]) -> str:
        if losses and all(ls.reason == REGIONS_GONE for ls in losses):
            return loss_message(losses)  # the producer exited: its own hint
        return loss_message(losses, batch_hint(origin))

    return message


__all__ = ["batch_hint", "batch_loss_message", "explicit_start_hint"]
