"""Issue #13.5 end to end: an attach flood cannot lock out configured streams.

The default deployment: a real `tensorpool driver` daemon hosting its embedded Aeron media
driver, temp dirs. A client floods the control stream with `ShmAttachRequest`s for fresh
stream ids with `publishMode=EXISTING_OR_CREATE` (real codecs on a real Aeron publication);
then the project's producer and consumer attach to a configured stream in driver mode and
frames flow. The refusals are counted, by reason, in the daemon's status file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from driver_fixtures import (
    CONSUMER,
    CONTROL_CHANNEL,
    EXISTING_OR_CREATE,
    INSTANCE,
    OK,
    PRODUCER,
    REJECTED,
    ControlClient,
    DriverProcess,
    driver_toml,
    read_status,
)

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import Producer
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
FLOOD = 200
PER_CLIENT = 4
TOTAL = 16
CONFIGURED = 10000


@pytest.fixture
def work() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-d135-it-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(work: str, extra_toml: str = "", **policies: object) -> tuple[DriverProcess, str, str]:
    """The daemon hosting its media driver in ``work/aeron``; returns (daemon, base, aeron)."""
    base = os.path.join(work, "shm")
    aeron_dir = os.path.join(work, "aeron")
    cfg = os.path.join(work, "driver.toml")
    pol = {"lease_expiry_grace_intervals": 5, **policies}
    text = driver_toml(base, aeron_dir, embedded=True, streams=[CONFIGURED], policies=pol)
    Path(cfg).write_text(text + extra_toml)
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log"))
    daemon.start().wait_ready()
    return daemon, base, aeron_dir


def _dynamic_stream_dirs(base: str) -> list[str]:
    try:
        names = os.listdir(os.path.join(base, "default", INSTANCE))
    except FileNotFoundError:
        return []
    return [n for n in names if n.startswith("stream-2")]  # the range is 20000-20099


def _flood(c: ControlClient, client_ids: list[int]) -> dict[str, int]:
    """One attach per client id (fresh stream id each, EXISTING_OR_CREATE); an OK lease is
    detached at once, as a misbehaving tool would, so the one-lease-per-client rule (§4.8)
    does not stop it. Returns how the driver answered, by code and message."""
    answers: dict[str, int] = {}
    for i, client_id in enumerate(client_ids):
        resp = c.attach(50000 + i, client_id, CONSUMER, mode=EXISTING_OR_CREATE)
        if resp["code"] == OK:
            assert c.detach(resp, client_id, CONSUMER)["code"] == OK
            key = "ok"
        else:
            assert resp["code"] == REJECTED, resp.fields
            key = resp["error_message"].rsplit("(", 1)[-1].rstrip(")")
        answers[key] = answers.get(key, 0) + 1
    return answers


def _core_counters(base: str, want: dict[str, int], timeout: float = 10.0) -> dict[str, int]:
    """The status file's core counters once they show ``want`` (it is rewritten periodically)."""
    deadline = time.monotonic() + timeout
    counters: dict[str, int] = {}
    while time.monotonic() < deadline:
        doc = read_status(base) or {}
        counters = doc.get("counters", {}).get("core", {})
        if all(counters.get(k) == v for k, v in want.items()):
            return counters
        time.sleep(0.05)
    raise AssertionError(f"status counters {counters} never showed {want}")


def _frames_flow(aeron_dir: str, base: str) -> int:
    """The project's producer and consumer, in driver mode, on the configured stream."""
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=aeron_dir),
        channels=Endpoints(control_channel=CONTROL_CHANNEL),
        shm_base_dir=base,
        announce_period_ns=200_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        producer = Producer(ctx, CONFIGURED, settings, driver=True)
        producer.wait_until_attached()  # #14.1: construction does not block
        consumer = Consumer(ctx, CONFIGURED, settings, driver=True)
        try:
            got: list[int] = []
            deadline = time.monotonic() + 20
            seq = 0
            while len(got) < 10 and time.monotonic() < deadline:
                producer.offer(np.full(64, seq % 251, np.uint8))
                seq += 1
                producer.do_work()
                consumer.poll(lambda f: got.append(int(f.array[0])))
                time.sleep(0.01)
            assert len(got) >= 10, consumer.stats
            return len(got)
        finally:
            consumer.close()
            producer.close()


def test_13_5_attach_flood_then_configured_producer_frames_flow(work: str) -> None:
    """#13.5: 200 EXISTING_OR_CREATE attaches with fresh stream ids from one client, then 200
    from forged client ids: the per-client and total limits refuse them (REJECTED, counted by
    reason in the status file); the configured producer attaches and its frames flow."""
    daemon, base, aeron_dir = _start(
        work, max_dynamic_streams_per_client=PER_CLIENT, max_dynamic_streams=TOTAL
    )
    try:
        with ControlClient(aeron_dir, channel=CONTROL_CHANNEL) as c:
            c.wait_connected()
            one_client = _flood(c, [7] * FLOOD)
            assert one_client == {"ok": PER_CLIENT, "policies.max_dynamic_streams_per_client": 196}
            forged = _flood(c, list(range(1000, 1000 + FLOOD)))
            assert forged == {"ok": TOTAL - PER_CLIENT, "policies.max_dynamic_streams": 188}
        assert len(_dynamic_stream_dirs(base)) == TOTAL
        assert _frames_flow(aeron_dir, base) >= 10
        _core_counters(
            base,
            {
                "attach_error_dynamic_client_limit": 196,
                "attach_error_dynamic_total_limit": 188,
                "dynamic_streams_created": TOTAL,
            },
        )
    finally:
        assert daemon.stop() == 0, daemon.log_text()


#: A configured stream whose one epoch (65536 slots x 2 GiB) fits on no filesystem: the space
#: the driver keeps for it is more than any shm.base_dir has, so every dynamic creation must be
#: refused on space, which proves the daemon hands the core the real statvfs figure. The stream
#: itself is never attached, so nothing that size is ever created.
_HUGE_RESERVE = """
[profiles.reserved]
header_nslots = 65536
payload_pools = [{ pool_id = 1, stride_bytes = 2147483648 }]

[streams.reserved]
stream_id = 10001
profile = "reserved"
"""


def test_13_5_space_for_configured_streams_is_kept(work: str) -> None:
    """#13.5: a dynamic stream that would leave less free space in shm.base_dir than one epoch
    of every configured stream is refused (REJECTED, saying what was needed); the configured
    stream that fits still attaches and its frames flow."""
    daemon, base, aeron_dir = _start(work, _HUGE_RESERVE, default_profile="small")
    try:
        with ControlClient(aeron_dir, channel=CONTROL_CHANNEL) as c:
            c.wait_connected()
            resp = c.attach(50000, 7, PRODUCER, mode=EXISTING_OR_CREATE)
            assert resp["code"] == REJECTED, resp.fields
            assert "bytes are kept for the configured streams" in resp["error_message"]
            assert _dynamic_stream_dirs(base) == []
        assert _frames_flow(aeron_dir, base) >= 10
        _core_counters(base, {"attach_error_dynamic_no_space": 1})
    finally:
        assert daemon.stop() == 0, daemon.log_text()


def test_13_5_idle_dynamic_stream_reclaimed_by_the_daemon(work: str) -> None:
    """#13.5: a dynamic stream without a lease for dynamic_stream_idle_reclaim_ms loses its
    epoch directories (the last-epoch marker stays) and no longer counts against its creator;
    created again, it gets an epoch above the reclaimed ones."""
    daemon, base, aeron_dir = _start(
        work, max_dynamic_streams_per_client=1, dynamic_stream_idle_reclaim_ms=300
    )
    try:
        with ControlClient(aeron_dir, channel=CONTROL_CHANNEL) as c:
            c.wait_connected()
            first = c.attach(20050, 7, PRODUCER, mode=EXISTING_OR_CREATE)
            assert first["code"] == OK, first.fields
            assert c.detach(first, 7, PRODUCER)["code"] == OK  # opens epoch 2 (§6)
            stream_dir = os.path.join(base, "default", INSTANCE, "stream-20050")
            deadline = time.monotonic() + 10
            while os.listdir(stream_dir) != ["last-epoch"] and time.monotonic() < deadline:
                c.pump(0.05)
            assert os.listdir(stream_dir) == ["last-epoch"]
            again = c.attach(20050, 7, PRODUCER, mode=EXISTING_OR_CREATE)
            assert again["code"] == OK, again.fields
            assert again["epoch"] > first["epoch"] + 1
        _core_counters(base, {"dynamic_streams_reclaimed": 1})
    finally:
        assert daemon.stop() == 0, daemon.log_text()
