"""Throughput of tensorpool.ingest against a bare ``collections.deque`` floor.

Run: ``.venv/bin/python -m bench.bench_ingest`` (``--quick`` for a smoke run).

Every row is the best of ``REPEATS`` runs over ``N`` items on one core. The floor is what a
Python loop can do with no bookkeeping at all: ``append(item)`` for ingest and
``handle(popleft())`` for drain, both with the bound method cached. ``ratio`` is our rate
divided by the floor's rate in the same process (1.0 = as fast as a bare deque).
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from operator import itemgetter
from typing import Any

from tensorpool.ingest import IngressBuffer, IngressScheduler

N = 100_000
REPEATS = 5
LANES4 = ("a", "b", "c", "d")


def _best(fn: Callable[[], float]) -> float:
    """Best (smallest) seconds of REPEATS runs; the GC is paused so it does not add noise."""
    best = float("inf")
    for _ in range(REPEATS):
        gc.collect()
        gc.disable()
        try:
            best = min(best, fn())
        finally:
            gc.enable()
    return best


def _noop(_: Any) -> None:
    return None


def _items(n: int, lanes: int) -> list[Any]:
    if lanes == 1:
        return [(i, "a") for i in range(n)]
    return [(i, LANES4[i % 4]) for i in range(n)]


def _make(mode: str, lanes: int, capacity: int, **kw: Any) -> IngressBuffer:
    keyed = mode != "queue"
    return IngressBuffer(
        f"bench.{mode}",
        mode=mode,
        capacity=capacity,
        key=itemgetter(0) if keyed else None,
        lane=itemgetter(1) if lanes > 1 else None,
        **kw,
    )


# ------------------------------------------------------------------ floors
def floor_ingest(items: list[Any]) -> float:
    q: deque[Any] = deque()
    append = q.append
    t = time.perf_counter()
    for x in items:
        append(x)
    return time.perf_counter() - t


def floor_drain(items: list[Any]) -> float:
    q: deque[Any] = deque(items)
    popleft = q.popleft
    handle = _noop
    t = time.perf_counter()
    for _ in range(len(q)):
        handle(popleft())
    return time.perf_counter() - t


# ------------------------------------------------------------------ ours
def ours_ingest(mode: str, lanes: int, items: list[Any], capacity: int, **kw: Any) -> float:
    buf = _make(mode, lanes, capacity, **kw)
    ingest = buf.ingest
    t = time.perf_counter()
    for x in items:
        ingest(x)
    return time.perf_counter() - t


def ours_ingest_many(mode: str, lanes: int, items: list[Any], capacity: int, **kw: Any) -> float:
    buf = _make(mode, lanes, capacity, **kw)
    t = time.perf_counter()
    buf.ingest_many(items)
    return time.perf_counter() - t


def ours_reingest(mode: str, lanes: int, items: list[Any], keys: int, **kw: Any) -> float:
    """Hot keys: ``keys`` distinct keys cycled, so nearly every ingest dedupes/replaces."""
    buf = _make(mode, lanes, keys, **kw)
    hot = [(x[0] % keys, x[1]) for x in items]
    ingest = buf.ingest
    t = time.perf_counter()
    for x in hot:
        ingest(x)
    return time.perf_counter() - t


def ours_drain(mode: str, lanes: int, items: list[Any], **kw: Any) -> float:
    buf = _make(mode, lanes, len(items), **kw)
    buf.ingest_many(items)
    t = time.perf_counter()
    st = buf.drain(len(items), _noop)
    dt = time.perf_counter() - t
    assert st.processed == len(items), st
    return dt


def ours_drain_timed(mode: str, lanes: int, items: list[Any]) -> float:
    buf = _make(mode, lanes, len(items))
    buf.ingest_many(items)
    clock = time.monotonic

    def now_ms() -> float:
        return clock() * 1000.0

    t = time.perf_counter()
    st = buf.drain(len(items), _noop, max_millis=1e9, now_millis=now_ms)
    dt = time.perf_counter() - t
    assert st.processed == len(items), st
    return dt


def ours_drain_ticks(mode: str, lanes: int, items: list[Any], per_tick: int) -> float:
    """Many small drains (``per_tick`` items each): per-call bookkeeping dominates."""
    buf = _make(mode, lanes, len(items))
    buf.ingest_many(items)
    drain = buf.drain
    calls = len(items) // per_tick
    t = time.perf_counter()
    for _ in range(calls):
        drain(per_tick, _noop)
    return time.perf_counter() - t


def ours_scheduler(items: list[Any], per_tick: int) -> float:
    """Four single-lane queue buffers at two priorities under one tick budget."""
    sched = IngressScheduler("bench", max_items_per_tick=per_tick)
    bufs = []
    for i in range(4):
        b = IngressBuffer(f"b{i}", mode="queue", capacity=len(items))
        b.ingest_many(items[i::4])
        sched.add_buffer(b, priority=1 + i // 2, handle=_noop)
        bufs.append(b)
    ticks = len(items) // per_tick
    t = time.perf_counter()
    for _ in range(ticks):
        sched.drain_tick()
    return time.perf_counter() - t


def time_call(fn: Callable[[], object], reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


# ------------------------------------------------------------------ report
def main(argv: list[str] | None = None) -> int:
    global N, REPEATS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10k items, 1 repeat (smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        N, REPEATS = 10_000, 1
    rows: list[tuple[str, str, int, float, float]] = []  # op, config, lanes, rate, floor rate

    f_ing = {ln: N / _best(partial(floor_ingest, _items(N, ln))) for ln in (1, 4)}
    f_drn = {ln: N / _best(partial(floor_drain, _items(N, ln))) for ln in (1, 4)}

    def add(
        op: str, cfg: str, lanes: int, run: Callable[[], float], floor: dict[int, float], n: int = 0
    ) -> None:
        rows.append((op, cfg, lanes, (n or N) / _best(run), floor[lanes]))

    for lanes in (1, 4):
        items = _items(N, lanes)
        for mode in ("queue", "dedup_set", "latest_by_key"):
            add("ingest", mode, lanes, partial(ours_ingest, mode, lanes, items, N), f_ing)
        for mode in ("dedup_set", "latest_by_key"):
            run = partial(ours_ingest, mode, lanes, items, N, ordering="fifo")
            add("ingest", f"{mode} fifo", lanes, run, f_ing)
        add(
            "ingest_many",
            "queue",
            lanes,
            partial(ours_ingest_many, "queue", lanes, items, N),
            f_ing,
        )
        run = partial(ours_ingest, "queue", lanes, items, N // 10)
        add("ingest", "queue full, drop_oldest", lanes, run, f_ing)
        for mode in ("dedup_set", "latest_by_key"):
            run = partial(ours_ingest, mode, lanes, items, N // 10)
            add("ingest", f"{mode} full, evict_lru", lanes, run, f_ing)
            run = partial(ours_reingest, mode, lanes, items, 1000)
            add("ingest", f"{mode} hot keys (1000)", lanes, run, f_ing)
        for mode in ("queue", "dedup_set", "latest_by_key"):
            add("drain", mode, lanes, partial(ours_drain, mode, lanes, items), f_drn)
        run = partial(ours_drain, "dedup_set", lanes, items, ordering="fifo")
        add("drain", "dedup_set fifo", lanes, run, f_drn)
        run = partial(ours_drain_timed, "queue", lanes, items)
        add("drain", "queue, max_millis + clock", lanes, run, f_drn)
        run = partial(ours_drain_ticks, "queue", lanes, items, 100)
        add("drain", "queue, 100 items/call", lanes, run, f_drn)
        run = partial(ours_drain_ticks, "queue", lanes, items[: N // 10], 1)
        add("drain", "queue, 1 item/call", lanes, run, f_drn, n=N // 10)
    add(
        "drain_tick",
        "scheduler, 4 buffers, 100/tick",
        1,
        partial(ours_scheduler, _items(N, 1), 100),
        f_drn,
    )

    print(f"# tensorpool.ingest throughput (N={N:,}, best of {REPEATS})\n")
    print(f"Python {sys.version.split()[0]} on {platform.machine()} ({platform.system()})\n")
    print("| operation | configuration | lanes | items/s | deque floor items/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for op, cfg, lanes, rate, floor in rows:
        print(f"| {op} | {cfg} | {lanes} | {rate:,.0f} | {floor:,.0f} | {rate / floor:.2f} |")

    # Metrics bookkeeping: what the pull side and the per-drain sampling cost.
    print("\n| metrics bookkeeping | lanes | cost per call |")
    print("| --- | ---: | ---: |")
    for lanes in (1, 4):
        buf = _make("latest_by_key", lanes, N)
        buf.ingest_many(_items(1000, lanes))
        buf.drain(10, _noop)
        m = time_call(buf.metrics, 2000)
        r = time_call(buf.metrics_reset, 2000)
        empty = _make("queue", lanes, N)
        if lanes > 1:
            empty.ingest_many(_items(4, lanes))
            empty.drain(4, _noop)
        d0 = time_call(lambda b=empty: b.drain(0, _noop), 20000)
        print(f"| `metrics()` snapshot | {lanes} | {m * 1e6:.2f} µs |")
        print(f"| `metrics_reset()` | {lanes} | {r * 1e6:.2f} µs |")
        print(f"| `drain(0)` (stats, deltas, means, EMA; no items) | {lanes} | {d0 * 1e6:.2f} µs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
