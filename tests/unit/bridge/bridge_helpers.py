"""Builders for bridge unit tests: header slots, announces, chunk streams, a ready core."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from tensorpool.bridge.assembler import (
    Dropped,
    FrameComplete,
    ReceiverCore,
    ReceiverMapping,
    ScratchSink,
    SourceAnnounce,
)
from tensorpool.bridge.chunker import Chunker
from tensorpool.shm.layout import SLOT_FIELDS, SLOT_FIELDS_OFFSET, TENSOR_BLOB_OFFSET
from tensorpool.shm.tensor import TensorLayout

SRC = 10000
DEST = 20000
CHUNK = 1280
NSLOTS = 64
SOURCE_STRIDE = 1 << 20
LOCAL_STRIDE = 1 << 20
TIMEOUT_NS = 250_000_000
MS = 1_000_000


def header_slot(
    seq: int,
    layout: TensorLayout,
    values_len: int,
    *,
    pool_id: int = 1,
    timestamp_ns: int = 1234,
    meta_version: int = 7,
    committed: bool = True,
    payload_offset: int = 0,
    payload_slot: int | None = None,
) -> bytes:
    """The 256-byte header slot a source producer would have written for frame ``seq``."""
    buf = bytearray(256)
    struct.pack_into("<Q", buf, 0, (seq << 1) | (1 if committed else 0))
    SLOT_FIELDS.pack_into(
        buf,
        SLOT_FIELDS_OFFSET,
        values_len,
        (seq & (NSLOTS - 1)) if payload_slot is None else payload_slot,
        pool_id,
        payload_offset,
        timestamp_ns,
        meta_version,
    )
    buf[TENSOR_BLOB_OFFSET:256] = layout.blob
    return bytes(buf)


def u8_layout(n: int) -> TensorLayout:
    return TensorLayout.contiguous((n,), np.uint8)


def pattern(seq: int, n: int) -> bytes:
    """Self-describing payload: 4-byte words (seq, word index) so a misplaced byte shows."""
    words = (n + 3) // 4
    idx = np.arange(words, dtype=np.uint32)
    arr = ((np.uint32(seq & 0xFFFF) << np.uint32(16)) | (idx & np.uint32(0xFFFF))).astype("<u4")
    return arr.tobytes()[:n]


def announce(
    epoch: int = 1,
    *,
    stream_id: int = SRC,
    pools: tuple[tuple[int, int, int], ...] = ((1, NSLOTS, SOURCE_STRIDE),),
    nslots: int = NSLOTS,
    header_slot_bytes: int = 256,
) -> SourceAnnounce:
    return SourceAnnounce(stream_id, epoch, 1, nslots, header_slot_bytes, pools)


@dataclass
class Frame:
    seq: int
    epoch: int
    payload: bytes
    header: bytes
    chunks: list[bytes] = field(default_factory=list)


def make_frame(
    seq: int,
    nbytes: int,
    *,
    epoch: int = 1,
    chunk: int = CHUNK,
    stream_id: int = SRC,
    layout: TensorLayout | None = None,
    header: bytes | None = None,
    payload: bytes | None = None,
    **header_kw: object,
) -> Frame:
    data = pattern(seq, nbytes) if payload is None else payload
    lay = layout if layout is not None else u8_layout(nbytes)
    hdr = header if header is not None else header_slot(seq, lay, len(data), **header_kw)  # type: ignore[arg-type]
    chunks = Chunker(chunk).encode_frame(
        stream_id=stream_id, epoch=epoch, seq=seq, header=hdr, payload=data
    )
    return Frame(seq, epoch, data, hdr, chunks)


class RecordingSink(ScratchSink):
    """A scratch sink that remembers every size it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def acquire(self, mapping: int, seq: int, payload_length: int) -> memoryview | str:
        self.sizes.append(payload_length)
        return super().acquire(mapping, seq, payload_length)


def make_core(
    *,
    ready: bool = True,
    announced: bool = True,
    chunk_bound: int = CHUNK,
    max_payload: int = 1 << 30,
    local_stride: int = LOCAL_STRIDE,
    local_nslots: int = NSLOTS,
    sink: ScratchSink | None = None,
    ann: SourceAnnounce | None = None,
) -> tuple[ReceiverCore, RecordingSink]:
    rec = sink if sink is not None else RecordingSink()
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST)],
        chunk_bound=chunk_bound,
        max_payload_bytes=max_payload,
        assembly_timeout_ns=TIMEOUT_NS,
        sink=rec,
    )
    if announced:
        core.on_announce(ann or announce(), 0)
    if announced and ready:
        core.destination_ready(
            0, header_nslots=local_nslots, max_stride=local_stride, dest_stream_id=DEST
        )
    return core, rec  # type: ignore[return-value]


def feed(core: ReceiverCore, chunks: list[bytes], now_ns: int = 0) -> list[object]:
    """Feed chunks; return every non-None result. A FrameComplete's payload is copied out."""
    out: list[object] = []
    for c in chunks:
        r = core.on_chunk(c, now_ns)
        if isinstance(r, FrameComplete):
            r.payload = memoryview(bytes(r.payload))
        if r is not None:
            out.append(r)
    return out


def completes(results: list[object]) -> list[FrameComplete]:
    return [r for r in results if isinstance(r, FrameComplete)]


def drops(results: list[object]) -> list[str]:
    return [r.reason for r in results if isinstance(r, Dropped)]


def patch(msg: bytes, offset: int, fmt: str, value: int) -> bytes:
    b = bytearray(msg)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


# byte offsets inside a chunk message
OFF_STREAM = 8
OFF_EPOCH = 12
OFF_SEQ = 20
OFF_INDEX = 28
OFF_COUNT = 32
OFF_OFFSET = 36
OFF_LENGTH = 40
OFF_PLEN = 44
OFF_HINC = 48
OFF_HLEN = 49
