"""The bridge receiver: chunks in over UDP, ordinary frames out on the local host.

Thin agent around :class:`~tensorpool.bridge.assembler.ReceiverCore` (Bridge Spec §2.2,
§6-§9). It polls the bridge payload subscription, takes the bridge control and metadata
messages its context's :class:`~tensorpool.client.conductor.ContextConductor` decoded for it
(#28.1: one subscription per stream in the process, each message decoded once), feeds the
core, and carries out what the core decides:

* ``OpenDestination`` — attach (or re-attach, on a source epoch change) a
  :class:`~tensorpool.client.producer.Producer` for ``dest_stream_id``: through the host's
  SHM driver as the stream's exclusive producer (driver mode; the driver hands out a new,
  higher epoch every time, §8), or by creating the regions from the mapping's profile
  (standalone mode; the epoch is one above any this instance used before). If the
  destination already has a producer, a statically configured mapping fails and is
  retried later; one allocated from ``dest_stream_id_range`` moves to the next free id
  (§4). The driver's answer is never waited for: the attach is started, then driven one
  step per duty cycle (``Producer.poll_attach``) while every other mapping keeps flowing;
  meanwhile the core drops this stream's chunks as ``destination_attaching``. A refusal
  or the attach timeout (``local.attach_timeout_ms``) takes the failure path above.
* assembling — the core writes every chunk straight into the local payload slot the
  producer claimed for the frame (:class:`LocalSink`), so payload bytes are copied once,
  from the Aeron log into shared memory;
* ``FrameComplete`` — write the slot header (seq preserved, local ``pool_id`` and
  ``payload_slot``, source timestamp and ``meta_version``), commit the seqlock, and only
  then publish the local ``FrameDescriptor`` (§6 steps 8-11, Producer.commit);
* forwarded metadata is republished on the local metadata stream with ``stream_id``
  rewritten to the mapping's ``metadata_stream_id`` and ``meta_version`` preserved (§7.1);
  forwarded ``FrameProgress`` gets the destination stream id and the local header index
  (§9), forwarded QoS the destination stream id, both on ``dest_control_stream_id``.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from tensorpool.bridge.assembler import (
    RUN_HEAD,
    Dropped,
    FrameComplete,
    OpenDestination,
    ProgressOut,
    ReceiverCore,
    ReceiverMapping,
    SourceAnnounce,
)
from tensorpool.bridge.config import BridgeConfig, BridgeMapping
from tensorpool.bridge.reasons import ControlDrop, FrameDrop
from tensorpool.client.conductor import ContextConductor
from tensorpool.client.driver_client import default_client_id
from tensorpool.client.producer import AttachError, FrameClaim, Producer, StreamConfig
from tensorpool.client.producer_core import AttachWait
from tensorpool.counters import DropCounters, Reason
from tensorpool.shm.errors import ShmError
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs import CodecError
from tensorpool.specs.generated import wire
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import Publisher

log = logging.getLogger(__name__)

__all__ = ["BridgeReceiver", "LocalSink"]

_U8: Final = int(wire.Dtype.UINT8)
_ROW: Final = int(wire.MajorOrder.ROW)
_STREAM_ID_AT: Final = struct.Struct("<I")
_RETRY_NS: Final = 1_000_000_000
_NO_DEST: Final = "dest_not_open"
_RUN_STAGING_BYTES: Final = 4 << 20  # bound on the chunk-run staging rows (64 KiB chunks)


@dataclass(slots=True)
class _Dest:
    """One receiver mapping's local side: the producer and the frame being assembled."""

    mapping: BridgeMapping
    dest_stream_id: int
    producer: Producer | None = None
    pending: Producer | None = None  # attaching (driver mode): driven by do_work
    attach_wait: AttachWait | None = None  # the pending attach's refusal/deadline rules
    claim: FrameClaim | None = None
    local_epoch: int = 0
    open_failures: int = 0
    last_error: str = ""
    retry_at_ns: int = 0
    wanted_epoch: int | None = None  # source epoch an open is pending for
    tried: set[int] = field(default_factory=set)
    meta_name: str | None = None
    meta_summary: str = ""
    meta_version: int | None = None
    meta_attrs: dict[str, tuple[str, bytes]] | None = None
    meta_attrs_version: int = 0
    client_id: int = field(default_factory=default_client_id)
    """The one client id of every producer this destination opens (Driver Model §4.8): a
    grant that came for an attempt given up on (a stalled or restarting driver answers a
    queued request late) then names *our* id, and the next attempt releases it at once
    instead of meeting "already has a producer" until it expires (#30 soak defect (b))."""


class LocalSink:
    """Frames are assembled directly in the destination's payload slot (FrameSink).

    ``acquire`` claims the slot for ``seq`` with a placeholder byte layout of the frame's
    length (the real layout arrives with chunk 0, possibly last); the seqlock marks the
    slot in progress, so local consumers never read a half-assembled frame. ``release``
    abandons it uncommitted: it is never described by a descriptor and is overwritten by a
    later frame.
    """

    __slots__ = ("_dests", "_layouts")

    def __init__(self, dests: dict[int, _Dest]) -> None:
        self._dests = dests
        self._layouts: dict[int, TensorLayout] = {}

    def acquire(self, mapping: int, seq: int, payload_length: int) -> memoryview | str:
        dest = self._dests[mapping]
        producer = dest.producer
        if producer is None:
            return _NO_DEST
        layout = self._layouts.get(payload_length)
        if layout is None:
            if len(self._layouts) > 64:
                self._layouts.clear()
            layout = self._layouts[payload_length] = TensorLayout(_U8, _ROW, (payload_length,))
        try:
            claim = producer.claim(layout=layout, seq=seq)
        except ValueError:  # seq behind the producer (cannot happen after the core's floor)
            return FrameDrop.COMMIT_FAILED
        if claim is None:
            return "no_lease" if not producer.attached else Reason.NO_POOL_FITS
        dest.claim = claim
        return memoryview(claim.array).cast("B")

    def release(self, mapping: int, seq: int) -> None:
        self._dests[mapping].claim = None


class BridgeReceiver:
    """All receiver mappings of one bridge process (an Agent)."""

    role_name = "bridge-receiver"

    def __init__(
        self,
        ctx: AeronContext,
        config: BridgeConfig,
        *,
        clock: NanoClock = now_ns,
        fragment_limit: int = 256,
    ) -> None:
        self.config = config
        self._ctx = ctx
        self._clock = clock
        b = config.bridge
        local = config.local
        self._settings = local.client_settings()
        self._fragment_limit = fragment_limit
        self._dests: dict[int, _Dest] = {
            m.index: _Dest(m, m.dest_stream_id) for m in config.receiver_mappings
        }
        self._by_source = {d.mapping.source_stream_id: d for d in self._dests.values()}
        self.sink = LocalSink(self._dests)
        self.core = ReceiverCore(
            [
                ReceiverMapping(m.index, m.source_stream_id, m.dest_stream_id)
                for m in config.receiver_mappings
            ],
            chunk_bound=b.chunk_size,
            max_payload_bytes=b.max_payload_bytes,
            assembly_timeout_ns=b.assembly_timeout_ns,
            sink=self.sink,
        )
        self.errors = 0
        self.control_drops = DropCounters()
        self._now = clock()
        self._on_chunk_core = self.core.on_chunk
        self._on_run_core = self.core.on_chunk_run
        # Staging for runs of full-size middle chunks, one message per row: a poll hands
        # at most fragment_limit messages, all of which fit unless chunks are huge (then a
        # full stage just sends the rest through the scalar path).
        self._run_stride = RUN_HEAD + b.chunk_size
        cap = min(fragment_limit, max(16, _RUN_STAGING_BYTES // self._run_stride))
        self._run_rows = np.zeros((cap, self._run_stride), np.uint8)
        self._run_k = [0]
        self.run_chunks = 0
        """Chunks handed to the core in staged runs (the rest went one by one)."""
        self._buf = bytearray(64 * 1024)
        self._sub_payload = ctx.add_subscription(
            b.receive_payload_channel,
            b.payload_stream_id,
            self._chunk_handler(),
            fragment_limit=fragment_limit,
            guard=False,
        )
        self._conductor = hub = ContextConductor.acquire(ctx)
        w = wire
        kinds = (w.ShmPoolAnnounceDecoder, w.FrameProgressDecoder, w.QosProducerDecoder,
                 w.QosConsumerDecoder)  # fmt: skip
        self._taps = [
            (hub.tap(b.receive_control_channel, b.control_stream_id, kinds, all_errors=True),
             self._on_control),
        ]  # fmt: skip
        self._forward_progress = b.forward_progress
        self._forward_qos = b.forward_qos
        self._local_meta: Publisher | None = None
        if b.metadata_enabled:
            kinds = (w.DataSourceAnnounceDecoder, w.DataSourceMetaDecoder)
            self._taps.append(
                (hub.tap(b.receive_metadata_channel, b.metadata_stream_id, kinds, all_errors=True),
                 self._on_metadata),
            )  # fmt: skip
            ch = local.channels
            self._local_meta = hub.publication(ch.metadata_channel, ch.metadata_stream_id)
        self._local_control: dict[int, Publisher] = {}
        if b.forward_progress or b.forward_qos:
            for m in config.receiver_mappings:
                if m.dest_control_stream_id and m.dest_control_stream_id not in self._local_control:
                    self._local_control[m.dest_control_stream_id] = hub.publication(
                        local.channels.control_channel, m.dest_control_stream_id
                    )

    # -- agent ------------------------------------------------------------------------------------

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        self.close()

    def do_work(self) -> int:
        now = self._clock()
        self._now = now
        work = self._conductor.poll(now)
        for tap, handler in self._taps:
            for dec, raw, _join in tap.drain():
                handler(dec, raw)
                work += 1
        work += self._sub_payload.poll()
        if self._run_k[0]:
            self._flush_run()
        for dest in self._dests.values():
            p = dest.producer
            if p is not None:
                work += p.do_work(now)
                if p.epoch != dest.local_epoch:
                    self._destination_changed(dest)
            elif dest.pending is not None:
                work += self._drive_attach(dest, now)
            elif dest.wanted_epoch is not None and now >= dest.retry_at_ns:
                self._open(dest, dest.wanted_epoch)
        for d in self.core.tick(now):
            self._on_drop(d)
        return work

    # -- chunks (hot path) ------------------------------------------------------------------------

    def _chunk_handler(self) -> Callable[[object, object], None]:
        """The payload subscription's handler (a closure: the hottest Python in the bridge).

        The common message — a middle chunk of the full chunk size (chunk 0 also carries the
        header slot, the last chunk is usually shorter) — is only copied into the next
        staging row; :meth:`do_work` hands the rows to ``ReceiverCore.on_chunk_run`` after
        the poll. Any other message first flushes what is staged, so the core sees every
        message in arrival order. Recording cannot raise (guard=False).
        """
        stride = self._run_stride
        rows = [memoryview(row) for row in self._run_rows]
        cap = len(rows)
        state = self._run_k
        other = self._on_other_chunk

        def on_chunk(buffer: object, header: object) -> None:
            if len(buffer) == stride:  # type: ignore[arg-type]
                k = state[0]
                if k < cap:
                    rows[k][:] = buffer  # type: ignore[assignment]
                    state[0] = k + 1
                    return
            other(buffer)

        return on_chunk

    def _on_other_chunk(self, buffer: object) -> None:
        if self._run_k[0]:
            self._flush_run()
        try:
            r = self._on_chunk_core(buffer, self._now)  # type: ignore[arg-type]
            if r is not None and r.__class__ is FrameComplete:
                self._publish(r)  # type: ignore[arg-type]
        except Exception:  # never lose the rest of a poll batch to one bad frame
            self._chunk_error()

    def _flush_run(self) -> None:
        k = self._run_k[0]
        self._run_k[0] = 0
        self.run_chunks += k
        events = self._on_run_core(self._run_rows, k, self._now)
        while True:
            try:
                for r in events:  # lazily: each frame is published before the next row
                    if r.__class__ is FrameComplete:
                        self._publish(r)  # type: ignore[arg-type]
                return
            except Exception:  # a failed publish: go on with the run (a core error ends it)
                self._chunk_error()

    def _chunk_error(self) -> None:
        self.errors += 1
        if self.errors & (self.errors - 1) == 0:
            log.exception("bridge receiver: chunk handling failed (%d so far)", self.errors)

    def _publish(self, c: FrameComplete) -> None:
        dest = self._dests[c.mapping]
        claim = dest.claim
        dest.claim = None
        producer = dest.producer
        stats = self.core.stats(c.mapping)
        if claim is None or producer is None or claim.seq != c.seq:
            stats.frame_drops.increment(FrameDrop.COMMIT_FAILED)
            return
        # The payload [0, values_len_bytes) was assembled into a claim of exactly that many
        # bytes (the smallest pool that holds it); the header keeps the source's
        # values_len_bytes, also 0 with non-zero dims or more than the extent (Wire §8.2,
        # Bridge §6.9, #14.3).
        claim.layout = c.layout
        if (
            producer.commit(
                claim,
                timestamp_ns=c.timestamp_ns,
                meta_version=c.meta_version,
                values_len_bytes=c.values_len_bytes,
            )
            is None
        ):
            stats.frame_drops.increment(FrameDrop.COMMIT_FAILED)

    def _on_drop(self, d: Dropped) -> None:
        if d.frame and d.mapping >= 0:
            self._dests[d.mapping].claim = None

    # -- destinations -----------------------------------------------------------------------------

    def _open(self, dest: _Dest, source_epoch: int) -> None:
        """(Re)attach the local producer for a (new) source epoch (§4, §8), without waiting.

        Why not ``wait_until_attached``: the driver may take up to the attach timeout to
        answer (slow, restarting, stopped), and every other mapping of this receiver would
        stall meanwhile — no chunks polled, UDP buffers full, healthy streams' frames lost.
        A driver-mode producer is left pending and driven by :meth:`_drive_attach` each duty
        cycle; a standalone one is attached on construction.
        """
        dest.wanted_epoch = source_epoch
        self._close_producer(dest)
        m = dest.mapping
        local = self.config.local
        stream: StreamConfig | int
        if local.driver_mode:
            stream = dest.dest_stream_id
        else:
            prof = self.config.profiles[m.profile]
            stream = StreamConfig(
                dest.dest_stream_id,
                header_nslots=prof.header_nslots,
                pools=prof.payload_pools,
                name=dest.meta_name or "",
                summary=dest.meta_summary,
            )
        try:
            producer = Producer(
                self._ctx,
                stream,
                self._settings,
                driver=local.driver_mode,
                instance_id=f"{self.config.bridge.instance_id}-{dest.dest_stream_id}",
                producer_id=dest.client_id if local.driver_mode else None,
                clock=self._clock,
                attach_timeout_s=local.attach_timeout_ms / 1000,
                # a taken destination is not waited for here (that would stall the receiver's
                # loop): the receiver retries it on its own schedule, or moves to the next
                # id of an allocated range
                wait_for_held_lease=False,
            )
        except (AttachError, ShmError, OSError, ValueError) as exc:
            self._open_failed(dest, str(exc))
            return
        if producer.attached:
            self._opened(dest, producer)
            return
        now = self._clock()
        dest.pending = producer
        dest.attach_wait = AttachWait(
            dest.dest_stream_id,
            local.attach_timeout_ms * 1_000_000,
            now,
            wait_for_held_lease=False,
        )
        d = self.core.destination_attaching(m.index)
        if d is not None:
            self._on_drop(d)
        log.info(
            "mapping %s: attaching destination stream %d (source epoch %d)",
            m.name, dest.dest_stream_id, source_epoch,
        )  # fmt: skip

    def _drive_attach(self, dest: _Dest, now: int) -> int:
        """One step of a pending attach: done, refused, timed out, or still waiting."""
        producer = dest.pending
        wait = dest.attach_wait
        assert producer is not None and wait is not None
        try:
            error = producer.poll_attach(wait, now)
        except (ShmError, OSError, ValueError) as exc:
            error = str(exc)
        if error is not None:
            if wait.unanswered and not dest.mapping.dest_allocated:
                # No answer at all: the driver may be stalled and still hold our requests.
                # Keep this producer attaching (its lease machine re-sends, and takes a grant
                # that comes late): a new producer would have a new client id, and the grant
                # of the old one's queued request would hold the stream for nobody until that
                # lease expired. The failure is reported all the same, once per window.
                dest.attach_wait = AttachWait(
                    dest.dest_stream_id, wait.timeout_ns, now, wait_for_held_lease=False
                )
                dest.open_failures += 1
                dest.last_error = error
                log.warning(
                    "mapping %s: destination %d: %s; still attaching",
                    dest.mapping.name, dest.dest_stream_id, error,
                )  # fmt: skip
                return 1
            self._abandon_attach(dest)
            self._open_failed(dest, error)
            return 1
        if not producer.attached:
            return 0
        dest.pending = dest.attach_wait = None
        self._opened(dest, producer)
        return 1

    def _open_failed(self, dest: _Dest, error: str) -> None:
        m = dest.mapping
        dest.open_failures += 1
        dest.last_error = error
        dest.retry_at_ns = self._clock() + _RETRY_NS
        d = self.core.destination_lost(m.index)  # attaching -> dest_not_ready until retried
        if d is not None:
            self._on_drop(d)
        log.warning(
            "mapping %s: cannot open destination %d: %s", m.name, dest.dest_stream_id, error
        )
        if m.dest_allocated:
            self._remap(dest)

    def _opened(self, dest: _Dest, producer: Producer) -> None:
        m = dest.mapping
        dest.producer = producer
        source_epoch = dest.wanted_epoch
        dest.wanted_epoch = None
        dest.last_error = ""
        self._destination_changed(dest)
        self._restore_metadata(dest)
        log.info(
            "mapping %s: destination stream %d open, local epoch %d (source epoch %s)",
            m.name, dest.dest_stream_id, producer.epoch, source_epoch,
        )  # fmt: skip

    def _remap(self, dest: _Dest) -> None:
        """§4: an allocated destination that cannot be attached moves to the next free id."""
        id_range = self.config.bridge.dest_stream_id_range
        if id_range is None:
            return
        dest.tried.add(dest.dest_stream_id)
        taken = self.config.reserved_stream_ids | {d.dest_stream_id for d in self._dests.values()}
        for sid in id_range:
            if sid not in taken and sid not in dest.tried:
                log.warning(
                    "mapping %s: remapping destination %d -> %d",
                    dest.mapping.name, dest.dest_stream_id, sid,
                )  # fmt: skip
                dest.dest_stream_id = sid
                dest.retry_at_ns = 0
                return

    def _destination_changed(self, dest: _Dest) -> None:
        p = dest.producer
        if p is None:
            return
        dest.claim = None
        dest.local_epoch = p.epoch
        if p.attached:
            self.core.destination_ready(
                dest.mapping.index,
                header_nslots=p.stream.header_nslots,
                max_stride=p.payload_capacity(),
                dest_stream_id=dest.dest_stream_id,
            )
        else:
            d = self.core.destination_lost(dest.mapping.index)
            if d is not None:
                self._on_drop(d)

    @staticmethod
    def _abandon_attach(dest: _Dest) -> None:
        """Drop the attach in progress, not waited for: a grant still in flight is never used
        and expires with its lease."""
        if dest.pending is not None:
            dest.pending.close(detach_timeout_ns=0)
        dest.pending = dest.attach_wait = None

    def _close_producer(self, dest: _Dest) -> None:
        if dest.pending is not None:  # an attach still in progress
            self._abandon_attach(dest)
            d = self.core.destination_lost(dest.mapping.index)
            if d is not None:
                self._on_drop(d)
        if dest.producer is not None:
            d = self.core.destination_lost(dest.mapping.index)
            if d is not None:
                self._on_drop(d)
            dest.producer.close()
            dest.producer = None
            dest.claim = None

    # -- control channel --------------------------------------------------------------------------

    def _on_control(self, dec: object, buffer: bytes) -> None:
        if isinstance(dec, str):  # the conductor could not decode it
            self.control_drops.increment(ControlDrop.DECODE_ERROR + "_" + dec)
            return
        try:
            if isinstance(dec, wire.ShmPoolAnnounceDecoder):
                self._on_announce(SourceAnnounce.from_decoder(dec))
            elif isinstance(dec, wire.FrameProgressDecoder):
                self._on_progress(dec)
            elif isinstance(dec, wire.QosProducerDecoder | wire.QosConsumerDecoder):
                self._on_qos(buffer, dec.stream_id)
        except CodecError as exc:
            self.control_drops.increment(ControlDrop.DECODE_ERROR + "_" + exc.reason)

    def _on_announce(self, ann: SourceAnnounce) -> None:
        for ev in self.core.on_announce(ann, self._clock()):
            if isinstance(ev, OpenDestination):
                dest = self._dests[ev.mapping]
                self._open(dest, ev.source_epoch)
            elif isinstance(ev, Dropped):
                self._on_drop(ev)

    def _on_progress(self, dec: wire.FrameProgressDecoder) -> None:
        if not self._forward_progress:
            self.control_drops.increment(ControlDrop.PROGRESS_DISABLED)
            return
        out = self.core.on_progress(
            dec.stream_id, dec.epoch, dec.frame_id, dec.payload_bytes_filled, dec.state_raw
        )
        if not isinstance(out, ProgressOut):
            return
        dest = self._by_source[dec.stream_id]
        pub = self._local_control.get(dest.mapping.dest_control_stream_id)
        if pub is None:
            return
        n = wire.FrameProgressEncoder.encode(
            self._buf,
            0,
            stream_id=out.dest_stream_id,
            epoch=out.epoch,
            frame_id=out.frame_id,
            header_index=out.header_index,
            payload_bytes_filled=out.payload_bytes_filled,
            state=out.state,
        )
        if not pub.offer(self._buf, 0, n):
            self.control_drops.increment(ControlDrop.FORWARD_FAILED)

    def _on_qos(self, buffer: object, stream_id: int) -> None:
        if not self._forward_qos:
            self.control_drops.increment(ControlDrop.QOS_DISABLED)
            return
        dest = self._by_source.get(stream_id)
        if dest is None:
            self.control_drops.increment(ControlDrop.QOS_UNKNOWN_STREAM)
            return
        pub = self._local_control.get(dest.mapping.dest_control_stream_id)
        if pub is None:
            return
        msg = bytearray(bytes(buffer))  # type: ignore[call-overload]
        _STREAM_ID_AT.pack_into(msg, 8, dest.dest_stream_id)
        if not pub.offer(msg):
            self.control_drops.increment(ControlDrop.FORWARD_FAILED)

    # -- metadata (§7.1) --------------------------------------------------------------------------

    def _on_metadata(self, dec: object, _raw: bytes) -> None:
        if isinstance(dec, str):  # the conductor could not decode it
            self.control_drops.increment(ControlDrop.DECODE_ERROR + "_" + dec)
            return
        try:
            if isinstance(dec, wire.DataSourceAnnounceDecoder):
                dest = self._by_source.get(dec.stream_id)
                if dest is None:
                    self.control_drops.increment(ControlDrop.METADATA_UNKNOWN_STREAM)
                    return
                dest.meta_name = dec.name
                dest.meta_summary = dec.summary
                dest.meta_version = dec.meta_version
                self._apply_announce(dest, dec.producer_id)
            elif isinstance(dec, wire.DataSourceMetaDecoder):
                dest = self._by_source.get(dec.stream_id)
                if dest is None:
                    self.control_drops.increment(ControlDrop.METADATA_UNKNOWN_STREAM)
                    return
                dest.meta_attrs = {a.key: (a.format, bytes(a.value)) for a in dec.attributes}
                dest.meta_attrs_version = dec.meta_version
                self._apply_meta(dest, dec.timestamp_ns)
        except CodecError as exc:
            self.control_drops.increment(ControlDrop.DECODE_ERROR + "_" + exc.reason)

    def _owns_metadata(self, dest: _Dest) -> bool:
        """The local producer's own metadata stream id is the rewritten one: let it carry the
        forwarded metadata (it also repeats it every announce period for late joiners)."""
        return dest.producer is not None and dest.mapping.metadata_stream_id in (
            0,
            dest.dest_stream_id,
            dest.mapping.dest_stream_id,
        )

    def _meta_stream_id(self, dest: _Dest) -> int:
        m = dest.mapping
        if m.metadata_stream_id in (0, m.dest_stream_id):
            return dest.dest_stream_id  # follows a runtime remap of the destination
        return m.metadata_stream_id

    def _apply_announce(self, dest: _Dest, producer_id: int) -> None:
        version = dest.meta_version or 0
        p = dest.producer
        if self._owns_metadata(dest) and p is not None:
            p.meta_version = version
            p.stream = dataclasses.replace(
                p.stream, name=dest.meta_name or "", summary=dest.meta_summary
            )
        if self._local_meta is None:
            return
        n = wire.DataSourceAnnounceEncoder.encode(
            self._buf,
            0,
            stream_id=self._meta_stream_id(dest),
            producer_id=producer_id,
            epoch=dest.local_epoch,
            meta_version=version,
            name=dest.meta_name or "",
            summary=dest.meta_summary,
        )
        if not self._local_meta.offer(self._buf, 0, n):
            self.control_drops.increment(ControlDrop.FORWARD_FAILED)

    def _apply_meta(self, dest: _Dest, timestamp_ns: int) -> None:
        attrs = dest.meta_attrs
        if attrs is None:
            return
        p = dest.producer
        if self._owns_metadata(dest) and p is not None:
            p.set_metadata(attrs, meta_version=dest.meta_attrs_version)
            return
        if self._local_meta is None:
            return
        n = wire.DataSourceMetaEncoder.encode(
            self._buf,
            0,
            stream_id=self._meta_stream_id(dest),
            meta_version=dest.meta_attrs_version,
            timestamp_ns=timestamp_ns,
            attributes=[(k, f, v) for k, (f, v) in attrs.items()],
        )
        if not self._local_meta.offer(self._buf, 0, n):
            self.control_drops.increment(ControlDrop.FORWARD_FAILED)

    def _restore_metadata(self, dest: _Dest) -> None:
        """A reopened destination (new local epoch) gets the last forwarded metadata."""
        if dest.meta_version is not None:
            self._apply_announce(dest, 0)
        if dest.meta_attrs is not None:
            self._apply_meta(dest, self._clock())

    # -- status -----------------------------------------------------------------------------------

    def status(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for dest in self._dests.values():
            m = dest.mapping
            st = self.core.stats(m.index)
            p = dest.producer
            row: dict[str, object] = {
                "role": "receiver",
                "mapping": m.name,
                "source_stream_id": m.source_stream_id,
                "dest_stream_id": dest.dest_stream_id,
                "source_epoch": self.core.source_epoch(m.index),
                "destination": self.core.destination_state(m.index),
                "local_epoch": p.epoch if p is not None else None,
                "descriptors_not_sent": p.stats.descriptors_not_sent if p is not None else 0,
                "open_failures": dest.open_failures,
                "last_error": dest.last_error,
            }
            row.update(st.snapshot())
            out.append(row)
        return out

    def close(self) -> None:
        for dest in self._dests.values():
            self._abandon_attach(dest)
            if dest.producer is not None:
                dest.producer.close()
                dest.producer = None
        hub, taps, self._taps = self._conductor, self._taps, []
        if not taps:
            return  # closed before
        for tap, _ in taps:
            hub.unregister(tap)
        pubs = [*self._local_control.values(), self._local_meta]
        self._local_control, self._local_meta = {}, None
        for pub in pubs:
            if pub is not None:
                hub.release_publication(pub)
        hub.release()
