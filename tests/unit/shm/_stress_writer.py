"""Writer process for the torn-read stress test: rewrites an 8-slot ring as fast as it can.

Usage: python _stress_writer.py <base> <header_path> <pool_path> <control_path> <max_seconds>
[batch]

With ``batch``, frames are written 3 at a time through the vectorized ``BatchWriter``
(claim, fill, commit: one store pass per §8.3 step), so the claims keep crossing the wrap.

Each frame ``seq`` is 512 uint64 words: 511 copies of ``seq`` and a checksum ``stamp(seq)``.
The control file holds three u64 words: latest published seq + 1, a stop flag set by the reader,
and the number of frames written (set on exit).
"""

from __future__ import annotations

import mmap
import sys
import time

import numpy as np

from tensorpool.shm import (
    ExpectedRegion,
    PathPolicy,
    SlotWriter,
    TensorLayout,
    format_shm_uri,
    map_region,
)
from tensorpool.shm.batch import BatchWriter

NSLOTS = 8
STRIDE = 4096
STREAM_ID = 4242
EPOCH = 1
WORDS = STRIDE // 8
MASK64 = (1 << 64) - 1


def stamp(seq: int) -> int:
    return (seq * 0x9E3779B97F4A7C15 + 0x5BD1E995) & MASK64


def main() -> None:
    base, header_path, pool_path, control_path, max_seconds = sys.argv[1:6]
    policy = PathPolicy([base])
    header = map_region(
        format_shm_uri(header_path),
        ExpectedRegion.header_ring(epoch=EPOCH, stream_id=STREAM_ID, nslots=NSLOTS),
        policy,
        writable=True,
    )
    pool = map_region(
        format_shm_uri(pool_path),
        ExpectedRegion.payload_pool(
            epoch=EPOCH, stream_id=STREAM_ID, pool_id=1, nslots=NSLOTS, stride_bytes=STRIDE
        ),
        policy,
        writable=True,
    )
    writer = SlotWriter(header, [pool])
    batch = len(sys.argv) > 6 and sys.argv[6] == "batch"
    with open(control_path, "r+b") as f:
        ctl_map = mmap.mmap(f.fileno(), 64)
    ctl = memoryview(ctl_map).cast("Q")
    frame = np.empty(WORDS, np.uint64)
    deadline = time.monotonic() + float(max_seconds)
    seq = 0
    write = writer.write
    if batch:
        bw = BatchWriter(writer)
        layout = TensorLayout.contiguous((WORDS,), np.dtype(np.uint64))
        mul = np.uint64(0x9E3779B97F4A7C15)
        add = np.uint64(0x5BD1E995)
        while not (ctl[1] or time.monotonic() > deadline):
            claim = bw.claim(seq, 3, layout, 1)
            seqs = np.arange(seq, seq + claim.n, dtype=np.uint64)
            claim.array[:, :-1] = seqs[:, None]
            claim.array[:, -1] = seqs * mul + add  # stamp(), wrapping like the Python one
            bw.commit(claim, seqs, 0)
            seq += claim.n
            ctl[0] = seq
    while not batch:
        if not seq & 1023 and (ctl[1] or time.monotonic() > deadline):
            break
        frame.fill(seq)
        frame[-1] = stamp(seq)
        write(seq, frame, timestamp_ns=seq)
        ctl[0] = seq + 1
        seq += 1
    ctl[2] = seq
    writer.close()
    ctl.release()
    ctl_map.close()
    header.close()
    pool.close()


if __name__ == "__main__":
    main()
