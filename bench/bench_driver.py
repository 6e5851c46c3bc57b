"""SHM driver daemon: attach latency and idle CPU, against an Aeron echo agent (GitHub issue 4).

Run: ``.venv/bin/python -m bench.bench_driver`` (about 30 s on 2 cores). Prints one markdown
table; ``--json`` adds the raw numbers.

Setup: one standalone Aeron media driver process; the real daemon
(``python -m tensorpool driver --config ... --log-level warning``) with 10 streams joins it;
the bench process plays every client with raw schema-901 messages on the control stream
(distinct clientIds stand for distinct client processes).

Baseline, run in the same session: an **echo agent** process — the same ``AgentRunner``, the
same backoff idle strategy (``tensorpool.driver.daemon.default_idle_strategy``) and the same
Aeron IPC hops, but its only work is to copy each request back on a second stream. Its round
trip is the floor for "a Python agent behind Aeron IPC"; the ratio column is driver / echo.

Measured:

* **attach latency**: client send → correlated ``ShmAttachResponse`` received, for 1, 10 and 100
  concurrent clients (N requests sent back to back, then all N answers awaited; fresh clientIds
  every round, leases detached between rounds). Consumer attaches to a stream whose epoch is
  ready; one row of producer attach/detach cycles, where every attach creates an epoch's files.
* **idle CPU**: utime+stime of the daemon process from ``/proc/<pid>/stat`` over ``--idle-s``
  seconds with 10 streams and 20 leases (a producer and a consumer per stream, keepalives every
  second from the bench process, announces every second) — once joined to the external media
  driver and once hosting its own (embedded) media driver, whose threads then count too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyaeron

from tensorpool.specs import peek_header
from tensorpool.specs.generated import driver as drv
from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.publication import Publisher
from tensorpool.transport.subscription import Subscriber

CHANNEL = "aeron:ipc?term-length=4m"
CONTROL = 1000
ECHO_IN, ECHO_OUT = 2000, 2001
STREAMS = range(10000, 10010)
CLK_TCK = os.sysconf("SC_CLK_TCK")
_CORR = struct.Struct("<q")


# --------------------------------------------------------------------------- echo baseline


def echo_main(aeron_dir: str, max_park_ns: int) -> None:
    """The baseline agent: copy each message from ECHO_IN to ECHO_OUT."""
    from tensorpool.driver.daemon import default_idle_strategy
    from tensorpool.transport.agent import AgentRunner

    aeron = pyaeron.Aeron(context=pyaeron.Context(dir=aeron_dir, error_handler=lambda *a: None))
    pub = Publisher(aeron.add_exclusive_publication(CHANNEL, ECHO_OUT))

    def handler(buffer: Any, _header: Any) -> None:
        pub.offer(bytes(buffer))

    sub = Subscriber(aeron, CHANNEL, ECHO_IN, handler, fragment_limit=64)

    class Echo:
        role_name = "echo"

        def on_start(self) -> None:
            pass

        def do_work(self) -> int:
            time.monotonic_ns()  # the driver reads its clock every cycle too
            return sub.poll()

        def on_close(self) -> None:
            pass

    runner = AgentRunner(Echo(), default_idle_strategy(max_park_ns))
    signal.signal(signal.SIGTERM, lambda *_: runner.request_stop())
    print("ready", flush=True)
    runner.run()
    sub.close()
    pub.close()
    aeron.close()


# --------------------------------------------------------------------------- client side


class Client:
    """Raw control-plane client with per-correlation receive timestamps."""

    def __init__(self, aeron_dir: str, out_stream: int, in_stream: int) -> None:
        self.aeron = pyaeron.Aeron(
            context=pyaeron.Context(dir=aeron_dir, error_handler=lambda *a: None)
        )
        self.pub = Publisher(self.aeron.add_exclusive_publication(CHANNEL, out_stream))
        self.sub = Subscriber(self.aeron, CHANNEL, in_stream, self._on, fragment_limit=256)
        self.received: dict[int, tuple[int, int, Any]] = {}  # corr -> (t_ns, code, lease)
        self._buf = bytearray(256)
        self._corr = 1 << 40
        self.echo = in_stream != CONTROL

    def _on(self, buffer: Any, _header: Any) -> None:
        t = time.monotonic_ns()
        _, template, schema, _ = peek_header(buffer)
        if self.echo:
            (corr,) = _CORR.unpack_from(buffer, 8)
            self.received[corr] = (t, 0, None)
        elif schema == drv.SCHEMA_ID and template == drv.ShmAttachResponseDecoder.TEMPLATE_ID:
            d = drv.ShmAttachResponseDecoder().wrap(buffer)
            self.received[d.correlation_id] = (t, d.code_raw, d.lease_id)
        elif schema == drv.SCHEMA_ID and template == drv.ShmDetachResponseDecoder.TEMPLATE_ID:
            d2 = drv.ShmDetachResponseDecoder().wrap(buffer)
            self.received[d2.correlation_id] = (t, d2.code_raw, None)

    def wait_connected(self) -> None:
        deadline = time.monotonic() + 10
        while not self.pub.is_connected or self.sub.image_count < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("not connected")
            time.sleep(0.01)

    def send(self, n: int) -> None:
        while not self.pub.offer(self._buf, 0, n):
            self.sub.poll()

    def attach(self, stream: int, client_id: int, role: int) -> int:
        self._corr += 1
        n = drv.ShmAttachRequestEncoder.encode(
            self._buf,
            0,
            correlation_id=self._corr,
            stream_id=stream,
            client_id=client_id,
            role=role,
            expected_layout_version=0,
            max_dims=0,
            publish_mode=1,
            require_hugepages=0,
        )
        self.send(n)
        return self._corr

    def detach(self, lease: int, stream: int, client_id: int, role: int) -> int:
        self._corr += 1
        n = drv.ShmDetachRequestEncoder.encode(
            self._buf,
            0,
            correlation_id=self._corr,
            lease_id=lease,
            stream_id=stream,
            client_id=client_id,
            role=role,
        )
        self.send(n)
        return self._corr

    def keepalive(self, lease: int, stream: int, client_id: int, role: int) -> None:
        n = drv.ShmLeaseKeepaliveEncoder.encode(
            self._buf,
            0,
            lease_id=lease,
            stream_id=stream,
            client_id=client_id,
            role=role,
            client_timestamp_ns=time.monotonic_ns(),
        )
        self.send(n)

    def wait(self, corrs: list[int], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        received = self.received
        while any(c not in received for c in corrs):
            if not self.sub.poll() and time.monotonic() > deadline:  # busy-poll: no added delay
                raise RuntimeError(f"{sum(c not in received for c in corrs)} answers missing")

    def close(self) -> None:
        self.sub.close()
        self.pub.close()
        self.aeron.close()


def _pct(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0


def attach_latency(c: Client, concurrency: int, samples: int, next_client: list[int]) -> list[int]:
    """Consumers on stream 10000: N requests back to back, all answers, detach, repeat."""
    out: list[int] = []
    role = int(drv.Role.CONSUMER)
    while len(out) < samples:
        ids = list(range(next_client[0], next_client[0] + concurrency))
        next_client[0] += concurrency
        sent: list[tuple[int, int, int]] = []
        for cid in ids:
            t = time.monotonic_ns()
            sent.append((c.attach(10000, cid, role), t, cid))
        c.wait([corr for corr, _, _ in sent])
        for corr, t, _ in sent:
            out.append(c.received[corr][0] - t)
            assert c.echo or c.received[corr][1] == 0, "attach refused"
        # The echo gets the same detach round trip, so both see the same request pattern.
        detaches = [c.detach(c.received[corr][2] or 0, 10000, cid, role) for corr, _, cid in sent]
        c.wait(detaches)
    return out


def producer_cycle_latency(c: Client, samples: int, next_client: list[int]) -> list[int]:
    """Producer attach (new epoch, files created) then detach, one at a time on stream 10001."""
    out: list[int] = []
    role = int(drv.Role.PRODUCER)
    for _ in range(samples):
        cid = next_client[0]
        next_client[0] += 1
        t = time.monotonic_ns()
        corr = c.attach(10001, cid, role)
        c.wait([corr])
        out.append(c.received[corr][0] - t)
        assert c.echo or c.received[corr][1] == 0, "producer attach refused"
        c.wait([c.detach(c.received[corr][2] or 0, 10001, cid, role)])
    return out


# --------------------------------------------------------------------------- service time


def service_time(requests: int) -> tuple[float, float]:
    """Busy service time per request, in process: (driver agent, echo agent) microseconds.

    A real ``DriverAgent`` (real core, files, embedded Aeron media driver) and an echo agent
    each get ``requests`` consumer attach requests queued on their input stream, then run
    ``do_work`` until all are answered; no idling, no scheduling, no client in the loop.
    """
    from tensorpool.driver.agent import DriverAgent
    from tensorpool.driver.config import parse_driver_config
    from tensorpool.driver.core import DriverCore
    from tensorpool.driver.regions import RegionFiles
    from tensorpool.transport.config import TransportConfig
    from tensorpool.transport.context import AeronContext

    base = tempfile.mkdtemp(prefix="tp-bench-driver-svc-", dir="/dev/shm")
    try:
        with AeronContext(TransportConfig()) as ctx:
            cfg = parse_driver_config(
                {
                    "driver": {"control_channel": CHANNEL},
                    "shm": {"base_dir": base},
                    "profiles": {
                        "small": {
                            "header_nslots": 64,
                            "payload_pools": [{"pool_id": 1, "stride_bytes": 65536}],
                        }
                    },
                    "streams": {"s": {"stream_id": 10000, "profile": "small"}},
                },
                env={},
            )
            core = DriverCore(cfg, now_ns=time.monotonic_ns())
            agent = DriverAgent(cfg, ctx, core, RegionFiles(cfg))
            agent.on_start()
            pub = ctx.add_publication(CHANNEL, CONTROL)
            echo_in = ctx.add_publication(CHANNEL, ECHO_IN)
            echo_out = ctx.add_publication(CHANNEL, ECHO_OUT)
            echoed = [0]

            def echo(buffer: Any, _header: Any) -> None:
                echo_out.offer(bytes(buffer))
                echoed[0] += 1

            echo_sub = ctx.add_subscription(CHANNEL, ECHO_IN, echo, fragment_limit=64)
            # The echo's output must really be appended (a subscriber exists) like the driver's.
            ctx.add_subscription(CHANNEL, ECHO_OUT, lambda *_: None)
            for p in (pub, echo_in, echo_out):
                p.await_connected(5)
            buf = bytearray(64)
            msgs = []
            for i in range(requests + 1):
                n = drv.ShmAttachRequestEncoder.encode(
                    buf,
                    0,
                    correlation_id=i,
                    stream_id=10000,
                    client_id=i + 1,
                    role=int(drv.Role.CONSUMER),
                    expected_layout_version=0,
                    max_dims=0,
                    publish_mode=1,
                    require_hugepages=0,
                )
                msgs.append(bytes(buf[:n]))
            pub.offer(msgs[0])  # first attach creates the epoch's files: not timed
            while core.counters["attach_ok"] < 1:
                agent.do_work()
            for m in msgs[1:]:
                while not pub.offer(m):
                    agent.do_work()
            t0 = time.perf_counter()
            while core.counters["attach_ok"] < requests + 1:
                agent.do_work()
            driver_us = (time.perf_counter() - t0) / requests * 1e6
            for m in msgs[1:]:
                while not echo_in.offer(m):
                    echo_sub.poll()
            t0 = time.perf_counter()
            while echoed[0] < requests:
                time.monotonic_ns()
                echo_sub.poll()
            echo_us = (time.perf_counter() - t0) / requests * 1e6
            agent.on_close()
            agent.files.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return driver_us, echo_us


# --------------------------------------------------------------------------- CPU


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def idle_cpu(c: Client, pid: int, seconds: float, others: dict[str, int]) -> dict[str, float]:
    """Hold 20 leases (producer + consumer per stream) with 1 s keepalives; CPU % per pid."""
    leases: list[tuple[int, int, int, int]] = []
    for i, stream in enumerate(STREAMS):
        for role, cid in (
            (int(drv.Role.PRODUCER), 50_000 + i),
            (int(drv.Role.CONSUMER), 60_000 + i),
        ):
            corr = c.attach(stream, cid, role)
            c.wait([corr])
            _, code, lease = c.received[corr]
            assert code == 0, f"attach refused on {stream}"
            leases.append((lease, stream, cid, role))
    time.sleep(1.0)  # settle (file creation, first announces)
    pids = {"driver": pid, **others}
    start = {name: cpu_ticks(p) for name, p in pids.items()}
    t0 = time.monotonic()
    next_ka = 0.0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() >= next_ka:
            for lease in leases:
                c.keepalive(*lease)
            next_ka = time.monotonic() + 1.0
        c.sub.poll()
        time.sleep(0.05)
    wall = time.monotonic() - t0
    cpu = {name: 100.0 * (cpu_ticks(p) - start[name]) / CLK_TCK / wall for name, p in pids.items()}
    c.wait([c.detach(*lease) for lease in leases])  # free the streams for the next phase
    return cpu


# --------------------------------------------------------------------------- orchestration


def _config(base: str, aeron_dir: str, embedded: bool) -> str:
    streams = "\n".join(
        f'[streams.s{sid}]\nstream_id = {sid}\nprofile = "small"\n' for sid in STREAMS
    )
    return f"""
[driver]
instance_id = "bench"
aeron_dir = "{aeron_dir}"
embedded_media_driver = {"true" if embedded else "false"}
control_channel = "{CHANNEL}"

[shm]
base_dir = "{base}"

[policies]
announce_period_ms = 1000
lease_keepalive_interval_ms = 1000
lease_expiry_grace_intervals = 3
shutdown_timeout_ms = 0

[profiles.small]
header_nslots = 64
payload_pools = [{{ pool_id = 1, stride_bytes = 65536 }}]

{streams}
"""


def _start_daemon(
    work: str, name: str, aeron_dir: str, embedded: bool, max_park_us: int
) -> subprocess.Popen[bytes]:
    base = os.path.join(work, f"shm-{name}")
    cfg = os.path.join(work, f"{name}.toml")
    Path(cfg).write_text(_config(base, aeron_dir, embedded))
    log = open(os.path.join(work, f"{name}.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorpool",
            "driver",
            "--config",
            cfg,
            "--log-level",
            "warning",
            "--idle-max-park-us",
            str(max_park_us),
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    status = os.path.join(base, "default", "driver-status.json")
    deadline = time.monotonic() + 30
    while True:
        try:
            doc = json.loads(Path(status).read_text())
            if doc.get("pid") == proc.pid and doc.get("state") == "RUNNING":
                return proc
        except (OSError, ValueError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"driver {name} did not start:\n" + Path(log.name).read_text())
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--idle-s", type=float, default=5.0, help="idle CPU window per setup")
    p.add_argument("--max-park-us", type=int, default=10000, help="idle strategy max park")
    p.add_argument("--json", action="store_true")
    p.add_argument("--echo", metavar="AERON_DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.echo:
        echo_main(args.echo, args.max_park_us * 1000)
        return 0

    work = tempfile.mkdtemp(prefix="tp-bench-driver-", dir="/dev/shm")
    results: dict[str, Any] = {}
    results["service_us"] = service_time(5000)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with MediaDriverProcess() as md:
            driver = _start_daemon(work, "external", md.dir, False, args.max_park_us)
            procs.append(driver)
            echo = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.bench_driver",
                    "--echo",
                    md.dir,
                    "--max-park-us",
                    str(args.max_park_us),
                ],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            procs.append(echo)
            assert echo.stdout is not None and echo.stdout.readline().strip() == b"ready"
            dc = Client(md.dir, CONTROL, CONTROL)
            ec = Client(md.dir, ECHO_IN, ECHO_OUT)
            dc.wait_connected()
            ec.wait_connected()
            # Idle first, on a fresh daemon: later phases leave epochs for the GC to delete.
            results["idle_external"] = idle_cpu(
                dc, driver.pid, args.idle_s, {"echo": echo.pid, "media_driver": md.pid or 0}
            )
            ids = [100_000]
            attach_latency(dc, 1, 20, ids)  # warm-up
            attach_latency(ec, 1, 20, ids)
            # Driver and echo rounds alternate, so both see the same host load.
            plan = [(1, 500), (10, 500), (100, 1000)]
            for n, samples in plan:
                d_out: list[int] = []
                e_out: list[int] = []
                while len(d_out) < samples:
                    d_out += attach_latency(dc, n, n, ids)
                    e_out += attach_latency(ec, n, n, ids)
                results[f"attach_c{n}"], results[f"echo_c{n}"] = d_out, e_out
            results["producer_cycle"], results["echo_producer"] = [], []
            for _ in range(100):
                results["producer_cycle"] += producer_cycle_latency(dc, 1, ids)
                results["echo_producer"] += producer_cycle_latency(ec, 1, ids)
            dc.close()
            ec.close()
            _stop(driver)
            _stop(echo)

            emb_dir = os.path.join(work, "aeron-embedded")
            emb = _start_daemon(work, "embedded", emb_dir, True, args.max_park_us)
            procs.append(emb)
            ecl = Client(emb_dir, CONTROL, CONTROL)
            ecl.wait_connected()
            results["idle_embedded"] = idle_cpu(ecl, emb.pid, args.idle_s, {})
            ecl.close()
            _stop(emb)
    finally:
        for proc in procs:
            _stop(proc)
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    for n, _ in [(1, 0), (10, 0), (100, 0)]:
        d, e = results[f"attach_c{n}"], results[f"echo_c{n}"]
        rows.append((f"consumer attach, {n} concurrent", d, e))
    rows.append(
        (
            "producer attach (new epoch + files), 1",
            results["producer_cycle"],
            results["echo_producer"],
        )
    )
    print(
        f"host: {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
        f"idle max park {args.max_park_us} us\n"
    )
    print("| measurement | driver p50 | driver p99 | echo p50 | echo p99 | p50 ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, d, e in rows:
        print(
            f"| {label} (n={len(d)}) | {_pct(d, 0.5):.0f} us | {_pct(d, 0.99):.0f} us | "
            f"{_pct(e, 0.5):.0f} us | {_pct(e, 0.99):.0f} us | "
            f"{_pct(d, 0.5) / max(_pct(e, 0.5), 1e-9):.1f}x |"
        )
    svc_driver, svc_echo = results["service_us"]
    print()
    print("| busy service time per attach (in process, 5000 queued) | driver | echo | ratio |")
    print("| --- | --- | --- | --- |")
    print(
        f"| decode + core + encode + offer | {svc_driver:.1f} us | {svc_echo:.1f} us | "
        f"{svc_driver / max(svc_echo, 1e-9):.1f}x |"
    )
    ext = results["idle_external"]
    emb_cpu = results["idle_embedded"]
    print()
    print("| idle, 10 streams + 20 leases | driver CPU | echo agent CPU (baseline) | ratio |")
    print("| --- | --- | --- | --- |")
    print(
        f"| daemon joined to external media driver | {ext['driver']:.2f} % | "
        f"{ext['echo']:.2f} % | {ext['driver'] / max(ext['echo'], 1e-9):.1f}x |"
    )
    print(
        f"| daemon hosting its media driver (embedded) | {emb_cpu['driver']:.2f} % | "
        f"{ext['echo']:.2f} % + media driver {ext['media_driver']:.2f} % | "
        f"{emb_cpu['driver'] / max(ext['echo'] + ext['media_driver'], 1e-9):.1f}x |"
    )
    if args.json:
        summary = {
            k: (
                {
                    "p50_us": _pct(v, 0.5),
                    "p99_us": _pct(v, 0.99),
                    "n": len(v),
                    "mean_us": statistics.fmean(v) / 1000,
                }
                if isinstance(v, list)
                else v
            )
            for k, v in results.items()
        }
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
