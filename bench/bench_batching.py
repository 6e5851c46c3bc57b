"""Throughput of RateAwareMessageBatcher against appending to a list.

Replays three streams as fast as possible -- a gated 14 Hz detector, a gated 5 Hz
monitor and an ungated ~20 Hz log, with +-2 ms jitter and 1 % dropped pulses --
through ``offer`` (one message per call, batches taken as they close), through
``feed`` (polls of 256 messages), and through the baseline
``list.append((stream_id, timestamp_ns, item))`` in the same loop shape. Reports the
best of several interleaved repetitions: messages/s, ns/message and the ratio to the baseline.
Target: >= 300 000 messages/s on one core.

Run: ``.venv/bin/python -m bench.bench_batching`` (about 15 s).
"""

from __future__ import annotations

import gc
import os
import platform
import random
import sys
import time
from collections.abc import Callable

from tensorpool.batching import Batch, CloseReason, RateAwareMessageBatcher

S = 1_000_000_000
T0 = 1_700_000_000 * S
DET, MON, LOG = "det", "mon", "log"
EVENT_SECONDS = 4_000  # ~155 000 messages per run
REPEATS = 9
POLL = 256
TARGET_MSGS_PER_S = 300_000

Msg = tuple[str, int, int]


def make_traffic(seconds: int, seed: int = 1) -> list[Msg]:
    rng = random.Random(seed)
    msgs: list[Msg] = []
    item = 0
    for sid, rate in ((DET, 14), (MON, 5)):
        for i in range(seconds * rate):
            if rng.random() < 0.01:
                continue
            msgs.append((sid, T0 + (i * S) // rate + rng.randint(-2_000_000, 2_000_000), item))
            item += 1
    for _ in range(seconds * 20):
        msgs.append((LOG, T0 + rng.randrange(seconds * S), item))
        item += 1
    msgs.sort(key=lambda m: m[1])
    return msgs


def run_baseline(msgs: list[Msg]) -> int:
    out: list[Msg] = []
    append = out.append
    t = time.perf_counter_ns()
    for sid, ts, item in msgs:
        append((sid, ts, item))
    return time.perf_counter_ns() - t


def new_batcher() -> RateAwareMessageBatcher[str, int]:
    return RateAwareMessageBatcher(S, gated={DET, MON}, start_ns=T0)


def run_offer(msgs: list[Msg]) -> int:
    """One message per call; the consumer takes batches as soon as they close."""
    b = new_batcher()
    offer = b.offer
    take = b.take
    batches = []
    t = time.perf_counter_ns()
    for sid, ts, item in msgs:
        if offer(sid, ts, item):
            batches += take()
    elapsed = time.perf_counter_ns() - t
    check(batches + b.flush(), msgs)
    return elapsed


def run_feed(msgs: list[Msg]) -> int:
    """Polls of POLL messages, as a transport poll loop would hand them over."""
    b = new_batcher()
    polls = [msgs[i : i + POLL] for i in range(0, len(msgs), POLL)]
    feed = b.feed
    batches = []
    t = time.perf_counter_ns()
    for poll in polls:
        batches += feed(poll)
    elapsed = time.perf_counter_ns() - t
    check(batches + b.flush(), msgs)
    return elapsed


def check(batches: list[Batch[str, int]], msgs: list[Msg]) -> None:
    """The run must be a real one: every message delivered once, nearly all by slot gate."""
    delivered = sorted(item for x in batches for v in x.messages.values() for _, item in v)
    if delivered != list(range(len(msgs))):
        raise SystemExit("batcher lost or duplicated messages")
    gate = sum(x.reason is CloseReason.SLOT_GATE for x in batches)
    if gate < 0.95 * len(batches):
        raise SystemExit(f"only {gate} of {len(batches)} batches closed on the slot gate")


def main() -> int:
    msgs = make_traffic(EVENT_SECONDS)
    n = len(msgs)
    paths: list[tuple[str, Callable[[list[Msg]], int]]] = [
        ("list.append (baseline)", run_baseline),
        ("RateAwareMessageBatcher.offer", run_offer),
        (f"RateAwareMessageBatcher.feed (polls of {POLL})", run_feed),
    ]
    # Interleaved repetitions, best of each: on a shared machine a quiet moment is
    # then equally likely to be caught by every path.
    best = [float("inf")] * len(paths)
    for _ in range(REPEATS):
        for i, (_, fn) in enumerate(paths):
            gc.collect()
            best[i] = min(best[i], fn(msgs))
    rows = [(name, int(ns)) for (name, _), ns in zip(paths, best, strict=True)]
    base = rows[0][1]

    print(f"# bench_batching: {n} messages (14 Hz + 5 Hz gated, ~20 Hz ungated), best of {REPEATS}")
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs\n")
    print("| path | messages/s | ns/message | ratio to list.append |")
    print("| --- | ---: | ---: | ---: |")
    for name, ns in rows:
        print(f"| {name} | {n / ns * 1e9:,.0f} | {ns / n:.0f} | {ns / base:.1f}x |")
    worst = min(n / ns * 1e9 for _, ns in rows[1:])
    verdict = "meets" if worst >= TARGET_MSGS_PER_S else "MISSES"
    print(f"\nslowest batcher path {worst:,.0f} msg/s {verdict} the {TARGET_MSGS_PER_S:,} target")
    return 0 if worst >= TARGET_MSGS_PER_S else 1


if __name__ == "__main__":
    sys.exit(main())
