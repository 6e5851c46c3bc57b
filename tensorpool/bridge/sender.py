"""The bridge sender: a local consumer whose frames leave as ``BridgeFrameChunk``s over UDP.

Thin agent (Bridge Spec §2.1, §5, §7, §9). Per sender mapping it runs an ordinary
:class:`~tensorpool.client.consumer.Consumer` of the source stream (driver mode or
standalone, like any other consumer); for every frame it is handed, the seqlock-validated
read has already happened (Wire Spec §8.3), and :class:`ChunkSender`:

1. copies the 256-byte header slot and the payload out of shared memory (Frame.raw_views)
   into a private staging buffer laid out as the chunk messages (§5.1, §5.2: uniform
   chunks of ``min(chunk_bytes, mtu_bytes - 128)``, chunk 0 carrying the header slot);
2. re-validates the slot (``Frame.is_current()``): a frame overwritten while it was being
   copied is dropped (``source_overwritten``), never sent as good (§5.3);
3. sends the messages in order, one ``offer`` each, as far as the publication's
   flow-control window allows; the rest goes out on the next duty cycles, before any newer
   frame — frames arriving meanwhile are dropped (``back_pressured``), and a frame not out
   within the assembly timeout is given up.

The ``claim`` strategy (``tensorpool bridge --send-strategy claim``) writes each chunk
straight from shared memory into an Aeron ``try_claim`` buffer instead, committing the last
chunk only after re-validation; it saves the staging copy but costs more Python calls per
chunk (measured slower, see docs/benchmarks/bridge.md). Either way back-pressure never
blocks the source consumer: frames are dropped and counted.

Control plane: the source's ``ShmPoolAnnounce`` (as mapped by the consumer) is forwarded on
the bridge control channel whenever the epoch changes and every announce period (§7.2);
chunks of an epoch are only sent once its announce went out. ``DataSourceAnnounce`` /
``DataSourceMeta`` of mapped streams are forwarded verbatim on the metadata channel (§7.1);
``FrameProgress`` and ``QosProducer``/``QosConsumer`` seen on a mapping's
``source_control_stream_id`` go on the control channel when enabled (§9). Every message
keeps its source stream id; the receiver rewrites it.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice, takewhile
from typing import Final

import numpy as np
import pyaeron

from tensorpool.bridge.chunker import (
    CHUNK_PREFIX,
    FIRST_PREFIX,
    HEADER_SLOT_BYTES,
    NO_HEADER_OVERHEAD,
    WITH_HEADER_OVERHEAD,
)
from tensorpool.bridge.config import BridgeConfig, BridgeMapping
from tensorpool.bridge.reasons import ControlDrop, SendDrop
from tensorpool.client.conductor import ContextConductor, Tap
from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.progress_core import ProgressRequest
from tensorpool.counters import DropCounters
from tensorpool.specs.generated import wire
from tensorpool.specs.generated.bridge import BridgeFrameChunkDecoder
from tensorpool.transport.channels import channel_mtu
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import OfferRejected, Publisher

log = logging.getLogger(__name__)

__all__ = ["PENDING", "BridgeSender", "ChunkSender", "SenderStats"]

_BL: Final = BridgeFrameChunkDecoder.BLOCK_LENGTH
_TID: Final = BridgeFrameChunkDecoder.TEMPLATE_ID
_SID: Final = BridgeFrameChunkDecoder.SCHEMA_ID
_VER: Final = BridgeFrameChunkDecoder.SCHEMA_VERSION
_U32: Final = struct.Struct("<I")
_HDR_END: Final = FIRST_PREFIX.size + HEADER_SLOT_BYTES  # 309
_AERON_HEADER: Final = 32
_CLOCK_MONOTONIC: Final = int(wire.ClockDomain.MONOTONIC)
_STREAM_ID_AT: Final = struct.Struct("<I")  # every wire message starts with streamId at +8
_ADMIN_ACTION: Final = pyaeron.ADMIN_ACTION
#: :meth:`ChunkSender.submit`/:meth:`~ChunkSender.flush`: the frame is staged, waiting for room.
PENDING: Final = "pending"
_NOT_CONNECTED: Final = pyaeron.NOT_CONNECTED


@dataclass(slots=True)
class SenderStats:
    frames: int = 0
    bytes: int = 0
    chunks: int = 0
    announces: int = 0
    metadata: int = 0
    progress: int = 0
    qos: int = 0
    drops: DropCounters = field(default_factory=DropCounters)
    control_drops: DropCounters = field(default_factory=DropCounters)


class _Layout:
    """Where each chunk message of a frame of one length lies in the staging buffer.

    Views and header values are computed once per length (cached by :class:`ChunkSender`);
    :meth:`write_headers` stamps the per-length header fields into the buffer whenever this
    layout takes the buffer over from one of another length. Per frame only epoch and seq
    change (two column stores).
    """

    __slots__ = ("count", "fields", "last", "length", "lens", "nfull", "rows", "stream_id", "views")

    def __init__(self, stg: np.ndarray, length: int, c: int, stream_id: int) -> None:
        count = -(-length // c) if length else 1
        self.length = length
        self.count = count
        self.stream_id = stream_id
        n0 = min(c, length)
        mv = memoryview(stg)  # type: ignore[arg-type]
        views = [mv[: WITH_HEADER_OVERHEAD + n0]]
        stride = NO_HEADER_OVERHEAD + c
        base = WITH_HEADER_OVERHEAD + c
        nrows = count - 1
        self.last = length - (count - 1) * c if count > 1 else 0  # bytes in the last chunk
        self.nfull = nrows - 1 if nrows and self.last != c else nrows
        self.rows = stg[base : base + nrows * stride].reshape(nrows, stride)
        self.fields = stg[base : base + nrows * stride].view(_row_dtype(stride))
        lens = np.full(nrows, c, dtype=np.uint32)
        if nrows:
            lens[-1] = self.last
        self.lens = lens
        for i in range(nrows):
            start = base + i * stride
            views.append(mv[start : start + NO_HEADER_OVERHEAD + int(lens[i])])
        self.views = views

    def write_headers(self, c: int) -> None:
        """Fill every field of chunks 1..n-1 except epoch and seq (vectorized)."""
        fields = self.fields
        if not len(fields):
            return
        idx = np.arange(1, self.count, dtype=np.uint32)
        fields["hdr"] = (_BL, _TID, _SID, _VER)
        fields["stream_id"] = self.stream_id
        fields["index"] = idx
        fields["count"] = self.count
        fields["offset"] = idx * c
        fields["length"] = self.lens
        fields["payload_length"] = self.length
        fields["header_included"] = 0
        fields["header_length"] = 0
        fields["data_length"] = self.lens


_ROW_DTYPES: dict[int, np.dtype] = {}


def _row_dtype(stride: int) -> np.dtype:
    """A structured view of one staged chunk message (unaligned fields are fine in numpy)."""
    dt = _ROW_DTYPES.get(stride)
    if dt is None:
        dt = _ROW_DTYPES[stride] = np.dtype(
            {
                "names": ["hdr", "stream_id", "epoch", "seq", "index", "count", "offset",
                          "length", "payload_length", "header_included", "header_length",
                          "data_length"],
                "formats": [("<u2", 4), "<u4", "<u8", "<u8", "<u4", "<u4", "<u4", "<u4", "<u4",
                            "u1", "<u4", "<u4"],
                "offsets": [0, 8, 12, 20, 28, 32, 36, 40, 44, 48, 49, 53],
                "itemsize": stride,
            }
        )  # fmt: skip
    return dt


class ChunkSender:
    """Sends frames as ``BridgeFrameChunk`` messages; the hot loop of the sender.

    Two strategies, both copying each payload byte out of shared memory once and
    re-validating the slot before the frame can complete at the receiver:

    * ``"staging"`` (default): header slot and payload are copied with two vectorized
      copies into a private staging buffer already laid out as the chunk messages (headers
      pre-filled per frame length, epoch/seq written as two column stores), the slot is
      re-validated, then every message is one ``offer`` of a ready-made view. Measured on
      this project's 2-core host with warm log buffers: ~0.5 µs per 1280-byte chunk, staging
      copy included, against ~2 µs for ``try_claim`` (four Python↔C calls per chunk) — the
      extra memcpy costs far less than the calls it saves (docs/benchmarks/bridge.md).
      Because the staged copy is private, a frame need not fit the flow-control window at
      once (a 640 KiB frame does not fit Aeron's default 128 KiB receiver window): chunks
      go out while the publication takes them and the rest is sent on the next duty
      cycles, in order, before any other frame. Frames arriving meanwhile are dropped
      (``back_pressured``); a frame still unfinished ``max_hold_ns`` after it was staged is
      abandoned (the receiver drops the partial frame by its assembly timeout).
    * ``"claim"``: every chunk that fits one Aeron frame is encoded straight into a
      ``try_claim`` buffer from shared memory (no staging copy); the last chunk is
      committed only after the slot was re-validated, so an overwritten frame can never
      complete at the receiver. A frame refused mid-way is abandoned, so frames larger
      than the window cannot pass; kept for comparison (``--send-strategy claim``).

    Nothing here ever waits: back-pressure drops frames, it never blocks the source.
    """

    __slots__ = (
        "_claim",
        "_layout",
        "_layouts",
        "_pending",
        "_pub",
        "_scratch",
        "_stg",
        "chunk_bytes",
        "max_claim",
        "max_hold_ns",
        "moved",
        "stats",
        "strategy",
        "stream_id",
    )

    def __init__(
        self,
        pub: Publisher,
        chunk_bytes: int,
        max_claim: int,
        *,
        stream_id: int = 0,
        strategy: str = "staging",
        stats: SenderStats | None = None,
        max_hold_ns: int = 250_000_000,
    ) -> None:
        if strategy not in ("staging", "claim"):
            raise ValueError(f"strategy must be 'staging' or 'claim', got {strategy!r}")
        self._pub = pub
        self._claim = pub.try_claim
        self.chunk_bytes = chunk_bytes
        self.max_claim = max_claim
        self.stream_id = stream_id
        self.strategy = strategy
        self.stats = stats if stats is not None else SenderStats()
        self.max_hold_ns = max_hold_ns
        #: messages that went out since the caller last reset it (``BridgeSender.do_work``)
        self.moved = 0
        self._scratch = bytearray(WITH_HEADER_OVERHEAD + chunk_bytes)
        self._stg = np.zeros(0, np.uint8)
        self._layout: _Layout | None = None
        self._layouts: dict[int, _Layout] = {}
        # the staged frame being sent: layout, index of the next message, time staged
        self._pending: tuple[_Layout, int, int] | None = None

    @property
    def pending(self) -> bool:
        """A staged frame is still being sent."""
        return self._pending is not None

    def _reason(self, before: tuple[int, int]) -> str:
        cnt = self._pub.counters
        if cnt.not_connected != before[1]:
            return SendDrop.NOT_CONNECTED
        if cnt.back_pressured != before[0]:
            return SendDrop.BACK_PRESSURED
        return SendDrop.PUBLICATION_FAILED

    def _dropped(self, reason: str) -> str:
        self.stats.drops.increment(reason)
        return reason

    def _sent(self, length: int) -> None:
        stats = self.stats
        stats.frames += 1
        stats.bytes += length

    def submit(
        self,
        stream_id: int,
        epoch: int,
        seq: int,
        header: memoryview,
        payload: memoryview,
        is_current: Callable[[], bool],
        now_ns: int = 0,
    ) -> str | None:
        """Offer one frame: None once all of it went out, :data:`PENDING` while the rest of
        it waits for room (staging strategy only), else the reason it was dropped (counted in
        ``stats.drops``). Never waits."""
        length = payload.nbytes
        if self.strategy == "claim" and NO_HEADER_OVERHEAD + self.chunk_bytes <= self.max_claim:
            reason = self._send_claimed(stream_id, epoch, seq, header, payload, is_current)
            if reason is None:
                self._sent(length)
                return None
            return self._dropped(reason)
        if self._pending is not None and self.flush(now_ns) == PENDING:
            # Still busy with an earlier frame: it goes out first, whole; this one is dropped.
            self._pub.counters.back_pressured += 1
            return self._dropped(SendDrop.BACK_PRESSURED)
        lay = self._stage(stream_id, epoch, seq, header, payload)
        # Everything this frame will carry is now private: validate it once, then send.
        if not is_current():
            return self._dropped(SendDrop.SOURCE_OVERWRITTEN)
        self._pending = (lay, 0, now_ns)
        return self.flush(now_ns)

    def send(
        self,
        stream_id: int,
        epoch: int,
        seq: int,
        header: memoryview,
        payload: memoryview,
        is_current: Callable[[], bool],
    ) -> str | None:
        """:meth:`submit` without resuming: whatever cannot go out now is abandoned."""
        reason = self.submit(stream_id, epoch, seq, header, payload, is_current)
        if reason == PENDING:
            self._pending = None
            return self._dropped(SendDrop.BACK_PRESSURED)
        return reason

    def flush(self, now_ns: int = 0) -> str | None:
        """Send as much of the pending frame as the publication takes: None when nothing is
        pending (any more — the frame is out), :data:`PENDING` if part of it still waits, or
        the reason it was abandoned."""
        pending = self._pending
        if pending is None:
            return None
        lay, i, since = pending
        start = i
        views = lay.views
        n = len(views)
        # looked up per frame: the context re-creates the publication after a media driver
        # restart (#13.2), so a reference kept from construction would go stale
        offer = self._pub.publication.offer
        cnt = self._pub.counters
        reason: str | None = None
        admin = 0
        while i < n:
            try:
                # No bytecode per chunk: `map` offers the staged messages lazily, in order,
                # and `takewhile` stops at the first refusal (nothing after it is offered);
                # `sum` counts the accepted ones (`True` is 1, an OfferCode is falsy).
                i += sum(takewhile(bool, map(offer, islice(views, i, None))))
                if i == n:
                    break
                r = offer(views[i])  # the refused one again: why (or it fits by now)
            except Exception:  # closed publication, message too long for the channel
                cnt.closed += 1
                reason = SendDrop.PUBLICATION_FAILED
                break
            if r is True:
                i += 1
                continue
            if r is _ADMIN_ACTION and admin < 8:
                cnt.admin_action += 1
                admin += 1
                continue  # the log rotated under us: retrying at once normally succeeds
            if r is _NOT_CONNECTED:
                cnt.not_connected += 1
                reason = SendDrop.NOT_CONNECTED
            else:
                cnt.back_pressured += 1
                reason = PENDING
            break
        self.moved += i - start
        if i == n:
            cnt.ok += n
            self._pending = None
            self._sent(lay.length)
            return None
        if reason == PENDING and now_ns - since <= self.max_hold_ns:
            self._pending = (lay, i, since)
            return PENDING
        self._pending = None
        return self._dropped(SendDrop.BACK_PRESSURED if reason == PENDING else reason)  # type: ignore[arg-type]

    # -- staging -----------------------------------------------------------------------------
    def _stage(
        self, stream_id: int, epoch: int, seq: int, header: memoryview, payload: memoryview
    ) -> _Layout:
        length = payload.nbytes
        c = self.chunk_bytes
        lay = self._layout
        if lay is None or lay.length != length or lay.stream_id != stream_id:
            lay = self._use(length, stream_id)
        stg = self._stg
        count = lay.count
        n0 = length if length < c else c
        FIRST_PREFIX.pack_into(
            stg, 0, _BL, _TID, _SID, _VER, stream_id, epoch, seq, 0, count, 0, n0, length, 1,
            HEADER_SLOT_BYTES,
        )  # fmt: skip
        _U32.pack_into(stg, _HDR_END, n0)
        stg[FIRST_PREFIX.size : _HDR_END] = header
        src = np.frombuffer(payload, np.uint8)
        stg[WITH_HEADER_OVERHEAD : WITH_HEADER_OVERHEAD + n0] = src[:n0]
        if count > 1:
            fields = lay.fields
            fields["epoch"] = epoch
            fields["seq"] = seq
            nfull = lay.nfull
            rows = lay.rows
            if nfull:
                rows[:nfull, NO_HEADER_OVERHEAD:] = src[c : c + nfull * c].reshape(nfull, c)
            if nfull != count - 1:
                rows[-1, NO_HEADER_OVERHEAD : NO_HEADER_OVERHEAD + lay.last] = src[
                    length - lay.last :
                ]
        return lay

    def _use(self, length: int, stream_id: int) -> _Layout:
        """The layout for this length (cached, up to 16 lengths), headers stamped in."""
        c = self.chunk_bytes
        count = -(-length // c) if length else 1
        need = WITH_HEADER_OVERHEAD + c + (count - 1) * (NO_HEADER_OVERHEAD + c)
        if self._stg.size < need:
            self._stg = np.zeros(need, np.uint8)
            self._layouts.clear()  # their views point into the old buffer
        lay = self._layouts.get(length)
        if lay is None or lay.stream_id != stream_id:
            if len(self._layouts) >= 16:
                self._layouts.clear()
            lay = self._layouts[length] = _Layout(self._stg, length, c, stream_id)
        lay.write_headers(c)
        self._layout = lay
        return lay

    # -- try_claim ---------------------------------------------------------------------------
    def _send_claimed(
        self,
        stream_id: int,
        epoch: int,
        seq: int,
        header: memoryview,
        payload: memoryview,
        is_current: Callable[[], bool],
    ) -> str | None:
        length = payload.nbytes
        c = self.chunk_bytes
        count = -(-length // c) if length else 1
        cnt = self._pub.counters
        before = (cnt.back_pressured, cnt.not_connected)
        claim_fn = self._claim
        n = length if length < c else c
        msg = WITH_HEADER_OVERHEAD + n
        last = count == 1
        if msg <= self.max_claim:
            claim = claim_fn(msg)
            if claim is None:
                return self._reason(before)
            b = claim.buffer
        else:  # chunk 0 with the header slot is larger than one frame: encode and offer
            claim = None
            b = self._scratch  # type: ignore[assignment]
        FIRST_PREFIX.pack_into(
            b, 0, _BL, _TID, _SID, _VER, stream_id, epoch, seq, 0, count, 0, n, length, 1,
            HEADER_SLOT_BYTES,
        )  # fmt: skip
        b[FIRST_PREFIX.size : _HDR_END] = header
        _U32.pack_into(b, _HDR_END, n)
        b[_HDR_END + 4 : _HDR_END + 4 + n] = payload[0:n]
        if last and not is_current():
            if claim is not None:
                claim.abort()
            return SendDrop.SOURCE_OVERWRITTEN
        if claim is not None:
            claim.commit()
        else:
            try:
                ok = self._pub.offer(b, 0, msg)
            except OfferRejected:
                return SendDrop.PUBLICATION_FAILED
            if not ok:
                return self._reason(before)
        if last:
            return None
        pack = CHUNK_PREFIX.pack_into
        end = count - 1
        off = c
        for i in range(1, count):
            n = c if i < end else length - off
            claim = claim_fn(NO_HEADER_OVERHEAD + n)
            if claim is None:
                return self._reason(before)
            b = claim.buffer
            pack(
                b, 0, _BL, _TID, _SID, _VER, stream_id, epoch, seq, i, count, off, n, length,
                0, 0, n,
            )  # fmt: skip
            b[NO_HEADER_OVERHEAD : NO_HEADER_OVERHEAD + n] = payload[off : off + n]
            if i == end and not is_current():
                claim.abort()
                return SendDrop.SOURCE_OVERWRITTEN
            claim.commit()
            off += c
        return None


class _SenderMapping:
    __slots__ = (
        "announced_epoch",
        "chunks",
        "consumer",
        "mapping",
        "next_announce_ns",
        "seen_epoch",
        "stats",
    )

    def __init__(self, mapping: BridgeMapping, consumer: Consumer, chunks: ChunkSender) -> None:
        self.mapping = mapping
        self.consumer = consumer
        self.chunks = chunks
        self.announced_epoch = -1
        self.seen_epoch = -1
        self.next_announce_ns = 0
        self.stats = chunks.stats


class BridgeSender:
    """All sender mappings of one bridge process (an Agent: ``do_work`` returns work done)."""

    role_name = "bridge-sender"

    def __init__(
        self,
        ctx: AeronContext,
        config: BridgeConfig,
        *,
        clock: NanoClock = now_ns,
        frames_per_poll: int = 8,
        strategy: str = "staging",
    ) -> None:
        self.config = config
        b = config.bridge
        local = config.local
        settings = local.client_settings()
        self._clock = clock
        self._now = clock()
        self._frames_per_poll = frames_per_poll
        self._announce_period_ns = local.announce_period_ms * 1_000_000
        self._buf = bytearray(64 * 1024)
        self._payload = ctx.add_publication(b.payload_channel, b.payload_stream_id, exclusive=False)
        self._control = ctx.add_publication(b.control_channel, b.control_stream_id)
        mtu = b.mtu_bytes
        try:
            max_claim = int(self._payload.publication.max_payload_length)  # type: ignore[union-attr]
        except AttributeError:  # pragma: no cover - exclusive publications
            max_claim = (channel_mtu(b.payload_channel) or mtu) - _AERON_HEADER
        self.mappings: list[_SenderMapping] = []
        for m in config.sender_mappings:
            consumer = Consumer(
                ctx,
                m.source_stream_id,
                settings,
                driver=local.driver_mode,
                clock=clock,
                # a producer publishes FrameProgress only to consumers that ask (§10.2.2)
                progress=ProgressRequest() if b.forward_progress else None,
            )
            chunks = ChunkSender(
                self._payload, b.chunk_size, max_claim, stream_id=m.source_stream_id,
                strategy=strategy, max_hold_ns=b.assembly_timeout_ns,
            )  # fmt: skip
            self.mappings.append(_SenderMapping(m, consumer, chunks))
        self._by_source = {sm.mapping.source_stream_id: sm for sm in self.mappings}
        self._current: _SenderMapping | None = None
        self._metadata: Publisher | None = None
        # the local streams come through the process's conductor (#28.1), decoded once
        self._conductor = hub = ContextConductor.acquire(ctx)
        self._conductor_held = True
        self._taps: list[tuple[Tap, Callable[[object, bytes], None]]] = []
        w = wire
        if b.metadata_enabled and self.mappings:
            self._metadata = ctx.add_publication(b.metadata_channel, b.metadata_stream_id)
            kinds: tuple[type, ...] = (w.DataSourceAnnounceDecoder, w.DataSourceMetaDecoder)
            tap = hub.tap(local.channels.metadata_channel, b.source_metadata_stream_id, kinds)
            self._taps.append((tap, self._on_metadata))
        if b.forward_progress or b.forward_qos:
            kinds = (w.FrameProgressDecoder,) if b.forward_progress else ()
            if b.forward_qos:
                kinds += (w.QosProducerDecoder, w.QosConsumerDecoder)
            for sid in sorted({m.source_control_stream_id for m in config.sender_mappings}):
                tap = hub.tap(local.channels.control_channel, sid, kinds)
                self._taps.append((tap, self._on_source_control))
        self._forward_progress = b.forward_progress
        self._forward_qos = b.forward_qos

    # -- agent ------------------------------------------------------------------------------------

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        self.close()

    def do_work(self) -> int:
        work = 0
        now = self._now = self._clock()
        work += self._conductor.poll(now)
        for tap, handler in self._taps:
            for dec, raw, _join in tap.drain():
                if not isinstance(dec, str):  # damage: the conductor counted it
                    handler(dec, raw)
                work += 1
        for sm in self.mappings:
            chunks = sm.chunks
            chunks.moved = 0
            if chunks.pending and chunks.flush(now) is None:
                work += 1  # the staged frame found room (or was given up)
            self._current = sm
            work += sm.consumer.poll(self._on_frame, self._frames_per_poll)
            # Chunks that went out are work even when the frame is not done: the window is
            # moving, so come back soon rather than park. (Frames dropped behind a full window
            # count as work too: parking then saved ~0.2 cores here but slowed the reaction to
            # the window opening; see docs/benchmarks/bridge.md.)
            work += chunks.moved
            work += self._maybe_announce(sm, now)
        self._current = None
        return work

    # -- frames -----------------------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        sm = self._current
        assert sm is not None
        stats = sm.stats
        if frame.epoch != sm.announced_epoch:
            self._maybe_announce(sm, self._clock())
            if frame.epoch != sm.announced_epoch:
                stats.drops.increment(SendDrop.NO_ANNOUNCE_SENT)
                return
        header, payload = frame.raw_views()
        length = payload.nbytes
        if length > self.config.bridge.max_payload_bytes:
            stats.drops.increment(SendDrop.PAYLOAD_TOO_LARGE)
            return
        sm.chunks.submit(  # counts what it sends and drops in sm.stats
            sm.mapping.source_stream_id,
            frame.epoch,
            frame.seq,
            header,
            payload,
            frame.is_current,
            self._now,
        )

    # -- control plane ----------------------------------------------------------------------------

    def _maybe_announce(self, sm: _SenderMapping, now: int) -> int:
        """Forward the mapped source announce on epoch change and every announce period."""
        consumer = sm.consumer
        layout = consumer.layout
        epoch = consumer.epoch
        if layout is None or epoch is None:
            return 0
        if epoch != sm.seen_epoch:  # a new epoch is announced at once
            sm.seen_epoch = epoch
            sm.next_announce_ns = 0
        if now < sm.next_announce_ns:
            return 0
        n = wire.ShmPoolAnnounceEncoder.encode(
            self._buf,
            0,
            stream_id=sm.mapping.source_stream_id,
            producer_id=layout.producer_id,
            epoch=layout.epoch,
            announce_timestamp_ns=now,
            announce_clock_domain=_CLOCK_MONOTONIC,
            layout_version=layout.layout_version,
            header_nslots=layout.header_nslots,
            header_slot_bytes=layout.header_slot_bytes,
            payload_pools=[
                (p.pool_id, p.nslots, p.stride_bytes, p.region_uri) for p in layout.pools
            ],
            header_region_uri=layout.header_region_uri,
        )
        if not self._control.offer(self._buf, 0, n):
            # nobody listening yet, or back-pressure: retry soon, count the failed attempt
            sm.stats.control_drops.increment(ControlDrop.FORWARD_FAILED)
            sm.next_announce_ns = now + 10_000_000
            return 0
        sm.announced_epoch = layout.epoch
        sm.next_announce_ns = now + self._announce_period_ns
        sm.stats.announces += 1
        return 1

    def _stream_of(self, buffer: object) -> _SenderMapping | None:
        try:
            return self._by_source.get(_STREAM_ID_AT.unpack_from(buffer, 8)[0])  # type: ignore[arg-type]
        except struct.error:
            return None

    def _on_metadata(self, dec: object, buffer: bytes) -> None:
        sm = self._stream_of(buffer)
        if sm is None or self._metadata is None:
            return
        if self._metadata.offer(buffer):  # type: ignore[arg-type]
            sm.stats.metadata += 1
        else:
            sm.stats.control_drops.increment(ControlDrop.FORWARD_FAILED)

    def _on_source_control(self, dec: object, buffer: bytes) -> None:
        sm = self._stream_of(buffer)
        if sm is None:
            return
        if self._control.offer(buffer):  # type: ignore[arg-type]
            if isinstance(dec, wire.FrameProgressDecoder):
                sm.stats.progress += 1
            else:
                sm.stats.qos += 1
        else:
            sm.stats.control_drops.increment(ControlDrop.FORWARD_FAILED)

    # -- status -----------------------------------------------------------------------------------

    def status(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for sm in self.mappings:
            st = sm.stats
            c = sm.consumer
            out.append(
                {
                    "role": "sender",
                    "mapping": sm.mapping.name,
                    "source_stream_id": sm.mapping.source_stream_id,
                    "source_epoch": c.epoch,
                    "frames": st.frames,
                    "bytes": st.bytes,
                    "announces": st.announces,
                    "metadata": st.metadata,
                    "progress": st.progress,
                    "qos": st.qos,
                    "drops": st.drops.snapshot(),
                    "source_drops_gap": c.drops_gap,
                    "source_drops_late": c.drops_late,
                    "source_drops": c.stats.drops.snapshot(),
                    "source_control_drops": c.stats.control.snapshot(),
                    "control_drops": st.control_drops.snapshot(),
                }
            )
        return out

    def close(self) -> None:
        for sm in self.mappings:
            sm.consumer.close()
        hub, taps, self._taps = self._conductor, self._taps, []
        for tap, _ in taps:
            hub.unregister(tap)
        if self._conductor_held:
            self._conductor_held = False
            hub.release()
