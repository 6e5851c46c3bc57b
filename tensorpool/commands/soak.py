"""`tensorpool soak`: a chaos soak that shows load held, faults survived, every frame counted.

It builds a realistic topology on this machine, each part a real `tensorpool` process in a
fresh temporary directory (issue #30):

* host A: an external media driver (`tensorpool mediadriver`) and the SHM driver
  (`tensorpool driver`); eight producers from 4 KiB to 4 MiB and from 10 Hz to 5 kHz, paced
  and bursty, some standalone and some through the driver; one consumer per stream
  (per-frame, batch and `--idle semaphore` all used); a rate limiter; `tensorpool serve`;
* host B (loopback, its own directories): a media driver, an SHM driver, and a consumer of
  the stream the bridge (`tensorpool bridge`, a sender on A and a receiver on B) carries.

Faults come from a seeded schedule (:mod:`tensorpool.soak.schedule`); a part that was killed
is started again at once, and a part that exits on its own is a *crash* (counted, restarted).
Every consumer reports its per-mapping accounting (`consume --json` "segments"), every
producer what it committed per epoch (`produce --json` "published"); the ledger
(:mod:`tensorpool.soak.ledger`) checks that every seq was delivered or counted. The report
(a table, or JSON with --json) holds load, drops by reason, faults injected and survived,
recovery times, crashes, unaccounted frames, per-process resources at warm-up and end, and
leftovers after everything stopped. Exit status 0 when nothing is unaccounted, nothing
crashed, nothing was left behind and every fault was survived; 1 otherwise.

Sized for a 2-core host: the 5 kHz stream carries 4 KiB frames in bursts of 50, the 4 MiB
stream runs at 10 Hz, producers write a seq stamp rather than a full pattern.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorpool.cli import UserError
from tensorpool.commands import soak_hostnet as hostnet
from tensorpool.commands.soak_hostnet import HostNet
from tensorpool.soak.ledger import (
    LedgerResult,
    Published,
    Segment,
    SparkBatch,
    check_bridge,
    check_rate_limit,
    reconcile,
    spark_segments,
)
from tensorpool.soak.schedule import FAULT_KINDS, Fault, parse_faults, plan

#: Seconds a client gets to deliver a frame again after a fault before it counts as not
#: survived (the run's end also ends the wait).
RECOVERY_TIMEOUT_S = 30.0
REPORT_INTERVAL_S = 0.25  # consumers' JSON lines: the resolution of recovery times
WARMUP_TIMEOUT_S = 120.0  # a loaded 2-core host starts ~20 Python processes slowly
#: A Spark query starts a JVM and its Python workers: a minute or more on a loaded 2-core
#: host, so its first batch (warm-up) and its first batch after a restart get this long.
SPARK_TIMEOUT_S = 300.0
#: The Spark query's session (its driver, JVM and ~10 Python workers) weighs as ~9 parts
#: (autogroup nice -10: weight 9548 against 1024). At one part's weight (1/27 of the CPU at
#: the soak's own load) Spark's streaming-source Python worker (``python_streaming_source_
#: runner``, 0.45 s of CPU to import) misses Spark's fixed 10 s connect-back and the query
#: fails with "Python worker failed to connect back" (docs/reliability.md).
SPARK_SESSION_NICE = -10


@dataclass(frozen=True)
class StreamSpec:
    stream_id: int
    shape: str
    dtype: str
    rate: float
    batch: int  # producer frames per burst (1: paced)
    driver: bool  # through the SHM driver (else standalone)
    consume: tuple[str, ...]  # consumer flags: per-frame (), batch, semaphore

    @property
    def frame_bytes(self) -> int:
        import math

        import numpy as np

        return math.prod(int(x) for x in self.shape.split(",")) * np.dtype(self.dtype).itemsize


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(101, "4096", "uint8", 5000, 50, False, ("--batch", "64")),  # 4 KiB, 5 kHz bursts
    StreamSpec(102, "1024,1024", "uint32", 10, 1, True, ()),  # 4 MiB, 10 Hz
    StreamSpec(103, "16384", "uint32", 1000, 1, True, ("--idle", "semaphore")),  # 64 KiB, 1 kHz
    StreamSpec(104, "4096", "uint32", 200, 1, False, ()),  # 16 KiB, 200 Hz
    StreamSpec(105, "65536", "uint32", 50, 1, True, ()),  # 256 KiB, 50 Hz: rate limiter source
    StreamSpec(106, "262144", "uint32", 20, 1, True, ("--batch", "16")),  # 1 MiB, 20 Hz: bridged
    StreamSpec(107, "4096", "uint8", 100, 10, False, ("--idle", "semaphore")),  # 4 KiB bursts
    StreamSpec(108, "8192", "uint32", 500, 1, True, ("--batch", "32")),  # 32 KiB: served
)
RL_SOURCE, RL_DEST, RL_RATE_HZ = 105, 115, 5
BRIDGE_SOURCE, BRIDGE_DEST = 106, 206
SERVED = 108
#: The Spark query's streams: one read through the SHM (driver mode), one through `serve`.
SPARK_LOCAL, SPARK_FLIGHT = 105, SERVED
#: Parts whose deliveries are recovery's "first frame again" (a consumer, the Spark query).
CLIENT_KINDS = ("consumer", "spark")


def spark_available() -> bool:
    """The Spark extra is installed (the query runs in the soak's own Python)."""
    import importlib.util

    return importlib.util.find_spec("pyspark") is not None


DRIVER_TOML = """\
[driver]
instance_id = "soak-{host}"
aeron_dir = "{aeron}"
embedded_media_driver = false

[shm]
base_dir = "{shm}"
namespace = "soak"
permissions_mode = "600"
allowed_base_dirs = ["{shm}"]

[policies]
allow_dynamic_streams = false
announce_period_ms = 250
lease_keepalive_interval_ms = 500
lease_expiry_grace_intervals = 6
cleanup_shm_on_exit = true
epoch_gc_keep = 1
{profiles}{streams}"""

RATELIMITER_TOML = """\
[rate_limiter]
instance_id = "soak-rl"
descriptor_channel = "aeron:ipc?term-length=4m"
descriptor_stream_id = 1100
max_rate_hz = {rate}

[[mappings]]
source_stream_id = {src}
dest_stream_id = {dest}
profile = "p{src}"

[driver]
aeron_dir = "{aeron}"

[shm]
base_dir = "{shm}"
"""

BRIDGE_TOML = """\
[bridge]
instance_id = "soak-bridge-{role}"
role = "{role}"
payload_channel = "aeron:udp?endpoint={addr}:{p0}|term-length=16m"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint={addr}:{p1}"
control_stream_id = 3001
metadata_channel = "aeron:udp?endpoint={addr}:{p2}"
metadata_stream_id = 3002
forward_progress = false
assembly_timeout_ms = 5000

[local]
aeron_dir = "{aeron}"
driver_mode = true
shm_base_dir = "{shm}"
allowed_base_dirs = ["{shm}"]
announce_period_ms = 250

[[mappings]]
source_stream_id = {src}
dest_stream_id = {dest}
profile = "p{src}"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=300.0, help="seconds of faults and load")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (%(default)s)")
    p.add_argument(
        "--faults",
        default="all",
        help="comma list of fault kinds, 'all' or 'none' (%(default)s); kinds: "
        + ", ".join(FAULT_KINDS),
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument(
        "--no-spark",
        action="store_true",
        help="leave out the Spark query (included when the Spark extra is installed; its "
        "session gets the CPU weight of its ~10 processes when run as root)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the working directory (logs, configs) after the run, for a post-mortem",
    )


# --- processes ------------------------------------------------------------------------------
@dataclass
class Role:
    """One part of the topology: how to start it and what it depends on."""

    name: str
    kind: str  # a schedule.COMPONENTS kind
    argv: list[str]
    deps: frozenset[str] = frozenset()
    stream: int = 0
    restart: bool = True  # started again when it exits
    #: The nice value of the part's session's scheduling group (Linux autogroup): each part
    #: runs in a session of its own, and the kernel shares the CPU between sessions, not
    #: between processes; a part of many processes (the Spark query) gets a larger weight.
    session_nice: int = 0


@dataclass
class Instance:
    """One start of a role: its process and what its JSON lines said."""

    role: Role
    proc: subprocess.Popen[bytes]
    started: float
    expected_exit: bool = False
    frames: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    segments: list[dict[str, Any]] = field(default_factory=list)
    published: dict[str, list[int]] = field(default_factory=dict)
    not_sent: int = 0  # a producer's descriptors_not_sent (its final line has none)
    final: bool = False
    lines: list[str] = field(default_factory=list)  # the last few non-JSON lines
    stopped_at: float = 0.0
    first_output_at: float = 0.0  # its first stdout line: it runs (imports done, joined)


class Topology:
    """Starts, watches and restarts the parts; reads their JSON lines on threads."""

    def __init__(self, work: Path, keep_lines: bool = False) -> None:
        self.work = work
        self.keep_lines = keep_lines  # --keep: every JSON line into logs/<name>.jsonl
        self.roles: dict[str, Role] = {}
        self.current: dict[str, Instance] = {}
        self.history: list[Instance] = []
        self.crashes: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        # consumer name -> [(monotonic time, frames delivered by all its instances)]
        self.delivered: dict[str, int] = {}
        self.delivered_at: dict[str, float] = {}
        self.stopping = False
        self.window: tuple[dict[str, int], dict[str, int]] = ({}, {})
        # the Spark query's batches (its lines in the working directory, read at the stop)
        self.spark_batches: list[SparkBatch] = []
        # what raising a session's weight gave: {"session_nice": N} or {"not_raised": why}
        self.session_weight: dict[str, Any] | None = None

    def add(self, role: Role) -> None:
        self.roles[role.name] = role

    def start(self, name: str) -> Instance:
        role = self.roles[name]
        from tensorpool.transport.process import child_env

        log = open(self.work / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            proc = subprocess.Popen(
                role.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=child_env(),  # the parts stop when the soak is gone, however it ended
                start_new_session=True,  # Ctrl-C reaches the soak only; it stops the parts
            )
        finally:
            log.close()
        if role.session_nice:
            self.weigh_session(proc.pid, role.session_nice)
        inst = Instance(role, proc, time.monotonic())
        with self.lock:
            self.current[name] = inst
            self.history.append(inst)
        threading.Thread(target=self._read, args=(inst,), daemon=True).start()
        return inst

    def weigh_session(self, pid: int, nice: int) -> None:
        """Set the CPU weight of ``pid``'s session (it called setsid before Popen returned:
        the exec happened). Needs CAP_SYS_NICE for a negative value; without it (or without
        autogroups) the session keeps one part's weight, and the report says why."""
        try:
            if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "0":
                self.session_weight = {"not_raised": "autogroups are off: no session weight"}
                return
            Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
        except OSError as exc:
            self.session_weight = {"not_raised": f"/proc/{pid}/autogroup: {exc.strerror}"}
        else:
            self.session_weight = {"session_nice": nice}

    def _read(self, inst: Instance) -> None:
        assert inst.proc.stdout is not None
        name = inst.role.name
        for raw in inst.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not inst.first_output_at:
                inst.first_output_at = time.monotonic()
            if not line.startswith("{"):
                inst.lines = [*inst.lines[-4:], line]
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if self.keep_lines:
                with open(self.work / "logs" / f"{name}.jsonl", "a") as f:
                    f.write(line + "\n")
            with self.lock:
                inst.last = doc
                if doc.get("segments") is not None:
                    inst.segments = doc["segments"]
                if doc.get("published") is not None:
                    inst.published = doc["published"]
                if doc.get("descriptors_not_sent") is not None:
                    inst.not_sent = int(doc["descriptors_not_sent"])
                if doc.get("final"):
                    inst.final = True
                if inst.role.kind in CLIENT_KINDS and "frames" in doc:
                    gained = int(doc["frames"]) - inst.frames
                    if gained > 0:
                        inst.frames = int(doc["frames"])
                        self.delivered[name] = self.delivered.get(name, 0) + gained
                        self.delivered_at[name] = time.monotonic()

    def signal(
        self, name: str, sig: int, *, expected: bool = True, group: bool = False
    ) -> Instance | None:
        """Signal a part; ``group``: its whole process group (the Spark query's JVM too)."""
        inst = self.current.get(name)
        if inst is None or inst.proc.poll() is not None:
            return None
        inst.expected_exit = inst.expected_exit or (
            expected and sig in (signal.SIGKILL, signal.SIGTERM)
        )
        with contextlib.suppress(ProcessLookupError):
            if group:  # started with start_new_session: the group is the part's own
                os.killpg(inst.proc.pid, sig)
            else:
                inst.proc.send_signal(sig)
        return inst

    def reap(self, now: float) -> list[str]:
        """Restart parts that exited; a part that exited without being killed is a crash.
        Returns the names started again."""
        restarted = []
        for name, inst in list(self.current.items()):
            rc = inst.proc.poll()
            if rc is None or self.stopping:
                continue
            if not inst.stopped_at:
                inst.stopped_at = now
            if not inst.expected_exit:
                self.crashes.append(
                    {
                        "process": name,
                        "exit_status": rc,
                        "at_s": round(now - self.t0, 2),
                        "last_output": _tail(self.work / "logs" / f"{name}.log"),
                    }
                )
            if inst.role.restart:
                self.start(name)
                restarted.append(name)
            else:
                del self.current[name]
        return restarted

    t0 = 0.0

    def stop_all(self, order: list[str]) -> None:
        """SIGTERM in dependency order (clients first, drivers and media drivers last)."""
        from tensorpool.transport.process import stop_process

        self.stopping = True
        for name in order:
            inst = self.current.get(name)
            if inst is None:
                continue
            inst.expected_exit = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(inst.proc.pid, signal.SIGCONT)  # a stalled part must see the SIGTERM
            stop_process(inst.proc, timeout_s=20)
        for inst in self.history:  # earlier instances: reaped already, or killed now
            if inst.proc.poll() is None:
                stop_process(inst.proc, timeout_s=5)
        for inst in self.history:  # a Spark query's JVM outlived its driver: ours, by group
            if inst.role.kind == "spark" and _group_members(inst.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(inst.proc.pid, signal.SIGKILL)


def _group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def _tail(path: Path, n: int = 3) -> list[str]:
    try:
        return path.read_text(errors="replace").strip().splitlines()[-n:]
    except OSError:
        return []


def _tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorpool", *args]


def _free_udp_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stride(nbytes: int) -> int:
    stride = 4096
    while stride < nbytes:
        stride *= 2
    return stride


def build(
    work: Path, keep_lines: bool = False, net: HostNet | None = None, spark: bool = True
) -> Topology:
    """Write the configs and declare every part (nothing is started here); host B's parts
    run in ``net``'s network namespace when it has one."""
    net = net or HostNet("127.0.0.1", reason="not asked for")
    topo = Topology(work, keep_lines)
    (work / "logs").mkdir()
    hosts = {h: (work / h / "aeron", work / h / "shm") for h in ("a", "b")}
    for _aeron, shm in hosts.values():
        shm.mkdir(parents=True)
    by_id = {s.stream_id: s for s in STREAMS}

    def profile(sid: int, nbytes: int) -> str:
        return (
            f"\n[profiles.p{sid}]\nheader_nslots = 64\n"
            f"payload_pools = [{{ pool_id = 1, stride_bytes = {_stride(nbytes)} }}]\n"
        )

    def stream(sid: int) -> str:
        return f'\n[streams.s{sid}]\nstream_id = {sid}\nprofile = "p{sid}"\n'

    a_ids = [s.stream_id for s in STREAMS if s.driver]
    a_prof = "".join(profile(sid, by_id[sid].frame_bytes) for sid in a_ids)
    a_prof += profile(RL_DEST, by_id[RL_SOURCE].frame_bytes)
    a_streams = "".join(stream(sid) for sid in [*a_ids, RL_DEST])
    b_prof = profile(BRIDGE_DEST, by_id[BRIDGE_SOURCE].frame_bytes)
    b_prof += profile(BRIDGE_SOURCE, by_id[BRIDGE_SOURCE].frame_bytes)
    cfg = {}
    for h, prof, streams in (("a", a_prof, a_streams), ("b", b_prof, stream(BRIDGE_DEST))):
        aeron, shm = hosts[h]
        path = work / f"driver-{h}.toml"
        path.write_text(
            DRIVER_TOML.format(host=h, aeron=aeron, shm=shm, profiles=prof, streams=streams)
        )
        cfg[h] = path
    aeron_a, shm_a = hosts["a"]
    aeron_b, shm_b = hosts["b"]
    (work / "ratelimiter.toml").write_text(
        RATELIMITER_TOML.format(
            rate=RL_RATE_HZ, src=RL_SOURCE, dest=RL_DEST, aeron=aeron_a, shm=shm_a
        )
    )
    ports = _free_udp_ports(3)
    for role, aeron, shm in (("sender", aeron_a, shm_a), ("receiver", aeron_b, shm_b)):
        (work / f"bridge-{role}.toml").write_text(
            BRIDGE_TOML.format(
                role=role,
                aeron=aeron,
                shm=shm,
                src=BRIDGE_SOURCE,
                dest=BRIDGE_DEST,
                addr=net.addr,
                **{f"p{i}": port for i, port in enumerate(ports)},
            )
        )
    md = ("--ipc-term-length", str(4 << 20))
    on = {"a": lambda argv: argv, "b": net.wrap}  # host B's parts in its network namespace
    for h, (aeron, _shm) in hosts.items():
        topo.add(
            Role(
                f"mediadriver-{h}",
                "mediadriver",
                on[h](_tp("mediadriver", "--aeron-dir", str(aeron), *md)),
            )
        )
        topo.add(
            Role(
                f"driver-{h}",
                "driver",
                on[h](_tp("driver", "--config", str(cfg[h]), "--log-level", "warning")),
                deps=frozenset({f"mediadriver-{h}"}),
            )
        )
    client_a = ("--aeron-dir", str(aeron_a), "--shm-base-dir", str(shm_a))
    client_b = ("--aeron-dir", str(aeron_b), "--shm-base-dir", str(shm_b))
    host_a = frozenset({"mediadriver-a", "driver-a"})
    host_b = frozenset({"mediadriver-b", "driver-b"})
    report = f"--json --report-interval {REPORT_INTERVAL_S}"
    for s in STREAMS:
        mode = "--driver" if s.driver else "--takeover"
        opts = (
            f"{mode} --stream-id {s.stream_id} --shape {s.shape} --dtype {s.dtype} --rate "
            f"{s.rate} --batch {s.batch} --pattern stamp --json --producer-id {s.stream_id}"
        )
        deps = host_a if s.driver else frozenset({"mediadriver-a"})
        name = f"producer-{s.stream_id}"
        topo.add(
            Role(name, "producer", _tp("produce", *client_a, *opts.split()), deps, s.stream_id)
        )
    consumers = [(s.stream_id, s.driver, s.consume, f"producer-{s.stream_id}") for s in STREAMS]
    consumers.append((RL_DEST, True, (), f"producer-{RL_SOURCE}"))
    for sid, drv, flags, producer in consumers:
        opts = f"{'--driver' if drv else ''} --stream-id {sid} {report} {' '.join(flags)}"
        deps = (host_a if drv else frozenset({"mediadriver-a"})) | {producer}
        if sid == RL_DEST:
            deps |= {"ratelimiter"}
        argv = _tp("consume", *client_a, *opts.split())
        topo.add(Role(f"consumer-{sid}", "consumer", argv, deps, sid))
    rl = _tp("ratelimiter", "--config", str(work / "ratelimiter.toml"), "--json")
    topo.add(Role("ratelimiter", "ratelimiter", [*rl, "--report-interval", "1"], host_a))
    for role, deps in (("sender", host_a), ("receiver", host_b)):
        argv = _tp("bridge", "--config", str(work / f"bridge-{role}.toml"), "--json")
        argv = net.wrap(argv) if role == "receiver" else argv
        topo.add(Role(f"bridge-{role}", "bridge", argv, deps))
    opts = f"--driver --stream-id {BRIDGE_DEST} {report} --batch 16"
    deps = host_a | host_b | {"bridge-sender", "bridge-receiver", f"producer-{BRIDGE_SOURCE}"}
    argv = net.wrap(_tp("consume", *client_b, *opts.split()))
    topo.add(Role(f"consumer-{BRIDGE_DEST}", "consumer", argv, deps, BRIDGE_DEST))
    opts = f"--driver --stream-id {SERVED} --port {_free_tcp_port()}"
    topo.add(Role("serve", "serve", _tp("serve", *client_a, *opts.split()), host_a))
    if spark and spark_available():
        port = opts.split()[-1]
        (work / "spark").mkdir()
        argv = [
            sys.executable,
            "-m",
            "tensorpool.commands.soak_spark",
            "--out",
            str(work / "spark" / "batches.jsonl"),
            "--checkpoint",
            str(work / "spark" / "checkpoint"),
            "--aeron-dir",
            str(aeron_a),
            "--shm-base-dir",
            str(shm_a),
            "--local",
            str(SPARK_LOCAL),
            "--flight",
            f"127.0.0.1:{port}/{SPARK_FLIGHT}",
        ]
        deps = host_a | {"serve", f"producer-{SPARK_LOCAL}", f"producer-{SPARK_FLIGHT}"}
        topo.add(Role("spark", "spark", argv, deps, session_nice=SPARK_SESSION_NICE))
    topo.client_args = {"a": client_a, "b": client_b}  # type: ignore[attr-defined]
    return topo


START_ORDER = (
    ["mediadriver-a", "mediadriver-b", "driver-a", "driver-b"]
    + [f"producer-{s.stream_id}" for s in STREAMS]
    + ["ratelimiter", "bridge-sender", "bridge-receiver", "serve"]
    + [f"consumer-{s.stream_id}" for s in STREAMS]
    + [f"consumer-{RL_DEST}", f"consumer-{BRIDGE_DEST}", "spark"]
)
#: Producers first, so every consumer sees the last frames (the ledger's tail stays small);
#: the drivers and media drivers last.
STOP_ORDER = [
    *(n for n in START_ORDER if n.startswith("producer-")),
    *(n for n in reversed(START_ORDER) if not n.startswith(("producer-", "driver-", "media"))),
    "driver-b",
    "driver-a",
    "mediadriver-b",
    "mediadriver-a",
]


# --- observation -------------------------------------------------------------------------------
def _proc_resources(pid: int) -> dict[str, int] | None:
    """RSS (KiB), open files and mappings of one process (None: it is gone)."""
    try:
        rss = anon = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("RssAnon:"):  # private memory: the leak signal (RSS also
                anon = int(line.split()[1])  # counts the touched pages of mapped SHM files)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return {"rss_kib": rss, "anon_kib": anon, "open_files": fds, "mappings": maps}


def _resources(topo: Topology) -> dict[str, dict[str, int]]:
    out = {}
    for name, inst in sorted(topo.current.items()):
        got = _proc_resources(inst.proc.pid) if inst.proc.poll() is None else None
        if got is not None:
            out[name] = {**got, "pid": inst.proc.pid}
    return out


#: The goal's window for memory growth (#30.5): from minute 5 of the run to its end.
GROWTH_FROM_S = 300.0


def _growth(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, Any]:
    """RSS and private-memory growth (percent) of every part that ran as the same process at
    both snapshots (a restarted part is a new process: its growth says nothing)."""
    parts = {}
    for name, b in before.items():
        a = after.get(name)
        if a is None or a["pid"] != b["pid"]:
            continue
        parts[name] = {
            k.removesuffix("_kib") + "_pct": round(100.0 * (a[k] - b[k]) / b[k], 2)
            for k in ("rss_kib", "anon_kib")
            if b[k]
        }
    rss = [v["rss_pct"] for v in parts.values() if "rss_pct" in v]
    anon = [v["anon_pct"] for v in parts.values() if "anon_pct" in v]
    return {
        "parts": parts,
        "max_rss_pct": max(rss, default=None),
        "max_anon_pct": max(anon, default=None),
    }


class ServeProbe:
    """A Flight client of `tensorpool serve`: it "delivers" when the served stream lists frames
    (the serve's affected client, for recovery times)."""

    def __init__(self, topo: Topology, port: int) -> None:
        self.topo, self.port = topo, port
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            from pyarrow import flight
        except ImportError:
            return
        while not self.stop.wait(0.5):
            try:
                client = flight.FlightClient(f"grpc://127.0.0.1:{self.port}")
                try:
                    infos = list(client.list_flights())
                finally:
                    client.close()
            except Exception:  # down, restarting: the recovery clock keeps running
                continue
            if any(i.total_records > 0 for i in infos):
                with self.topo.lock:
                    name = "serve-probe"
                    self.topo.delivered[name] = self.topo.delivered.get(name, 0) + 1
                    self.topo.delivered_at[name] = time.monotonic()


# --- faults ------------------------------------------------------------------------------------
@dataclass
class Injected:
    fault: Fault
    at: float  # monotonic: the fault's end (kill, SIGCONT, join, send)
    affected: list[str]
    baseline: dict[str, int]
    recovered: dict[str, float] = field(default_factory=dict)
    injected: bool = True
    note: str = ""
    crashes_before: int = 0
    resume_at: float = 0.0  # deliveries count for recovery from here on
    baseline_taken: bool = False
    replaced: Instance | None = None  # a killed part: its replacement must run first
    failed: str = ""  # why a fault without client recovery (fs-full) was not survived
    pending: bool = False  # its action still runs on a thread
    deferred_s: float = 0.0  # how long it waited for the previous fault's recovery
    # where a restart's recovery time goes (fault -> the replacement's start -> its first
    # output line, i.e. Python started, imported and attached -> the clients' first frames)
    replacement: Instance | None = None  # the first one (a later fault may replace it too)
    started_s: float | None = None
    first_line_s: float | None = None

    @property
    def timeout_s(self) -> float:
        """How long its clients get to deliver again (a restarted Spark query: a JVM)."""
        return SPARK_TIMEOUT_S if self.fault.kind == "spark-restart" else RECOVERY_TIMEOUT_S


def affected_clients(topo: Topology, target: str) -> list[str]:
    """Consumers (and the serve probe) that depend on ``target``; a consumer is its own."""
    names = [
        n
        for n, r in topo.roles.items()
        if r.kind in CLIENT_KINDS
        and (n == target or target in r.deps)
        and (r.restart or n in topo.current)  # a churned consumer that left is no client
    ]
    if target in ("serve", "mediadriver-a", "driver-a") or target.startswith("producer-108"):
        names.append("serve-probe")
    return sorted(names)


FORGE_SCRIPT = """
import sys, time
import pyaeron
from tensorpool.specs.generated import driver as dp, wire
from tensorpool.transport.clock import now_ns
from tensorpool.transport.publication import Publisher
kind, aeron_dir, stream = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = bytearray(4096)
if kind == "announce":
    n = wire.ShmPoolAnnounceEncoder.encode(buf, 0, stream_id=stream, producer_id=99,
        epoch=2**40, announce_timestamp_ns=now_ns(), announce_clock_domain=1,
        layout_version=1, header_nslots=64, header_slot_bytes=256,
        payload_pools=[(1, 64, 4096, "shm:file?path=/nonexistent/forged/payload-1.pool")],
        header_region_uri="shm:file?path=/nonexistent/forged/header.ring")
    channel, sid = "aeron:ipc?term-length=1m", 1000
elif kind == "descriptor":
    n = wire.FrameDescriptorEncoder.encode(buf, 0, stream_id=stream, epoch=1, seq=2**40,
        header_index=0, timestamp_ns=now_ns())
    channel, sid = "aeron:ipc?term-length=16m", 1100
elif kind == "revoke":
    n = dp.ShmLeaseRevokedEncoder.encode(buf, 0, timestamp_ns=now_ns(), lease_id=1,
        stream_id=stream, client_id=1, role=dp.Role.PRODUCER, reason=dp.LeaseRevokeReason.REVOKED,
        error_message="forged by tensorpool soak")
    channel, sid = "aeron:ipc?term-length=1m", 1000
else:
    n = dp.ShmDriverShutdownEncoder.encode(buf, 0, timestamp_ns=now_ns(),
        reason=dp.ShutdownReason.ADMIN, error_message="forged by tensorpool soak")
    channel, sid = "aeron:ipc?term-length=1m", 1000
aeron = pyaeron.Aeron(context=pyaeron.Context(dir=aeron_dir, error_handler=lambda c, m: None))
pub = Publisher(aeron.add_exclusive_publication(channel, sid))
deadline = time.monotonic() + 10
sent = 0
while time.monotonic() < deadline and sent < 3:
    if pub.offer(buf, 0, n):
        sent += 1
    time.sleep(0.05)
pub.close()
aeron.close()
print(sent)
"""


def _forge(kind: str, aeron_dir: str, stream: int) -> str:
    """Publish a forged control message from a separate Aeron client (a short-lived process)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", FORGE_SCRIPT, kind, aeron_dir, str(stream)],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"stream {stream}: forger timed out"
    if out.returncode != 0:
        return "forger failed: " + out.stderr.decode(errors="replace").strip()[-200:]
    return f"stream {stream}: sent {out.stdout.decode().strip()}"


def _endpoints_ok() -> bool:
    """The forger uses the default control (1000) and descriptor (1100) endpoints."""
    from tensorpool.endpoints import Endpoints

    e = Endpoints()
    return (e.control_stream_id, e.descriptor_stream_id) == (1000, 1100)


def _fs_full_possible() -> str | None:
    """Why the fs-full fault cannot run here (None: it can: we can mount a small tmpfs)."""
    if os.geteuid() != 0:
        return "needs root to mount a dedicated tmpfs"
    if shutil.which("mount") is None:
        return "no mount(8)"
    return None


def _fill(path: Path, leave_bytes: int) -> str:
    """Fill the filesystem of ``path`` to within ``leave_bytes`` of full (one file, ours)."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    n = max(0, free - leave_bytes)
    with open(path / "soak-filler", "wb") as f:
        chunk = b"\0" * (1 << 20)
        left = n
        with contextlib.suppress(OSError):
            while left > 0:
                f.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
    return f"filled {n >> 20} MiB, {leave_bytes >> 10} KiB left"


class Injector:
    def __init__(self, topo: Topology, work: Path, rng: random.Random) -> None:
        self.topo, self.work, self.rng = topo, work, rng
        self.pending_cont: list[tuple[float, str]] = []
        self.pending_stop: list[tuple[float, str]] = []
        self.churn = 0
        self.spark_restarts = 0
        self.fs_mount: Path | None = None
        self.threads: list[threading.Thread] = []

    def inject(self, f: Fault, now: float) -> Injected:
        topo = self.topo
        kind, target = f.kind, f.target
        note = failed = ""
        work: Callable[[], str] | None = None  # slow (a process to start): on a thread
        affected = affected_clients(topo, target) if target else []
        ok = True
        if kind.startswith(("kill9-", "sigterm-")):
            sig = signal.SIGKILL if kind.startswith("kill9-") else signal.SIGTERM
            ok = topo.signal(target, sig) is not None
        elif kind == "producer-restart":
            # kill -9 and start again at once: the new producer meets the old one's lease
            # (driver mode) or its lock and regions (standalone: --takeover)
            inst = topo.signal(target, signal.SIGKILL)
            ok = inst is not None
            if inst is not None:
                inst.proc.wait()
                inst.stopped_at = time.monotonic()
                topo.reap(time.monotonic())
        elif kind == "stall":
            ok = topo.signal(target, signal.SIGSTOP, expected=False) is not None
            if ok:
                self.pending_cont.append((now + f.hold_s, target))
                note = f"{f.hold_s:.1f} s"
        elif kind == "consumer-churn":
            sid = self.rng.choice([s.stream_id for s in STREAMS])
            self.churn += 1
            name = f"churn-{self.churn}-{sid}"
            base = topo.roles[f"consumer-{sid}"]
            topo.add(Role(name, "consumer", base.argv, base.deps, sid, restart=False))
            topo.start(name)
            self.pending_stop.append((now + f.hold_s, name))
            affected = [name]
            note = f"stream {sid} for {f.hold_s:.1f} s"
        elif kind.startswith("forge-"):
            sid = self.rng.choice([s.stream_id for s in STREAMS])
            aeron = str(self.work / "a" / "aeron")
            work = functools.partial(_forge, kind.removeprefix("forge-"), aeron, sid)
            affected = sorted(
                n
                for n, r in topo.roles.items()
                if r.kind == "consumer" and not n.startswith("churn-") and r.stream != BRIDGE_DEST
            )
        elif kind == "spark-restart":
            # SIGTERM to the query's process (it stops the query, then its JVM) and kill -9 of
            # its whole process group (the JVM too) in turn; the soak starts it again at once
            # from the same checkpoint (Topology.reap)
            self.spark_restarts += 1
            sig = signal.SIGTERM if self.spark_restarts % 2 else signal.SIGKILL
            ok = topo.signal(target, sig, group=sig == signal.SIGKILL) is not None
            note = signal.Signals(sig).name
        elif kind == "fs-full":
            why = _fs_full_possible()
            if why is not None:
                return Injected(f, now, [], {}, injected=False, note=f"skipped: {why}")
            work = self._fs_full
            affected = []
        else:
            return Injected(f, now, [], {}, injected=False, note=f"skipped: {kind} not built")
        if not ok:
            return Injected(f, now, [], {}, injected=False, note=f"{target} was not running")
        t = time.monotonic()
        # frames read in the half second after a kill were committed before it (consumers
        # report every 0.25 s), and frames a restarted part's buffers still held arrive
        # before the replacement runs: the baseline is taken once the fault is over
        resume = t + (f.hold_s if kind == "stall" else 2 * REPORT_INTERVAL_S)
        replaced = (
            topo.current.get(target)
            if kind.startswith(("kill9-", "sigterm-")) or kind == "spark-restart"
            else None
        )
        if work is not None:
            inj = Injected(f, t, affected, {}, crashes_before=len(topo.crashes), pending=True)
            thread = threading.Thread(target=self._finish, args=(inj, work), daemon=True)
            self.threads.append(thread)
            thread.start()
            return inj
        return Injected(
            f,
            t,
            affected,
            {},
            note=note,
            crashes_before=len(topo.crashes),
            resume_at=resume,
            replaced=replaced,
            failed=failed,
        )

    def _finish(self, inj: Injected, work: Callable[[], str]) -> None:
        """Run a slow fault's action; the fault happened when it returns (the forged message is
        sent, the producer on the full filesystem refused)."""
        try:
            inj.note = work()
        except Exception as exc:  # the fault could not be made: said, not a soak failure
            inj.note = f"not injected: {exc}"
            inj.injected = False
        if inj.fault.kind == "fs-full" and ("left behind:" in inj.note or "exited 0" in inj.note):
            inj.failed = "a producer on a full filesystem left files or did not refuse"
        if inj.note.startswith("skipped"):
            inj.injected = False
        inj.at = time.monotonic()
        inj.resume_at = inj.at + 2 * REPORT_INTERVAL_S
        inj.pending = False

    def _fs_full(self) -> str:
        """A dedicated 64 MiB tmpfs, driven to 256 KiB from full; a standalone producer is
        pointed at it by restart (its regions then do not fit: counted, refused cleanly)."""
        self._unmount()  # never a mount over a mount
        if self.fs_mount is not None:
            return "skipped: the previous fs-full tmpfs could not be unmounted"
        mnt = self.work / "fsfull"
        mnt.mkdir(exist_ok=True)
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "soak-fsfull", str(mnt)],
            capture_output=True,
            check=False,
        )
        if res.returncode != 0:
            return "skipped: mount failed: " + res.stderr.decode(errors="replace").strip()
        self.fs_mount = mnt
        note = _fill(mnt, 256 << 10)
        probe = subprocess.run(
            _tp(
                "produce",
                *self.topo.client_args["a"][:2],
                "--shm-base-dir",
                str(mnt),  # type: ignore[attr-defined]
                "--stream-id",
                "199",
                "--shape",
                "262144",
                "--dtype",
                "uint32",
                "--count",
                "5",
                "--quiet",
            ),
            capture_output=True,
            timeout=120,
            check=False,
        )
        err = probe.stderr.decode(errors="replace").strip().splitlines()
        left = sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*") if p.name != "soak-filler")
        # unmounted now, not at the end: each fs-full fault mounts afresh, and a mount left
        # under the next one was stacked out of cleanup()'s reach (9 left after 10 faults)
        self._unmount()
        return (
            f"{note}; a producer on it exited {probe.returncode}"
            + (f" ({err[-1][:160]})" if err else "")
            + (f"; left behind: {left}" if left else "; nothing left behind")
        )

    def due(self, now: float, faults: list[Injected] | None = None) -> None:
        """SIGCONT stalled parts and stop churned consumers whose time came.

        A churned consumer leaves after its hold, but not before its first frame (at most
        the recovery window after it joined): on a loaded host a consumer takes seconds to
        start. Once it left it is nobody's client: a fault it had not recovered from is judged
        by its other clients (the 30-minute run counted three faults as not survived because
        a churned consumer left by plan before it delivered again)."""
        for item in [x for x in self.pending_cont if x[0] <= now]:
            self.pending_cont.remove(item)
            self.topo.signal(item[1], signal.SIGCONT, expected=False)
        for item in [x for x in self.pending_stop if x[0] <= now]:
            name = item[1]
            inst = self.topo.current.get(name)
            if (
                inst is not None
                and not self.topo.delivered.get(name)
                and now - inst.started < RECOVERY_TIMEOUT_S
            ):
                continue
            self.pending_stop.remove(item)
            self.topo.signal(name, signal.SIGTERM)
            for inj in faults or []:
                gone = name in inj.affected and name not in inj.recovered
                if gone and inj.fault.kind != "consumer-churn":
                    inj.affected.remove(name)

    def cleanup(self) -> None:
        for thread in self.threads:  # bounded by the forger's and the probe's own timeouts
            thread.join()
        for _t, name in self.pending_cont:
            self.topo.signal(name, signal.SIGCONT, expected=False)
        self.pending_cont.clear()
        self._unmount()

    def _unmount(self) -> None:
        if self.fs_mount is not None:
            res = subprocess.run(["umount", str(self.fs_mount)], capture_output=True, check=False)
            if res.returncode == 0:
                self.fs_mount = None


def _recovering(faults: list[Injected], now: float) -> bool:
    """A fault is still open: its action runs, its stall holds, or a client it affected has
    not delivered again and its recovery window has not ended. The next fault waits, so each
    is judged alone: on a loaded host a part restarted after a kill can take longer to start
    than the schedule's slot, and a second fault on it then would count against the first
    (#30 soak defect (c): a restarted rate limiter killed again before it had started)."""
    for inj in faults:
        if not inj.injected:
            continue
        if inj.pending:  # bounded by the action's own timeouts
            return True
        if now - inj.at > inj.timeout_s:  # over, recovered or not
            continue
        if not inj.baseline_taken or len(inj.recovered) < len(inj.affected):
            return True
    return False


def _track_recovery(topo: Topology, faults: list[Injected], now: float) -> None:
    with topo.lock:
        for inj in faults:
            if not inj.injected or inj.pending:
                continue
            if inj.replaced is not None and inj.replacement is None:
                cur = topo.current.get(inj.fault.target)
                if cur is not None and cur is not inj.replaced:  # the profile's timestamps
                    inj.replacement = cur
                    inj.started_s = cur.started - inj.at
            rep = inj.replacement
            if rep is not None and inj.first_line_s is None and rep.first_output_at:
                inj.first_line_s = rep.first_output_at - inj.at
            if not inj.baseline_taken and inj.replaced is not None:
                cur = topo.current.get(inj.fault.target)
                if cur is None or cur is inj.replaced:
                    continue
                # the replacement runs: its first output line, or 2 s for a silent driver
                if not cur.first_output_at and now - cur.started < 2.0:
                    continue
            if not inj.baseline_taken and now >= inj.resume_at:
                inj.baseline = {a: topo.delivered.get(a, 0) for a in inj.affected}
                inj.baseline_taken = True
            if not inj.baseline_taken:
                continue
            for a in inj.affected:
                if a in inj.recovered or now - inj.at > inj.timeout_s:
                    continue
                if topo.delivered.get(a, 0) > inj.baseline[a]:
                    inj.recovered[a] = topo.delivered_at[a] - inj.at


# --- the report ----------------------------------------------------------------------------------
def recovery_phases(inj: Injected) -> dict[str, float]:
    """Where a restarted part's recovery time went: ``restart`` (the fault to the new
    process: a SIGTERM'd part's shutdown, the spawn), ``process_start`` (to its first output
    line: Python's start, imports, attach, a lease), ``first_frame`` (to the last affected
    client's first frame; from the process's start for a part that prints nothing)."""
    if not inj.recovered or inj.started_s is None:
        return {}
    out = {"restart": inj.started_s}
    back = max(inj.recovered.values())
    ready = inj.started_s
    if inj.first_line_s is not None:  # a part's first line may come after its clients' frames
        ready = min(inj.first_line_s, back)  # (a bridge prints at its first report)
        out["process_start"] = ready - inj.started_s
    out["first_frame"] = back - ready
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))
    return round(v[k], 3)


def _ledger(topo: Topology) -> tuple[LedgerResult, LedgerResult]:
    published: list[Published] = []
    for inst in topo.history:
        if inst.role.kind != "producer":
            continue
        for epoch, (first, last) in inst.published.items():
            published.append(
                Published(inst.role.stream, int(epoch), first, last, complete=inst.final)
            )
    segments: list[Segment] = []
    for i, inst in enumerate(topo.history):
        if inst.role.kind != "consumer":
            continue
        for rec in inst.segments:
            segments.append(
                Segment(
                    f"{inst.role.name}#{i}",
                    inst.role.stream,
                    int(rec["epoch"]),
                    int(rec["first_seq"]),
                    int(rec["last_seq"]),
                    int(rec["delivered"]),
                    int(rec["drops_gap"]),
                    dict(rec["drops"]),
                )
            )
    # the rate limiter's output and the bridge's destination are checked by their own rules
    # below; their seqs follow the source's, so the phantom rule is applied to sources only
    res = reconcile(
        published,
        [s for s in segments if s.stream_id not in (RL_DEST, BRIDGE_DEST)],
    )
    derived = reconcile([], [s for s in segments if s.stream_id in (RL_DEST, BRIDGE_DEST)])
    if "spark" in topo.roles:
        spark_segs, odd, across = spark_segments(topo.spark_batches)
        got = reconcile(published, spark_segs)
        got.unaccounted += odd
        topo.spark = {  # type: ignore[attr-defined]
            "batches": len(spark_segs),
            "rows": got.delivered,
            "lost": got.dropped,
            "batches_across_epochs": across,
            "unaccounted_frames": got.unaccounted_frames,
            "ranges_without_complete_producer_report": got.unverified_segments,
            "session_weight": topo.session_weight,
        }
        derived.unaccounted += got.unaccounted
        derived.delivered += got.delivered
        derived.overcounted += got.overcounted
        derived.overcounted_in += got.overcounted_in
    return res, derived


def _offset_doc(text: str | None) -> dict[str, Any]:
    """A source offset of a query's progress as an object; {} when it is none."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def spark_batches(d: Path) -> list[SparkBatch]:
    """The Spark query's per-batch lines (soak_spark.py): rows and offsets joined by batch
    id; the last line of a replayed batch wins, a line cut by a kill is skipped."""
    rows: dict[int, list[list[int]]] = {}
    offsets: dict[int, list[list[str | None]]] = {}
    runs: dict[int, str] = {}
    with contextlib.suppress(OSError), open(d / "batches.jsonl") as f:
        for line in f:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if "batch" in doc:
                rows[int(doc["batch"])] = doc["rows"]
            elif "progress" in doc:
                offsets[int(doc["progress"])] = doc["offsets"]
                runs[int(doc["progress"])] = str(doc.get("run", ""))
    out = []
    for bid, pairs in sorted(offsets.items()):
        if bid not in rows:
            continue  # the sink did not finish it (killed): Spark runs it again
        per_epoch: dict[int, dict[int, tuple[int, int, int, int]]] = {}
        for sid, epoch, count, distinct, lo, hi in rows[bid]:
            per_epoch.setdefault(int(sid), {})[int(epoch)] = (count, distinct, lo, hi)
        for start_text, end_text in pairs:
            # the query's first batch has no start offset to check against: PySpark gives
            # it as the text "None"
            start, end = _offset_doc(start_text), _offset_doc(end_text)
            for key, e in end.items():
                b = start.get(key)
                if not (isinstance(e, dict) and isinstance(b, dict) and "seq" in e and "seq" in b):
                    continue  # not a stream's position ("source", a new stream)
                sid = int(key.rsplit("/", 1)[-1])
                out.append(
                    SparkBatch(
                        bid,
                        sid,
                        int(b["epoch"]),
                        int(b["seq"]),
                        int(b.get("lost", 0)),
                        int(b.get("lostLate", 0)),
                        int(e["epoch"]),
                        int(e["seq"]),
                        int(e.get("lost", 0)),
                        int(e.get("lostLate", 0)),
                        per_epoch.get(sid, {}),
                        runs[bid],
                    )
                )
    return out


def build_report(
    topo: Topology,
    faults: list[Injected],
    args: argparse.Namespace,
    held_s: float,
    warm: dict[str, dict[str, int]],
    end: dict[str, dict[str, int]],
    leftovers: dict[str, list[str]],
    interrupted: bool,
) -> dict[str, Any]:
    res, derived = _ledger(topo)
    by_stream: dict[int, dict[str, Any]] = {}
    for inst in topo.history:
        if inst.role.kind != "consumer" or inst.role.name.startswith("churn-"):
            continue
        row = by_stream.setdefault(inst.role.stream, {"frames": 0, "bytes": 0, "drops": {}})
        row["frames"] += inst.frames
        for seg in inst.segments:
            for r, n in seg["drops"].items():
                row["drops"][r] = row["drops"].get(r, 0) + n
            if seg["drops_gap"]:
                row["drops"]["drops_gap"] = row["drops"].get("drops_gap", 0) + seg["drops_gap"]
    # frames/s over the held window (warm-up and the final grace excluded); drops over the run
    for name, role in topo.roles.items():
        if role.kind == "consumer" and not name.startswith("churn-") and role.stream in by_stream:
            got = topo.window[1].get(name, 0) - topo.window[0].get(name, 0)
            by_stream[role.stream]["window_frames"] = (
                by_stream[role.stream].get("window_frames", 0) + got
            )
    sizes = {s.stream_id: s.frame_bytes for s in STREAMS}
    sizes[RL_DEST] = sizes[RL_SOURCE]
    sizes[BRIDGE_DEST] = sizes[BRIDGE_SOURCE]
    # descriptors a producer could not offer (back-pressure of the shared descriptor stream's
    # slowest subscriber, or no subscriber): its consumers count them as gaps
    not_sent: dict[int, int] = {}
    for inst in topo.history:
        if inst.role.kind == "producer":
            not_sent[inst.role.stream] = not_sent.get(inst.role.stream, 0) + inst.not_sent
    load = {}
    for sid, row in sorted(by_stream.items()):
        fps = row.get("window_frames", 0) / held_s if held_s > 0 else 0.0
        total = row["frames"] + sum(row["drops"].values())
        load[str(sid)] = {
            "frames_per_s": round(fps, 1),
            "bytes_per_s": round(fps * sizes.get(sid, 0)),
            "frames": row["frames"],
            "drops": row["drops"],
            "drop_rate": round(sum(row["drops"].values()) / total, 4) if total else 0.0,
            **({"descriptors_not_sent": not_sent[sid]} if sid in not_sent else {}),
        }
    # rate limiter: it may publish at most max_rate_hz (RateLimiter spec), by its own count
    rl_frames = by_stream.get(RL_DEST, {}).get("window_frames", 0)
    rl_runs = [
        (
            sum(m.get("published", 0) for m in inst.last.get("mappings", [])),
            (inst.stopped_at or time.monotonic()) - inst.started,
        )
        for inst in topo.history
        if inst.role.kind == "ratelimiter"
    ]
    rl_excess = check_rate_limit(rl_runs, RL_RATE_HZ)
    src_published = sum(
        last - first + 1
        for inst in topo.history
        if inst.role.stream == BRIDGE_SOURCE and inst.role.kind == "producer"
        for first, last in inst.published.values()
    )
    bridge_excess = check_bridge(src_published, by_stream.get(BRIDGE_DEST, {}).get("frames", 0))
    unaccounted = res.unaccounted + derived.unaccounted
    per_kind: dict[str, dict[str, Any]] = {}
    for inj in faults:
        k = per_kind.setdefault(
            inj.fault.kind,
            {"injected": 0, "survived": 0, "skipped": 0, "recovery_s": [], "phases": {}},
        )
        if not inj.injected:
            k["skipped"] += 1
            k.setdefault("notes", []).append(inj.note)
            continue
        k["injected"] += 1
        times = list(inj.recovered.values())
        k["recovery_s"].extend(times)
        for phase, secs in recovery_phases(inj).items():
            k["phases"].setdefault(phase, []).append(secs)
        ok = len(inj.recovered) == len(inj.affected) and not inj.failed
        crashed = [
            c["process"]
            for c in topo.crashes[inj.crashes_before :]
            if c["at_s"] <= (inj.at - topo.t0 + inj.timeout_s)
        ]
        if ok and not crashed:
            k["survived"] += 1
        else:
            k.setdefault("failures", []).append(
                {
                    "at_s": round(inj.at - topo.t0, 2),
                    "target": inj.fault.target,
                    "not_recovered": sorted(set(inj.affected) - set(inj.recovered)),
                    "crashed": crashed,
                    **({"failed": inj.failed} if inj.failed else {}),
                }
            )
        if inj.note:
            k.setdefault("notes", []).append(inj.note)
    all_rec: list[float] = []
    kinds_out = {}
    for kind, k in sorted(per_kind.items()):
        rec = k.pop("recovery_s")
        phases = k.pop("phases")
        all_rec.extend(rec)
        kinds_out[kind] = {
            **k,
            **(
                {
                    "recovery_profile_p50_s": {p: _pct(v, 50) for p, v in phases.items()},
                    "recovery_profile_max_s": {p: round(max(v), 3) for p, v in phases.items()},
                }
                if phases
                else {}
            ),
            "recovery_p50_s": _pct(rec, 50),
            "recovery_p99_s": _pct(rec, 99),
            "recovery_max_s": round(max(rec), 3) if rec else None,
        }
    n_left = sum(len(v) for v in leftovers.values())
    faults_injected = sum(k["injected"] for k in kinds_out.values())
    faults_survived = sum(k["survived"] for k in kinds_out.values())
    return {
        "command": "tensorpool soak "
        + " ".join(
            ["--duration", f"{args.duration:g}", "--seed", str(args.seed), "--faults", args.faults]
        ),
        "seed": args.seed,
        "duration_s": round(held_s, 1),
        "interrupted": interrupted,
        "host": {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
        "load": load,
        "rate_limiter": {
            "dest_frames": rl_frames,
            "published": sum(n for n, _s in rl_runs),
            "max_rate_hz": RL_RATE_HZ,
            "frames_over_rule": rl_excess,
        },
        "bridge": {"source_published": src_published, "frames_not_from_source": bridge_excess},
        "spark": getattr(topo, "spark", None),
        "faults": kinds_out,
        "faults_injected": faults_injected,
        "faults_survived": faults_survived,
        "recovery_p50_s": _pct(all_rec, 50),
        "recovery_p99_s": _pct(all_rec, 99),
        "recovery_max_s": round(max(all_rec), 3) if all_rec else None,
        "crashes": len(topo.crashes),
        "crash_list": topo.crashes,
        "unaccounted_frames": res.unaccounted_frames
        + derived.unaccounted_frames
        + rl_excess
        + bridge_excess,
        "unaccounted": [dataclasses.asdict(u) for u in unaccounted],
        "ledger": {
            "delivered": res.delivered + derived.delivered,
            "dropped_by_reason": res.dropped,
            "overcounted": res.overcounted + derived.overcounted,
            "overcounted_in": [*res.overcounted_in, *derived.overcounted_in][:50],
            "tail_after_last_seen": res.tail,
            "segments_without_complete_producer_report": res.unverified_segments,
        },
        "resources": {"warmup": warm, "end": end},  # minute 5 and growth: added by run()
        "leftovers": n_left,
        "leftover_list": leftovers,
    }


def render(report: dict[str, Any]) -> str:
    """The readable table (rich when stdout is a terminal, plain text otherwise)."""
    out = [
        f"{report['command']}  ({report['duration_s']} s held"
        + (", interrupted" if report["interrupted"] else "")
        + f"; host {report['host']['cpus']} CPUs, load {report['host']['loadavg'][0]:.1f})",
        "",
        f"{'stream':>8} {'frames/s':>10} {'MB/s':>8} {'frames':>9} {'drop rate':>9}  drops",
    ]
    for sid, row in report["load"].items():
        drops = ", ".join(f"{k}={v}" for k, v in sorted(row["drops"].items())) or "-"
        if row.get("descriptors_not_sent"):
            drops += f"; producer's descriptors not sent {row['descriptors_not_sent']}"
        out.append(
            f"{sid:>8} {row['frames_per_s']:>10.1f} {row['bytes_per_s'] / 1e6:>8.2f} "
            f"{row['frames']:>9} {row['drop_rate']:>9.4f}  {drops}"
        )
    out += [
        "",
        f"{'fault':>20} {'injected':>8} {'survived':>8} {'p50 s':>7} {'p99 s':>7} "
        f"{'max s':>7}  notes",
    ]
    for kind, k in report["faults"].items():

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        notes = "; ".join(k.get("notes", [])[:2])
        if k.get("skipped"):
            notes = f"{k['skipped']} skipped; " + notes
        out.append(
            f"{kind:>20} {k['injected']:>8} {k['survived']:>8} {fmt(k['recovery_p50_s']):>7} "
            f"{fmt(k['recovery_p99_s']):>7} {fmt(k['recovery_max_s']):>7}  {notes[:100]}"
        )
    out += [
        "",
        f"faults injected {report['faults_injected']}, survived {report['faults_survived']}; "
        f"recovery p50 {report['recovery_p50_s']} s, p99 {report['recovery_p99_s']} s",
        f"faults planned {report.get('faults_planned')}, not reached "
        f"{report.get('faults_not_reached')} (each waits for the previous one's recovery; "
        f"at most {report.get('fault_deferral_max_s')} s behind plan)",
        f"host B network: {report.get('host_b_network')}",
        f"crashes {report['crashes']}; unaccounted frames {report['unaccounted_frames']}; "
        f"leftovers {report['leftovers']}",
        f"ledger: delivered {report['ledger']['delivered']}, overcounted "
        f"{report['ledger']['overcounted']}, rate limiter over rule "
        f"{report['rate_limiter']['frames_over_rule']}, bridge frames not from source "
        f"{report['bridge']['frames_not_from_source']}",
    ]
    growth = report["resources"].get("growth_minute_5_to_end")
    if growth is not None:
        out.append(
            f"memory growth, minute 5 to the end (parts that ran as one process): max RSS "
            f"{growth['max_rss_pct']} %, max private {growth['max_anon_pct']} %"
        )
    for u in report["unaccounted"][:10]:
        out.append(
            f"  UNACCOUNTED {u['frames']} frame(s): {u['consumer']} stream {u['stream_id']} "
            f"epoch {u['epoch']} seq {u['first_seq']}..{u['last_seq']} ({u['why']})"
        )
    for c in report["crash_list"][:10]:
        out.append(f"  CRASH {c['process']} status {c['exit_status']} at {c['at_s']} s")
    for what, items in report["leftover_list"].items():
        for item in items[:10]:
            out.append(f"  LEFTOVER {what}: {item}")
    return "\n".join(out)


# --- the run ---------------------------------------------------------------------------------
class Progress:
    """One line while it runs: a rich progress bar on a terminal, a plain line otherwise."""

    def __init__(self, total: float) -> None:
        self.total = total
        self.rich = None
        self.last = 0.0
        if sys.stderr.isatty():
            with contextlib.suppress(ImportError):
                from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

                self.rich = Progress(
                    TextColumn("soak"),
                    BarColumn(),
                    TextColumn("{task.description}"),
                    TimeRemainingColumn(),
                    transient=True,
                )
                self.rich.start()
                self.task = self.rich.add_task("", total=total)

    def update(self, done: float, text: str) -> None:
        if self.rich is not None:
            self.rich.update(self.task, completed=done, description=text)
        elif time.monotonic() - self.last >= 5.0:
            self.last = time.monotonic()
            print(f"soak: {done:5.0f}/{self.total:g} s  {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.rich is not None:
            self.rich.stop()


def _wait(
    cond: Callable[[], bool], timeout_s: float, what: str, alive: Callable[[], bool], stop: Any
) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if stop.requested:
            raise KeyboardInterrupt
        if not alive():
            raise UserError(f"{what} exited during start-up")
        if time.monotonic() > deadline:
            raise UserError(f"{what} did not come up within {timeout_s:g} s")
        time.sleep(0.1)


def _start_all(topo: Topology, work: Path, stop: Any) -> None:
    from tensorpool.driver.config import load_driver_config
    from tensorpool.driver.status import status_path
    from tensorpool.transport.mediadriver import serves

    for name in (n for n in START_ORDER if n in topo.roles):
        if stop.requested:
            raise KeyboardInterrupt
        inst = topo.start(name)

        def alive(i: Instance = inst) -> bool:
            return i.proc.poll() is None

        if name.startswith("mediadriver-"):
            aeron = str(work / name[-1] / "aeron")
            _wait(lambda a=aeron: serves(a), 60, name, alive, stop)
        elif name.startswith("driver-"):
            path = status_path(load_driver_config(str(work / f"{name}.toml")))
            from tensorpool.driver.status import wait_running

            if not wait_running(path, 60, alive=lambda a=alive: a() and not stop.requested):
                if stop.requested:
                    raise KeyboardInterrupt
                raise UserError(f"{name} did not come up: {_tail(work / 'logs' / f'{name}.log')}")


def _leftovers(
    topo: Topology, work: Path, shm_before: set[str], keep: bool
) -> dict[str, list[str]]:
    from tensorpool.transport.process import pid_running

    pids = {i.proc.pid for i in topo.history}
    procs = sorted(
        f"{i.role.name} pid {i.proc.pid}"
        for i in topo.history
        if pid_running(i.proc.pid) and i.proc.poll() is None
    )
    procs += [  # the Spark query's JVM and Python workers: its process group
        f"{i.role.name} group {i.proc.pid}: pid {p}"
        for i in topo.history
        if i.role.kind == "spark"
        for p in _group_members(i.proc.pid)
    ]
    shm = []
    with contextlib.suppress(OSError):
        for entry in sorted(set(os.listdir("/dev/shm")) - shm_before):
            # wake semaphores carry their consumer's pid: ours when it names one of our pids
            if any(f"-{pid}-" in entry for pid in pids) or (entry == work.name and not keep):
                shm.append(f"/dev/shm/{entry}")
    return {"processes": procs, "dev_shm": shm}


def _files_left(work: Path) -> list[str]:
    """Files the parts left in their SHM and Aeron directories after a clean stop."""
    left = []
    for h in ("a", "b"):
        for sub in ("shm", "aeron"):
            d = work / h / sub
            if d.exists():
                left += [str(p.relative_to(work)) for p in d.rglob("*") if p.is_file()]
    return sorted(left)


def run(args: argparse.Namespace) -> int:
    from tensorpool.transport.process import StopSignals

    try:
        kinds = parse_faults(args.faults)
    except ValueError as exc:
        raise UserError(f"--faults: {exc}") from None
    if not args.duration > 0:
        raise UserError(f"--duration must be > 0, got {args.duration}")
    if any(k.startswith("forge-") for k in kinds) and not _endpoints_ok():
        raise UserError("the forged-message faults need the default control endpoints")
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    work = Path(tempfile.mkdtemp(prefix="tensorpool-soak-", dir=root))
    net = hostnet.setup()
    try:
        topo = build(work, args.keep, net, spark=not args.no_spark)
    except BaseException:
        net.close()
        raise
    targets: dict[str, list[str]] = {}
    for name, role in topo.roles.items():
        targets.setdefault(role.kind, []).append(name)
    # kinds this run cannot inject are named in the report, not scheduled
    skipped_kinds = {}
    if "spark" not in topo.roles:
        skipped_kinds["spark-restart"] = (
            "--no-spark" if args.no_spark else "the Spark extra is not installed (no pyspark)"
        )
    why = _fs_full_possible()
    if why is not None:
        skipped_kinds["fs-full"] = why
    skipped_kinds = {k: v for k, v in skipped_kinds.items() if k in kinds}
    kinds = tuple(k for k in kinds if k not in skipped_kinds)
    schedule = plan(args.seed, args.duration, kinds, targets)
    rng = random.Random(args.seed + 1)
    injector = Injector(topo, work, rng)
    stop = StopSignals().install()
    faults: list[Injected] = []
    warm: dict[str, dict[str, int]] = {}
    minute5: dict[str, dict[str, int]] = {}
    end: dict[str, dict[str, int]] = {}
    interrupted = False
    held_s = 0.0
    probe: ServeProbe | None = None
    progress: Progress | None = None
    if not args.json:
        print(
            f"soak: working under {work}; {len(schedule)} faults planned (seed {args.seed})",
            file=sys.stderr,
            flush=True,
        )
    try:
        _start_all(topo, work, stop)
        port = int(topo.roles["serve"].argv[topo.roles["serve"].argv.index("--port") + 1])
        probe = ServeProbe(topo, port)
        probe.thread.start()
        consumers = [n for n, r in topo.roles.items() if r.kind in CLIENT_KINDS]
        deadline = time.monotonic() + (
            SPARK_TIMEOUT_S if "spark" in topo.roles else WARMUP_TIMEOUT_S
        )
        while not stop.requested and time.monotonic() < deadline:
            topo.reap(time.monotonic())
            with topo.lock:
                if all(topo.delivered.get(c, 0) > 0 for c in consumers):
                    break
            time.sleep(0.2)
        else:
            if not stop.requested:
                missing = [c for c in consumers if not topo.delivered.get(c)]
                print(f"soak: warm-up ended without frames at {missing}", file=sys.stderr)
        warm = _resources(topo)
        t0 = topo.t0 = time.monotonic()
        with topo.lock:
            topo.window = (dict(topo.delivered), {})
        progress = Progress(args.duration)
        pending = list(schedule)
        while not stop.requested:
            now = time.monotonic()
            elapsed = now - t0
            if elapsed >= args.duration:
                break
            while pending and pending[0].at_s <= elapsed and not _recovering(faults, now):
                fault = pending.pop(0)
                faults.append(injector.inject(fault, now))
                faults[-1].deferred_s = max(0.0, elapsed - fault.at_s)
            injector.due(now, faults)
            topo.reap(now)
            _track_recovery(topo, faults, now)
            if not minute5 and elapsed >= GROWTH_FROM_S:
                minute5 = _resources(topo)
            progress.update(
                elapsed,
                f"faults {sum(f.injected for f in faults)}/{len(schedule)}  "
                f"crashes {len(topo.crashes)}  load {os.getloadavg()[0]:.1f}",
            )
            time.sleep(0.1)
        interrupted = stop.requested
        held_s = time.monotonic() - t0
        with topo.lock:
            topo.window = (topo.window[0], dict(topo.delivered))
        # the last faults get their recovery time: until every affected client delivered
        # again, at most RECOVERY_TIMEOUT_S after the fault (load is not counted any more)
        while not interrupted and not stop.requested:
            grace = max((f.at + f.timeout_s for f in faults if f.injected), default=0.0)
            if time.monotonic() >= grace and not any(f.pending for f in faults):
                break
            if all(len(f.recovered) == len(f.affected) and not f.pending for f in faults):
                break
            injector.due(time.monotonic(), faults)
            topo.reap(time.monotonic())
            _track_recovery(topo, faults, time.monotonic())
            time.sleep(0.1)
        end = _resources(topo)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if progress is not None:
            progress.close()
        if probe is not None:
            probe.stop.set()
        injector.cleanup()
        topo.stop_all(STOP_ORDER)
        stop.restore()
        net_left = net.close()
    files_left = _files_left(work)
    if "spark" in topo.roles:  # read before the working directory goes
        topo.spark_batches = spark_batches(work / "spark")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    leftovers = _leftovers(topo, work, shm_before, args.keep)
    if work.exists() and not args.keep:
        leftovers["files"] = [str(work)]
    if net_left:
        leftovers["network"] = net_left
    report = build_report(topo, faults, args, held_s, warm, end, leftovers, interrupted)
    report["files_left_in_work_dir_at_stop"] = files_left
    if minute5:
        report["resources"]["minute_5"] = minute5
        report["resources"]["growth_minute_5_to_end"] = _growth(minute5, end)
    report["host_b_network"] = net.describe()
    # each fault waits for the previous one's recovery (_recovering): how many the run reached
    deferred = [f.deferred_s for f in faults]
    report["faults_planned"] = len(schedule)
    report["faults_not_reached"] = len(schedule) - len(faults)
    report["fault_deferral_max_s"] = round(max(deferred), 1) if deferred else 0.0
    report["fault_kinds_skipped"] = skipped_kinds
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps(report, default=str), flush=True)
    else:
        print(render(report), flush=True)
    failed = (
        report["unaccounted_frames"]
        or report["crashes"]
        or report["leftovers"]
        or report["faults_survived"] < report["faults_injected"]
    )
    if interrupted:
        return 130
    return 1 if failed else 0
