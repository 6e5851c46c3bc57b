"""Cutting a frame into ``BridgeFrameChunk`` messages (Bridge Spec §5.1, §5.2) — pure.

A frame is the 256-byte header slot (``SlotHeader`` prefix, headerBytes length, embedded
``TensorHeader``) plus ``payloadLength`` payload bytes. It travels as ``chunkCount``
messages; chunk ``i`` carries payload bytes ``[i * c, min((i + 1) * c, L))`` where ``c`` is
the effective chunk size (``min(chunk_bytes, mtu_bytes - 128)``), and chunk 0 also carries
the header slot. An empty payload is one chunk of length 0 (``chunkCount >= 1``).

Uniform chunks keep every receiver simple (some place chunk ``i`` at ``i * c``); this
package's receiver assembles by ``chunkOffset``/``chunkLength`` regardless (§5.2).

Byte layout of one message, little-endian (identical to what the generated
:class:`~tensorpool.specs.generated.bridge.BridgeFrameChunkEncoder` writes; a unit test
compares them byte for byte)::

    0   u16 blockLength=41  u16 templateId=1  u16 schemaId=902  u16 version=1
    8   u32 streamId  u64 epoch  u64 seq  u32 chunkIndex  u32 chunkCount
    36  u32 chunkOffset  u32 chunkLength  u32 payloadLength  u8 headerIncluded
    49  u32 headerBytes length (256 or 0), then the header bytes
        u32 payloadBytes length (= chunkLength), then the payload bytes

Fast path: one precompiled ``Struct.pack_into`` writes everything up to the payload (57
bytes, or 53 + header + 4 for chunk 0), and one slice assignment copies the payload — so
a chunk can be written straight into an Aeron ``try_claim`` buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Buffer, Iterator
from typing import Final

from tensorpool.specs.generated.bridge import BridgeFrameChunkDecoder as _Dec

__all__ = [
    "CHUNK_PREFIX",
    "FIRST_PREFIX",
    "HEADER_SLOT_BYTES",
    "NO_HEADER_OVERHEAD",
    "WITH_HEADER_OVERHEAD",
    "Chunker",
]

HEADER_SLOT_BYTES: Final = 256
_BLOCK: Final = _Dec.BLOCK_LENGTH
_TEMPLATE: Final = _Dec.TEMPLATE_ID
_SCHEMA: Final = _Dec.SCHEMA_ID
_VERSION: Final = _Dec.SCHEMA_VERSION

#: Message header + block + headerBytes length (0) + payloadBytes length: chunks 1..n-1.
CHUNK_PREFIX: Final = struct.Struct("<HHHHIQQIIIIIBII")
#: Message header + block + headerBytes length (256): chunk 0, header bytes follow.
FIRST_PREFIX: Final = struct.Struct("<HHHHIQQIIIIIBI")
_U32: Final = struct.Struct("<I")
NO_HEADER_OVERHEAD: Final = CHUNK_PREFIX.size  # 57
WITH_HEADER_OVERHEAD: Final = FIRST_PREFIX.size + HEADER_SLOT_BYTES + 4  # 313

assert CHUNK_PREFIX.size == 8 + _BLOCK + 8
assert FIRST_PREFIX.size == 8 + _BLOCK + 4


class Chunker:
    """Splits payloads into uniform chunks of ``chunk_bytes`` and encodes them.

    Stateless apart from the chunk size: safe to share, trivial to test.
    """

    __slots__ = ("chunk_bytes",)

    def __init__(self, chunk_bytes: int) -> None:
        if not 1 <= chunk_bytes <= 0xFFFF:
            raise ValueError(f"chunk_bytes must be in 1..65535, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes

    def count(self, payload_length: int) -> int:
        """``chunkCount`` for a payload (at least 1, §5.2)."""
        if payload_length <= 0:
            return 1
        return -(-payload_length // self.chunk_bytes)

    def spans(self, payload_length: int) -> Iterator[tuple[int, int, int]]:
        """``(chunkIndex, chunkOffset, chunkLength)`` in sending order."""
        c = self.chunk_bytes
        n = self.count(payload_length)
        for i in range(n):
            off = i * c
            yield i, off, min(c, payload_length - off) if payload_length else 0

    @staticmethod
    def message_length(chunk_index: int, chunk_length: int) -> int:
        """Encoded size of chunk ``chunk_index`` carrying ``chunk_length`` payload bytes."""
        return (WITH_HEADER_OVERHEAD if chunk_index == 0 else NO_HEADER_OVERHEAD) + chunk_length

    def frame_wire_bytes(self, payload_length: int) -> int:
        """Bytes of all chunk messages of one frame (without Aeron framing)."""
        n = self.count(payload_length)
        return payload_length + WITH_HEADER_OVERHEAD + (n - 1) * NO_HEADER_OVERHEAD

    @staticmethod
    def encode(
        buf: Buffer,
        offset: int,
        *,
        stream_id: int,
        epoch: int,
        seq: int,
        chunk_index: int,
        chunk_count: int,
        chunk_offset: int,
        payload_length: int,
        header: Buffer | None,
        payload: Buffer,
    ) -> int:
        """Write one chunk message at ``offset``; returns its length.

        ``header`` (256 bytes) is required for chunk 0 and refused otherwise; ``payload``
        is this chunk's slice (its length is ``chunkLength``).
        """
        mv = memoryview(buf)  # type: ignore[arg-type]
        n = memoryview(payload).nbytes  # type: ignore[arg-type]
        if chunk_index == 0:
            if header is None or memoryview(header).nbytes != HEADER_SLOT_BYTES:  # type: ignore[arg-type]
                raise ValueError("chunk 0 needs the 256-byte header slot")
            FIRST_PREFIX.pack_into(
                mv, offset, _BLOCK, _TEMPLATE, _SCHEMA, _VERSION, stream_id, epoch, seq,
                0, chunk_count, chunk_offset, n, payload_length, 1, HEADER_SLOT_BYTES,
            )  # fmt: skip
            pos = offset + FIRST_PREFIX.size
            mv[pos : pos + HEADER_SLOT_BYTES] = header  # type: ignore[assignment]
            pos += HEADER_SLOT_BYTES
            _U32.pack_into(mv, pos, n)
            pos += 4
        else:
            if header is not None:
                raise ValueError("only chunk 0 carries the header slot")
            CHUNK_PREFIX.pack_into(
                mv, offset, _BLOCK, _TEMPLATE, _SCHEMA, _VERSION, stream_id, epoch, seq,
                chunk_index, chunk_count, chunk_offset, n, payload_length, 0, 0, n,
            )  # fmt: skip
            pos = offset + CHUNK_PREFIX.size
        mv[pos : pos + n] = payload  # type: ignore[assignment]
        return pos + n - offset

    def encode_frame(
        self, *, stream_id: int, epoch: int, seq: int, header: Buffer, payload: Buffer
    ) -> list[bytes]:
        """Every chunk of one frame as separate messages, in order (tests and tools)."""
        data = memoryview(payload).cast("B")  # type: ignore[arg-type]
        total = data.nbytes
        count = self.count(total)
        out: list[bytes] = []
        for i, off, length in self.spans(total):
            buf = bytearray(self.message_length(i, length))
            self.encode(
                buf,
                0,
                stream_id=stream_id,
                epoch=epoch,
                seq=seq,
                chunk_index=i,
                chunk_count=count,
                chunk_offset=off,
                payload_length=total,
                header=header if i == 0 else None,
                payload=data[off : off + length],
            )
            out.append(bytes(buf))
        return out
