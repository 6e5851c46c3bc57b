"""Frames from a live producer into GPU memory: registered pool vs the copies a user would write
(GitHub issue 20).

Run: ``python3 -m bench.bench_gpu`` on a host with a CUDA GPU and ``tensorpool[gpu]`` (about
40 s; ``--json FILE`` writes the raw results). Without CuPy or a GPU it exits with status 77
(``bench.SKIPPED``: ``python -m bench`` lists it as skipped) and one line saying which.

Setup: one standalone Aeron media driver; one producer process (``multiprocessing`` spawn) that
``claim``/``commit``s frames of one size flat out, stamping only 8 bytes (the payload bytes are
whatever the slot held: copies cost the same). The benchmark's own credit counter (a shared
integer, not a tensorpool feature) keeps the producer at most half a ring ahead of the
consumer, so no copy is wasted on a frame the producer already overwrote and every variant
runs at the consumer's own speed. Per frame size, each variant gets a fresh consumer:

* **registered**: ``Consumer.poll_batch(B, device="cuda:0")``: the pool pinned once, one
  asynchronous 2D copy per batch on a CUDA stream, synchronize, re-check the commit words;
* **pageable**: ``poll_batch(B)`` then ``cupy.asarray(batch.array)`` (no registration), then
  ``batch.confirm()``;
* **torch**: ``torch.from_numpy(batch.array).cuda()`` then ``batch.confirm()`` (when torch is
  importable);
* **host** (``--variants host``, runs without a GPU): ``poll_batch(B, copy=True)``, the host
  batch path's own copy: a check of the producer/credit plumbing anywhere;
* **pinned H2D**: the device's host-to-device bandwidth from a ``cupy`` pinned buffer of one
  batch, no producer: the ceiling the registered path is measured against (goal >= 0.9).

GB/s counts accepted frame bytes per wall-clock second of the measured window; frames/s too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, Final

import numpy as np

from bench import SKIPPED

KIB: Final = 1024
MIB: Final = 1024 * KIB
STREAM: Final = 20
#: (label, shape, dtype)
SIZES: Final = (
    ("640 KiB", (640 * KIB,), "uint8"),
    ("640x480 uint16", (480, 640), "uint16"),
    ("4 MiB", (4 * MIB,), "uint8"),
)


def _settings(aeron_dir: str, shm_base: str) -> Any:
    from tensorpool.client.settings import ClientSettings
    from tensorpool.transport.config import TransportConfig

    return ClientSettings(
        transport=TransportConfig(aeron_dir=aeron_dir),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )


def producer_main(
    aeron_dir: str,
    shm_base: str,
    shape: tuple[int, ...],
    dtype: str,
    nslots: int,
    published: Any,
    consumed: Any,
    stop: Any,
) -> None:
    """Flat out, at most ``nslots // 2`` frames ahead of the consumer's credit."""
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.transport.context import AeronContext

    settings = _settings(aeron_dir, shm_base)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    stride = StreamConfig.for_frame_bytes(STREAM, nbytes).pools[0].stride_bytes
    stream = StreamConfig(STREAM, header_nslots=nslots, pools=(PoolConfig(1, stride),))
    window = nslots // 2
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        p = Producer(ctx, stream, settings)
        n = 0
        while not stop.value:
            if p.next_seq - consumed.value >= window:
                p.do_work()
                continue
            claim = p.claim(shape, dtype)
            if claim is None:
                p.do_work()
                continue
            claim.array.reshape(-1).view(np.uint8)[:8] = np.frombuffer(
                claim.seq.to_bytes(8, "little"), np.uint8
            )
            p.commit(claim)
            published.value = p.next_seq
            n += 1
            if n % 64 == 0:
                p.do_work()
        p.close()


def _measure(consumer: Any, step: Any, consumed: Any, published: Any, seconds: float) -> dict:
    """Warm up 0.5 s, then count accepted frames and bytes for ``seconds``."""
    stats = consumer.stats
    deadline = time.monotonic() + 10
    while not consumer.is_mapped:
        consumer.poll_batch(64)
        if time.monotonic() > deadline:
            raise RuntimeError("consumer did not map the producer's stream in 10 s")
    consumed.value = published.value  # let the producer go
    t0 = time.monotonic()
    warm = t0 + 0.5
    end = warm + seconds
    f0 = b0 = 0
    t_start = warm
    measuring = False
    last_got = t0
    while True:
        now = time.monotonic()
        if not measuring and now >= warm:
            measuring, f0, b0, t_start = True, stats.frames, stats.bytes, now
        if now >= end:
            break
        last = step()
        if last >= 0:
            consumed.value = last + 1
            last_got = now
        elif now - last_got > 0.05:  # nothing for 50 ms (a new consumer joined mid-stream)
            consumed.value = published.value
            last_got = now
    elapsed = time.monotonic() - t_start
    frames, nbytes = stats.frames - f0, stats.bytes - b0
    drops = stats.drops.snapshot()
    return {
        "frames_s": frames / elapsed,
        "gb_s": nbytes / elapsed / 1e9,
        "frames": frames,
        "torn": drops.get("torn_read", 0),
        "drops": drops,
    }


def _pinned_h2d(cp: Any, nbytes: int, seconds: float) -> float:
    """Host-to-device GB/s from a pinned buffer of ``nbytes`` (the ceiling)."""
    mem = cp.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(mem, np.uint8, nbytes)
    host[:] = 1
    dev = cp.empty(nbytes, cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(3):
        dev.set(host, stream=stream)
    stream.synchronize()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            cp.cuda.runtime.memcpyAsync(dev.data.ptr, int(mem.ptr), nbytes, 1, stream.ptr)
        stream.synchronize()
        n += 8
    return n * nbytes / (time.perf_counter() - t0) / 1e9


def run_size(
    label: str, shape: tuple[int, ...], dtype: str, args: argparse.Namespace, cp: Any
) -> dict:
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.mediadriver import MediaDriverProcess

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    nslots = max(16, min(256, (256 * MIB) // nbytes))
    nslots = 1 << (nslots.bit_length() - 1)
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    if parent and shutil.disk_usage(parent).free < 3 * nslots * nbytes:
        parent = None  # a small /dev/shm (containers): a page-cache file in the temp dir
    shm_base = tempfile.mkdtemp(prefix="tp-bench-gpu-", dir=parent)
    mpc = mp.get_context("spawn")
    published, consumed, stop = mpc.Value("q", 0), mpc.Value("q", 0), mpc.Value("b", 0)
    row: dict[str, Any] = {"size": label, "frame_bytes": nbytes, "nslots": nslots}
    try:
        with MediaDriverProcess() as md:
            settings = _settings(md.dir, shm_base)
            proc = mpc.Process(
                target=producer_main,
                args=(md.dir, shm_base, shape, dtype, nslots, published, consumed, stop),
                daemon=True,
            )
            proc.start()
            try:
                with AeronContext(settings.transport) as ctx:
                    ctx.start()
                    batch_n = max(1, min(args.batch, nslots // 4))
                    row["batch"] = batch_n
                    for variant in args.variants:
                        row[variant] = _variant(variant, ctx, settings, batch_n, cp, args, shared=(
                            consumed, published))  # fmt: skip
                    row["pinned_h2d_gb_s"] = (
                        _pinned_h2d(cp, batch_n * nbytes, args.seconds) if cp is not None else 0.0
                    )
            finally:
                stop.value = 1
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    finally:
        shutil.rmtree(shm_base, ignore_errors=True)
    return row


def _variant(
    variant: str, ctx: Any, settings: Any, batch_n: int, cp: Any, args: argparse.Namespace,
    shared: tuple[Any, Any],
) -> dict | None:  # fmt: skip
    from tensorpool.client.consumer import Consumer

    consumed, published = shared
    torch = None
    if variant == "torch":
        try:
            import torch
        except ImportError:
            return None
    consumer = Consumer(ctx, STREAM, settings)
    try:
        if variant == "registered":
            consumer.to_device(args.device)

            def step() -> int:
                b = consumer.poll_batch(batch_n, device=args.device)
                return int(b.seqs[-1]) if len(b) else -1

        elif variant == "host":  # the host batch path's own copy (no GPU): the plumbing's check

            def step() -> int:
                b = consumer.poll_batch(batch_n, copy=True)
                return int(b.seqs[-1]) if len(b) else -1

        else:
            sink: list[Any] = [None]
            to_dev = (
                cp.asarray
                if variant == "pageable"
                else (lambda a: torch.from_numpy(a).cuda(args.device))  # type: ignore[union-attr]
            )

            def step() -> int:
                b = consumer.poll_batch(batch_n)
                if not len(b):
                    return -1
                arr = (
                    b.array
                    if b.array is not None
                    else np.stack([a for a in b.arrays if a is not None])
                )
                sink[0] = to_dev(arr)
                b.confirm()
                return int(b.seqs[-1])

        with contextlib.ExitStack() as stack:
            if cp is not None:
                stack.enter_context(cp.cuda.Device(int(args.device.partition(":")[2] or 0)))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")  # torch: "the given NumPy array is not writable"
            return _measure(consumer, step, consumed, published, args.seconds)
    finally:
        consumer.close()


def build_table(rows: list[dict], gpu_name: str) -> str:
    out = [
        f"GPU: {gpu_name}",
        "",
        "| frame | batch | registered GB/s | frames/s | pageable GB/s | frames/s | "
        "torch .cuda() GB/s | frames/s | host copy GB/s | frames/s | pinned H2D GB/s | "
        "registered / pinned | registered / pageable frames/s | torn (registered) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["size"], str(r["batch"])]
        for v in ("registered", "pageable", "torch", "host"):
            res = r.get(v)
            cells += [f"{res['gb_s']:.1f}", f"{res['frames_s']:,.0f}"] if res else ["-", "-"]
        reg, page = r.get("registered"), r.get("pageable")
        pinned = r["pinned_h2d_gb_s"]
        cells.append(f"{pinned:.1f}" if pinned else "-")
        cells.append(f"{reg['gb_s'] / pinned:.2f}" if reg and pinned else "-")
        cells.append(
            f"{reg['frames_s'] / page['frames_s']:.1f}x"
            if reg and page and page["frames_s"]
            else "-"
        )
        cells.append(str(reg["torn"]) if reg else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per variant")
    ap.add_argument("--batch", type=int, default=16, help="frames per poll_batch (max)")
    ap.add_argument(
        "--sizes", default="all", help="comma list of labels: 640K,640x480,4M (default all)"
    )
    ap.add_argument(
        "--variants",
        default="registered,pageable,torch,host",
        type=lambda s: [v for v in s.split(",") if v],
        help="comma list (default all four); host alone needs no GPU",
    )
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args(argv)

    from tensorpool.gpu.cuda import Cuda, GpuUnavailable, import_cupy, parse_device

    cp = None
    gpu_name = "none (--variants host)"
    try:
        ordinal = parse_device(args.device)
        if any(v != "host" for v in args.variants):  # `--variants host` runs without a GPU
            cp = import_cupy()
            Cuda(ordinal)
            name = cp.cuda.runtime.getDeviceProperties(ordinal)["name"]
            gpu_name = name.decode() if isinstance(name, bytes) else str(name)
    except ValueError as exc:
        print(f"bench_gpu: {exc}", file=sys.stderr)
        return 2
    except GpuUnavailable as exc:
        print(f"bench_gpu: {exc}", file=sys.stderr)
        return SKIPPED
    pick = {"640K": "640 KiB", "640x480": "640x480 uint16", "4M": "4 MiB"}
    wanted = (
        [s[0] for s in SIZES]
        if args.sizes == "all"
        else [pick.get(s.strip(), s.strip()) for s in args.sizes.split(",")]
    )
    load = os.getloadavg()
    rows = []
    for label, shape, dtype in SIZES:
        if label in wanted:
            rows.append(run_size(label, shape, dtype, args, cp))
            print(f"# {label} done", file=sys.stderr, flush=True)
    print(build_table(rows, gpu_name))
    print(f"\nload average before the run: {load[0]:.2f}; host {platform.node()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu_name, "load": load, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
