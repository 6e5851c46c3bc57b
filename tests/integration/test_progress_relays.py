"""The rate limiter and the bridge sender ask for progress when they forward it (issue #29;
Wire §10.1.2, §10.2.2; RateLimiter Spec §6.1; Bridge Spec §5, §8).

A producer publishes ``FrameProgress`` only while a consumer asked for it in its
``ConsumerHello`` (``supportsProgress``, §10.2.2's "only publish when at least one subscriber
has supports_progress=true"). A relay configured with ``forward_progress`` must therefore ask,
or it has nothing to forward. Real processes: `tensorpool driver`, a producer process attached
through it (tests/integration/progress_roles.py ``--driver``, publishing progress only when
asked), and `tensorpool ratelimiter` / `tensorpool bridge` (sender). The test process taps the
shared control stream for the relay's hello and the relay's output stream for the forwarded
``FrameProgress``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from driver_fixtures import CONTROL_CHANNEL, CONTROL_STREAM, DriverProcess, driver_toml
from jsonlines_proc import JsonLinesProcess

from tensorpool.client.conductor import ContextConductor
from tensorpool.specs.generated import wire
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.slow
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
ROLE = str(Path(__file__).with_name("progress_roles.py"))
RL_SOURCE, RL_DEST, BRIDGE_SOURCE = 10001, 10003, 10002  # provisioned by driver_toml
RL_PROGRESS_OUT = 2201
POLICIES = {"lease_keepalive_interval_ms": 500, "lease_expiry_grace_intervals": 60}
STEPS = 4
_TRUE = int(wire.Bool.TRUE)


@pytest.fixture(scope="module")
def deployment(media_driver) -> Iterator[dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="tp-progress-relays-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(driver_toml(base, media_driver.dir, policies=POLICIES))
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start().wait_ready()
    ctx = AeronContext(TransportConfig(aeron_dir=media_driver.dir)).start()
    hub = ContextConductor.acquire(ctx)
    yield {"work": work, "base": base, "driver_config": cfg, "md": media_driver.dir, "hub": hub}
    hub.release()
    ctx.close()
    daemon.stop()
    shutil.rmtree(work, ignore_errors=True)


class Source(JsonLinesProcess):
    """The producer process: claims 1 KiB frames and reports progress in STEPS steps."""

    def __init__(self, dep: dict[str, Any], stream_id: int) -> None:
        super().__init__(
            [sys.executable, ROLE, "--driver", "--aeron-dir", dep["md"],
             "--shm-base-dir", dep["base"], "--stream-id", str(stream_id),
             "--control-channel", CONTROL_CHANNEL, "--control-stream-id", str(CONTROL_STREAM),
             "--rows", str(STEPS), "--cols", "256", "--steps", str(STEPS)],
        )  # fmt: skip
        self.wait_event("ready", timeout=90)

    def do(self, command: str, answer: str) -> dict:
        self.send(command)
        return self.next_event(answer)

    def frame(self) -> int:
        seq = self.do("claim", "claimed")["seq"]
        for k in range(STEPS):
            self.do(f"step {k}", "stepped")
        self.do("commit", "committed")
        return seq


def _spin(pred: Callable[[], bool], what: str, hub: ContextConductor, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        hub.poll()
        time.sleep(0.005)


def _progress_hello(hub: ContextConductor, hellos: Any, stream_id: int, source: Source) -> None:
    """Until a ConsumerHello for ``stream_id`` asks for progress (supportsProgress)."""
    asked: list[int] = []

    def asked_for_progress() -> bool:
        for dec, _raw, _join in hellos.drain():
            if dec.stream_id == stream_id:
                asked.append(dec.supports_progress_raw)
        return _TRUE in asked

    _spin(asked_for_progress, f"a hello for stream {stream_id} with supportsProgress", hub)
    assert source.do("stats", "stats")["interested"] >= 1  # and the producer took it so


def _forwarded(
    hub: ContextConductor, out: Any, source: Source, stream_id: int, what: str
) -> list[Any]:
    """Write frames until FrameProgress naming ``stream_id`` comes out of ``out``."""
    got: list[Any] = []

    def arrived() -> bool:
        got.extend(d for d, _raw, _j in out.drain() if d.stream_id == stream_id)
        return bool(got)

    deadline = time.monotonic() + 90
    while not arrived():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        source.frame()
        for _ in range(20):
            hub.poll()
            time.sleep(0.005)
    return got


def _rl_toml(dep: dict[str, Any]) -> str:
    path = os.path.join(dep["work"], "rl.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "rl-progress"
descriptor_channel = "aeron:ipc?term-length=16m"
descriptor_stream_id = 2100
max_rate_hz = 0
forward_progress = true
control_channel = "{CONTROL_CHANNEL}"
source_control_stream_id = {CONTROL_STREAM}
dest_control_stream_id = {RL_PROGRESS_OUT}

[[mappings]]
source_stream_id = {RL_SOURCE}
dest_stream_id = {RL_DEST}
profile = "small"

[driver]
aeron_dir = "{dep["md"]}"
control_channel = "{CONTROL_CHANNEL}"
config = "{dep["driver_config"]}"

[shm]
base_dir = "{dep["base"]}"
"""
    )
    return path


def test_s6_1_rate_limiter_with_forward_progress_asks_for_progress_and_forwards_it(
    deployment,
) -> None:
    """RateLimiter §6.1 with Wire §10.2.2: `tensorpool ratelimiter` with forward_progress says
    supportsProgress in its source consumer's hello, so the source producer publishes progress
    at all, and the rate limiter republishes it on dest_control_stream_id for its destination."""
    dep = deployment
    hub: ContextConductor = dep["hub"]
    hellos = hub.tap(CONTROL_CHANNEL, CONTROL_STREAM, (wire.ConsumerHelloDecoder,))
    out = hub.tap("aeron:ipc", RL_PROGRESS_OUT, (wire.FrameProgressDecoder,))
    source = Source(dep, RL_SOURCE)
    rl = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "ratelimiter", "--config", _rl_toml(dep)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(dep["work"], "rl.log"), "wb"),  # noqa: SIM115
    )
    try:
        _progress_hello(hub, hellos, RL_SOURCE, source)
        got = _forwarded(hub, out, source, RL_DEST, "FrameProgress on the destination")
        assert all(d.header_index == d.frame_id & 15 for d in got)  # the destination's ring
    finally:
        stop_process(rl)
        stop_process(source.proc)
        hub.unregister(hellos)
        hub.unregister(out)


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sender_toml(dep: dict[str, Any], control: str) -> str:
    path = os.path.join(dep["work"], "bridge.toml")
    Path(path).write_text(
        f"""
[bridge]
instance_id = "bridge-progress"
role = "sender"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{_udp_port()}"
payload_stream_id = 3000
control_channel = "{control}"
control_stream_id = 3001
forward_progress = true

[local]
aeron_dir = "{dep["md"]}"
driver_mode = true
shm_base_dir = "{dep["base"]}"
control_channel = "{CONTROL_CHANNEL}"
control_stream_id = {CONTROL_STREAM}
announce_period_ms = 200

[[mappings]]
source_stream_id = {BRIDGE_SOURCE}
dest_stream_id = 20050
profile = "small"
source_control_stream_id = {CONTROL_STREAM}
dest_control_stream_id = 2202
"""
    )
    return path


def test_bridge_sender_with_forward_progress_asks_for_progress_and_forwards_it(
    deployment,
) -> None:
    """Bridge §5/§8 with Wire §10.2.2: `tensorpool bridge` (sender) with forward_progress says
    supportsProgress in its source consumer's hello, so the source producer publishes progress,
    and the sender forwards it on the bridge control channel."""
    dep = deployment
    hub: ContextConductor = dep["hub"]
    control = f"aeron:udp?endpoint=127.0.0.1:{_udp_port()}"
    hellos = hub.tap(CONTROL_CHANNEL, CONTROL_STREAM, (wire.ConsumerHelloDecoder,))
    out = hub.tap(control, 3001, (wire.FrameProgressDecoder,))
    source = Source(dep, BRIDGE_SOURCE)
    bridge = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "bridge", "--config", _sender_toml(dep, control)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(dep["work"], "bridge.log"), "wb"),  # noqa: SIM115
    )
    try:
        _progress_hello(hub, hellos, BRIDGE_SOURCE, source)
        _forwarded(hub, out, source, BRIDGE_SOURCE, "FrameProgress on the bridge control channel")
    finally:
        stop_process(bridge)
        stop_process(source.proc)
        hub.unregister(hellos)
        hub.unregister(out)
