"""Metadata, progress and QoS forwarding (RateLimiter Spec §6, §6.1), without I/O.

The agent hands every message it receives on the forwarding subscriptions to a
:class:`Forwarder`, which decides whether it belongs to a mapping's source stream and, if
so, re-encodes it for the destination and returns the bytes to offer. Rules:

* ``DataSourceAnnounce`` / ``DataSourceMeta`` (§6): ``meta_version`` preserved, ``stream_id``
  rewritten to the mapping's ``metadata_stream_id`` (which defaults to ``dest_stream_id``).
  Name, summary, attributes and the meta timestamp are preserved; an announce's
  ``producer_id``/``epoch`` become the destination's own (the destination stream has its own
  epoch, §7). Until the destination is attached the latest source message of each kind is
  only remembered; :meth:`Forwarder.replay` re-encodes them after each destination attach,
  so a destination consumer does not wait a whole source period for metadata.
* ``FrameProgress`` (§6.1): ``streamId`` -> destination, ``epoch`` -> destination epoch,
  ``headerIndex`` -> the destination ring slot of that ``frameId`` (the destination writes
  seq ``s`` at ``s & (nslots - 1)``, and ``frameId`` is the preserved seq). Progress of a
  source epoch that is not the mapped one, or while the destination is not attached, is
  dropped and counted. ``FrameDescriptor`` stays the only availability signal.
* ``QosProducer`` / ``QosConsumer`` (§6.1): ``streamId`` -> destination, everything else
  preserved for observability.

Messages of other streams and other schemas are ignored (the streams are shared); messages
that fail to decode are counted under ``<kind>_<codec reason>`` and never raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from tensorpool.counters import DropCounters
from tensorpool.specs import CodecError, peek_header
from tensorpool.specs.generated import wire

__all__ = ["Forwarder", "Route"]

_WIRE: Final = wire.SCHEMA_ID
_T_ANNOUNCE: Final = wire.DataSourceAnnounceDecoder.TEMPLATE_ID
_T_META: Final = wire.DataSourceMetaDecoder.TEMPLATE_ID
_T_PROGRESS: Final = wire.FrameProgressDecoder.TEMPLATE_ID
_T_QOS_PRODUCER: Final = wire.QosProducerDecoder.TEMPLATE_ID
_T_QOS_CONSUMER: Final = wire.QosConsumerDecoder.TEMPLATE_ID
_progress_tuple = wire.FrameProgressDecoder.decode_tuple
_encode_progress = wire.FrameProgressEncoder.encode
_qos_consumer_tuple = wire.QosConsumerDecoder.decode_tuple
_encode_qos_consumer = wire.QosConsumerEncoder.encode
_encode_qos_producer = wire.QosProducerEncoder.encode

PROGRESS_DEST_NOT_ATTACHED: Final = "progress_dest_not_attached"
PROGRESS_SOURCE_NOT_MAPPED: Final = "progress_source_not_mapped"
PROGRESS_STALE_EPOCH: Final = "progress_stale_epoch"
METADATA_HELD: Final = "metadata_held_until_attached"


@dataclass(slots=True)
class Route:
    """One mapping as the forwarder sees it; the agent keeps the live fields current."""

    source_stream_id: int
    dest_stream_id: int
    metadata_stream_id: int
    dest_epoch: int = 0
    dest_producer_id: int = 0
    dest_nslots: int = 0
    """0 while the destination is not attached."""
    source_epoch: int | None = None
    """The source epoch currently mapped (None: not mapped)."""
    name: str = ""
    summary: str = ""
    meta_version: int | None = None
    """From the latest forwarded source ``DataSourceAnnounce``/``DataSourceMeta``."""
    last_announce: bytes | None = field(default=None, repr=False)
    last_meta: bytes | None = field(default=None, repr=False)

    @property
    def dest_attached(self) -> bool:
        return self.dest_nslots > 0


class Forwarder:
    """Translates source-stream control messages for the destination (sans-IO)."""

    def __init__(self, routes: Iterable[Route], *, buffer_bytes: int = 64 * 1024) -> None:
        self.routes: dict[int, Route] = {r.source_stream_id: r for r in routes}
        self.counters = DropCounters()
        self.forwarded: dict[str, int] = {
            "announce": 0,
            "meta": 0,
            "progress": 0,
            "qos_producer": 0,
            "qos_consumer": 0,
        }
        self._buf = bytearray(buffer_bytes)
        self._announce = wire.DataSourceAnnounceDecoder()
        self._meta = wire.DataSourceMetaDecoder()
        self._qos_producer = wire.QosProducerDecoder()

    def _fail(self, kind: str, exc: CodecError) -> None:
        self.counters.increment(f"{kind}_{exc.reason}")

    @staticmethod
    def _header(buffer: object) -> tuple[int, int] | None:
        try:
            _, template_id, schema_id, _ = peek_header(buffer)  # type: ignore[arg-type]
        except CodecError:
            return None
        return schema_id, template_id

    # --- §6 metadata -----------------------------------------------------------------------
    def metadata(self, buffer: object) -> tuple[Route, memoryview] | None:
        """A message from the metadata stream; returns (route, bytes to offer) or None."""
        head = self._header(buffer)
        if head is None:
            self.counters.increment("metadata_truncated")
            return None
        schema_id, template_id = head
        if schema_id != _WIRE or template_id not in (_T_ANNOUNCE, _T_META):
            return None
        try:
            if template_id == _T_ANNOUNCE:
                stream_id = self._announce.wrap(buffer).stream_id  # type: ignore[arg-type]
            else:
                stream_id = self._meta.wrap(buffer).stream_id  # type: ignore[arg-type]
        except CodecError as exc:
            self._fail("metadata", exc)
            return None
        route = self.routes.get(stream_id)
        if route is None:
            return None
        raw = bytes(buffer)  # type: ignore[call-overload]
        if template_id == _T_ANNOUNCE:
            route.last_announce = raw
        else:
            route.last_meta = raw
        if not route.dest_attached:
            self.counters.increment(METADATA_HELD)
            return None
        out = self._translate(route, raw, template_id)
        return None if out is None else (route, out)

    def replay(self, route: Route) -> Iterator[memoryview]:
        """The remembered source metadata re-encoded for the route's current destination."""
        for raw, template_id in ((route.last_announce, _T_ANNOUNCE), (route.last_meta, _T_META)):
            if raw is not None and route.dest_attached:
                out = self._translate(route, raw, template_id)
                if out is not None:
                    yield out

    def _translate(self, route: Route, raw: bytes, template_id: int) -> memoryview | None:
        buf = self._buf
        try:
            if template_id == _T_ANNOUNCE:
                d = self._announce.wrap(raw)
                name, summary, version = d.name, d.summary, d.meta_version
                n = wire.DataSourceAnnounceEncoder.encode(
                    buf,
                    0,
                    stream_id=route.metadata_stream_id,
                    producer_id=route.dest_producer_id,
                    epoch=route.dest_epoch,
                    meta_version=version,
                    name=name,
                    summary=summary,
                )
                route.name, route.summary = name, summary
                self.forwarded["announce"] += 1
            else:
                m = self._meta.wrap(raw)
                version = m.meta_version
                n = wire.DataSourceMetaEncoder.encode(
                    buf,
                    0,
                    stream_id=route.metadata_stream_id,
                    meta_version=version,
                    timestamp_ns=m.timestamp_ns,
                    attributes=[(a.key, a.format, bytes(a.value)) for a in m.attributes],
                )
                self.forwarded["meta"] += 1
        except CodecError as exc:
            self._fail("metadata", exc)
            return None
        except (ValueError, OverflowError, IndexError):
            self.counters.increment("metadata_too_large")
            return None
        if route.meta_version is None or version >= route.meta_version:
            route.meta_version = version
        return memoryview(buf)[:n]

    # --- §6.1 progress ---------------------------------------------------------------------
    def progress(self, buffer: object) -> memoryview | None:
        """A message from the source control stream; the rewritten ``FrameProgress`` or None."""
        head = self._header(buffer)
        if head is None or head != (_WIRE, _T_PROGRESS):
            return None
        try:
            stream_id, epoch, frame_id, _index, filled, state = _progress_tuple(buffer)  # type: ignore[arg-type]
        except CodecError as exc:
            self._fail("progress", exc)
            return None
        route = self.routes.get(stream_id)
        if route is None:
            return None
        if route.source_epoch is None:
            self.counters.increment(PROGRESS_SOURCE_NOT_MAPPED)
            return None
        if epoch != route.source_epoch:
            self.counters.increment(PROGRESS_STALE_EPOCH)
            return None
        nslots = route.dest_nslots
        if not nslots:
            self.counters.increment(PROGRESS_DEST_NOT_ATTACHED)
            return None
        buf = self._buf
        try:
            n = _encode_progress(
                buf,
                0,
                stream_id=route.dest_stream_id,
                epoch=route.dest_epoch,
                frame_id=frame_id,
                header_index=frame_id & (nslots - 1),
                payload_bytes_filled=filled,
                state=state,
            )
        except (CodecError, ValueError):
            self.counters.increment("progress_bad_state")
            return None
        self.forwarded["progress"] += 1
        return memoryview(buf)[:n]

    # --- §6.1 QoS --------------------------------------------------------------------------
    def qos(self, buffer: object) -> memoryview | None:
        """A message from the source QoS stream; the rewritten ``QosProducer``/``QosConsumer``."""
        head = self._header(buffer)
        if head is None or head[0] != _WIRE or head[1] not in (_T_QOS_PRODUCER, _T_QOS_CONSUMER):
            return None
        buf = self._buf
        try:
            if head[1] == _T_QOS_CONSUMER:
                sid, consumer_id, epoch, last_seq, gap, late, mode = _qos_consumer_tuple(buffer)  # type: ignore[arg-type]
                route = self.routes.get(sid)
                if route is None:
                    return None
                n = _encode_qos_consumer(
                    buf,
                    0,
                    stream_id=route.dest_stream_id,
                    consumer_id=consumer_id,
                    epoch=epoch,
                    last_seq_seen=last_seq,
                    drops_gap=gap,
                    drops_late=late,
                    mode=mode,
                )
                self.forwarded["qos_consumer"] += 1
            else:
                d = self._qos_producer.wrap(buffer)  # type: ignore[arg-type]
                route = self.routes.get(d.stream_id)
                if route is None:
                    return None
                n = _encode_qos_producer(
                    buf,
                    0,
                    stream_id=route.dest_stream_id,
                    producer_id=d.producer_id,
                    epoch=d.epoch,
                    current_seq=d.current_seq,
                    watermark=d.watermark,
                )
                self.forwarded["qos_producer"] += 1
        except CodecError as exc:
            self._fail("qos", exc)
            return None
        except ValueError:
            self.counters.increment("qos_bad_enum")
            return None
        return memoryview(buf)[:n]
