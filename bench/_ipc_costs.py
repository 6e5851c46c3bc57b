"""Per-frame CPU cost of each transport's producer and consumer side, in one process.

Model: the two-process runs of ``bench.bench_ipc`` measure what a user gets on this host, but
on a shared 2-core machine their wall-clock rates swing with other load. Here each side is
timed alone in CPU seconds of this process (``time.process_time``, all threads, so
``multiprocessing.Queue``'s feeder thread counts): the producer publishes a batch while nobody
reads, then the consumer drains the batch. Best of several repeats. The numbers are the
intrinsic cost of a frame and explain the two-process results: a side that costs more CPU per
frame than the other falls behind.

Rows: tensorpool ``offer`` / ``claim``+``commit`` and consumer accept (touching one byte per
page, then ``is_current``) and the consumer's cost for a descriptor it has to drop (the ring
was lapped); baseline (a) ``pyaeron`` offer / poll of the whole payload; baseline (b)
``np.copyto`` + ``Queue.put`` / ``Queue.get`` + touch.
"""

from __future__ import annotations

import queue as queue_mod
import shutil
import tempfile
import time
from collections.abc import Callable
from multiprocessing import get_context
from typing import Final

import numpy as np

from bench import _ipc_workers as w
from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

REPEATS: Final = 5
BATCH: Final = 64
"""Frames per batch of the batch-path rows (the issue's "batches of 64")."""


def touch_batch(batch: object) -> int:
    """One byte per 4 KiB page of every frame of a batch, one numpy reduction for a stacked
    batch (the batch path's counterpart of ``make_touch``)."""
    arr = batch.array  # type: ignore[attr-defined]
    if arr is not None:
        rows = arr.reshape(len(arr), -1).view(np.uint8)
        return int(rows[:, :: w.PAGE].sum())
    return sum(
        int(a.reshape(-1).view(np.uint8)[:: w.PAGE].sum()) for a in batch.arrays if a is not None
    )  # type: ignore[attr-defined]


_cpu = time.process_time


def _best(fn: Callable[[], tuple[float, int]]) -> float:
    """Lowest CPU seconds per frame over REPEATS runs of `fn` (-> (cpu seconds, frames))."""
    best = float("inf")
    for _ in range(REPEATS):
        t, n = fn()
        if n:
            best = min(best, t / n)
    return best


def _batch(size: int) -> tuple[int, int]:
    """(frames per batch, batches): a batch fits the ring (no lap) and a quarter of baseline
    (a)'s term (no back-pressure while nobody reads); ~64 MiB of payload per repeat."""
    term = int(w.inline_channel_for(size).split("term-length=")[1].split("|")[0])
    per = max(1, min(32, term // 4 // size))
    rounds = max(4, min(300, (64 << 20) // (size * per)))
    return per, rounds


def tensorpool_costs(size: int) -> dict[str, float]:
    base = tempfile.mkdtemp(prefix="tp-bench-ipc-costs-", dir="/dev/shm")
    out: dict[str, float] = {}
    try:
        settings = ClientSettings(shm_base_dir=base)
        with AeronContext(TransportConfig()) as ctx:
            p = Producer(ctx, StreamConfig.for_frame_bytes(7, size), settings, prefault=True)
            c = Consumer(ctx, 7, settings)
            deadline = time.monotonic() + 10
            while not c.is_mapped and time.monotonic() < deadline:
                p.do_work()
                c.poll(lambda f: None)
                time.sleep(0.001)
            touch = w.make_touch(size)
            src = np.full(size, 7, np.uint8)
            per, rounds = _batch(size)

            def handler(frame: Frame) -> None:
                touch(frame.array)
                frame.is_current()

            def drain() -> None:
                while c.poll(handler, 64):
                    pass

            def produce() -> tuple[float, int]:
                t = 0.0
                for _ in range(rounds):
                    p.do_work()
                    t0 = _cpu()
                    for _ in range(per):
                        p.offer(src)
                    t += _cpu() - t0
                    drain()
                return t, rounds * per

            def claim() -> tuple[float, int]:
                stamp = np.arange(8, dtype=np.uint8)
                shape = (size,)
                t = 0.0
                for _ in range(rounds):
                    p.do_work()
                    t0 = _cpu()
                    for _ in range(per):
                        cl = p.claim(shape, np.uint8)
                        assert cl is not None
                        cl.array[:8] = stamp
                        p.commit(cl)
                    t += _cpu() - t0
                    drain()
                return t, rounds * per

            def consume() -> tuple[float, int]:
                t = 0.0
                f0 = c.stats.frames
                for _ in range(rounds):
                    p.do_work()
                    for _ in range(per):
                        p.offer(src)
                    t0 = _cpu()
                    drain()
                    t += _cpu() - t0
                return t, c.stats.frames - f0

            def dropped() -> tuple[float, int]:
                # the producer laps the 64-slot ring four times before the consumer looks
                t = 0.0
                n = 0
                for _ in range(max(2, rounds // 8)):
                    p.do_work()
                    for _ in range(4 * w.NSLOTS):
                        p.offer(src)
                    t0 = _cpu()
                    drain()
                    t += _cpu() - t0
                    n += 4 * w.NSLOTS
                return t, n

            # the batch path (#15): offer_batch of a whole ring's worth, poll_batch(64)
            # 64 frames per batch up to 4 MiB a batch; beyond, the per-frame rows' burst, so
            # both paths read frames that are equally warm in cache (a 64 x 640 KiB burst is
            # 40 MiB: cold pages would be measured, not the path)
            bper = min(BATCH, w.NSLOTS, max(per, (4 << 20) // size))
            stacked = np.full((bper, size), 7, np.uint8)
            brounds = max(4, (rounds * per) // bper)

            def drain_batch() -> None:
                while True:
                    b = c.poll_batch(BATCH)
                    if not len(b):
                        return
                    touch_batch(b)
                    b.confirm()

            def produce_batch() -> tuple[float, int]:
                t = 0.0
                for _ in range(brounds):
                    p.do_work()
                    t0 = _cpu()
                    p.offer_batch(stacked)
                    t += _cpu() - t0
                    drain_batch()
                return t, brounds * bper

            def consume_batch() -> tuple[float, int]:
                t = 0.0
                f0 = c.stats.frames
                for _ in range(brounds):
                    p.do_work()
                    p.offer_batch(stacked)
                    t0 = _cpu()
                    drain_batch()
                    t += _cpu() - t0
                return t, c.stats.frames - f0

            def dropped_batch() -> tuple[float, int]:
                # as ``dropped``, through offer_batch(16) / poll_batch(64): what a batch
                # consumer pays per descriptor once it has fallen a ring behind
                t = 0.0
                n = 0
                sixteen = np.full((16, size), 7, np.uint8)
                for _ in range(max(2, rounds // 8)):
                    p.do_work()
                    for _ in range(4 * w.NSLOTS // 16):
                        p.offer_batch(sixteen)
                    t0 = _cpu()
                    drain_batch()
                    t += _cpu() - t0
                    n += 4 * w.NSLOTS
                return t, n

            out["tp_offer"] = _best(produce)
            out["tp_offer_batch"] = _best(produce_batch)
            out["tp_accept_batch"] = _best(consume_batch)
            out["tp_claim_commit"] = _best(claim)
            out["tp_accept"] = _best(consume)
            if size <= 64 * 1024:  # writing 256 large frames per repeat just to drop them: skip
                out["tp_drop"] = _best(dropped)
                out["tp_drop_batch"] = _best(dropped_batch)
            c.close()
            p.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def inline_costs(size: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with AeronContext(TransportConfig(pre_touch_mapped_memory=True)) as ctx:
        channel = w.inline_channel_for(size)
        pub = ctx.aeron.add_exclusive_publication(channel, 4242)
        sub = ctx.aeron.add_subscription(channel, 4242)
        pub.await_connected(timeout=10)
        src = np.full(size, 7, np.uint8)
        data = memoryview(src)
        ts_view = src[:8].view(np.int64)
        touch = w.make_touch(size)
        frombuffer = np.frombuffer
        u8 = np.uint8
        per, rounds = _batch(size)
        limit = 64 * max(1, -(-size // 65472))
        count = [0]

        def handler(buffer: object, header: object) -> None:
            touch(frombuffer(buffer, u8))  # type: ignore[call-overload]
            w._i64.unpack_from(buffer, 0)  # type: ignore[arg-type]
            count[0] += 1

        def drain() -> None:
            while sub.poll(handler, limit):
                pass

        def produce() -> tuple[float, int]:
            t = 0.0
            for _ in range(rounds):
                t0 = _cpu()
                for _ in range(per):
                    ts_view[0] = time.monotonic_ns()
                    while pub.offer(data) is not True:
                        pass
                t += _cpu() - t0
                drain()
            return t, rounds * per

        def consume() -> tuple[float, int]:
            t = 0.0
            c0 = count[0]
            for _ in range(rounds):
                for _ in range(per):
                    while pub.offer(data) is not True:
                        pass
                t0 = _cpu()
                drain()
                t += _cpu() - t0
            return t, count[0] - c0

        out["inline_offer"] = _best(produce)
        out["inline_accept"] = _best(consume)
        pub.close()
        sub.close()
    return out


def mpq_costs(size: int) -> dict[str, float]:
    q = get_context("spawn").Queue(maxsize=w.MPQ_DEPTH)
    slots = np.zeros((w.NSLOTS, size), np.uint8)
    slots.fill(1)
    views = list(slots)
    src = np.full(size, 7, np.uint8)
    touch = w.make_touch(size)
    per, rounds = _batch(size)
    out: dict[str, float] = {}
    try:

        def flushed() -> None:
            # Queue.put only appends to a buffer; a feeder thread pickles and writes it to the
            # pipe. Wait for it (private attribute, bench only) so its CPU lands on this side.
            while q._buffer:  # type: ignore[attr-defined]
                time.sleep(0.0001)

        def produce() -> tuple[float, int]:
            t = 0.0
            i = 0
            for _ in range(rounds):
                t0 = _cpu()
                for _ in range(per):
                    ts = time.monotonic_ns()
                    np.copyto(views[i], src)
                    q.put((i, ts))
                    i = (i + 1) & (w.NSLOTS - 1)
                flushed()
                t += _cpu() - t0
                for _ in range(per):
                    q.get()
            return t, rounds * per

        def consume() -> tuple[float, int]:
            t = 0.0
            for _ in range(rounds):
                for k in range(per):
                    q.put((k, 0))
                flushed()
                t0 = _cpu()
                for _ in range(per):
                    k, _ts = q.get()
                    touch(views[k])
                t += _cpu() - t0
            return t, rounds * per

        out["mpq_put"] = _best(produce)
        out["mpq_accept"] = _best(consume)
    finally:
        while True:
            try:
                q.get_nowait()
            except queue_mod.Empty:
                break
        q.close()
        q.join_thread()
    return out


ROWS: Final = (
    ("tensorpool", "tp_offer", "tp_accept"),
    (
        "tensorpool batch path: offer_batch / poll_batch, ≤ 64 frames and ≤ 4 MiB a batch",
        "tp_offer_batch",
        "tp_accept_batch",
    ),
    ("tensorpool claim/commit (8-byte stamp)", "tp_claim_commit", ""),
    ("tensorpool, descriptor dropped (ring lapped)", "", "tp_drop"),
    ("tensorpool batch path, descriptor dropped (ring lapped)", "", "tp_drop_batch"),
    ("(a) pyaeron inline", "inline_offer", "inline_accept"),
    ("(b) shm + mp.Queue", "mpq_put", "mpq_accept"),
)


def cost_table(sizes: list[int], label: Callable[[int], str]) -> str:
    """Markdown table of per-frame CPU µs, producer and consumer side, per size."""
    lines = [
        "| size | transport | producer CPU µs/frame | consumer CPU µs/frame |",
        "| --- | --- | ---: | ---: |",
    ]
    for size in sizes:
        costs = {**tensorpool_costs(size), **inline_costs(size), **mpq_costs(size)}
        for name, prod, cons in ROWS:
            p = costs.get(prod, float("nan")) * 1e6
            c = costs.get(cons, float("nan")) * 1e6
            if p != p and c != c:
                continue
            lines.append(f"| {label(size)} | {name} | {_us(p)} | {_us(c)} |")
    return "\n".join(lines)


def _us(x: float) -> str:
    if x != x:
        return "–"
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def batch_phases(size: int, batches: int = 2000) -> str:
    """Where one ``poll_batch(64)`` + ``confirm()`` spends its CPU time, per phase (markdown).

    Each phase is wrapped at class level with a CPU-time counter (~0.5 µs of overhead per
    wrapped call); the producer writes 64 frames per batch, nobody reads meanwhile.
    """
    from tensorpool.client.consumer_core import ConsumerCore
    from tensorpool.shm.batch import BatchReader
    from tensorpool.transport.subscription import Subscriber

    phases = (
        (BatchReader, "read_run", "seqlock read, `BatchReader.read_run`"),
        (Consumer, "_clean_run", "descriptor check, `_clean_run`"),
        (Subscriber, "poll_with", "Aeron poll + fragment handler recording each descriptor"),
        (BatchReader, "confirm", "final check, `BatchReader.confirm`"),
        (Consumer, "_count_batch", "stats, `_count_batch`"),
        (ConsumerCore, "accept_run", "`ConsumerCore.accept_run`"),
    )
    spent = {label: 0 for _, _, label in phases}
    originals = [(cls, name, getattr(cls, name)) for cls, name, _ in phases]

    def timed(fn: Callable[..., object], label: str) -> Callable[..., object]:
        def wrapper(*args: object, **kw: object) -> object:
            t0 = time.process_time_ns()
            try:
                return fn(*args, **kw)
            finally:
                spent[label] += time.process_time_ns() - t0

        return wrapper

    base = tempfile.mkdtemp(prefix="tp-bench-ipc-phases-", dir="/dev/shm")
    total = 0
    try:
        for cls, name, label in phases:
            setattr(cls, name, timed(getattr(cls, name), label))
        settings = ClientSettings(shm_base_dir=base)
        with AeronContext(TransportConfig()) as ctx:
            p = Producer(ctx, StreamConfig.for_frame_bytes(7, size), settings, prefault=True)
            c = Consumer(ctx, 7, settings)
            deadline = time.monotonic() + 10
            while not c.is_mapped and time.monotonic() < deadline:
                p.do_work()
                c.poll(lambda f: None)
                time.sleep(0.001)
            frames = np.full((BATCH, size), 7, np.uint8)
            for key in spent:
                spent[key] = 0
            for _ in range(batches):
                p.do_work()
                p.offer_batch(frames)
                t0 = time.process_time_ns()
                b = c.poll_batch(BATCH)
                b.confirm()
                total += time.process_time_ns() - t0
            c.close()
            p.close()
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)
        shutil.rmtree(base, ignore_errors=True)
    per = batches * BATCH
    lines = ["| phase | µs per batch | µs per frame |", "| --- | ---: | ---: |"]
    for label, ns in sorted(spent.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {label} | {ns / batches / 1e3:.1f} | {ns / per / 1e3:.2f} |")
    lines.append(
        f"| total `poll_batch` + `confirm` | {total / batches / 1e3:.1f} "
        f"| {total / per / 1e3:.2f} |"
    )
    return "\n".join(lines)


def write_vs_copyto(size: int, frames: int = 16, repeats: int = 7) -> str:
    """The producer's write against ``numpy.copyto`` from the *same* source, one process.

    The two-process rows compare ``offer`` with a ``copyto`` baseline that runs alone; this
    separates the write's own cost from the contention of a 2-vCPU host. Sources: one hot
    frame (what the throughput rows offer), and ``frames`` distinct rows (a camera's burst,
    what ``offer_batch`` gets). Destinations: the prefaulted ring, or 64 rotating numpy rows
    (the ring's footprint), touched once before timing. CPU µs per frame, best of repeats.
    """
    base = tempfile.mkdtemp(prefix="tp-bench-ipc-write-", dir="/dev/shm")
    try:
        settings = ClientSettings(shm_base_dir=base)
        with AeronContext(TransportConfig()) as ctx:
            p = Producer(ctx, StreamConfig.for_frame_bytes(8, size), settings, prefault=True)
            rows = np.full((frames, size), 7, np.uint8)
            hot = np.full(size, 7, np.uint8)
            dst = np.ones((64, size), np.uint8)  # touched: no first-write faults in the timing
            turn = [0]

            def copy_from(src: Callable[[int], np.ndarray]) -> None:
                for k in range(frames):
                    np.copyto(dst[turn[0] % 64], src(k))
                    turn[0] += 1

            cases: list[tuple[str, Callable[[], object]]] = [
                ("`offer`, one hot source", lambda: [p.offer(hot) for _ in range(frames)]),
                ("`copyto`, one hot source", lambda: copy_from(lambda k: hot)),
                (f"`offer`, {frames} distinct rows", lambda: [p.offer(r) for r in rows]),
                (f"`offer_batch({frames})`", lambda: p.offer_batch(rows)),
                (f"`copyto`, {frames} distinct rows", lambda: copy_from(lambda k: rows[k])),
            ]
            out = ["| source / path | CPU µs per frame |", "| --- | ---: |"]
            for name, fn in cases:
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.process_time()
                    fn()
                    best = min(best, (time.process_time() - t0) / frames)
                out.append(f"| {name} | {_us(best * 1e6)} |")
            p.close()
        return "\n".join(out)
    finally:
        shutil.rmtree(base, ignore_errors=True)
