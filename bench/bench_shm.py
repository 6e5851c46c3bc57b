"""Single-core throughput of the SHM hot paths against plain struct/numpy baselines.

Run: ``.venv/bin/python -m bench.bench_shm`` (about 25 s). Prints a markdown table.

* read: seqlock-validated slot read — descriptor checks, SlotHeader + embedded TensorHeader
  validation, zero-copy numpy view, second seq_commit load (steady state: the slot's layout
  repeats, as it does for a camera stream). Also the first-sight path (cache miss: full
  TensorHeader validation) and ``read_copy`` of 4 KiB.
* write: ``SlotWriter.write`` of a 4 KiB float32 tensor — in-progress store, payload copy,
  header overwrite, commit store.
* baselines: the floor any Python implementation pays — ``struct.unpack_from`` of the same
  header fields (and ``pack_into`` for writes), a bare 4 KiB ``numpy.copyto``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable

import numpy as np

from tensorpool.shm import (
    EpochLayout,
    ExpectedRegion,
    PathPolicy,
    SlotReader,
    SlotWriter,
    SuperblockFields,
    create_region,
    format_shm_uri,
    map_region,
)

NSLOTS = 64
STRIDE = 4096
TARGET_PER_S = 300_000


def _measure(
    benches: dict[str, tuple[Callable[[int], None], int]], rounds: int
) -> dict[str, float]:
    """Best ops per CPU-second for each benchmark over ``rounds`` interleaved rounds.

    ``fn(n)`` performs ``n`` operations. Time is this thread's CPU time, so the figure is the
    single-core throughput even when other processes compete for the CPU (wall-clock rates on a
    loaded 2-core box vary by 2x); interleaving spreads cache and frequency effects evenly.
    """
    best = dict.fromkeys(benches, float("inf"))
    for _ in range(rounds):
        for name, (fn, n) in benches.items():
            t0 = time.thread_time()
            fn(n)
            best[name] = min(best[name], (time.thread_time() - t0) / n)
    return {name: 1.0 / per_op for name, per_op in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=200_000, help="operations per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    args = ap.parse_args()
    n, repeats = args.n, args.repeats

    base = tempfile.mkdtemp(
        prefix="tp-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    try:
        layout = EpochLayout(base, "bench", "p0", 1)
        now = time.monotonic_ns()
        header = create_region(
            layout.header_path,
            SuperblockFields.header_ring(epoch=1, stream_id=1, nslots=NSLOTS, now_ns=now),
        )
        pool = create_region(
            layout.pool_path(1),
            SuperblockFields.payload_pool(
                epoch=1, stream_id=1, pool_id=1, nslots=NSLOTS, stride_bytes=STRIDE, now_ns=now
            ),
        )
        writer = SlotWriter(header, [pool])
        policy = PathPolicy([base])
        h_ro = map_region(
            format_shm_uri(layout.header_path),
            ExpectedRegion.header_ring(epoch=1, stream_id=1, nslots=NSLOTS),
            policy,
        )
        p_ro = map_region(
            format_shm_uri(layout.pool_path(1)),
            ExpectedRegion.payload_pool(
                epoch=1, stream_id=1, pool_id=1, nslots=NSLOTS, stride_bytes=STRIDE
            ),
            policy,
        )
        reader = SlotReader(h_ro, [p_ro])
        tensor = np.random.default_rng(1).random((32, 32), dtype=np.float32)  # 4 KiB
        mask = NSLOTS - 1
        for seq in range(NSLOTS):
            writer.write(seq, tensor, timestamp_ns=seq)

        def bench_write(k: int) -> None:
            w = writer.write
            for seq in range(k):
                w(seq, tensor, timestamp_ns=seq)

        def refill() -> None:
            """Make every slot hold seq == index again (the write benchmark moves them on)."""
            for seq in range(NSLOTS):
                writer.write(seq, tensor, timestamp_ns=seq)

        def bench_read(k: int) -> None:
            r = reader.read
            for i in range(k):
                idx = i & mask
                if r(idx, idx) is None:
                    raise RuntimeError(f"unexpected drop: {reader.last_drop_reason}")

        def bench_read_validated(k: int) -> None:
            r = reader.read
            cur = reader.is_current
            for i in range(k):
                idx = i & mask
                got = r(idx, idx)
                if got is None or not cur(got):
                    raise RuntimeError(f"unexpected drop: {reader.last_drop_reason}")

        def bench_read_cold(k: int) -> None:
            r = reader.read
            keys = reader._keys
            known = reader._known
            for i in range(k):
                idx = i & mask
                keys[idx] = None
                known.clear()
                if r(idx, idx) is None:
                    raise RuntimeError(f"unexpected drop: {reader.last_drop_reason}")

        def bench_read_copy(k: int) -> None:
            r = reader.read_copy
            for i in range(k):
                idx = i & mask
                if r(idx, idx) is None:
                    raise RuntimeError(f"unexpected drop: {reader.last_drop_reason}")

        # Baselines: the same fields through plain struct calls, and a bare 4 KiB copy.
        words = h_ro.words
        hmm = h_ro.mmap
        slot_fmt = struct.Struct("<IIHIQI")
        tensor_fmt = struct.Struct("<IHHHHhhBBBI8i8i")

        def base_unpack(k: int) -> None:
            for i in range(k):
                off = 64 + (i & mask) * 256
                words[off >> 3]
                slot_fmt.unpack_from(hmm, off + 8)
                tensor_fmt.unpack_from(hmm, off + 60)
                words[off >> 3]

        w_hmm = header.mmap
        w_words = header.words
        slot_w = struct.Struct("<IIHIQI26x")
        tensor_w = struct.Struct("<IHHHHhhBBBI8i8i109x")
        dims = (32, 32, 0, 0, 0, 0, 0, 0)
        strides = (128, 4, 0, 0, 0, 0, 0, 0)

        def base_pack(k: int) -> None:
            for seq in range(k):
                off = 64 + (seq & mask) * 256
                w_words[off >> 3] = seq << 1
                slot_w.pack_into(w_hmm, off + 8, 4096, seq & mask, 1, 0, seq, 0)
                tensor_w.pack_into(
                    w_hmm, off + 60, 192, 184, 52, 900, 1, 9, 1, 2, 0, 0, 0, *dims, *strides
                )
                w_words[off >> 3] = (seq << 1) | 1

        dst = np.frombuffer(pool.mmap, np.uint8)[64 : 64 + 4096].view(np.float32).reshape(32, 32)

        def base_copy(k: int) -> None:
            c = np.copyto
            for _ in range(k):
                c(dst, tensor)

        def bench_read_refill(k: int) -> None:
            refill()
            bench_read(k)

        rates = _measure(
            {
                "write": (bench_write, n),
                "read": (bench_read_refill, n),
                "read_valid": (bench_read_validated, n),
                "read_cold": (bench_read_cold, n // 4),
                "read_copy": (bench_read_copy, n),
                "unpack": (base_unpack, n),
                "pack": (base_pack, n),
                "copyto": (base_copy, n),
            },
            repeats,
        )
        unpack, pack = "struct unpack of same fields", "struct pack of same fields"
        rows = [
            ("slot read: zero-copy view (steady state)", "read", unpack, "unpack"),
            ("slot read + is_current() after use", "read_valid", unpack, "unpack"),
            ("slot read, layout never seen (full validation)", "read_cold", unpack, "unpack"),
            ("slot read_copy (4 KiB copied under seqlock)", "read_copy", unpack, "unpack"),
            ("slot write 4 KiB (seqlock + header + copy)", "write", pack, "pack"),
            ("slot write 4 KiB (seqlock + header + copy)", "write", "numpy copyto 4 KiB", "copyto"),
        ]

        title = f"SHM hot paths, ops per CPU-second on one core, n={n}, best of {repeats} rounds"
        print(f"{title}, target {TARGET_PER_S:,}/s\n")
        print("| operation | ops/s | baseline | baseline ops/s | ratio | target met |")
        print("| --- | ---: | --- | ---: | ---: | :---: |")
        for name, key, bname, bkey in rows:
            rate, brate = rates[key], rates[bkey]
            ok = "yes" if rate >= TARGET_PER_S else "-"
            print(f"| {name} | {rate:,.0f} | {bname} | {brate:,.0f} | {rate / brate:.2f} | {ok} |")
        reader.close()
        writer.close()
        for region in (h_ro, p_ro, header, pool):
            region.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
