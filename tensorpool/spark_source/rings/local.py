"""Rings mapped on this host: the local :class:`~.port.RingSource` and batch snapshot (#27.2).

The Spark driver learns the streams' layouts from their announces (a standalone producer) or
leases (the SHM driver) through an :class:`~.attach.Attachment` or the process's shared
:class:`~.probe.AnnounceProbe` (#15), maps their regions (:mod:`.mapped_rings`) and scans
them; executors map the same regions and read the planned frames with the seqlock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorpool.spark_source.rings import discovery, mapped_rings, stream_meta
from tensorpool.spark_source.rings.attach import (
    DEFAULT_INTAKE_CAPACITY,
    Attachment,
    StreamsNotAttached,
    open_attachment,
)
from tensorpool.spark_source.rings.hosts import BATCH, STREAM, PlanOrigin
from tensorpool.spark_source.rings.probe import AnnounceProbe, shared_probe

if TYPE_CHECKING:
    import pyarrow as pa

    from tensorpool.spark_source.options import SourceOptions
    from tensorpool.spark_source.plan.offsets import RingState
    from tensorpool.spark_source.plan.planner import DescriptorFeed
    from tensorpool.transport.context import AeronContext

log = logging.getLogger("tensorpool.spark_source")


def settings(opts: SourceOptions) -> Any:
    return opts.connection.client_settings(freshness_ms=opts.freshness_ms)


def _validate(base_dirs: tuple[str, ...]) -> Callable[[Any], None]:
    """A probe's ``map_layout``: an announced layout counts once its regions map and validate
    (mapped anew if the files changed since this process mapped them)."""

    def validate(layout: Any) -> None:
        spec = mapped_rings.RegionSpec.from_layout(layout)
        mapped_rings.mapped(spec, base_dirs, revalidate=True)

    return validate


def kept_probe(opts: SourceOptions) -> AbstractContextManager[AnnounceProbe]:
    """This process's announce probe for ``opts``' control channel, kept between plans (#15)."""
    base_dirs = opts.connection.base_dirs
    return shared_probe(
        settings(opts),
        map_layout=_validate(base_dirs),
        is_current=mapped_rings.layout_still_mapped,
        scope=base_dirs,
    )


def plan_origin(spec: mapped_rings.RegionSpec, opts: SourceOptions, kind: str) -> PlanOrigin | None:
    """This planning host's view of ``spec``'s header ring (#16.3), None if it is not mapped."""
    try:
        m = mapped_rings.mapped(spec, opts.connection.base_dirs)
    except Exception:  # regions gone since the scan: the tasks report that as loss
        return None
    return PlanOrigin.of(m.regions[0].path, opts.connection.shm_base_dir, kind)


@dataclass(frozen=True, slots=True)
class LocalRead:
    """Read a partition from the mapped regions under ``base_dirs`` (the planning host's)."""

    base_dirs: tuple[str, ...]

    def read(
        self, part: Any, on_loss: Callable[[int, str], None], schema: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        return mapped_rings.read_range(
            part.region,
            self.base_dirs,
            part.first,
            part.end,
            # the metadata column is chosen by each frame's meta_version (#16.4)
            include_meta=part.include_meta or getattr(part, "stream_meta", None) is not None,
            on_loss=on_loss,
            schema=schema,
            runs=part.runs,
        )


class LocalRings:
    """The :class:`~.port.RingSource` of rings mapped here, over a control-plane attachment.

    It is also the planner's descriptor feed (``pending``/``take``) when the attachment keeps
    descriptor intakes (sparse streams)."""

    def __init__(self, att: Attachment, opts: SourceOptions) -> None:
        self.att = att
        self._opts = opts

    @classmethod
    def attach(cls, opts: SourceOptions, *, descriptors: bool = True) -> LocalRings:
        """The streaming reader's attachment, waiting up to ``attachTimeoutMs`` for the layouts
        (``descriptors``: keep each stream's descriptor intake, the planner's feed).

        A stream that does not appear in time is not an error: it may come later (producer not
        started yet, or restarting) and is picked up when it appears; until then it has no data.
        """
        att = open_attachment(
            opts.streams,
            settings(opts),
            driver=opts.connection.driver,
            intake_capacity=DEFAULT_INTAKE_CAPACITY if descriptors else None,
        )
        try:
            att.wait_for_layouts(opts.connection.attach_timeout_ms / 1000)
        except StreamsNotAttached as exc:
            log.warning("tensorpool: %s; continuing without them for now", exc)
        except BaseException:
            att.close()
            raise
        return cls(att, opts)

    def scan(
        self, streams: tuple[int, ...], specs: dict[tuple[int, int], mapped_rings.RegionSpec]
    ) -> dict[int, RingState | None]:
        """Every stream's mapped ring (None: not announced / not mappable right now); records
        each stream epoch's RegionSpec in ``specs`` (partitions need it later)."""
        base_dirs = self._opts.connection.base_dirs
        layouts = self.att.layouts()
        out: dict[int, RingState | None] = {}
        for sid in streams:
            layout = layouts.get(sid)
            if layout is None:
                out[sid] = None
                continue
            spec = mapped_rings.RegionSpec.from_layout(layout)
            specs[(sid, spec.epoch)] = spec
            try:
                out[sid] = mapped_rings.mapped(spec, base_dirs).scan()
            except Exception as exc:  # regions vanished between announce and map
                log.warning("tensorpool: stream %d epoch %d not mappable: %s", sid, spec.epoch, exc)
                out[sid] = None
        return out

    def scan_one(self, sid: int, spec: mapped_rings.RegionSpec) -> RingState:
        return mapped_rings.mapped(spec, self._opts.connection.base_dirs).scan()

    def liveness(self, now_ns: int) -> dict[int, tuple[bool, int | None]]:
        return self.att.liveness(now_ns)

    def feed(self) -> DescriptorFeed | None:
        return self if self.att.intakes else None

    def pending(self, stream_id: int) -> int:
        return self.att.pending(stream_id)

    def take(self, stream_id: int, max_items: int) -> Any:
        return self.att.take(stream_id, max_items)

    def origin(self, spec: mapped_rings.RegionSpec) -> PlanOrigin | None:
        return plan_origin(spec, self._opts, STREAM)

    def reader_for(self, sid: int) -> LocalRead:
        return LocalRead(self._opts.connection.base_dirs)

    def take_losses(self, streams: tuple[int, ...]) -> dict[int, int]:
        return {}  # a local read's loss goes through the spool

    def forget_losses(self) -> None:
        pass

    @property
    def context(self) -> AeronContext:
        return self.att.context

    def add_poller(self, poller: Callable[[], int]) -> None:
        self.att.add_poller(poller)

    def add_streams(self, streams: tuple[int, ...]) -> None:
        self.att.add_streams(streams)

    def wait_for_layouts(self, timeout_s: float) -> Any:
        return self.att.wait_for_layouts(timeout_s)

    def close(self) -> None:
        self.att.close()


@dataclass
class LocalSnapshot:
    """A batch read's snapshot of rings mapped here (:class:`~.port.RingSnapshot`)."""

    opts: SourceOptions
    specs: dict[int, mapped_rings.RegionSpec]
    states: dict[int, RingState]
    meta: stream_meta.MetaTracker | None

    def origin(self, spec: mapped_rings.RegionSpec) -> PlanOrigin | None:
        return plan_origin(spec, self.opts, BATCH)

    def reader_for(self, sid: int) -> LocalRead:
        return LocalRead(self.opts.connection.base_dirs)


def local_snapshot(opts: SourceOptions) -> LocalSnapshot:
    """Every stream's layout (waiting up to ``attachTimeoutMs``) and ring scan now."""
    conn = opts.connection
    # streams="*" / a range (#16.4): the streams announced now (one announce period)
    if opts.stream_pattern is not None and not conn.driver:
        with kept_probe(opts) as probe:  # #15: a kept probe has heard the period already
            opts = discovery.discovered_from(probe, opts)
    else:
        opts = discovery.discovered_options(opts, settings(opts))
    timeout = conn.attach_timeout_ms / 1000
    meta_wait = min(timeout, opts.freshness_ms / 1000)
    if conn.driver:
        with open_attachment(
            opts.streams, settings(opts), driver=True, background=False, intake_capacity=None
        ) as att:
            meta = stream_meta.watch(att.context, opts)
            layouts = att.wait_for_layouts(timeout)
            if meta is not None:
                meta.wait(opts.streams, meta_wait)
    else:
        # #15: the process's shared probe, kept between plans (with its metadata tracker,
        # for includeStreamMetadata: subscribed before the hellos go out)
        with kept_probe(opts) as probe:
            meta = probe.meta_tracker() if opts.include_stream_metadata else None
            layouts = probe.wait_for_layouts(timeout, opts.streams)
            if meta is not None:  # the layouts' epochs: a kept tracker may know older ones
                meta.wait(
                    opts.streams,
                    meta_wait,
                    probe.hello,
                    epochs={sid: layout.epoch for sid, layout in layouts.items()},
                )
    specs = {sid: mapped_rings.RegionSpec.from_layout(layouts[sid]) for sid in opts.streams}
    states = {sid: mapped_rings.mapped(spec, conn.base_dirs).scan() for sid, spec in specs.items()}
    return LocalSnapshot(opts, specs, states, meta)


__all__ = [
    "LocalRead",
    "LocalRings",
    "LocalSnapshot",
    "kept_probe",
    "local_snapshot",
    "plan_origin",
]
