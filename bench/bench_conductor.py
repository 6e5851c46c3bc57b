"""One process, many clients: what the shared client conductor saves (issue #28.1, #28.5).

Run: ``.venv/bin/python -m bench.bench_conductor`` (about 30 s). Prints one markdown table.
Results and the before/after comparison: docs/benchmarks/conductor.md.

Setup: one standalone Aeron media driver process (``MediaDriverProcess``, private directory)
and one measured process with one ``AeronContext`` holding 8 standalone producers (streams
1-8, 4 KiB frames) and 64 consumers (8 per stream). Two phases of ``--seconds`` each:

* **load**: every 1 ms each producer offers one 4 KiB frame (8 streams x 1 kHz) and runs
  ``do_work()``, and every consumer polls;
* **idle**: the same loop without frames (producers announce, consumers poll).

Reported per phase: the CPU time of one round (all 72 clients driven once: the cost that does
not depend on how much CPU a loaded host leaves the process), rounds per second reached (goal
1,000), CPU seconds per second of the measured process (user + system), frames read per second
(all consumers; goal 64,000) and its RSS at the end. And once: the Aeron clients the media
driver serves (client heartbeat counters in ``cnc.dat``), the subscriber images on the control
stream (subscriptions x publishing sessions), the publications, and control messages decoded
per announce: every ``decode_any`` of the client modules (``tensorpool.client.*``) is counted,
divided by the producers' announces over both phases.

``--tree DIR`` runs the measured process on another checkout (for "before": a worktree of the
main branch): the worker uses only the public API (``AeronContext``, ``Producer``,
``Consumer``), which both have; counters are read here, from the driver's ``cnc.dat``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tensorpool.endpoints import DEFAULT_CONTROL_STREAM_ID
from tensorpool.transport.cnc import CLIENT_HEARTBEAT_TYPE, read_counters, subscriber_images
from tensorpool.transport.mediadriver import MediaDriverProcess

PUBLISHER_LIMIT_TYPE = 1  # one per publication (Aeron's counter type id)


# The measured process: public API only, so it runs on any checkout (--tree).
WORKER = r"""
import json, resource, sys, time
import numpy as np
import tensorpool.client.consumer, tensorpool.client.producer
from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

aeron_dir, shm_base, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
decodes = [0]
for name, mod in list(sys.modules.items()):
    f = getattr(mod, "decode_any", None)
    if name.startswith("tensorpool.client") and f is not None:
        def counted(*a, _f=f, **k):
            decodes[0] += 1
            return _f(*a, **k)
        mod.decode_any = counted

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

s = ClientSettings(transport=TransportConfig(aeron_dir=aeron_dir), shm_base_dir=shm_base)
with AeronContext(s.transport) as ctx:
    ctx.start()
    producers = [Producer(ctx, StreamConfig.for_frame_bytes(i, 4096), s) for i in range(1, 9)]
    consumers = [Consumer(ctx, 1 + i % 8, s) for i in range(64)]
    frame = np.zeros(4096, np.uint8)
    read = [0]
    def on_frame(f):
        read[0] += 1
    def step(offer):
        for p in producers:
            if offer:
                p.offer(frame)
            p.do_work()
        for c in consumers:
            c.poll(on_frame)
    deadline = time.monotonic() + 60
    while not all(c.is_mapped for c in consumers):
        assert time.monotonic() < deadline, "consumers did not map"
        step(False)
        time.sleep(0.001)
    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()
    out = {"clients": len(producers) + len(consumers)}
    announces0, decodes0 = sum(p.stats.announces for p in producers), decodes[0]
    for phase, offer in (("load", True), ("idle", False)):
        read[0] = 0
        c0, t0 = cpu(), time.monotonic()
        tick = t0
        rounds = 0
        while time.monotonic() - t0 < seconds:
            step(offer)
            rounds += 1
            tick += 0.001
            delay = tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                tick = time.monotonic()  # behind: no catch-up burst
        wall = time.monotonic() - t0
        used = cpu() - c0
        out[phase] = {
            "frames_per_s": read[0] / wall,
            "rounds_per_s": rounds / wall,
            "cpu_us_per_round": used / rounds * 1e6,
            "cpu_per_s": used / wall,
            "rss_mib": rss_mib(),
        }
    out["announces"] = sum(p.stats.announces for p in producers) - announces0
    out["decodes"] = decodes[0] - decodes0
    print(json.dumps({"event": "done", **out}), flush=True)
    sys.stdin.readline()
    for c in consumers:
        c.close()
    for p in producers:
        p.close()
"""


def run(tree: Path, seconds: float) -> dict[str, object]:
    with MediaDriverProcess() as md, tempfile.TemporaryDirectory(dir="/dev/shm") as shm_base:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, md.dir, shm_base, str(seconds)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            assert json.loads(proc.stdout.readline())["event"] == "ready"
            counters = read_counters(md.dir)
            types = Counter(t for t, _ in counters)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            result = json.loads(proc.stdout.readline())
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result["aeron_clients"] = types[CLIENT_HEARTBEAT_TYPE]
    result["publications"] = types[PUBLISHER_LIMIT_TYPE]
    result["control_images"] = subscriber_images(counters, DEFAULT_CONTROL_STREAM_ID)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--seconds", type=float, default=4.0, help="per phase")
    a = ap.parse_args()
    r = run(a.tree.resolve(), a.seconds)
    load, idle = r["load"], r["idle"]
    per = r["decodes"] / max(1, r["announces"])
    print(f"tree: {a.tree}  ({r['clients']} clients: 8 producers, 64 consumers, 8 streams)\n")
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| Aeron clients registered with the media driver | {r['aeron_clients']} |")
    print(f"| subscriber images on the control stream | {r['control_images']} |")
    print(f"| publications | {r['publications']} |")
    print(f"| control messages decoded per announce | {per:.1f} |")
    for name, ph in (("load", load), ("idle", idle)):
        print(f"| {name}: CPU per round of all 72 clients (us) | {ph['cpu_us_per_round']:,.0f} |")
        print(f"| {name}: rounds/s (goal 1,000) | {ph['rounds_per_s']:,.0f} |")
        print(f"| {name}: CPU s/s | {ph['cpu_per_s']:.2f} |")
    print(f"| load: frames read/s (goal 64,000) | {load['frames_per_s']:,.0f} |")
    print(f"| RSS after both phases (MiB) | {idle['rss_mib']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
