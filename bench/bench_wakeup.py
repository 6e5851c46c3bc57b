"""Idle consumer wakeup: backoff vs busy spin vs a posix-ipc named semaphore (issue 14).

Run: ``.venv/bin/python -m bench.bench_wakeup`` (about 5 min on 2 cores; ``--quick`` < 60 s).
Prints one markdown table. Results and analysis: docs/benchmarks/wakeup.md.

Setup: one standalone Aeron media driver process (``MediaDriverProcess``, private directory);
per scenario a fresh producer process and a fresh consumer process (``multiprocessing``
spawn) on a fresh IPC stream. The producer publishes one encoded ``FrameDescriptor`` (the
message every tensorpool frame costs on the descriptor stream) at ``--rates`` Hz, paced by
sleeping, with ``timestamp_ns`` = ``time.monotonic_ns()`` just before the offer; the consumer
polls (``Subscription.poll``, 64 fragments), decodes the descriptor, and records
``monotonic_ns() - timestamp_ns`` (CLOCK_MONOTONIC is system-wide). Rate 0 = no traffic: the
idle cost alone. The consumer's idle strategy is the variable:

* **backoff**: ``BackoffIdleStrategy()`` with its defaults (10 spins, 20 yields, parks of
  1 us doubling to 1 ms): what ``tensorpool consume`` and the relays use by default.
* **backoff_100us**: the same with parks capped at 100 us (``max_park_ns=100_000``): what
  backoff costs when tuned towards the semaphore's latency.
* **busy_spin**: ``BusySpinIdleStrategy`` (never waits).
* **semaphore**: ``SemaphoreIdleStrategy`` (``tensorpool.transport.wakeup``): the consumer
  blocks in ``sem_timedwait`` on its own named semaphore for at most 10 ms; the producer's
  ``WakePoster.post()`` after each offer wakes it.

Reported per (strategy, rate): latency percentiles over every frame of every round (pooled),
and the consumer's CPU (process CPU time / wall time over the measured window; median and
range over rounds). Rounds alternate the strategy order (ABC, CBA, ...) so slow drifts in a
shared host's load hit every strategy alike. The producer's cost of ``post()`` is measured
in-process (CPU time per call) with a blocked and with an awake consumer.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Final

import numpy as np

from tensorpool.transport.config import TransportConfig
from tensorpool.transport.mediadriver import MediaDriverProcess

STRATEGIES: Final = ("backoff", "backoff_100us", "busy_spin", "semaphore")
CHANNEL: Final = "aeron:ipc"
SEM_MAX_WAIT_NS: Final = 10_000_000
_mono = time.monotonic_ns


@dataclass(slots=True)
class Result:
    strategy: str
    rate_hz: int
    frames: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    wakeups: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    error: str = ""
    producer_cpu_s: float = 0.0
    published: int = 0
    post_ns: list[int] = field(default_factory=list)

    @property
    def cpu_pct(self) -> float:
        return 100.0 * self.cpu_s / self.seconds if self.seconds else float("nan")


def _consumer(
    conn: Connection, aeron_dir: str, stream_id: int, strategy: str, namespace: str
) -> None:  # pragma: no cover - child process
    from tensorpool.specs.generated import wire
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.idle import BackoffIdleStrategy, BusySpinIdleStrategy
    from tensorpool.transport.wakeup import SemaphoreIdleStrategy

    res = Result(strategy, 0)
    sem: SemaphoreIdleStrategy | None = None
    ctx = AeronContext(TransportConfig(aeron_dir=aeron_dir)).start()
    try:
        sub = ctx.aeron.add_subscription(CHANNEL, stream_id)
        if strategy == "semaphore":
            sem = SemaphoreIdleStrategy(namespace, stream_id, SEM_MAX_WAIT_NS)
            idle = sem.idle
        elif strategy == "backoff":
            idle = BackoffIdleStrategy().idle
        elif strategy == "backoff_100us":
            idle = BackoffIdleStrategy(max_park_ns=100_000).idle
        else:
            idle = BusySpinIdleStrategy().idle
        deadline = time.monotonic() + 15
        while not sub.is_connected:
            if time.monotonic() > deadline:
                raise TimeoutError("consumer: no publication after 15 s")
            time.sleep(0.001)
        conn.send(("ready",))
        measure_ns, end_ns = conn.recv()
        decode = wire.FrameDescriptorDecoder.decode_tuple
        lat = res.latencies_ns
        mono = _mono

        def handler(buffer: object, header: object) -> None:
            ts = decode(buffer, 0)[4]
            if measure_ns <= ts < end_ns:
                lat.append(mono() - ts)

        poll = sub.poll
        now = mono()
        while now < measure_ns:
            idle(poll(handler, 64))
            now = mono()
        t0, cpu0, w0 = now, time.process_time(), sem.wakeups if sem else 0
        while now < end_ns:
            idle(poll(handler, 64))
            now = mono()
        res.seconds = (now - t0) / 1e9
        res.cpu_s = time.process_time() - cpu0
        res.wakeups = (sem.wakeups if sem else 0) - w0
        # frames published just before end_ns: a short drain
        drain = now + 50_000_000
        while mono() < drain:
            idle(poll(handler, 64))
        res.frames = len(lat)
    except Exception as exc:
        res.error = repr(exc)
    finally:
        if sem is not None:
            sem.close()
        ctx.close()
    conn.send(("done", res))


def _producer(
    conn: Connection, aeron_dir: str, stream_id: int, strategy: str, namespace: str, rate: int
) -> None:  # pragma: no cover - child process
    from tensorpool.specs.generated import wire
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.wakeup import WakePoster

    ctx = AeronContext(TransportConfig(aeron_dir=aeron_dir)).start()
    poster: WakePoster | None = None
    error = ""
    out = Result(strategy, rate)
    try:
        pub = ctx.aeron.add_exclusive_publication(CHANNEL, stream_id)
        pub.await_connected(timeout=15.0)
        if strategy == "semaphore":
            poster = WakePoster(namespace, stream_id)
        conn.send(("ready",))
        _measure_ns, end_ns = conn.recv()
        if poster is not None:
            poster.rescan()  # the consumer made its semaphore before it said ready
        buf = bytearray(wire.FrameDescriptorEncoder.encoded_length())
        encode = wire.FrameDescriptorEncoder.encode
        offer = pub.offer
        post = poster.post if poster is not None else None
        mono = _mono
        perf = time.perf_counter_ns
        post_ns = out.post_ns
        seq = 0
        cpu0 = time.process_time()
        if rate > 0:
            period = 1_000_000_000 // rate
            nxt = mono() + period
            while nxt < end_ns:
                wait = nxt - mono()
                if wait > 0:
                    time.sleep(wait / 1e9)
                encode(
                    buf,
                    0,
                    stream_id=stream_id,
                    epoch=1,
                    seq=seq,
                    header_index=seq & 63,
                    timestamp_ns=mono(),
                    meta_version=0,
                )
                offer(buf)
                if post is not None:
                    t = perf()
                    post()
                    post_ns.append(perf() - t)
                seq += 1
                nxt += period
        else:
            time.sleep(max(0.0, (end_ns - mono()) / 1e9))
        out.producer_cpu_s = time.process_time() - cpu0
        out.published = seq
    except Exception as exc:
        error = repr(exc)
    finally:
        if poster is not None:
            poster.close()
        ctx.close()
    out.error = error
    conn.send(("done", out))


def run_one(
    aeron_dir: str, stream_id: int, strategy: str, rate: int, warmup_s: float, duration_s: float
) -> Result:
    spawn = mp.get_context("spawn")
    namespace = f"bench{os.getpid()}"
    c_parent, c_child = spawn.Pipe()
    p_parent, p_child = spawn.Pipe()
    cons = spawn.Process(
        target=_consumer, args=(c_child, aeron_dir, stream_id, strategy, namespace)
    )
    prod = spawn.Process(
        target=_producer, args=(p_child, aeron_dir, stream_id, strategy, namespace, rate)
    )
    cons.start()
    prod.start()
    try:
        for conn in (c_parent, p_parent):
            if not conn.poll(30):
                raise TimeoutError(f"{strategy}@{rate}: worker not ready after 30 s")
            msg = conn.recv()
            if msg[0] != "ready":
                raise RuntimeError(f"{strategy}@{rate}: {msg}")
        start = _mono() + 100_000_000
        window = (start + int(warmup_s * 1e9), start + int((warmup_s + duration_s) * 1e9))
        c_parent.send(window)
        p_parent.send(window)
        timeout = warmup_s + duration_s + 30
        if not c_parent.poll(timeout) or not p_parent.poll(timeout):
            raise TimeoutError(f"{strategy}@{rate}: no result")
        res: Result = c_parent.recv()[1]
        pres: Result = p_parent.recv()[1]
        res.rate_hz = rate
        res.error = res.error or pres.error
        res.producer_cpu_s = pres.producer_cpu_s
        res.published = pres.published
        res.post_ns = pres.post_ns
        return res
    finally:
        for proc in (prod, cons):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def post_cost_awake_us(n: int = 200_000) -> float:
    """CPU us per ``WakePoster.post()`` with one consumer that is awake (value already 1: one
    ``value`` read, no ``sem_post``), the cost a producer pays per frame while consumers are
    busy. The blocked case (``sem_post`` + ``futex`` wake) is timed in the producer process."""
    from tensorpool.transport.wakeup import SemaphoreIdleStrategy, WakePoster

    ns = f"benchcost{os.getpid()}"
    with SemaphoreIdleStrategy(ns, 1, 1_000_000):
        poster = WakePoster(ns, 1)
        try:
            poster.rescan()
            poster.post()
            t0 = time.process_time()
            for _ in range(n):
                poster.post()
            return (time.process_time() - t0) / n * 1e6
        finally:
            poster.close()


def _pct(lat: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(lat, np.float64), q)) / 1e3 if lat else float("nan")


def _us(v: float) -> str:
    if v != v:
        return "–"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s per scenario")
    ap.add_argument("--rounds", type=int, default=0, help="rounds (default 3, quick 1)")
    ap.add_argument("--duration", type=float, default=0, help="measured s per scenario")
    ap.add_argument("--rates", default="0,100,1000,10000", help="producer rates in Hz (0 = idle)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    duration = args.duration or (2.0 if args.quick else 4.0)
    warmup = 0.3
    rates = [int(r) for r in args.rates.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = set(strategies) - set(STRATEGIES)
    if unknown:
        ap.error(f"unknown strategies {sorted(unknown)}; expected {STRATEGIES}")

    # SIGTERM unwinds through the finally below: the media driver and its directory go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = os.getloadavg()
    base = tempfile.mkdtemp(prefix="tp-bench-wakeup-", dir="/dev/shm")
    driver = MediaDriverProcess(config=TransportConfig(embedded_parent_dir=base))
    results: dict[tuple[str, int], list[Result]] = {}
    stream_id = 4_000
    t_begin = time.monotonic()
    try:
        driver.start()
        for r in range(rounds):
            order = strategies if r % 2 == 0 else strategies[::-1]
            for rate in rates:
                for strategy in order:
                    stream_id += 1
                    res = run_one(driver.dir, stream_id, strategy, rate, warmup, duration)
                    if res.error:
                        raise RuntimeError(f"{strategy}@{rate} Hz: {res.error}")
                    results.setdefault((strategy, rate), []).append(res)
                    print(
                        f"  round {r + 1} {strategy:>9} @ {rate:>5} Hz: {res.frames} frames, "
                        f"p50 {_us(_pct(res.latencies_ns, 50))} us, "
                        f"p99 {_us(_pct(res.latencies_ns, 99))} us, "
                        f"cpu {res.cpu_pct:.1f} %",
                        flush=True,
                    )
        awake = post_cost_awake_us(20_000 if args.quick else 200_000)
    finally:
        driver.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    load_after = os.getloadavg()

    print()
    print(
        f"Host: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
        f"{rounds} round(s) x {duration:.0f} s per scenario, "
        f"{time.monotonic() - t_begin:.0f} s in all."
    )
    print()
    print(
        "| strategy | rate | frames | p50 µs | p99 µs | p99.9 µs | max µs "
        "| consumer CPU % (median, range) | producer CPU µs/frame | semaphore wakeups/s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rate in rates:
        for strategy in strategies:
            rs = results[(strategy, rate)]
            lat = [x for r in rs for x in r.latencies_ns]
            cpus = [r.cpu_pct for r in rs]
            cpu = f"{statistics.median(cpus):.2f} ({min(cpus):.2f}–{max(cpus):.2f})"
            wake = (
                f"{statistics.median(r.wakeups / r.seconds for r in rs):,.0f}"
                if strategy == "semaphore"
                else "–"
            )
            published = sum(r.published for r in rs)
            pcpu = (
                f"{sum(r.producer_cpu_s for r in rs) / published * 1e6:.1f}" if published else "–"
            )
            print(
                f"| {strategy} | {rate} Hz | {len(lat)} | {_us(_pct(lat, 50))} "
                f"| {_us(_pct(lat, 99))} | {_us(_pct(lat, 99.9))} "
                f"| {_us(max(lat) / 1e3 if lat else float('nan'))} | {cpu} | {pcpu} | {wake} |"
            )
    print()
    posts = [
        x for (st, _), rs in results.items() if st == "semaphore" for r in rs for x in r.post_ns
    ]
    if posts:
        print(
            f"`WakePoster.post()` in the producer (one consumer, wall time per call, all rates): "
            f"p50 {_pct(posts, 50) * 1e3:,.0f} ns, p99 {_pct(posts, 99) * 1e3:,.0f} ns "
            f"({len(posts)} calls; a blocked consumer: sem_post + futex wake); "
            f"{awake * 1e3:,.0f} ns CPU when the consumer is awake (value already 1: one read)."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
