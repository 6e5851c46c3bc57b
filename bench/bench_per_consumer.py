"""Per-consumer descriptor streams (issue #29.1): a 10 Hz consumer of a 1 kHz stream, on the
shared descriptor stream (dropping locally, Wire Spec §11) vs on a stream of its own (the
producer admits 10 Hz, §10.1.3).

Run: ``.venv/bin/python -m bench.bench_per_consumer`` (about 40 s; ``--window 5`` shorter).

All real, all processes: a standalone media driver, a producer (``tensorpool produce --rate
1000``, 4 KiB frames) and a consumer (``tensorpool consume --mode rate-limited --max-rate-hz 10
--json``, default backoff idle strategy). Scenario *shared*: the producer runs as today (it
declines per-consumer streams). Scenario *per-consumer*: the same producer with
``--per-consumer-streams --per-consumer-stream-ids 31000-31009``. After a warm-up (the consumer
reports it is mapped and on the stream the scenario expects), a window of ``--window`` seconds:
descriptors the consumer received and frames it delivered (from its JSON lines), and its CPU
(user + system time from ``/proc/<pid>/stat``) per wall second. Each scenario runs ``--runs``
times; the table shows every run.

The consumer process's CPU is mostly its idle loop (backoff: spin, yield, then 1 ms sleeps),
which at 1 kHz and at 10 Hz costs about the same; so a second table isolates what the
descriptors themselves cost. One thread, an embedded media driver, two standalone producers
(one offering per-consumer streams) and a 10 Hz RATE_LIMITED consumer of each: the producers
publish 1 kHz for ``--window`` seconds, and only the consumers' ``poll`` calls are timed with
``time.thread_time`` (CPU of this thread).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Final

import numpy as np

from tensorpool.client.consumer import MODE_RATE_LIMITED, Consumer
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.config_util import IdRange
from tensorpool.endpoints import DEFAULT_DESCRIPTOR_STREAM_ID, Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

TICK: Final = os.sysconf("SC_CLK_TCK")
STREAM: Final = 7
RANGE: Final = "31000-31009"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _spawn(args: list[str], out: IO[bytes] | int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tensorpool", *args],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.DEVNULL,
    )


def _next_line(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"consumer exited ({proc.poll()})")
        try:
            return json.loads(line)  # type: ignore[no-any-return]
        except ValueError:
            continue
    raise RuntimeError("no report from the consumer in time")


def run_scenario(md: MediaDriverProcess, work: str, per_consumer: bool, window: float) -> dict:
    common = ["--aeron-dir", md.dir, "--shm-base-dir", work, "--stream-id", str(STREAM)]
    extra = ["--per-consumer-streams", "--per-consumer-stream-ids", RANGE] if per_consumer else []
    frames = ["--shape", "4096", "--dtype", "uint8", "--rate", "1000", "--pattern", "ramp"]
    producer = _spawn(["produce", *common, *frames, "--quiet", *extra], subprocess.DEVNULL)
    consumer = _spawn(
        ["consume", *common, "--mode", "rate-limited", "--max-rate-hz", "10", "--json"],
        subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        own = False
        while True:  # warm-up: mapped, on the expected stream, frames flowing
            line = _next_line(consumer, deadline)
            own = not line["descriptor_stream"].endswith(f"#{DEFAULT_DESCRIPTOR_STREAM_ID}")
            if line["mapped"] and line["fps"] > 0 and own == per_consumer:
                break
        _next_line(consumer, deadline)  # one more interval after the switch
        first = _next_line(consumer, deadline)
        c0, t0 = cpu_seconds(consumer.pid), time.monotonic()
        last = first
        while time.monotonic() - t0 < window:
            last = _next_line(consumer, time.monotonic() + 30)
        c1, t1 = cpu_seconds(consumer.pid), time.monotonic()
        span = t1 - t0
        return {
            "scenario": "per-consumer stream" if per_consumer else "shared stream",
            "stream": last["descriptor_stream"],
            "descriptors_s": (last["descriptors"] - first["descriptors"]) / span,
            "frames_s": (last["frames"] - first["frames"]) / span,
            "cpu": (c1 - c0) / span,
        }
    finally:
        stop_process(consumer)
        stop_process(producer)


def poll_cpu(window: float) -> list[dict]:
    """CPU this thread spends in each consumer's ``poll`` while 1 kHz is published."""
    base = tempfile.mkdtemp(prefix="tp-bench-pc1-", dir="/dev/shm")
    rows = []
    try:
        settings = ClientSettings(transport=TransportConfig(), shm_base_dir=base)
        with AeronContext(settings.transport) as ctx:
            ctx.start()
            cfg = StreamConfig.for_frame_bytes
            offering = Producer(
                ctx,
                cfg(8, 4096, header_nslots=1024),
                settings,
                per_consumer=True,
                per_consumer_ids=IdRange(31000, 31009),
            )
            # its own shared descriptor stream: the shared consumer sees only its 1 kHz
            alone = dataclasses.replace(settings, channels=Endpoints(descriptor_stream_id=1101))
            declining = Producer(ctx, cfg(9, 4096, header_nslots=1024), alone)
            own = Consumer(ctx, 8, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10)
            shared = Consumer(ctx, 9, alone, mode=MODE_RATE_LIMITED, max_rate_hz=10)
            consumers = {"shared stream": shared, "per-consumer stream": own}
            frame = np.zeros(4096, np.uint8)
            deadline = time.monotonic() + 30
            while own.descriptor_stream[1] == DEFAULT_DESCRIPTOR_STREAM_ID or not (
                shared.is_mapped and own.is_mapped
            ):
                for p in (offering, declining):
                    p.offer(frame)
                    p.do_work()
                for c in consumers.values():
                    c.poll(lambda f: None)
                time.sleep(0.001)
                if time.monotonic() > deadline:
                    raise RuntimeError("consumers did not settle")
            cpu = dict.fromkeys(consumers, 0.0)
            start = {k: (c.stats.descriptors, c.stats.frames) for k, c in consumers.items()}
            t0 = time.monotonic()
            sent = 0
            while time.monotonic() - t0 < window:
                due = t0 + sent / 1000
                if time.monotonic() < due:
                    time.sleep(max(0.0, due - time.monotonic()))
                for p in (offering, declining):
                    p.offer(frame)
                    p.do_work()
                sent += 1
                for k, c in consumers.items():
                    c0 = time.thread_time()
                    c.poll(lambda f: None)
                    cpu[k] += time.thread_time() - c0
            span = time.monotonic() - t0
            for k, c in consumers.items():
                d0, f0 = start[k]
                rows.append(
                    {
                        "scenario": k,
                        "descriptors_s": (c.stats.descriptors - d0) / span,
                        "frames_s": (c.stats.frames - f0) / span,
                        "cpu": cpu[k] / span,
                        "published_s": sent / span,
                    }
                )
            for c in consumers.values():
                c.close()
            offering.close()
            declining.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=10.0, help="seconds measured per run")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    one_thread = [row for _ in range(a.runs) for row in poll_cpu(a.window)]
    work = tempfile.mkdtemp(prefix="tp-bench-pc-", dir="/dev/shm")
    rows = []
    try:
        with MediaDriverProcess() as md:
            for _ in range(a.runs):
                for per_consumer in (False, True):
                    rows.append(run_scenario(md, work, per_consumer, a.window))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print("\nper-consumer descriptor streams: 10 Hz consumer of a 1 kHz stream of 4 KiB frames")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {load:.1f}")
    print("\n| scenario | descriptor stream | descriptors received/s | frames/s | consumer CPU |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['scenario']} | `{r['stream']}` | {r['descriptors_s']:.1f} | "
            f"{r['frames_s']:.1f} | {100 * r['cpu']:.1f} % |"
        )
    print("\none thread, only the consumers' poll calls timed (time.thread_time):\n")
    print("| scenario | published/s | descriptors received/s | frames/s | poll CPU |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in one_thread:
        print(
            f"| {r['scenario']} | {r['published_s']:.0f} | {r['descriptors_s']:.1f} | "
            f"{r['frames_s']:.1f} | {100 * r['cpu']:.2f} % |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
