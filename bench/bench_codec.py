"""Single-core throughput of the generated SBE codecs against plain ``struct`` floors.

Run: ``.venv/bin/python -m bench.bench_codec`` (about 20 s). Prints a markdown table.

* FrameDescriptor encode: ``FrameDescriptorEncoder.encode`` with all six keyword fields,
  against one precompiled ``Struct.pack_into`` of header + fields (the floor: what any
  Python encoder has to pay).
* FrameDescriptor decode, three ways, each against one ``Struct.unpack_from`` of the
  44 bytes: the flyweight (``wrap`` + six lazy property reads), ``wrap`` +
  ``raw_tuple()``, and the static ``decode_tuple`` fast path.
* BridgeFrameChunk (1,408-byte payload, var data): encode and decode (``wrap`` +
  ``payload_bytes``), against ``pack_into`` + two length prefixes + a slice copy.

Each number is the best of ``--repeats`` timed runs of ``-n`` operations in a plain loop;
the codec and its baseline are timed alternately, in process CPU time (so other
processes competing for the two cores do not count against either side).
"""

from __future__ import annotations

import argparse
import struct
import time
from collections.abc import Callable

from tensorpool.specs.generated import bridge, wire

TARGET_PER_S = 1_000_000


def _rates(
    fn: Callable[[int], None], base: Callable[[int], None], n: int, repeats: int
) -> tuple[float, float]:
    """Best-of-``repeats`` ops/s of ``fn(n)`` and ``base(n)``, timed alternately so that
    a busy neighbour on a shared machine slows both sides of the ratio alike."""
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, f in enumerate((fn, base)):
            t0 = time.process_time()
            f(n)
            best[i] = min(best[i], time.process_time() - t0)
    return n / best[0], n / best[1]


# ------------------------------------------------------------------ FrameDescriptor

FD_FULL = struct.Struct("<HHHHIQQIQI")
FD_BUF = bytearray(64)
wire.FrameDescriptorEncoder.encode(
    FD_BUF, 0, stream_id=1, epoch=2, seq=3, header_index=4, timestamp_ns=5, meta_version=6
)


def fd_encode(n: int) -> None:
    enc, buf = wire.FrameDescriptorEncoder.encode, FD_BUF
    for i in range(n):
        enc(
            buf,
            0,
            stream_id=1,
            epoch=7,
            seq=i,
            header_index=i & 1023,
            timestamp_ns=i,
            meta_version=1,
        )


def fd_encode_floor(n: int) -> None:
    pack, buf = FD_FULL.pack_into, FD_BUF
    for i in range(n):
        pack(buf, 0, 36, 4, 900, 1, 1, 7, i, i & 1023, i, 1)


def fd_decode_flyweight(n: int) -> None:
    dec, buf = wire.FrameDescriptorDecoder(), FD_BUF
    for _ in range(n):
        d = dec.wrap(buf, 0)
        d.stream_id, d.epoch, d.seq, d.header_index, d.timestamp_ns, d.meta_version  # noqa: B018


def fd_decode_raw_tuple(n: int) -> None:
    dec, buf = wire.FrameDescriptorDecoder(), FD_BUF
    for _ in range(n):
        dec.wrap(buf, 0).raw_tuple()


def fd_decode_tuple(n: int) -> None:
    decode, buf = wire.FrameDescriptorDecoder.decode_tuple, FD_BUF
    for _ in range(n):
        decode(buf, 0)


def fd_decode_floor(n: int) -> None:
    unpack, buf = FD_FULL.unpack_from, FD_BUF
    for _ in range(n):
        unpack(buf, 0)


# ------------------------------------------------------------------ BridgeFrameChunk

CHUNK_BLOCK = struct.Struct("<HHHHIQQIIIIIB")
LEN = struct.Struct("<I")
PAYLOAD = bytes(range(256)) * 5 + bytes(128)  # 1,408 bytes: MTU 1,536 minus 128
CHUNK_BUF = bytearray(2048)
CHUNK_LEN = bridge.BridgeFrameChunkEncoder.encode(
    CHUNK_BUF,
    stream_id=1,
    epoch=2,
    seq=3,
    chunk_index=1,
    chunk_count=4,
    chunk_offset=1408,
    chunk_length=len(PAYLOAD),
    payload_length=4 * len(PAYLOAD),
    header_included=bridge.Bool.FALSE,
    payload_bytes=PAYLOAD,
)


def chunk_encode(n: int) -> None:
    enc, buf, payload = bridge.BridgeFrameChunkEncoder.encode, CHUNK_BUF, PAYLOAD
    for i in range(n):
        enc(
            buf,
            0,
            stream_id=1,
            epoch=2,
            seq=i,
            chunk_index=1,
            chunk_count=4,
            chunk_offset=1408,
            chunk_length=1408,
            payload_length=5632,
            header_included=0,
            payload_bytes=payload,
        )


def chunk_encode_floor(n: int) -> None:
    pack, plen, buf, payload = CHUNK_BLOCK.pack_into, LEN.pack_into, CHUNK_BUF, PAYLOAD
    for i in range(n):
        pack(buf, 0, 41, 1, 902, 1, 1, 2, i, 1, 4, 1408, 1408, 5632, 0)
        plen(buf, 49, 0)
        plen(buf, 53, 1408)
        buf[57:1465] = payload


def chunk_decode(n: int) -> None:
    dec, buf = bridge.BridgeFrameChunkDecoder(), CHUNK_BUF
    for _ in range(n):
        dec.wrap(buf, 0).payload_bytes  # noqa: B018


def chunk_decode_floor(n: int) -> None:
    unpack, ulen, buf = CHUNK_BLOCK.unpack_from, LEN.unpack_from, CHUNK_BUF
    for _ in range(n):
        unpack(buf, 0)
        ulen(buf, 49)
        (length,) = ulen(buf, 53)
        bytes(buf[57 : 57 + length])


CASES: list[tuple[str, Callable[[int], None], str, Callable[[int], None]]] = [
    ("FrameDescriptor encode (6 kwargs)", fd_encode, "Struct.pack_into", fd_encode_floor),
    (
        "FrameDescriptor decode: wrap + 6 properties",
        fd_decode_flyweight,
        "Struct.unpack_from",
        fd_decode_floor,
    ),
    (
        "FrameDescriptor decode: wrap + raw_tuple()",
        fd_decode_raw_tuple,
        "Struct.unpack_from",
        fd_decode_floor,
    ),
    (
        "FrameDescriptor decode: decode_tuple()",
        fd_decode_tuple,
        "Struct.unpack_from",
        fd_decode_floor,
    ),
    (
        "BridgeFrameChunk encode (1,408 B payload)",
        chunk_encode,
        "pack_into + slice copy",
        chunk_encode_floor,
    ),
    (
        "BridgeFrameChunk decode: wrap + payload_bytes",
        chunk_decode,
        "unpack_from + bytes()",
        chunk_decode_floor,
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=100_000, help="operations per timed run")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    print(f"n={args.n}, best of {args.repeats}, single core; target {TARGET_PER_S:,} ops/s\n")
    print("| operation | ops/s | baseline | baseline ops/s | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name, fn, base_name, base in CASES:
        ours, floor = _rates(fn, base, args.n, args.repeats)
        print(f"| {name} | {ours:,.0f} | {base_name} | {floor:,.0f} | {ours / floor:.2f} |")


if __name__ == "__main__":
    main()
