"""The one seam between the Spark adapters and the rings (#27.2): :class:`RingSource`.

The readers plan from ring states and hand each partition a :class:`PartitionRead`; whether the
rings are mapped here (:mod:`.local`) or served by ``tensorpool serve`` on their hosts
(:mod:`.remote`, Arrow Flight) is decided once, by :func:`open_rings` / :func:`snapshot`, and
nowhere else. Both sides give the same :class:`~tensorpool.spark_source.plan.offsets.RingState`
per stream, so offsets, admission, loss at planning and replay are one code path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from tensorpool.spark_source.options import SourceOptions
    from tensorpool.spark_source.plan.offsets import RingState
    from tensorpool.spark_source.plan.planner import DescriptorFeed
    from tensorpool.spark_source.rings.hosts import PlanOrigin
    from tensorpool.spark_source.rings.mapped_rings import RegionSpec
    from tensorpool.spark_source.rings.stream_meta import MetaTracker
    from tensorpool.transport.context import AeronContext

#: what a read calls for each frame it cannot deliver: ``(seq, reason)``
OnLoss = Callable[[int, str], None]


class PartitionRead(Protocol):
    """How an executor reads one partition's frames (picklable: it travels in the partition)."""

    def read(self, part: Any, on_loss: OnLoss, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The planned frames of ``part`` as record batches in ``schema``; frames not delivered
        go to ``on_loss``."""
        ...


class RingSource(Protocol):
    """A streaming query's rings on the Spark driver: scan them, say where a partition reads,
    and collect the read-time loss counted outside the spool."""

    def scan(
        self, streams: tuple[int, ...], specs: dict[tuple[int, int], RegionSpec]
    ) -> dict[int, RingState | None]:
        """Every stream's ring now (None: not announced or not readable right now); records
        each stream epoch's region in ``specs``."""
        ...

    def scan_one(self, sid: int, spec: RegionSpec) -> RingState:
        """A fresh scan of one stream epoch (a replayed batch); raises if it is gone."""
        ...

    def liveness(self, now_ns: int) -> dict[int, tuple[bool, int | None]]:
        """Per stream: whether its producer is live, and its announce's age in ms."""
        ...

    def feed(self) -> DescriptorFeed | None:
        """The received descriptors of sparse streams (None: plan from ring scans alone)."""
        ...

    def origin(self, spec: RegionSpec) -> PlanOrigin | None:
        """This planning host's view of ``spec``'s files, for a task to check (#16.3)."""
        ...

    def reader_for(self, sid: int) -> PartitionRead:
        """How the partitions of stream ``sid`` read their frames."""
        ...

    def take_losses(self, streams: tuple[int, ...]) -> dict[int, int]:
        """Read-time loss per stream counted where the frames were read (not spooled), plus
        what earlier calls returned that no offset recorded yet (see :meth:`forget_losses`)."""
        ...

    def forget_losses(self) -> None:
        """An offset recorded what :meth:`take_losses` returned."""
        ...

    # the control plane of mapped rings (stream discovery, metadata, streams named later);
    # options refuse these features for streams served by other hosts
    @property
    def context(self) -> AeronContext: ...

    def add_poller(self, poller: Callable[[], int]) -> None: ...

    def add_streams(self, streams: tuple[int, ...]) -> None: ...

    def wait_for_layouts(self, timeout_s: float) -> Mapping[int, Any]: ...

    def close(self) -> None: ...


class RingSnapshot(Protocol):
    """A batch read's consistent snapshot: each stream's region and ring state when it ran."""

    #: the options with ``streams`` resolved (``streams="*"``: the streams announced now)
    opts: SourceOptions
    specs: dict[int, RegionSpec]
    states: dict[int, RingState]
    #: includeStreamMetadata (#16.4): the streams' metadata versions; None: no column
    meta: MetaTracker | None

    def origin(self, spec: RegionSpec) -> PlanOrigin | None: ...

    def reader_for(self, sid: int) -> PartitionRead: ...


def open_rings(opts: SourceOptions, *, descriptors: bool = True) -> RingSource:
    """The streaming reader's rings: through ``tensorpool serve`` with ``hosts`` (no Aeron on
    the driver), else mapped here. ``descriptors``: keep the streams' received descriptors for
    :meth:`RingSource.feed` (the pulse reader cuts windows from the scans alone)."""
    if opts.remote is not None:
        from tensorpool.spark_source.rings.remote import FlightRings

        return FlightRings(opts.remote, opts.streams)
    from tensorpool.spark_source.rings.local import LocalRings

    return LocalRings.attach(opts, descriptors=descriptors)


def snapshot(opts: SourceOptions) -> RingSnapshot:
    """The batch reader's snapshot, from the streams' hosts with ``hosts``, else mapped here."""
    if opts.remote is not None:
        from tensorpool.spark_source.rings.remote import flight_snapshot

        return flight_snapshot(opts)
    from tensorpool.spark_source.rings.local import local_snapshot

    return local_snapshot(opts)
