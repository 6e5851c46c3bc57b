"""The rate limiter's destination rollover does not block (#14.3, RateLimiter §5 "MUST NOT
block").

Real parts: the SHM driver daemon (a subprocess) on a standalone media driver, two source
producers attached through it, a :class:`RateLimiterAgent` with two unlimited mappings in this
process (so the test sees each duty cycle), and destination consumers. Source A restarts
(new source epoch, seq from 0): mapping A has to give up its destination epoch and attach
again. That rollover must not stall the agent: the duty cycle that starts it returns with
the new attach still in flight, mapping B keeps relaying in the cycles until A's new
destination epoch arrives, and none of B's leases is lost. Behaviour only, no timing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from driver_fixtures import CONTROL_CHANNEL, CONTROL_STREAM, DriverProcess, driver_toml

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import Producer
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.ratelimiter.agent import RateLimiterAgent
from tensorpool.ratelimiter.config import load_ratelimiter_config
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
SRC_A, SRC_B = 10000, 10001  # provisioned in driver_toml (profile "small")
DST_A, DST_B = 10002, 10003
SRC_DESCRIPTORS = 1100
DEST_DESCRIPTORS = 2100
# 100 ms keepalives, 30 missed ones expire a lease: a stall of 3 s (the synchronous
# rollover could take up to 11 s) loses B's leases; setup stalls (the blocking startup
# attaches of the agent, the consumers and the sources here) stay well below that
POLICIES = {"lease_keepalive_interval_ms": 100, "lease_expiry_grace_intervals": 30}


@pytest.fixture
def deployment(media_driver) -> Iterator[dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="tp-rl-roll-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(driver_toml(base, media_driver.dir, policies=POLICIES))
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start().wait_ready()
    ctx = AeronContext(TransportConfig(aeron_dir=media_driver.dir)).start()
    try:
        yield {"work": work, "base": base, "driver_config": cfg, "md": media_driver.dir,
               "ctx": ctx, "daemon": daemon}  # fmt: skip
    finally:
        ctx.close()
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


def settings(dep: dict[str, Any], descriptors: int) -> ClientSettings:
    return ClientSettings(
        transport=dep["ctx"].config,
        channels=Endpoints(
            control_channel=CONTROL_CHANNEL,
            control_stream_id=CONTROL_STREAM,
            descriptor_stream_id=descriptors,
        ),
        shm_base_dir=dep["base"],
    )


def source(dep: dict[str, Any], stream_id: int) -> Producer:
    p = Producer(dep["ctx"], stream_id, settings(dep, SRC_DESCRIPTORS), driver=True)
    p.wait_until_attached()
    return p


def rl_config(dep: dict[str, Any]) -> str:
    path = os.path.join(dep["work"], "rl.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "rl-rollover"
descriptor_channel = "aeron:ipc?term-length=16m"
descriptor_stream_id = {DEST_DESCRIPTORS}
max_rate_hz = 0

[[mappings]]
source_stream_id = {SRC_A}
dest_stream_id = {DST_A}
profile = "small"

[[mappings]]
source_stream_id = {SRC_B}
dest_stream_id = {DST_B}
profile = "small"

[driver]
aeron_dir = "{dep["md"]}"
control_channel = "{CONTROL_CHANNEL}"
control_stream_id = {CONTROL_STREAM}
descriptor_stream_id = {SRC_DESCRIPTORS}

[shm]
base_dir = "{dep["base"]}"

[policies]
lease_keepalive_interval_ms = 100
"""
    )
    return path


def test_s5_source_restart_rollover_does_not_stall_other_mappings(deployment) -> None:
    """#14.3, RateLimiter §5 "MUST NOT block": source A restarts; the duty cycle that starts
    A's destination rollover returns with the attach still in flight (A's destination epoch
    0), mapping B relays frames in the cycles until A is attached again, B's destination
    sees every frame (no gap) on one epoch, and none of B's leases is lost; A then goes on
    at a new destination epoch."""
    dep = deployment
    ctx = dep["ctx"]
    # the agent's startup attaches block (by design: a refused destination must stop it), so
    # the sources come after it, and nothing here holds a lease that needs keepalives yet
    config = load_ratelimiter_config(rl_config(dep), env={})
    agent = RateLimiterAgent(config, ctx)
    dst_a = Consumer(ctx, DST_A, settings(dep, DEST_DESCRIPTORS), driver=True)
    dst_b = Consumer(ctx, DST_B, settings(dep, DEST_DESCRIPTORS), driver=True)
    src_a, src_b = source(dep, SRC_A), source(dep, SRC_B)
    relay_a, relay_b = agent.relays
    got_a: list[tuple[int, int]] = []
    got_b: list[tuple[int, int]] = []
    hold_a: list[bool] = []  # set: the restarted source A waits until the relay mapped it

    def offer(p: Producer) -> None:
        if p is src_a and hold_a and relay_a.source_epoch != p.epoch:
            return  # A's new frames (seq from 0) wait until the relay mapped A's new epoch
        if p.attached:
            p.offer(np.full(64, p.next_seq & 0xFF, np.uint8))

    def cycle() -> None:
        for p in (src_a, src_b):
            offer(p)
            p.do_work()
        agent.do_work()
        dst_a.poll(lambda f: got_a.append((f.epoch, f.seq)))
        dst_b.poll(lambda f: got_b.append((f.epoch, f.seq)))
        time.sleep(0.001)

    def state() -> str:
        a = relay_a.consumer
        return repr((agent.snapshot()["mappings"], a.epoch, a.stats))

    def spin(until: Any, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, (what, state())
            cycle()

    try:
        # both mappings flowing, and A's source far enough ahead that a restart regresses
        spin(lambda: len(got_a) > 20 and len(got_b) > 20, "both mappings flowing")
        b_dest_epoch, b_dest_epochs = relay_b.dest_epoch, relay_b.stats.dest_epochs
        b_source_remaps = relay_b.stats.source_remaps
        a_dest_epoch = relay_a.dest_epoch
        b_lease = relay_b.producer._driver.lease_id  # type: ignore[union-attr]
        b_before = len(got_b)

        # source A restarts: new source epoch, seq from 0, below what A's destination has
        # published, so the destination needs a new epoch (Wire §15.2: no seq regression)
        hold_a.append(True)
        src_a.close()
        src_a = source(dep, SRC_A)
        deadline = time.monotonic() + 20
        while relay_a.stats.dest_rollovers == 0:
            assert time.monotonic() < deadline, state()
            cycle()
        # the cycle that rolled A over returned before A's new destination was attached
        assert relay_a.dest_epoch == 0
        assert relay_a.producer is not None and not relay_a.producer.attached
        published_b = relay_b.stats.published
        waiting_cycles = 0
        while relay_a.dest_epoch == 0:
            assert time.monotonic() < deadline, state()
            cycle()
            waiting_cycles += 1
        assert waiting_cycles >= 1
        assert relay_b.stats.published > published_b, "B was served while A reattached"
        assert relay_a.dest_epoch > a_dest_epoch
        spin(lambda: any(e == relay_a.dest_epoch for e, _ in got_a), "A on its new epoch")
        spin(lambda: len(got_b) > b_before + 50, "B keeps flowing")

        # B never noticed: one epoch, every seq, same leases
        assert relay_b.dest_epoch == b_dest_epoch
        assert relay_b.stats.dest_epochs == b_dest_epochs
        assert relay_b.stats.source_remaps == b_source_remaps
        assert relay_b.producer._driver.lease_id == b_lease  # type: ignore[union-attr]
        assert relay_b.consumer.stats.drops.snapshot().get("no_lease", 0) == 0
        seqs_b = [s for e, s in got_b if e == b_dest_epoch]
        assert len(seqs_b) == len(got_b)
        assert seqs_b == list(range(seqs_b[0], seqs_b[0] + len(seqs_b)))
        assert dst_b.drops_gap == 0
        assert relay_b.stats.drops.snapshot() == {}
    finally:
        dst_a.close()
        dst_b.close()
        agent.close()
        src_a.close()
        src_b.close()
