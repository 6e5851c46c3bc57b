"""``includeStreamMetadata``: the producer's ``DataSourceMeta`` as a ``metadata`` column (#16.4).

Like Kafka's ``includeHeaders``, but the metadata belongs to the stream, not the record: a
producer publishes ``DataSourceAnnounce`` (its ``name``) and, when it has attributes
(``tensorpool produce --meta k=v``, ``Producer.set_metadata``), ``DataSourceMeta`` on the
metadata channel with every announce period (and at once when a consumer says hello), both
stamped with a ``meta_version``; every frame carries the ``meta_version`` it was produced
under. The Spark driver side (planner process or long-lived reader) listens on that channel
(:class:`MetaTracker`), keeps the versions of each stream epoch it saw, and passes them to the
partitions (:func:`versions_for`); executors give each row the map of *its frame's*
``meta_version`` (:func:`add_metadata_column`): ``name`` plus the attributes (an attribute
called ``name`` wins). A frame whose version the reader never saw (published before the
reader listened, and replaced since) gets a null map rather than another version's values.

Values: ``text/*`` and ``application/json`` attributes are decoded as UTF-8 (invalid bytes
replaced); any other format is given as ``base64:<data>`` so no byte is lost in a string map.
"""

from __future__ import annotations

import base64
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from tensorpool.specs import CodecError, decode_any
from tensorpool.specs.generated import wire

if TYPE_CHECKING:
    import pyarrow as pa

    from tensorpool.spark_source.options import SourceOptions
    from tensorpool.transport.context import AeronContext

COLUMN: Final = "metadata"
#: versions kept per stream epoch (older ones are forgotten first)
MAX_VERSIONS: Final = 16
#: stream epochs kept in all (a discovering query may see many streams)
MAX_EPOCHS: Final = 4096

#: one version's map: sorted ``(key, value)`` pairs (hashable, picklable)
Entries = tuple[tuple[str, str], ...]
#: what a partition carries: ``(meta_version, entries)`` of its stream epoch
Versions = tuple[tuple[int, Entries], ...]


def attribute_text(fmt: str, raw: bytes) -> str:
    """An attribute value as a map value (see the module doc)."""
    if fmt.startswith("text/") or fmt == "application/json":
        return raw.decode("utf-8", "replace")
    return "base64:" + base64.b64encode(raw).decode("ascii")


class MetaTracker:
    """``DataSourceAnnounce`` / ``DataSourceMeta`` of every stream, by (stream, epoch, version).

    Fed by a tap of the context's conductor on the metadata channel (:meth:`subscribe`: the
    process's one metadata subscription, #28.1); thread-safe (an attachment polls it on its own
    thread, the planner reads it on Spark's).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (stream, epoch) -> {version: (name or None, attributes or None)}
        self._seen: dict[tuple[int, int], dict[int, tuple[str | None, Entries | None]]] = {}
        self._epoch: dict[int, int] = {}  # stream -> epoch of its last DataSourceAnnounce
        self._conductor: Any = None
        self._tap: Any = None
        self._finalizer: Any = None

    def subscribe(self, ctx: AeronContext, channel: str, stream_id: int) -> Callable[[], int]:
        """Listen on the metadata channel of ``ctx``; returns the poll function. The tap
        goes with this tracker (:meth:`close`, or when it is collected)."""
        from tensorpool.client.conductor import ContextConductor

        self._conductor = conductor = ContextConductor.acquire(ctx)
        kinds = (wire.DataSourceAnnounceDecoder, wire.DataSourceMetaDecoder)
        self._tap = conductor.tap(channel, stream_id, kinds)
        self._finalizer = weakref.finalize(self, _untap, conductor, self._tap)
        return self.poll

    def close(self) -> None:
        """Stop listening (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()

    def poll(self) -> int:
        if self._tap is None:
            return 0
        work = self._conductor.poll()
        for dec, _raw, _join in self._tap.drain():
            work += 1
            if not isinstance(dec, str):  # damage on the channel is not ours to count
                self.on_decoded(dec)
        return work

    def on_message(self, buffer: object, header: object = None) -> None:
        try:
            self.on_decoded(decode_any(buffer))
        except CodecError:
            return  # other traffic (and damage) on the channel is not ours to count

    def on_decoded(self, dec: object) -> None:
        try:
            if isinstance(dec, wire.DataSourceAnnounceDecoder):
                self._record(dec.stream_id, dec.epoch, dec.meta_version, name=str(dec.name))
            elif isinstance(dec, wire.DataSourceMetaDecoder):
                attrs = tuple(
                    sorted(
                        (str(a.key), attribute_text(str(a.format), bytes(a.value)))
                        for a in dec.attributes
                    )
                )
                epoch = self._epoch.get(dec.stream_id)
                if epoch is not None:  # sent right after its announce on the same publication
                    self._record(dec.stream_id, epoch, dec.meta_version, attrs=attrs)
        except CodecError:
            return  # other traffic (and damage) on the channel is not ours to count

    def _record(
        self,
        sid: int,
        epoch: int,
        version: int,
        *,
        name: str | None = None,
        attrs: Entries | None = None,
    ) -> None:
        with self._lock:
            if name is not None:
                self._epoch[sid] = epoch
            per = self._seen.get((sid, epoch))
            if per is None:
                if len(self._seen) >= MAX_EPOCHS:
                    self._seen.pop(next(iter(self._seen)))
                per = self._seen[(sid, epoch)] = {}
            old_name, old_attrs = per.pop(version, (None, None))  # re-insert: newest last
            per[version] = (
                old_name if name is None else name,
                old_attrs if attrs is None else attrs,
            )
            while len(per) > MAX_VERSIONS:
                per.pop(next(iter(per)))

    def known(self, sid: int, epoch: int | None = None) -> bool:
        """Whether a ``DataSourceAnnounce`` of ``sid`` was received (of ``epoch``, if given: a
        tracker kept across plans may know only an earlier epoch of a restarted producer)."""
        with self._lock:
            return sid in self._epoch if epoch is None else (sid, epoch) in self._seen

    def versions_for(self, sid: int, epoch: int) -> Versions:
        """The maps of ``(sid, epoch)`` for a partition: ``name`` plus attributes."""
        with self._lock:
            per = dict(self._seen.get((sid, epoch), {}))
        out: list[tuple[int, Entries]] = []
        for version, (name, attrs) in sorted(per.items()):
            entries = dict(attrs or ())
            if name is not None:
                entries.setdefault("name", name)
            out.append((version, tuple(sorted(entries.items()))))
        return tuple(out)

    def wait(
        self,
        streams: Iterable[int],
        timeout_s: float,
        nudge: Callable[[int], object] | None = None,
        *,
        poll: bool = True,
        epochs: Mapping[int, int] | None = None,
    ) -> list[int]:
        """Wait until every stream's metadata arrived (``nudge(sid)`` every 0.2 s asks for it,
        e.g. a ConsumerHello; ``poll=False``: another thread polls the subscription; ``epochs``:
        the metadata of these epochs); returns the streams still without any."""
        deadline = time.monotonic() + timeout_s
        next_nudge = 0.0
        want = dict(epochs or {})
        missing = [s for s in streams if not self.known(s, want.get(s))]
        while missing and time.monotonic() < deadline:
            if nudge is not None and time.monotonic() >= next_nudge:
                for sid in missing:
                    nudge(sid)
                next_nudge = time.monotonic() + 0.2
            if not (poll and self.poll()):
                time.sleep(0.002)
            missing = [s for s in missing if not self.known(s, want.get(s))]
        # a DataSourceMeta follows its announce on the same publication: take it too
        settle = time.monotonic() + 0.02
        while time.monotonic() < settle:
            if not (poll and self.poll()):
                time.sleep(0.002)
        return missing


def _untap(conductor: Any, tap: object) -> None:
    conductor.unregister(tap)
    conductor.release()


def watch(ctx: AeronContext, opts: SourceOptions) -> MetaTracker | None:
    """A tracker on ``ctx``'s metadata channel when ``includeStreamMetadata`` is set, else None.
    Subscribe *before* the hellos go out: their answers carry the metadata."""
    if not opts.include_stream_metadata:
        return None
    ch = opts.connection
    tracker = MetaTracker()
    tracker.subscribe(ctx, ch.metadata_channel, ch.metadata_stream_id)
    return tracker


def for_partition(tracker: MetaTracker | None, sid: int, epoch: int) -> Versions | None:
    """What a partition carries: None without the option, else the stream epoch's versions."""
    return None if tracker is None else tracker.versions_for(sid, epoch)


# --- executor side -------------------------------------------------------------------------------
def add_metadata_column(
    batches: Iterator[pa.RecordBatch],
    versions: Versions,
    schema: pa.Schema,
    drop: tuple[str, ...] = (),
) -> Iterator[pa.RecordBatch]:
    """Append the ``metadata`` column to each batch (by the ``meta_version`` column), dropping
    ``drop`` (the tensor columns, when the read needed ``meta_version`` only for this)."""
    import pyarrow as pa

    map_type = schema.field(COLUMN).type
    by_version = dict(versions)
    for batch in batches:
        mv = batch.column("meta_version").to_numpy(zero_copy_only=False).astype(np.uint32)
        keys: list[str] = []
        vals: list[str] = []
        offsets = np.zeros(len(mv) + 1, np.int32)
        valid = np.ones(len(mv), bool)
        for i, v in enumerate(mv.tolist()):
            entries = by_version.get(v)
            if entries is None:
                valid[i] = False
            else:
                keys += [k for k, _ in entries]
                vals += [x for _, x in entries]
            offsets[i + 1] = len(keys)
        column = pa.MapArray.from_arrays(
            pa.array(offsets),
            pa.array(keys, pa.string()),
            pa.array(vals, pa.string()),
            type=map_type,
            mask=pa.array(~valid) if not valid.all() else None,
        )
        cols = [batch.column(n) for n in batch.schema.names if n not in drop]
        yield pa.RecordBatch.from_arrays([*cols, column], schema=schema)


__all__ = [
    "COLUMN",
    "MetaTracker",
    "Versions",
    "add_metadata_column",
    "attribute_text",
    "for_partition",
    "watch",
]
