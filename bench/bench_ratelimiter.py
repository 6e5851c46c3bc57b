"""Rate limiter benchmark (GitHub issue 5): CPU, added latency and rate error at 30 Hz, and
unlimited-mode throughput against a plain consumer, with real processes.

Run: ``.venv/bin/python -m bench.bench_ratelimiter`` (about 60 s; ``--quick`` about 35 s).

Setup, all real: a standalone media driver, the SHM driver daemon (``tensorpool driver``), a
producer process (``tensorpool produce --driver``), the rate limiter process (``tensorpool
ratelimiter``) and, in this process, consumers attached through the driver.

Scenarios:

* **30 Hz, 640 KiB @ 1 kHz**, once per hold mode — ``descriptor`` (keep the source
  descriptor, copy from source SHM when the slot opens) and ``copy`` (copy every offered
  frame into a held buffer). Measured over a window after a warm-up: rate limiter CPU (user +
  system time of its process from ``/proc``, per wall second), the destination's frames per
  second and the rate error against 30 Hz, and latency from the source ``timestamp_ns``
  (taken by the producer at commit) to acceptance by a destination consumer — next to the
  same latency for a plain consumer of the *source* in the same run, so the rate limiter's
  added latency is the difference.
* **unlimited, 64 KiB, producer flat out**: frames/s accepted by a plain consumer of the
  source (the producer/consumer benchmark's consumer, zero copy) against frames/s accepted by
  a consumer of the destination of a ``max_rate_hz = 0`` rate limiter, run one after the other
  on the same producer (the host has 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.idle import BackoffIdleStrategy
from tensorpool.transport.mediadriver import MediaDriverProcess

SRC_640K: Final = 10000
SRC_64K: Final = 10001
DEST_640K: Final = 11000
DEST_64K: Final = 11001
DEST_DESCRIPTORS: Final = 2100
CONTROL: Final = "aeron:ipc?term-length=1m"
TICK: Final = os.sysconf("SC_CLK_TCK")

DRIVER_TOML: Final = """
[driver]
instance_id = "bench-rl"
aeron_dir = "{aeron}"
embedded_media_driver = false
control_channel = "{control}"

[shm]
base_dir = "{base}"
permissions_mode = "600"

[policies]
announce_period_ms = 500
lease_keepalive_interval_ms = 1000
# long grace: the client lease machine does not advance its own expiry estimate (reported)
lease_expiry_grace_intervals = 600
prefault_shm = true

[profiles.big]
header_nslots = 64
payload_pools = [{{ pool_id = 1, stride_bytes = 1048576 }}]

[profiles.big_dest]
header_nslots = 16
payload_pools = [{{ pool_id = 1, stride_bytes = 1048576 }}]

[profiles.medium]
header_nslots = 64
payload_pools = [{{ pool_id = 1, stride_bytes = 65536 }}]

[streams.src640]
stream_id = {src640}
profile = "big"

[streams.src64]
stream_id = {src64}
profile = "medium"

[streams.dst640]
stream_id = {dst640}
profile = "big_dest"

[streams.dst64]
stream_id = {dst64}
profile = "medium"
"""

RL_TOML: Final = """
[rate_limiter]
instance_id = "bench-{name}"
descriptor_channel = "aeron:ipc?term-length=16m"
descriptor_stream_id = {desc}
max_rate_hz = {rate}
hold = "{hold}"

[[mappings]]
source_stream_id = {src}
dest_stream_id = {dst}
profile = "{profile}"

[driver]
aeron_dir = "{aeron}"
control_channel = "{control}"

[shm]
base_dir = "{base}"

[policies]
announce_period_ms = 500
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class Window:
    frames: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)

    def pct_ms(self, q: float) -> float:
        if not self.latencies_ns:
            return float("nan")
        return float(np.percentile(np.asarray(self.latencies_ns, np.float64), q)) / 1e6


class Bench:
    def __init__(self, work: str, aeron_dir: str, verbose: bool) -> None:
        self.work = work
        self.aeron = aeron_dir
        self.base = os.path.join(work, "shm")
        self.verbose = verbose
        self.procs: list[subprocess.Popen[bytes]] = []
        self.driver_config = os.path.join(work, "driver.toml")
        Path(self.driver_config).write_text(
            DRIVER_TOML.format(
                aeron=aeron_dir,
                control=CONTROL,
                base=self.base,
                src640=SRC_640K,
                src64=SRC_64K,
                dst640=DEST_640K,
                dst64=DEST_64K,
            )
        )
        self.contexts: dict[int, AeronContext] = {}

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.work, f"{name}.log"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorpool", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        self.procs.append(proc)
        return proc

    def start_driver(self) -> None:
        self.spawn("driver", "driver", "--config", self.driver_config)
        status = os.path.join(self.base, "default", "driver-status.json")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open(status) as f:
                    if json.load(f).get("state") == "RUNNING":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("driver did not start; see " + self.work)

    def start_producer(self, stream_id: int, shape: str, rate: float) -> subprocess.Popen[bytes]:
        return self.spawn(
            f"producer-{stream_id}",
            "produce",
            "--driver",
            "--stream-id",
            str(stream_id),
            "--shape",
            shape,
            "--dtype",
            "uint8",
            "--rate",
            str(rate),
            "--pattern",
            "stamp",
            "--quiet",
            "--aeron-dir",
            self.aeron,
            "--shm-base-dir",
            self.base,
        )

    def start_ratelimiter(
        self, name: str, src: int, dst: int, profile: str, rate: int, hold: str
    ) -> subprocess.Popen[bytes]:
        path = os.path.join(self.work, f"rl-{name}.toml")
        Path(path).write_text(
            RL_TOML.format(
                name=name,
                desc=DEST_DESCRIPTORS,
                rate=rate,
                hold=hold,
                src=src,
                dst=dst,
                profile=profile,
                aeron=self.aeron,
                control=CONTROL,
                base=self.base,
            )
        )
        return self.spawn(
            f"rl-{name}",
            "ratelimiter",
            "--config",
            path,
            "--report-interval",
            "0",
        )

    def consumer(self, stream_id: int, descriptors: int) -> Consumer:
        """A consumer on its own Aeron client: closing that client closes its subscriptions
        (``Consumer.close`` leaves them open, and an unpolled IPC subscription would hold
        the descriptor stream back for everyone joining later)."""
        ctx = AeronContext(TransportConfig(aeron_dir=self.aeron)).start()
        settings = ClientSettings(
            transport=ctx.config,
            channels=Endpoints(control_channel=CONTROL, descriptor_stream_id=descriptors),
            shm_base_dir=self.base,
            announce_period_ns=500_000_000,
        )
        consumer = Consumer(ctx, stream_id, settings, driver=True)
        self.contexts[id(consumer)] = ctx
        return consumer

    def release(self, consumer: Consumer) -> None:
        consumer.close()
        self.contexts.pop(id(consumer)).close()

    def measure(
        self, consumers: list[Consumer], warmup: float, seconds: float, pid: int | None
    ) -> tuple[list[Window], float, float]:
        """Poll until every consumer has frames, warm up, then measure one window."""
        windows = [Window() for _ in consumers]
        counting = False

        def handler(w: Window) -> Any:
            def on_frame(f: Frame) -> None:
                now = time.monotonic_ns()
                if counting:
                    w.frames += 1
                    w.latencies_ns.append(now - f.timestamp_ns)
                    w.seqs.append(f.seq)

            return on_frame

        handlers = [handler(w) for w in windows]
        idle = BackoffIdleStrategy(max_park_ns=200_000)  # leave CPU to the rate limiter
        deadline = time.monotonic() + 30
        seen = [0] * len(consumers)
        while min(seen) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("no frames; logs in " + self.work)
            for i, c in enumerate(consumers):
                seen[i] += c.poll(lambda f: None)
            time.sleep(0.001)
        t_warm = time.monotonic() + warmup
        while time.monotonic() < t_warm:
            work = sum(c.poll(lambda f: None, 256) for c in consumers)
            idle.idle(work)
        counting = True
        cpu0 = cpu_seconds(pid) if pid else 0.0
        t0 = time.monotonic()
        t_end = t0 + seconds
        while time.monotonic() < t_end:
            work = 0
            for c, h in zip(consumers, handlers, strict=True):
                work += c.poll(h, 256)
            idle.idle(work)
        wall = time.monotonic() - t0
        cpu = (cpu_seconds(pid) - cpu0) / wall if pid else float("nan")
        return windows, wall, cpu

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        for ctx in self.contexts.values():
            ctx.close()
        for proc in reversed(self.procs):
            self.stop(proc)


def per_frame_cost(frames: int, frame_bytes: int = 64 * 1024) -> dict[str, float]:
    """Single thread, CPU time: what one 64 KiB frame costs a plain consumer and the rate
    limiter (unlimited: consume + validate + copy + commit + descriptor).

    One process, an embedded media driver, real SHM and Aeron. The producer offers 16 frames,
    then the path under test runs one duty cycle; only the duty cycles are timed
    (``time.process_time``). Each path gets its own Aeron client, closed before the next
    one starts (an unpolled IPC subscription would hold the descriptor stream back). This is
    the throughput ceiling per core, free of the scheduling noise of busy processes sharing
    two cores.
    """
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.ratelimiter.config import MappingConfig
    from tensorpool.ratelimiter.relay import MappingRelay

    base = tempfile.mkdtemp(prefix="tp-bench-rl-cost-", dir="/dev/shm")
    pools = (PoolConfig(1, frame_bytes),)
    frame = np.zeros(frame_bytes, np.uint8)
    touched = [0]

    def touch(f: Frame) -> None:  # the producer/consumer benchmark's plain consumer
        a = f.array.reshape(-1).view(np.uint8)
        touched[0] += int(a[::4096].sum())
        f.is_current()

    def measure(path: str) -> tuple[float, int]:
        ctx = AeronContext(TransportConfig()).start()
        try:
            src = ClientSettings(transport=ctx.config, shm_base_dir=base)
            dst = ClientSettings(
                transport=ctx.config,
                channels=Endpoints(descriptor_stream_id=2101),
                shm_base_dir=base,
            )
            producer = Producer(
                ctx,
                StreamConfig(1, header_nslots=64, pools=pools),
                src,
                instance_id=f"cost-src-{path}",
            )
            if path == "plain":
                consumer = Consumer(ctx, 1, src)

                def step() -> int:
                    return consumer.poll(touch, 64)

                def mapped() -> bool:
                    return consumer.is_mapped

                close = consumer.close
            else:
                relay = MappingRelay(
                    MappingConfig(1, 2, "p", max_rate_hz=0),
                    Consumer(ctx, 1, src),
                    lambda: Producer(
                        ctx,
                        StreamConfig(2, header_nslots=64, pools=pools),
                        dst,
                        instance_id="cost-dst",
                    ),
                    hold="descriptor",
                    clock=time.monotonic_ns,
                )

                def step() -> int:
                    return relay.do_work(time.monotonic_ns())

                def mapped() -> bool:
                    return relay.consumer.is_mapped

                close = relay.close
            while not mapped():
                producer.do_work()
                step()
                time.sleep(0.002)
            spent = 0.0
            for i in range(frames):
                producer.offer(frame)
                if i % 16 == 15:
                    t0 = time.process_time()
                    step()
                    spent += time.process_time() - t0
            done = consumer.stats.frames if path == "plain" else relay.stats.published
            close()
            producer.close()
        finally:
            ctx.close()
        return spent, done

    try:
        plain_s, plain_n = measure("plain")
        relay_s, relay_n = measure("relay")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "plain_us": plain_s / max(plain_n, 1) * 1e6,
        "relay_us": relay_s / max(relay_n, 1) * 1e6,
        "plain_frames": plain_n,
        "relay_frames": relay_n,
        "frames": frames,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"limited": [], "unlimited": {}}
    window = 5.0 if args.quick else 8.0
    results["cost"] = per_frame_cost(10_000 if args.quick else 30_000)
    with MediaDriverProcess() as md:
        work = tempfile.mkdtemp(prefix="tp-bench-rl-", dir="/dev/shm")
        bench = Bench(work, md.dir, args.verbose)
        try:
            bench.start_driver()
            # --- 30 Hz, 640 KiB at 1 kHz, both hold modes --------------------------------------
            bench.start_producer(SRC_640K, "640,1024", 1000)
            for hold in ("descriptor", "copy"):
                rl = bench.start_ratelimiter(hold, SRC_640K, DEST_640K, "big_dest", 30, hold)
                src = bench.consumer(SRC_640K, 1100)
                dst = bench.consumer(DEST_640K, DEST_DESCRIPTORS)
                (ws, wd), wall, cpu = bench.measure([src, dst], 2.0, window, rl.pid)
                bench.release(src)
                bench.release(dst)
                bench.stop(rl)
                results["limited"].append(
                    {
                        "hold": hold,
                        "seconds": wall,
                        "dest_fps": wd.frames / wall,
                        "rate_error": wd.frames / wall / 30 - 1,
                        "cpu": cpu,
                        "dest_p50_ms": wd.pct_ms(50),
                        "dest_p99_ms": wd.pct_ms(99),
                        "src_p50_ms": ws.pct_ms(50),
                        "src_p99_ms": ws.pct_ms(99),
                        "src_fps": ws.frames / wall,
                        "seq_gaps": bool(wd.seqs) and wd.seqs[-1] - wd.seqs[0] > len(wd.seqs),
                    }
                )
            bench.stop(bench.procs[1])
            # --- unlimited, 64 KiB, flat out -----------------------------------------------------
            bench.start_producer(SRC_64K, "64,1024", 0)
            plain = bench.consumer(SRC_64K, 1100)
            (wp,), wall_p, _ = bench.measure([plain], 1.0, window / 2, None)
            bench.release(plain)
            rl = bench.start_ratelimiter("unlimited", SRC_64K, DEST_64K, "medium", 0, "auto")
            dst = bench.consumer(DEST_64K, DEST_DESCRIPTORS)
            (wd,), wall_d, cpu = bench.measure([dst], 1.0, window / 2, rl.pid)
            bench.release(dst)
            bench.stop(rl)
            results["unlimited"] = {
                "plain_fps": wp.frames / wall_p,
                "via_rl_fps": wd.frames / wall_d,
                "rl_cpu": cpu,
                "plain_p50_ms": wp.pct_ms(50),
                "via_rl_p50_ms": wd.pct_ms(50),
            }
        finally:
            bench.close()
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            else:
                print(f"logs kept in {work}", file=sys.stderr)
    return results


def report(r: dict[str, Any]) -> str:
    lines = [
        "### 30 Hz from a 1 kHz source of 640 KiB frames",
        "",
        "| hold | dest frames/s | rate error | RL CPU (one core) | dest latency p50 / p99 ms "
        "| plain source consumer p50 / p99 ms | added p50 ms | CPU ratio vs descriptor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base_cpu = r["limited"][0]["cpu"] if r["limited"] else float("nan")
    for row in r["limited"]:
        lines.append(
            f"| {row['hold']} | {row['dest_fps']:.2f} | {row['rate_error'] * 100:+.2f} % "
            f"| {row['cpu'] * 100:.1f} % | {row['dest_p50_ms']:.2f} / {row['dest_p99_ms']:.2f} "
            f"| {row['src_p50_ms']:.2f} / {row['src_p99_ms']:.2f} "
            f"| {row['dest_p50_ms'] - row['src_p50_ms']:+.2f} | {row['cpu'] / base_cpu:.2f} |"
        )
    c = r["cost"]
    lines += [
        "",
        "### Unlimited (`max_rate_hz = 0`), 64 KiB frames: CPU per frame, one thread",
        "",
        "| path | µs per frame (producer excluded) | frames/s per core | ratio vs plain consumer |",
        "| --- | ---: | ---: | ---: |",
        f"| plain consumer (zero copy, touches each page, is_current) | {c['plain_us']:.1f} "
        f"| {1e6 / c['plain_us']:,.0f} | 1.00 |",
        f"| rate limiter relay (consume, copy, commit, publish) | {c['relay_us']:.1f} "
        f"| {1e6 / c['relay_us']:,.0f} | {c['plain_us'] / c['relay_us']:.2f} |",
    ]
    u = r["unlimited"]
    lines += [
        "",
        "### Unlimited, 64 KiB frames, producer flat out: four processes on the host's cores",
        "",
        "| path | frames/s accepted | p50 latency ms | RL CPU | ratio vs plain consumer |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| plain consumer of the source (baseline) | {u['plain_fps']:,.0f} "
        f"| {u['plain_p50_ms']:.2f} | - | 1.00 |",
        f"| consumer of the rate limiter's destination | {u['via_rl_fps']:,.0f} "
        f"| {u['via_rl_p50_ms']:.2f} | {u['rl_cpu'] * 100:.0f} % "
        f"| {u['via_rl_fps'] / u['plain_fps']:.2f} |",
    ]
    checks = [
        (
            "RL CPU < 15 % of one core at 30 Hz (descriptor hold)",
            r["limited"][0]["cpu"] < 0.15,
        ),
        ("30 ± 1 frames/s", all(abs(x["dest_fps"] - 30) <= 1 for x in r["limited"])),
        ("destination seqs have gaps (source seqs kept)", all(x["seq_gaps"] for x in r["limited"])),
    ]
    lines += ["", *[f"- [{'x' if ok else ' '}] {text}" for text, ok in checks]]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="5 s windows instead of 10 s")
    p.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    p.add_argument("--json", action="store_true", help="print raw results as JSON too")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    t0 = time.monotonic()
    results = run(args)
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}, {time.monotonic() - t0:.0f} s\n"
    )
    print(report(results))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
