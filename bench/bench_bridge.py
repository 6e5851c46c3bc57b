"""640 KiB frames from host A to host B over loopback UDP (GitHub issue 9).

Run: ``.venv/bin/python -m bench.bench_bridge`` (≈ 60 s: two profiles × (setup + 3 s warm-up
+ 8 s measured) plus the micro rows; ``--quick`` ≈ 35 s). Prints one markdown table.

Topology — two "hosts" on one machine, nothing shared but 127.0.0.1:

    host A: media driver A, producer (standalone), `tensorpool bridge` (sender)
    host B: media driver B, `tensorpool bridge` (receiver, standalone destination), consumer

Every box is its own process. The producer is paced (``--rate``, default 3000 frames/s, more
than any profile carries) so the numbers show what the bridge delivers, not how fast one core
can memcpy; frames the bridge cannot take are dropped at the sender and counted. The
consumer on B polls, touches one byte per 4 KiB page of each frame and confirms it with
``is_current()``: "consumed on B" counts only frames a local application really got.

Profiles: **default** — Aeron's default MTU 1408, chunks of 1408 - 128 = 1280 bytes (512
chunks per frame); **jumbo** — ``mtu=8992`` on the channel (the largest multiple of 32 not
above 9000), ``mtu_bytes = 9000``, ``chunk_bytes = 8192`` (80 chunks per frame). Baseline:
the Julia reference implementation's published 640 KiB results (1,035 frames/s at MTU 1408;
1,553 frames/s with 8 KiB chunks / MTU 9000), reported in the same table as a ratio.

CPU: user + system time of each process over the measured window (``/proc/<pid>/stat``),
in cores (1.0 = one core busy), so the table shows where the time goes. The micro rows time
the two Python hot paths alone (CPU time, best of several rounds): the receiver core per
chunk (one at a time, and in the staged runs the receiver agent uses), and the sender per
frame for both send strategies. ``--profiles ''`` runs the micro rows alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import islice, takewhile
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

from bench import free_ports
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.mediadriver import MediaDriverProcess

JULIA_FPS: Final = {"default": 1035.0, "jumbo": 1553.0}
FRAME_BYTES: Final = 655360
SRC: Final = 10000
DEST: Final = 20000
SHM_ROOT: Final = "/dev/shm" if os.path.isdir("/dev/shm") else None
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")

PROFILES: Final = {
    "default": {"mtu": None, "mtu_bytes": 1408, "chunk_bytes": 0},
    "jumbo": {"mtu": 8992, "mtu_bytes": 9000, "chunk_bytes": 8192},
}


# --------------------------------------------------------------------------- workers


def _emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def _settings(aeron_dir: str, base: str) -> Any:
    from tensorpool.client.settings import ClientSettings

    return ClientSettings(
        transport=TransportConfig(aeron_dir=aeron_dir),
        shm_base_dir=base,
        announce_period_ns=200_000_000,
    )


def run_producer(a: argparse.Namespace) -> None:
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.transport.context import AeronContext

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    s = _settings(a.aeron_dir, a.shm_base_dir)
    stream = StreamConfig(SRC, header_nslots=64, pools=(PoolConfig(1, 1 << 20),))
    with AeronContext(s.transport) as ctx:
        p = Producer(ctx, stream, s, instance_id="bench-producer")
        frame = np.random.default_rng(1).integers(0, 255, a.frame_bytes, dtype=np.uint8)
        period = 1.0 / a.rate
        start = time.monotonic()
        sent = 0
        next_report = start + 0.5
        while not stop:
            now = time.monotonic()
            due = start + sent * period
            if now < due:
                p.do_work()
                time.sleep(min(due - now, 0.0005))
                continue
            if now - due > 0.05:  # fell behind (CPU starved): skip, do not burst
                start = now - sent * period
            frame[:8] = np.frombuffer(sent.to_bytes(8, "little"), np.uint8)
            p.offer(frame)
            sent += 1
            if now >= next_report:
                next_report += 0.5
                p.do_work()
                _emit(t=time.monotonic(), frames=sent)
        p.close()


def run_consumer(a: argparse.Namespace) -> None:
    from tensorpool.client.consumer import Consumer, Frame
    from tensorpool.transport.context import AeronContext

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    s = _settings(a.aeron_dir, a.shm_base_dir)
    got = 0
    nbytes = 0
    touched = 0

    def handler(f: Frame) -> None:
        nonlocal got, nbytes, touched
        arr = f.array
        touched += int(arr.reshape(-1).view(np.uint8)[::4096].sum())
        if f.is_current():
            got += 1
            nbytes += f.values_len_bytes

    with AeronContext(s.transport) as ctx:
        c = Consumer(ctx, DEST, s)
        next_report = time.monotonic() + 0.5
        while not stop:
            if not c.poll(handler, 16):
                time.sleep(0.0001)
            now = time.monotonic()
            if now >= next_report:
                next_report += 0.5
                _emit(t=now, frames=got, bytes=nbytes, epoch=c.epoch,
                      drops_gap=c.drops_gap, drops_late=c.drops_late)  # fmt: skip
        c.close()


def run_udp_sub(a: argparse.Namespace) -> None:
    """Raw Aeron UDP baseline, receiving side: count messages, touch nothing."""
    from tensorpool.transport.context import AeronContext

    n = [0, 0]

    def handler(buf: object, header: object) -> None:
        n[0] += 1
        n[1] += len(buf)  # type: ignore[arg-type]

    with AeronContext(TransportConfig(aeron_dir=a.aeron_dir)) as ctx:
        sub = ctx.add_subscription(a.channel, 3000, handler, fragment_limit=1024, guard=False)
        end = time.monotonic() + a.duration + 30
        next_report = time.monotonic() + 0.5
        while time.monotonic() < end:
            if not sub.poll():
                time.sleep(0.0001)
            if time.monotonic() >= next_report:
                next_report += 0.5
                _emit(t=time.monotonic(), msgs=n[0], bytes=n[1])


# --------------------------------------------------------------------------- orchestration

#: ``python -c`` body: run ``tensorpool`` (argv[2:]) under cProfile timed by CPU time, so
#: sleeps and yields of a starved process do not hide where its CPU goes; dump to argv[1].
_CPROFILE: Final = (
    "import cProfile, runpy, sys, time\n"
    "out = sys.argv[1]; sys.argv = ['tensorpool', *sys.argv[2:]]\n"
    "p = cProfile.Profile(time.process_time)\n"
    "try:\n    p.runcall(runpy.run_module, 'tensorpool', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    "finally:\n    p.dump_stats(out)\n"
)


def bridge_toml(
    role: str,
    aeron_dir: str,
    base: str,
    ports: list[int],
    prof: dict[str, Any],
    *,
    term: str = "16m",
    window: str = "4m",
) -> str:
    p_payload, p_control, p_meta = ports
    mtu = f"|mtu={prof['mtu']}" if prof["mtu"] else ""
    bufs = f"|rcv-wnd={window}|so-rcvbuf=4m" if role == "receiver" else "|so-sndbuf=4m"
    chunk = f"chunk_bytes = {prof['chunk_bytes']}\n" if prof["chunk_bytes"] else ""
    return f"""
[bridge]
instance_id = "bench-{role}"
role = "{role}"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{p_payload}|term-length={term}{mtu}{bufs}"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:{p_control}"
control_stream_id = 3001
metadata_channel = "aeron:udp?endpoint=127.0.0.1:{p_meta}"
metadata_stream_id = 3002
mtu_bytes = {prof["mtu_bytes"]}
{chunk}
[local]
aeron_dir = "{aeron_dir}"
driver_mode = false
shm_base_dir = "{base}"
announce_period_ms = 200

[profiles.cam]
header_nslots = 64
payload_pools = [{{ pool_id = 1, stride_bytes = 1048576 }}]

[[mappings]]
source_stream_id = {SRC}
dest_stream_id = {DEST}
profile = "cam"
"""


def udp_ceiling(name: str, a: argparse.Namespace) -> dict[str, Any]:
    """The transport alone: the same two media drivers and channel parameters, a Python
    publisher sending whole frames of chunk-sized messages (constant bytes, no SHM, no
    staging) whenever the flow-control window has room for one, a subscriber that only
    counts messages. What the bridge carries can be compared with it directly."""
    from tensorpool.bridge.chunker import NO_HEADER_OVERHEAD
    from tensorpool.bridge.config import effective_chunk_bytes
    from tensorpool.transport.context import AeronContext

    prof = PROFILES[name]
    chunk = effective_chunk_bytes(prof["mtu_bytes"], prof["chunk_bytes"], 65535)
    per_frame = -(-a.frame_bytes // chunk)
    port = free_ports(1, udp=True)[0]
    base = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length={a.term}"
    if prof["mtu"]:
        base += f"|mtu={prof['mtu']}"
    mds = [MediaDriverProcess().start(), MediaDriverProcess().start()]
    sub = None
    try:
        sub = spawn("udp sub", ["-m", "bench.bench_bridge", "--worker", "udpsub", "--aeron-dir",
                                mds[1].dir, "--channel", f"{base}|rcv-wnd={a.window}|so-rcvbuf=4m",
                                "--duration", str(a.duration)], subprocess.DEVNULL)  # fmt: skip
        with AeronContext(TransportConfig(aeron_dir=mds[0].dir)) as ctx:
            pub = ctx.add_publication(base + "|so-sndbuf=4m", 3000, exclusive=False)
            raw = pub.publication
            while not pub.is_connected:
                time.sleep(0.01)
            msg = bytes(NO_HEADER_OVERHEAD + chunk)
            need = per_frame * ((len(msg) + 32 + 31) // 32 * 32)
            offer = raw.offer
            end = time.monotonic() + a.warmup + a.duration + 0.5
            t_mark = time.monotonic() + a.warmup
            mark: dict[str, Any] | None = None
            pid = sub.popen.pid
            while time.monotonic() < end:
                if raw.position_limit - raw.position < need:  # type: ignore[attr-defined]
                    time.sleep(0.0001)
                else:
                    for _ in range(per_frame):
                        while offer(msg) is not True:
                            pass
                if mark is None and time.monotonic() >= t_mark:
                    sub.drain()
                    mark = {"cpu_pub": time.process_time(), "cpu_sub": cpu_seconds(pid),
                            "line": sub.lines[-1] if sub.lines else None}  # fmt: skip
            sub.drain()
            assert mark is not None
            c0, c1 = mark["line"], sub.lines[-1]
            wall = c1["t"] - c0["t"]
            msgs_s = (c1["msgs"] - c0["msgs"]) / wall
            return {
                "msgs_s": msgs_s,
                "fps_equiv": msgs_s / per_frame,
                "mb_s": (c1["bytes"] - c0["bytes"]) / wall / 1e6,
                "chunks_per_frame": per_frame,
                "cpu_pub": (time.process_time() - mark["cpu_pub"]) / (a.duration + 0.5),
                "cpu_sub": (cpu_seconds(pid) - mark["cpu_sub"]) / (a.duration + 0.5),
            }
    finally:
        if sub is not None:
            sub.stop()
        for md in mds:
            md.stop()


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    lines: list[dict[str, Any]] = field(default_factory=list)

    def drain(self) -> None:
        out = self.popen.stdout
        assert out is not None
        while True:
            ready, _, _ = select.select([out], [], [], 0)
            if not ready:
                return
            line = out.readline()
            if not line:
                return
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(line))

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.drain()


def spawn(name: str, args: list[str], log: IO[bytes] | int) -> Proc:
    popen = subprocess.Popen(
        [sys.executable, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=log, text=True, bufsize=1,
    )  # fmt: skip
    return Proc(name, popen)


def run_profile(name: str, a: argparse.Namespace) -> dict[str, Any]:
    prof = PROFILES[name]
    work = tempfile.mkdtemp(prefix=f"tp-bench-bridge-{name}-", dir=SHM_ROOT)
    procs: list[Proc] = []
    mds: list[MediaDriverProcess] = []
    log = open(os.path.join(work, "processes.log"), "ab")  # noqa: SIM115
    try:
        md_a = MediaDriverProcess().start()
        mds.append(md_a)
        md_b = MediaDriverProcess().start()
        mds.append(md_b)
        base_a, base_b = os.path.join(work, "shm-a"), os.path.join(work, "shm-b")
        ports = free_ports(3, udp=True)
        cfg_a, cfg_b = os.path.join(work, "a.toml"), os.path.join(work, "b.toml")
        Path(cfg_a).write_text(
            bridge_toml("sender", md_a.dir, base_a, ports, prof, term=a.term, window=a.window)
        )
        Path(cfg_b).write_text(
            bridge_toml("receiver", md_b.dir, base_b, ports, prof, term=a.term, window=a.window)
        )
        me = ["-m", "bench.bench_bridge"]
        consumer = spawn("consumer B", [*me, "--worker", "consumer", "--aeron-dir", md_b.dir,
                                        "--shm-base-dir", base_b], log)  # fmt: skip
        procs.append(consumer)
        bridge_args = ["--json", "--report-interval", "1"]
        rx_run, tx_run = ["-m", "tensorpool"], ["-m", "tensorpool"]
        if a.cprofile:  # whole bridge processes under cProfile, CPU time (written at exit)
            os.makedirs(a.cprofile, exist_ok=True)
            rx_run = ["-c", _CPROFILE, f"{a.cprofile}/{name}.receiver.prof"]
            tx_run = ["-c", _CPROFILE, f"{a.cprofile}/{name}.sender.prof"]
        rx = spawn("bridge B (receiver)", [*rx_run, "bridge", "--config", cfg_b, *bridge_args],
                   log)  # fmt: skip
        procs.append(rx)
        tx_args = [*tx_run, "bridge", "--config", cfg_a, *bridge_args,
                   "--send-strategy", a.strategy]  # fmt: skip
        tx = spawn("bridge A (sender)", tx_args, log)
        procs.append(tx)
        rate = a.rate or 1.25 * JULIA_FPS[name]
        producer = spawn("producer A", [*me, "--worker", "producer", "--aeron-dir", md_a.dir,
                                        "--shm-base-dir", base_a, "--rate", str(rate),
                                        "--frame-bytes", str(a.frame_bytes)], log)  # fmt: skip
        procs.append(producer)
        # wait until frames flow end to end
        deadline = time.monotonic() + 30
        while True:
            for p in procs:
                p.drain()
            if consumer.lines and consumer.lines[-1]["frames"] > 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no frames reached host B; see {work}/processes.log")
            time.sleep(0.1)
        time.sleep(a.warmup)
        pids = {"producer A": producer.popen.pid, "bridge A (sender)": tx.popen.pid,
                "media driver A": md_a.pid, "media driver B": md_b.pid,
                "bridge B (receiver)": rx.popen.pid, "consumer B": consumer.popen.pid}  # fmt: skip
        for p in procs:
            p.drain()
        c0, p0 = consumer.lines[-1], producer.lines[-1]
        cpu0 = {k: cpu_seconds(v) for k, v in pids.items() if v}
        t0 = time.monotonic()
        time.sleep(a.duration)
        for p in procs:
            p.drain()
        c1, p1 = consumer.lines[-1], producer.lines[-1]
        wall = time.monotonic() - t0
        cpu = {k: (cpu_seconds(v) - cpu0.get(k, 0.0)) / wall for k, v in pids.items() if v}
        dt = c1["t"] - c0["t"]
        result = {
            "profile": name,
            "consumed_fps": (c1["frames"] - c0["frames"]) / dt,
            "consumed_mb_s": (c1["bytes"] - c0["bytes"]) / dt / 1e6,
            "produced_fps": (p1["frames"] - p0["frames"]) / (p1["t"] - p0["t"]),
            "cpu": cpu,
        }
    finally:
        for p in reversed(procs):
            p.stop()
        for md in mds:
            md.stop()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    for row in reversed(tx.lines):
        if row.get("final"):
            result["sender_drops"] = row.get("drops", {})
            result["sender_frames"] = row.get("frames", 0)
            break
    for row in reversed(rx.lines):
        if row.get("final"):
            result["receiver_drops"] = {**row.get("chunk_drops", {}), **row.get("frame_drops", {})}
            result["receiver_frames"] = row.get("frames", 0)
            break
    return result


# --------------------------------------------------------------------------- micro rows


def micro_rows(rounds: int) -> list[tuple[str, float, str]]:
    """Per-chunk receiver core cost and per-frame sender cost, CPU time, best of rounds."""
    from tensorpool.bridge.assembler import (
        RUN_HEAD,
        ReceiverCore,
        ReceiverMapping,
        SourceAnnounce,
    )
    from tensorpool.bridge.chunker import Chunker
    from tensorpool.bridge.sender import ChunkSender
    from tensorpool.shm.layout import SLOT_FIELDS, SLOT_FIELDS_OFFSET, TENSOR_BLOB_OFFSET
    from tensorpool.shm.tensor import TensorLayout
    from tensorpool.transport.context import AeronContext

    rows: list[tuple[str, float, str]] = []
    layout = TensorLayout.contiguous((FRAME_BYTES,), np.uint8)
    payload = np.random.default_rng(2).integers(0, 255, FRAME_BYTES, dtype=np.uint8)

    def header(seq: int) -> bytes:
        b = bytearray(256)
        b[:8] = ((seq << 1) | 1).to_bytes(8, "little")
        SLOT_FIELDS.pack_into(b, SLOT_FIELDS_OFFSET, FRAME_BYTES, seq & 63, 1, 0, seq, 0)
        b[TENSOR_BLOB_OFFSET:] = layout.blob
        return bytes(b)

    for name, chunk in (("default", 1280), ("jumbo", 8192)):
        chunker = Chunker(chunk)
        frames = [
            chunker.encode_frame(stream_id=SRC, epoch=1, seq=s, header=header(s), payload=payload)
            for s in range(1, 11)
        ]
        best = float("inf")
        for _ in range(rounds):
            core = ReceiverCore([ReceiverMapping(0, SRC, DEST)], chunk_bound=chunk,
                                max_payload_bytes=1 << 30, assembly_timeout_ns=10**9)  # fmt: skip
            core.on_announce(SourceAnnounce(SRC, 1, 1, 64, 256, ((1, 64, 1 << 20),)), 0)
            core.destination_ready(0, header_nslots=64, max_stride=1 << 20, dest_stream_id=DEST)
            on_chunk = core.on_chunk
            t0 = time.process_time()
            for f in frames:
                for m in f:
                    on_chunk(m, 0)
            best = min(best, (time.process_time() - t0) / len(frames))
            assert core.stats(0).frames == len(frames)
        n = len(frames[0])
        rows.append((f"receiver core, {name} ({n} chunks/frame)", best,
                     f"{best / n * 1e9:.0f} ns/chunk"))  # fmt: skip
        # The receiver agent's way (#15): full-size middle chunks are only copied into a
        # staging row (BridgeReceiver._chunk_handler), each poll's rows go to on_chunk_run at
        # once; any other chunk flushes and goes one by one. Polls of 256 messages.
        stride = RUN_HEAD + chunk
        staging = np.zeros((256, stride), np.uint8)
        row_views = [memoryview(r) for r in staging]
        msgs = [m for f in frames for m in f]
        polls = [msgs[i : i + 256] for i in range(0, len(msgs), 256)]
        best_run = float("inf")
        for _ in range(rounds):
            core = ReceiverCore([ReceiverMapping(0, SRC, DEST)], chunk_bound=chunk,
                                max_payload_bytes=1 << 30, assembly_timeout_ns=10**9)  # fmt: skip
            core.on_announce(SourceAnnounce(SRC, 1, 1, 64, 256, ((1, 64, 1 << 20),)), 0)
            core.destination_ready(0, header_nslots=64, max_stride=1 << 20, dest_stream_id=DEST)
            on_chunk, on_run = core.on_chunk, core.on_chunk_run
            t0 = time.process_time()
            for poll in polls:
                k = 0
                for m in poll:
                    if len(m) == stride:
                        row_views[k][:] = m
                        k += 1
                        continue
                    if k:
                        for _r in on_run(staging, k, 0):
                            pass
                        k = 0
                    on_chunk(m, 0)
                if k:
                    for _r in on_run(staging, k, 0):
                        pass
            best_run = min(best_run, (time.process_time() - t0) / len(frames))
            assert core.stats(0).frames == len(frames)
        rows.append((f"receiver core, {name}, staged runs", best_run,
                     f"{best_run / n * 1e9:.0f} ns/chunk (copy to staging row + on_chunk_run), "
                     f"{best / best_run:.1f}x"))  # fmt: skip

    ctx = AeronContext(TransportConfig(pre_touch_mapped_memory=True)).start()
    try:
        channel = "aeron:ipc?term-length=8m|mtu=8992"
        pub = ctx.add_publication(channel, 9, exclusive=False)
        sub = ctx.add_subscription(channel, 9, lambda b, h: None, fragment_limit=4096,
                                   guard=False)  # fmt: skip
        while not pub.is_connected:
            time.sleep(0.01)
        hdr = memoryview(header(1))
        pmv = memoryview(payload)
        max_claim = int(pub.publication.max_payload_length)
        for name, chunk in (("default", 1280), ("jumbo", 8192)):
            for strategy in ("staging", "claim"):
                cs = ChunkSender(pub, chunk, max_claim, stream_id=SRC, strategy=strategy)
                best = float("inf")
                for _ in range(rounds):
                    total = 0.0
                    for k in range(8):
                        raw = pub.publication
                        while raw.position_limit - raw.position < 2 * FRAME_BYTES:  # type: ignore[union-attr]
                            sub.poll(4096)  # let the driver move the limit (no timing here)
                        t0 = time.process_time()
                        r = cs.send(SRC, 1, k, hdr, pmv, lambda: True)
                        total += time.process_time() - t0
                        assert r is None, r
                        while sub.poll(4096):
                            pass
                    best = min(best, total / 8)
                rows.append((f"sender, {name}, {strategy}", best, f"{1 / best:,.0f} frames/s max"))
            # the floor under any sender: the frame's messages (already encoded, laid out as
            # the staging buffer holds them) offered by a C-level loop, no Python per chunk;
            # and the raw baseline's way: one hot chunk-sized buffer offered as often
            msgs = b"".join(
                Chunker(chunk).encode_frame(stream_id=SRC, epoch=1, seq=1, header=hdr,
                                            payload=pmv)
            )  # fmt: skip
            mv = memoryview(msgs)
            views, pos = [], 0
            for i, _off, n in Chunker(chunk).spans(FRAME_BYTES):
                size = Chunker.message_length(i, n)
                views.append(mv[pos : pos + size])
                pos += size
            one = bytes(views[1])
            for label, items in (
                ("staged messages", views),
                ("one hot buffer", [one] * len(views)),
            ):
                best = float("inf")
                for _ in range(rounds * 8):
                    raw = pub.publication
                    while raw.position_limit - raw.position < 2 * FRAME_BYTES:  # type: ignore[union-attr]
                        sub.poll(4096)
                    t0 = time.process_time()
                    sent = 0
                    while sent < len(items):  # a refusal is the log rotating: offer again
                        sent += sum(takewhile(bool, map(raw.offer, islice(items, sent, None))))  # type: ignore[union-attr]
                    best = min(best, time.process_time() - t0)
                    while sub.poll(4096):
                        pass
                each = f"{len(items)} offers, {best / len(items) * 1e9:.0f} ns each"
                rows.append((f"offers alone, {name}, {label}", best, each))
    finally:
        ctx.close()
    return rows


def sender_backpressure_cpu(seconds: float, rate: float) -> dict[str, float]:
    """The sender's own CPU while its window stays full and frames keep arriving.

    In the end-to-end runs the window is full most of the time (the producer offers 1.25x
    what the transport carries): every frame arriving meanwhile is read and dropped
    (back_pressured). One process: an embedded media driver, a producer of 640 KiB frames
    at ``rate``, a :class:`BridgeSender` whose payload subscriber never reads, and the
    ``tensorpool bridge`` idle strategy (backoff, 200 µs park); the producer's own CPU is
    subtracted (thread CPU time around each offer)."""
    from tensorpool.bridge.config import parse_bridge_config
    from tensorpool.bridge.sender import BridgeSender
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.idle import idle_strategy

    ch = "aeron:ipc?term-length=4m"
    base = tempfile.mkdtemp(prefix="tp-bench-bridge-bp-", dir=SHM_ROOT)
    try:
        with AeronContext(TransportConfig()) as ctx:
            doc = {
                "bridge": {
                    "instance_id": "bp", "role": "sender", "payload_channel": ch,
                    "payload_stream_id": 901, "control_channel": ch, "control_stream_id": 902,
                    "metadata_channel": ch, "metadata_stream_id": 903,
                    "forward_metadata": False, "mtu_bytes": 1408,
                },
                "local": {"aeron_dir": ctx.dir, "driver_mode": False, "shm_base_dir": base},
                "profiles": {"p": {"header_nslots": 64,
                                   "payload_pools": [{"pool_id": 1, "stride_bytes": 1 << 20}]}},
                "mappings": [{"source_stream_id": SRC, "dest_stream_id": DEST, "profile": "p"}],
            }  # fmt: skip
            cfg = parse_bridge_config(doc)
            stuck = ctx.add_subscription(ch, 901, lambda b, h: None)
            ann = ctx.add_subscription(ch, 902, lambda b, h: None)
            sender = BridgeSender(ctx, cfg)
            stream = StreamConfig(SRC, header_nslots=64, pools=(PoolConfig(1, 1 << 20),))
            prod = Producer(ctx, stream, cfg.local.client_settings())
            try:
                frame = np.zeros(FRAME_BYTES, np.uint8)
                sm = sender.mappings[0]
                deadline = time.monotonic() + 30
                while not sm.chunks.pending:  # until a staged frame waits for window
                    if time.monotonic() > deadline:
                        raise RuntimeError("the sender never filled its window")
                    prod.do_work()
                    if sm.consumer.is_mapped:
                        prod.offer(frame)
                    sender.do_work()
                idle = idle_strategy("backoff", max_park_ns=200_000)
                tt = time.thread_time
                prod_cpu, arrived, cycles = 0.0, 0, 0
                t0 = next_due = time.monotonic()
                c0 = tt()
                while (now := time.monotonic()) - t0 < seconds:
                    if now >= next_due:
                        c = tt()
                        prod.offer(frame)
                        prod.do_work()
                        prod_cpu += tt() - c
                        arrived += 1
                        next_due += 1 / rate
                    idle.idle(sender.do_work())
                    cycles += 1
                cpu = tt() - c0 - prod_cpu
                assert sm.chunks.pending, "the window opened: not a back-pressure measurement"
            finally:
                prod.close()
                sender.close()
                ctx.release(stuck)
                ctx.release(ann)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"cores": cpu / seconds, "arrived_s": arrived / seconds, "cycles_s": cycles / seconds}


# --------------------------------------------------------------------------- report


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_bridge")
    ap.add_argument("--worker", choices=("producer", "consumer", "udpsub"), help=argparse.SUPPRESS)
    ap.add_argument("--channel", help=argparse.SUPPRESS)
    ap.add_argument("--aeron-dir", help=argparse.SUPPRESS)
    ap.add_argument("--shm-base-dir", help=argparse.SUPPRESS)
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="producer frames/s (paced); default 1.25 x the Julia reference of each profile",
    )
    ap.add_argument("--frame-bytes", type=int, default=FRAME_BYTES)
    ap.add_argument("--duration", type=float, default=8.0, help="measured seconds per profile")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--profiles", default="default,jumbo")
    ap.add_argument("--strategy", choices=("staging", "claim"), default="staging")
    ap.add_argument("--term", default="16m", help="payload channel term-length")
    ap.add_argument("--window", default="2m", help="payload channel rcv-wnd (so-rcvbuf is 4m)")
    ap.add_argument("--quick", action="store_true", help="4 s measured, 2 s warm-up")
    ap.add_argument("--no-micro", action="store_true")
    ap.add_argument(
        "--cprofile",
        metavar="DIR",
        help="run both bridge processes under cProfile, writing DIR/<profile>.<role>.prof",
    )
    ap.add_argument("--json", action="store_true", help="also print raw results as JSON")
    a = ap.parse_args()
    if a.worker == "producer":
        return run_producer(a)
    if a.worker == "consumer":
        return run_consumer(a)
    if a.worker == "udpsub":
        return run_udp_sub(a)
    if a.quick:
        a.duration, a.warmup = 4.0, 2.0
    names = [p.strip() for p in a.profiles.split(",") if p.strip()]
    results = [run_profile(p, a) for p in names]
    ceilings = {p: udp_ceiling(p, a) for p in names}
    micro = [] if a.no_micro else micro_rows(3)
    bp = None if a.no_micro else sender_backpressure_cpu(3.0, 1.25 * JULIA_FPS["default"])
    load = os.getloadavg()
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {load[0]:.1f} / {load[1]:.1f}; "
          f"{a.frame_bytes // 1024} KiB frames, producer paced at "
          f"{a.rate or 1.25:.{0 if a.rate else 2}f}{'/s' if a.rate else ' x reference'}, "
          f"{a.duration:.0f} s measured after {a.warmup:.0f} s warm-up\n")  # fmt: skip
    print(
        "| profile | produced on A (frames/s) | consumed on B (frames/s) | MB/s "
        "| Julia reference (frames/s) | ratio | sender drops | receiver drops |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for r in results:
        ref = JULIA_FPS[r["profile"]]
        sd = ", ".join(f"{k}={v}" for k, v in sorted(r.get("sender_drops", {}).items())) or "-"
        rd = ", ".join(
            f"{k}={v}" for k, v in sorted(r.get("receiver_drops", {}).items())
            if k != "duplicate_chunk"
        ) or "-"  # fmt: skip
        print(f"| {r['profile']} | {r['produced_fps']:,.0f} | {r['consumed_fps']:,.0f} | "
              f"{r['consumed_mb_s']:,.0f} | "
              f"{ref:,.0f} | {r['consumed_fps'] / ref:.2f} | {sd} | {rd} |")  # fmt: skip
    print("\nSame run, same media drivers and channel parameters, transport alone: whole "
          "frames of chunk-sized messages offered whenever the window has room, a subscriber "
          "that only counts them:\n")  # fmt: skip
    print("| profile | raw Aeron UDP msgs/s | = frames/s | MB/s | bridge / raw | "
          "publisher CPU | counting subscriber CPU |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        c = ceilings[r["profile"]]
        print(f"| {r['profile']} ({c['chunks_per_frame']} chunks/frame) | {c['msgs_s']:,.0f} | "
              f"{c['fps_equiv']:,.0f} | {c['mb_s']:,.0f} | "
              f"{r['consumed_fps'] / c['fps_equiv']:.2f} | {c['cpu_pub']:.2f} | "
              f"{c['cpu_sub']:.2f} |")  # fmt: skip
    print("\nCPU per process over the measured window (cores; 1.00 = one core busy):\n")
    names = list(results[0]["cpu"]) if results else []
    print("| process | " + " | ".join(r["profile"] for r in results) + " |")
    print("| --- | " + " | ".join("---:" for _ in results) + " |")
    for n in names:
        print(f"| {n} | " + " | ".join(f"{r['cpu'].get(n, 0):.2f}" for r in results) + " |")
    total = " | ".join(f"{sum(r['cpu'].values()):.2f}" for r in results)
    print(f"| **total** | {total} |")
    if micro:
        print("\nHot paths alone (CPU time per 640 KiB frame, best of 3):\n")
        print("| path | µs/frame | note |")
        print("| --- | ---: | --- |")
        for name, secs, note in micro:
            print(f"| {name} | {secs * 1e6:,.0f} | {note} |")
    if bp is not None:
        print(f"\nSender CPU while its window stays full, 640 KiB frames arriving at "
              f"{bp['arrived_s']:,.0f}/s (all dropped, back_pressured): {bp['cores']:.3f} cores, "
              f"{bp['cycles_s']:,.0f} duty cycles/s\n")  # fmt: skip
    if a.json:
        print(json.dumps({"results": results, "ceilings": ceilings, "micro": micro,
                          "sender_backpressure": bp}, indent=2, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
