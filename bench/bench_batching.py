"""Throughput of RateAwareMessageBatcher against appending to a list.

Replays three streams as fast as possible -- a gated 14 Hz detector, a gated 5 Hz
monitor and an ungated ~20 Hz log, with +-2 ms jitter and 1 % dropped pulses --
through ``offer`` (one message per call) and ``feed`` (polls of 256 messages), and
through the baseline: ``list.append((stream_id, timestamp_ns, item))`` in the same
loop shape. Reports the best of several repetitions, messages/s, ns/message and the
ratio to the baseline. Target: >= 300 000 messages/s on one core.

Run: ``.venv/bin/python -m bench.bench_batching`` (about 20 s).
"""

from __future__ import annotations

import gc
import os
import platform
import random
import sys
import time
from collections.abc import Callable

from tensorpool.batching import RateAwareMessageBatcher

S = 1_000_000_000
T0 = 1_700_000_000 * S
DET, MON, LOG = "det", "mon", "log"
EVENT_SECONDS = 12_000  # ~470 000 messages
REPEATS = 5
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
    b = new_batcher()
    offer = b.offer
    t = time.perf_counter_ns()
    for sid, ts, item in msgs:
        offer(sid, ts, item)
    elapsed = time.perf_counter_ns() - t
    check(b, msgs)
    return elapsed


def run_feed(msgs: list[Msg]) -> int:
    b = new_batcher()
    polls = [msgs[i : i + POLL] for i in range(0, len(msgs), POLL)]
    closed = 0
    t = time.perf_counter_ns()
    for poll in polls:
        closed += len(b.feed(poll))
    elapsed = time.perf_counter_ns() - t
    check(b, msgs, closed)
    return elapsed


def check(b: RateAwareMessageBatcher[str, int], msgs: list[Msg], taken: int = 0) -> None:
    """The run must be a real one: every message delivered exactly once, mostly by slot gate."""
    batches = b.take() + b.flush()
    n = sum(x.message_count for x in batches)
    if taken == 0 and n != len(msgs):
        raise SystemExit(f"batcher lost or duplicated messages: {n} != {len(msgs)}")
    gate = sum(x.reason == "slot_gate" for x in batches)
    if taken == 0 and gate < 0.95 * len(batches):
        raise SystemExit(f"only {gate} of {len(batches)} batches closed on the slot gate")


def best(fn: Callable[[list[Msg]], int], msgs: list[Msg]) -> int:
    times = []
    for _ in range(REPEATS):
        gc.collect()
        times.append(fn(msgs))
    return min(times)


def main() -> int:
    msgs = make_traffic(EVENT_SECONDS)
    n = len(msgs)
    base = best(run_baseline, msgs)
    rows = [("list.append (baseline)", base)]
    rows.append(("RateAwareMessageBatcher.offer", best(run_offer, msgs)))
    rows.append((f"RateAwareMessageBatcher.feed (polls of {POLL})", best(run_feed, msgs)))

    print(f"# bench_batching: {n} messages (14 Hz + 5 Hz gated, ~20 Hz ungated), best of {REPEATS}")
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs\n")
    print("| path | messages/s | ns/message | ratio to list.append |")
    print("| --- | ---: | ---: | ---: |")
    for name, ns in rows:
        print(f"| {name} | {n / ns * 1e9:,.0f} | {ns / n:.0f} | {ns / base:.1f}x |")
    worst = min(n / ns * 1e9 for _, ns in rows[1:])
    verdict = "meets" if worst >= TARGET_MSGS_PER_S else "MISSES"
    print(f"\nslowest batcher path {worst:,.0f} msg/s {verdict} the {TARGET_MSGS_PER_S:,} msg/s target")
    return 0 if worst >= TARGET_MSGS_PER_S else 1


if __name__ == "__main__":
    sys.exit(main())
