"""The SHM driver daemon end to end: a real `tensorpool driver` process, real Aeron clients.

Every test talks to the daemon through the control stream with raw schema-901 messages
(`driver_fixtures.ControlClient`), and checks files on disk where the spec says something
about them. Section numbers refer to the Driver Model v1.0 unless marked "Wire".

Timings are shortened in the test configs (keepalive 100 ms x 5, announces every 200 ms); the
waits below are "until X happens (or fail after a generous timeout)", never speed assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import (
    CONSUMER,
    EXISTING_OR_CREATE,
    INSTANCE,
    INVALID_PARAMS,
    OK,
    PRODUCER,
    REJECTED,
    REQUIRE_EXISTING,
    UNSUPPORTED,
    ControlClient,
    DriverProcess,
    Msg,
    cli,
    driver_toml,
    read_status,
)

from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import map_region
from tensorpool.shm.superblock import ExpectedRegion, read_superblock
from tensorpool.specs.generated import driver as drv
from tensorpool.transport.mediadriver import MediaDriverProcess

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
GRACE = {"lease_expiry_grace_intervals": 5}  # 500 ms leases: robust on a loaded 2-core host
REVOKED_DETACHED = int(drv.LeaseRevokeReason.DETACHED)
REVOKED_EXPIRED = int(drv.LeaseRevokeReason.EXPIRED)
SHUTDOWN_ADMIN = int(drv.ShutdownReason.ADMIN)


# --------------------------------------------------------------------------- fixtures


def _tmpdir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=SHM_ROOT)


@pytest.fixture(scope="module")
def shared_md() -> Iterator[MediaDriverProcess]:
    with MediaDriverProcess() as md:
        yield md


@pytest.fixture(scope="module")
def shared(shared_md: MediaDriverProcess) -> Iterator[tuple[DriverProcess, str, str]]:
    """One daemon for the tests that only need distinct streams and client ids."""
    work = _tmpdir("tp-drv-it-")
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    Path(cfg).write_text(
        driver_toml(base, shared_md.dir, policies=GRACE, streams=range(10000, 10011))
    )
    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log"))
    daemon.start("--log-format", "json").wait_ready()
    yield daemon, base, cfg
    daemon.stop()
    print(daemon.log_text())  # shown by pytest when a test of this module failed
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def client(
    shared_md: MediaDriverProcess, shared: tuple[DriverProcess, str, str]
) -> Iterator[ControlClient]:
    with ControlClient(shared_md.dir) as c:
        c.wait_connected()
        yield c


@pytest.fixture
def work() -> Iterator[str]:
    path = _tmpdir("tp-drv-w-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _ok(msg: Msg) -> Msg:
    assert msg["code"] == OK, f"expected OK, got {msg.fields}"
    return msg


def _epoch_dirs(base: str, stream_id: int) -> list[int]:
    root = os.path.join(base, "default", INSTANCE, f"stream-{stream_id}")
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(n.split("-", 1)[1]) for n in names if n.startswith("epoch-"))


def _announce_after(c: ControlClient, stream_id: int, start: int, epoch_above: int) -> Msg:
    return c.wait_for(
        lambda m: m.kind == "announce" and m["stream_id"] == stream_id and m["epoch"] > epoch_above,
        start=start,
    )


# --------------------------------------------------------------------------- attach / detach


def test_s4_2_attach_keepalive_detach_round_trip_both_roles(shared, client: ControlClient) -> None:
    """§4.2/§4.4/§4.9, Wire §15.21a: OK responses are complete and point at valid files; keepalives
    keep leases alive past their TTL; detach answers OK, revokes, and a producer detach bumps the
    epoch with the revocation published before the new announce."""
    _, base, _ = shared
    c = client
    prod = _ok(c.attach(10000, 101, PRODUCER))
    cons = _ok(c.attach(10000, 102, CONSUMER))
    epoch = prod["epoch"]
    assert cons["epoch"] == epoch and cons["lease_id"] != prod["lease_id"]
    for r in (prod, cons):
        assert r["stream_id"] == 10000 and r["layout_version"] == 1
        assert r["header_nslots"] == 16 and r["header_slot_bytes"] == 256 and r["max_dims"] == 8
        assert r["lease_expiry_timestamp_ns"] is not None
        assert [p[:3] for p in r["payload_pools"]] == [(1, 16, 4096), (2, 16, 65536)]
    # Wire §15.21a layout; each region passes the consumer-side validation (containment,
    # superblock against the response).
    epoch_dir = os.path.join(base, "default", INSTANCE, "stream-10000", f"epoch-{epoch}")
    assert prod["header_region_uri"] == f"shm:file?path={epoch_dir}/header.ring"
    policy = PathPolicy([base])
    map_region(
        prod["header_region_uri"],
        ExpectedRegion.header_ring(epoch=epoch, stream_id=10000, nslots=16),
        policy,
    ).close()
    for pool_id, nslots, stride, uri in prod["payload_pools"]:
        assert uri == f"shm:file?path={epoch_dir}/payload-{pool_id}.pool"
        expected = ExpectedRegion.payload_pool(
            epoch=epoch, stream_id=10000, pool_id=pool_id, nslots=nslots, stride_bytes=stride
        )
        map_region(uri, expected, policy).close()

    start = len(c.messages)
    c.keep_alive_for(1.2, [(prod, 101, PRODUCER), (cons, 102, CONSUMER)])  # > 2 lease TTLs
    assert not [m for m in c.messages[start:] if m.kind == "revoked" and m["stream_id"] == 10000]

    start = len(c.messages)
    assert c.detach(cons, 102, CONSUMER)["code"] == OK
    revoked = c.wait_for(
        lambda m: m.kind == "revoked" and m["lease_id"] == cons["lease_id"], start=start
    )
    assert revoked["reason"] == REVOKED_DETACHED and revoked["role"] == CONSUMER

    start = len(c.messages)
    assert c.detach(prod, 101, PRODUCER)["code"] == OK
    revoked = c.wait_for(
        lambda m: m.kind == "revoked" and m["lease_id"] == prod["lease_id"], start=start
    )
    assert revoked["reason"] == REVOKED_DETACHED and revoked["role"] == PRODUCER
    bumped = _announce_after(c, 10000, start, epoch)
    assert revoked.index < bumped.index  # §4.9 SHOULD: revocation first
    assert bumped["producer_id"] == 0  # §8: no producer attached
    # Detach is idempotent for the same lease (§4.9).
    assert c.detach(prod, 101, PRODUCER)["code"] == OK


def test_s5_second_producer_rejected(shared, client: ControlClient) -> None:
    """§5: at most one producer lease per stream; the second attach gets REJECTED."""
    c = client
    _ok(c.attach(10001, 201, PRODUCER))
    second = c.attach(10001, 202, PRODUCER)
    assert second["code"] == REJECTED
    assert second["lease_id"] is None and second["epoch"] is None  # §4.2: nulls on error
    assert "producer" in second["error_message"]


def test_s5_many_consumers_ok(shared, client: ControlClient) -> None:
    """§5: consumers are not limited; each gets its own lease on the same epoch."""
    c = client
    leases = [_ok(c.attach(10002, 300 + i, CONSUMER)) for i in range(20)]
    assert len({m["lease_id"] for m in leases}) == 20
    assert len({m["epoch"] for m in leases}) == 1


def test_s4_4_producer_expiry_revokes_then_announces_higher_epoch(
    shared, client: ControlClient
) -> None:
    """§4.4/§4.7a/§7: a producer that stops sending keepalives expires; ShmLeaseRevoked comes
    before the epoch-bumped announce; the consumer keeps its lease; a new producer attaches."""
    c = client
    prod = _ok(c.attach(10003, 401, PRODUCER))
    cons = _ok(c.attach(10003, 402, CONSUMER))
    start = len(c.messages)
    deadline = time.monotonic() + 10
    revoked = None
    while revoked is None and time.monotonic() < deadline:  # keep only the consumer alive
        c.keep_alive_for(0.1, [(cons, 402, CONSUMER)])
        revoked = next(
            (
                m
                for m in c.messages[start:]
                if m.kind == "revoked" and m["lease_id"] == prod["lease_id"]
            ),
            None,
        )
    assert revoked is not None, "producer lease never expired"
    assert revoked["reason"] == REVOKED_EXPIRED and revoked["role"] == PRODUCER
    bumped = _announce_after(c, 10003, start, prod["epoch"])
    assert revoked.index < bumped.index
    assert not [
        m for m in c.messages[start:] if m.kind == "revoked" and m["lease_id"] == cons["lease_id"]
    ]
    new_prod = _ok(c.attach(10003, 403, PRODUCER))
    assert new_prod["epoch"] > bumped["epoch"] > prod["epoch"]


def test_s4_9_consumer_expiry_affects_only_its_own_lease(shared, client: ControlClient) -> None:
    """§4.9: revocation is per lease; an expired consumer does not disturb the producer, the
    other consumer, or the epoch."""
    c = client
    prod = _ok(c.attach(10004, 501, PRODUCER))
    alive = _ok(c.attach(10004, 502, CONSUMER))
    silent = _ok(c.attach(10004, 503, CONSUMER))
    start = len(c.messages)
    deadline = time.monotonic() + 10
    revoked = None
    while revoked is None and time.monotonic() < deadline:
        c.keep_alive_for(0.1, [(prod, 501, PRODUCER), (alive, 502, CONSUMER)])
        revoked = next(
            (
                m
                for m in c.messages[start:]
                if m.kind == "revoked" and m["lease_id"] == silent["lease_id"]
            ),
            None,
        )
    assert revoked is not None and revoked["reason"] == REVOKED_EXPIRED
    c.keep_alive_for(0.6, [(prod, 501, PRODUCER), (alive, 502, CONSUMER)])
    later = c.messages[start:]
    assert [m["lease_id"] for m in later if m.kind == "revoked" and m["stream_id"] == 10004] == [
        silent["lease_id"]
    ]
    assert {m["epoch"] for m in later if m.kind == "announce" and m["stream_id"] == 10004} == {
        prod["epoch"]
    }


def test_attach_burst_of_100_all_answered(shared, client: ControlClient) -> None:
    """100 attach requests sent back to back: every one answered OK with its correlationId."""
    c = client
    corrs = {}
    start = len(c.messages)
    for i in range(100):
        corr = c.corr()
        corrs[corr] = 1000 + i
        c.send(c.attach_bytes(10006, 1000 + i, CONSUMER, correlation_id=corr))
    deadline = time.monotonic() + 20
    answers: dict[int, Msg] = {}
    while len(answers) < 100 and time.monotonic() < deadline:
        c.poll()
        for m in c.messages[start:]:
            if m.kind == "attach_response" and m["correlation_id"] in corrs:
                answers[m["correlation_id"]] = m
        time.sleep(0.005)
    assert len(answers) == 100
    assert all(m["code"] == OK for m in answers.values())
    assert len({m["lease_id"] for m in answers.values()}) == 100
    assert len({m["epoch"] for m in answers.values()}) == 1


# --------------------------------------------------------------------------- bad input


def _patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def test_s4_6_malformed_control_messages_get_spec_codes_and_never_crash(
    shared, client: ControlClient
) -> None:
    """§4.3/§4.4a/§4.6/§4.8/§4.13: bad requests get the right code (or are dropped and counted);
    the driver keeps serving."""
    daemon, base, _ = shared
    c = client
    att = drv.ShmAttachRequestDecoder
    det = drv.ShmDetachRequestDecoder

    def ask(data: bytes, corr: int, kind: str = "attach_response") -> Msg:
        start = len(c.messages)
        c.send(data)
        return c.response(kind, corr, start=start)

    def req(stream: int, client_id: int, role: int = CONSUMER, **kw: object) -> tuple[int, bytes]:
        corr = c.corr()
        return corr, c.attach_bytes(stream, client_id, role, correlation_id=corr, **kw)  # type: ignore[arg-type]

    expectations: list[tuple[str, int, bytes, int]] = []
    corr, data = req(10005, 601)
    expectations.append(("newer schema version", corr, _patched(data, 6, "<H", 2), UNSUPPORTED))
    corr, data = req(10005, 602)
    expectations.append(
        ("unknown role", corr, _patched(data, 8 + att.ROLE_OFFSET, "<B", 9), INVALID_PARAMS)
    )
    corr, data = req(10005, 603)
    expectations.append(
        (
            "unknown hugepages policy",
            corr,
            _patched(data, 8 + att.REQUIRE_HUGEPAGES_OFFSET, "<B", 7),
            INVALID_PARAMS,
        )
    )
    corr, data = req(10005, 604)
    expectations.append(
        (
            "unknown publish mode",
            corr,
            _patched(data, 8 + att.PUBLISH_MODE_OFFSET, "<B", 9),
            UNSUPPORTED,
        )
    )
    corr, data = req(4242, 605, mode=None)
    expectations.append(
        ("null publishMode = REQUIRE_EXISTING, unknown stream", corr, data, REJECTED)
    )
    corr, data = req(4243, 606, mode=REQUIRE_EXISTING)
    expectations.append(("REQUIRE_EXISTING, unknown stream", corr, data, REJECTED))
    corr, data = req(0xFFFF_FFFF, 607)
    expectations.append(("null streamId", corr, data, REJECTED))
    corr, data = req(10005, 608)
    expectations.append(("truncated body", corr, data[:16], INVALID_PARAMS))
    corr, data = req(10005, 609)
    expectations.append(
        ("block length too small", corr, _patched(data, 0, "<H", 8), INVALID_PARAMS)
    )
    corr, data = req(10005, 610, expected_layout_version=7)
    expectations.append(("layout version mismatch", corr, data, REJECTED))
    corr, data = req(10005, 616, require_hugepages=int(drv.HugepagesPolicy.HUGEPAGES))
    expectations.append(("hugepages on a tmpfs driver", corr, data, REJECTED))
    for label, corr, data, code in expectations:
        got = ask(data, corr)
        assert got["code"] == code, f"{label}: {got.fields}"
        assert got["lease_id"] is None, label
        assert got["error_message"], label

    # Valid but unusual: nonzero maxDims is ignored (§4.3); dynamic creation gets a range id.
    corr, data = req(10005, 611, max_dims=5)
    assert _ok(ask(data, corr))["max_dims"] == 8
    corr, data = req(10005, 617, require_hugepages=int(drv.HugepagesPolicy.STANDARD))
    _ok(ask(data, corr))
    corr, data = req(4244, 612, mode=EXISTING_OR_CREATE)
    assert 20000 <= _ok(ask(data, corr))["stream_id"] <= 20099
    # §4.8 duplicate clientId: the newer attach is rejected.
    corr, data = req(10005, 611, role=PRODUCER)
    assert ask(data, corr)["code"] == REJECTED

    # Detach: unknown or null lease → REJECTED; unknown role → INVALID_PARAMS.
    fake = Msg(0, "attach_response", {"lease_id": 0xFFFF_FFFF_FFFF_FFFF, "stream_id": 10005})
    assert c.detach(fake, 699, CONSUMER)["code"] == REJECTED
    fake.fields["lease_id"] = 12345
    assert c.detach(fake, 699, CONSUMER)["code"] == REJECTED
    corr = c.corr()
    buf = bytearray(64)
    n = drv.ShmDetachRequestEncoder.encode(
        buf, 0, correlation_id=corr, lease_id=1, stream_id=10005, client_id=699, role=CONSUMER
    )
    struct.pack_into("<B", buf, 8 + det.ROLE_OFFSET, 9)
    assert ask(bytes(buf[:n]), corr, "detach_response")["code"] == INVALID_PARAMS

    # Dropped without an answer (nothing to correlate, or no response in the schema):
    c.send(b"\x01\x02\x03")  # shorter than a message header
    c.send(_patched(req(10005, 613)[1], 4, "<H", 999))  # unknown schema id
    c.send(_patched(req(10005, 614)[1], 2, "<H", 77))  # unknown template of schema 901
    c.send(c.shutdown_request_bytes("x" * 100_000))  # oversized wrong token: ignored
    c.send(c.shutdown_request_bytes("", "no token"))  # missing token: ignored
    c.send(c.shutdown_request_bytes("wrong", "y" * 5000))  # wrong token, oversized message
    bad_len = bytearray(c.shutdown_request_bytes("s3cret"))
    struct.pack_into("<I", bad_len, 8 + 9, 0x4000_0001)  # token length beyond maxValue/buffer
    c.send(bytes(bad_len))
    ka = bytearray(64)
    n = drv.ShmLeaseKeepaliveEncoder.encode(
        ka,
        0,
        lease_id=424242,
        stream_id=10005,
        client_id=698,
        role=CONSUMER,
        client_timestamp_ns=1,
    )
    c.send(bytes(ka[:n]))  # keepalive for an unknown lease: ignored

    # Still alive and serving; the drops are counted under stable names.
    c.pump(0.3)
    assert daemon.proc.poll() is None
    corr, data = req(10005, 615)
    _ok(ask(data, corr))
    c.pump(0.5)
    status = read_status(base)
    assert status is not None and status["state"] == "RUNNING"
    agent = status["counters"]["agent"]
    core = status["counters"]["core"]
    for key in (
        "malformed_truncated",
        "malformed_unknown_schema_id",
        "malformed_unknown_template_id",
        "malformed_attach_unsupported_version",
        "malformed_shutdown_request_var_data_overflow",
    ):
        assert agent.get(key, 0) >= 1, (key, agent)
    assert core.get("shutdown_request_bad_token", 0) >= 3, core
    assert core.get("keepalive_unknown_lease", 0) >= 1, core


# --------------------------------------------------------------------------- files, status, GC


def test_s3_superblock_activity_refreshed_at_announce_cadence(
    shared, client: ControlClient
) -> None:
    """§3, Wire §7.1: the driver refreshes activity_timestamp_ns with its announces."""
    c = client
    prod = _ok(c.attach(10007, 701, PRODUCER))
    path = prod["header_region_uri"].split("=", 1)[1]

    def activity() -> int:
        with open(path, "rb") as f:
            return read_superblock(f.read(64)).activity_timestamp_ns

    first = activity()
    start = len(c.messages)
    # Two announces of this epoch after the first read: the second one's stamp was written first.
    c.wait_for(lambda m: m.kind == "announce" and m["stream_id"] == 10007, start=start)
    later = c.wait_for(
        lambda m: m.kind == "announce" and m["stream_id"] == 10007 and m.index >= start + 1,
        start=start + 1,
    )
    c.keepalive(prod, 701, PRODUCER)
    now = activity()
    assert now > first
    assert now >= later["announce_timestamp_ns"]


def test_status_json_shows_streams_and_leases(shared, client: ControlClient) -> None:
    """`tensorpool driver status --json`: streams with epoch/producer/consumer count, leases
    with role and age."""
    _, _, cfg = shared
    c = client
    prod = _ok(c.attach(10008, 801, PRODUCER))
    cons = _ok(c.attach(10008, 802, CONSUMER))
    leases = [(prod, 801, PRODUCER), (cons, 802, CONSUMER)]
    c.keep_alive_for(0.5, leases)  # at least two status rewrites
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "driver", "status", "--config", cfg, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while proc.poll() is None:
        c.keep_alive_for(0.05, leases)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert doc["liveness"]["verdict"] == "running"
    row = next(s for s in doc["streams"] if s["stream_id"] == 10008)
    assert row["producer_client_id"] == 801 and row["consumer_count"] == 1
    assert row["epoch"] == prod["epoch"] and row["regions_ready"]
    mine = {lease["lease_id"]: lease for lease in doc["leases"] if lease["stream_id"] == 10008}
    assert mine[prod["lease_id"]]["role"] == "PRODUCER"
    assert mine[cons["lease_id"]]["role"] == "CONSUMER"
    assert all(lease["age_ns"] >= 0 for lease in mine.values())
    text = cli("driver", "status", "--config", cfg)
    assert text.returncode == 0 and "10008" in text.stdout and "PRODUCER" in text.stdout


def test_epoch_gc_deletes_superseded_epoch_dirs(shared, client: ControlClient) -> None:
    """EPOCH_GC_POLICY: only the newest `epoch_gc_keep` (2) epoch dirs stay once older ones
    are past the minimum age; the last-epoch marker keeps the high-water mark."""
    _, base, _ = shared
    c = client
    for i in range(4):
        prod = _ok(c.attach(10009, 900 + i, PRODUCER))
        assert c.detach(prod, 900 + i, PRODUCER)["code"] == OK
    last = c.wait_for(
        lambda m: m.kind == "announce" and m["stream_id"] == 10009 and m["epoch"] > prod["epoch"],
        start=0,
    )
    deadline = time.monotonic() + 10
    while len(_epoch_dirs(base, 10009)) > 2 and time.monotonic() < deadline:
        c.pump(0.1)
    dirs = _epoch_dirs(base, 10009)
    assert dirs == [last["epoch"] - 1, last["epoch"]], dirs
    marker = os.path.join(base, "default", INSTANCE, "stream-10009", "last-epoch")
    assert int(Path(marker).read_text()) == last["epoch"]


def test_structured_logs_are_json_lines(shared, client: ControlClient) -> None:
    """`--log-format json`: one JSON object per line, with the event name and its fields."""
    daemon, _, _ = shared
    lease = _ok(client.attach(10008, 851, CONSUMER))
    deadline = time.monotonic() + 5
    events: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        lines = [ln for ln in daemon.log_text().splitlines() if ln.startswith("{")]
        events = [json.loads(ln) for ln in lines]
        if any(
            e.get("event") == "attach_ok" and e.get("lease") == lease["lease_id"] for e in events
        ):
            break
        time.sleep(0.05)
    ok = [
        e for e in events if e.get("event") == "attach_ok" and e.get("lease") == lease["lease_id"]
    ]
    assert ok and ok[0]["stream"] == 10008 and ok[0]["level"] == "INFO"
    assert any(e.get("event") == "driver_ready" for e in events)


def test_s2_client_driver_mode_frames_flow_through_driver_regions(shared, shared_md) -> None:
    """§2.2/§2.3/§3 with the project's clients in driver mode: the producer writes into the
    regions the daemon created and announced; the consumer maps them and reads every frame."""
    import numpy as np

    from tensorpool.client.consumer import Consumer
    from tensorpool.client.producer import Producer
    from tensorpool.client.settings import ClientSettings
    from tensorpool.transport.config import TransportConfig
    from tensorpool.transport.context import AeronContext

    _, base, _ = shared
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=shared_md.dir),
        shm_base_dir=base,
        announce_period_ns=200_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        producer = Producer(ctx, 10010, settings, driver=True)
        producer.wait_until_attached()  # #14.1: construction does not block
        consumer = Consumer(ctx, 10010, settings, driver=True)
        try:
            epoch_dir = os.path.join(base, "default", INSTANCE, "stream-10010")
            assert _epoch_dirs(base, 10010) == [producer.epoch]
            got: list[tuple[int, int]] = []
            deadline = time.monotonic() + 10
            seq = 0
            while len(got) < 10 and time.monotonic() < deadline:
                producer.offer(np.full(64, seq % 251, np.uint8))
                seq += 1
                producer.do_work()
                consumer.poll(lambda f: got.append((f.seq, int(f.array[0]))))
                time.sleep(0.01)
            assert len(got) >= 10, (got, consumer.stats)
            assert all(value == s % 251 for s, value in got)
            assert os.path.isdir(epoch_dir)
        finally:
            consumer.close()
            producer.close()


# --------------------------------------------------------------------------- lifecycle


#: Lifecycle tests share the module's media driver with the shared daemon. Each gets a control
#: stream of its own, so no driver answers another's clients and no client sees a message an
#: earlier test's driver left in a lingering Aeron log.
_own_streams = iter(range(1500, 1600))
_stream_of: dict[str, int] = {}


def _daemon(work: str, aeron_dir: str, name: str = "d", **kw: object) -> DriverProcess:
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    if not os.path.exists(cfg):
        stream = _stream_of.setdefault(work, next(_own_streams))
        text = driver_toml(base, aeron_dir, control_stream_id=stream, **kw)  # type: ignore[arg-type]
        Path(cfg).write_text(text)
    return DriverProcess(cfg, base, os.path.join(work, f"{name}.log"))


def _client(work: str, aeron_dir: str) -> ControlClient:
    return ControlClient(aeron_dir, stream_id=_stream_of[work])


def test_s10_restart_epochs_keep_increasing(shared_md: MediaDriverProcess, work: str) -> None:
    """§10/§4.13: SIGTERM → ShmDriverShutdown and exit 0; a restarted driver on the same base
    dir hands out epochs above every earlier one, even after cleanup removed the epoch dirs."""
    first = (
        _daemon(work, shared_md.dir, "first", policies={**GRACE, "cleanup_shm_on_exit": True})
        .start()
        .wait_ready()
    )
    seen: list[int] = []
    with _client(work, shared_md.dir) as c:
        c.wait_connected()
        prod = _ok(c.attach(10000, 11, PRODUCER))
        seen.append(prod["epoch"])
        start = len(c.messages)
        assert c.detach(prod, 11, PRODUCER)["code"] == OK
        seen.append(_announce_after(c, 10000, start, prod["epoch"])["epoch"])
        start = len(c.messages)
        first.signal(signal.SIGTERM)
        c.wait_for(lambda m: m.kind == "shutdown", start=start)
        assert first.wait() == 0
    assert _epoch_dirs(first.base_dir, 10000) == []  # cleanup_shm_on_exit
    assert read_status(first.base_dir)["state"] == "STOPPED"  # type: ignore[index]

    second = _daemon(work, shared_md.dir, "second").start().wait_ready()
    try:
        with _client(work, shared_md.dir) as c:
            c.wait_connected()
            again = _ok(c.attach(10000, 12, PRODUCER))
            assert again["epoch"] > max(seen)
            assert again["lease_id"] > prod["lease_id"]  # §4.8: seeded above the old ids
    finally:
        assert second.stop() == 0


def test_s2_1_one_driver_per_namespace_and_kill9_leaves_no_stuck_lock(
    shared_md: MediaDriverProcess, work: str
) -> None:
    """§2.1: a second driver on the same namespace refuses to start; after `kill -9` of the
    first, the kernel has dropped its lock and a new driver starts (with a higher epoch), and
    the epoch GC collects what the dead driver left behind (§10, EPOCH_GC_POLICY)."""
    first = _daemon(work, shared_md.dir, "first", policies=GRACE).start().wait_ready()
    with _client(work, shared_md.dir) as c:
        c.wait_connected()
        old = _ok(c.attach(10000, 21, PRODUCER))
        start = len(c.messages)
        assert c.detach(old, 21, PRODUCER)["code"] == OK
        old_epochs = [old["epoch"], _announce_after(c, 10000, start, old["epoch"])["epoch"]]
    assert _epoch_dirs(first.base_dir, 10000) == old_epochs
    rival = _daemon(work, shared_md.dir, "rival").start()
    assert rival.wait() == 2
    assert "another SHM driver" in rival.log_text()
    assert first.proc is not None and first.proc.poll() is None

    first.signal(signal.SIGKILL)
    first.wait()
    stale = cli("driver", "status", "--config", first.config_path, "--json")
    assert stale.returncode == 1
    assert json.loads(stale.stdout)["liveness"]["verdict"] == "stale"
    third = _daemon(work, shared_md.dir, "third").start().wait_ready()
    try:
        with _client(work, shared_md.dir) as c:
            c.wait_connected()
            new = _ok(c.attach(10000, 22, PRODUCER))
            assert new["epoch"] > max(old_epochs)
            deadline = time.monotonic() + 10  # 300 ms minimum age in the test config
            while _epoch_dirs(third.base_dir, 10000) != [old_epochs[1], new["epoch"]]:
                assert time.monotonic() < deadline, _epoch_dirs(third.base_dir, 10000)
                c.keep_alive_for(0.1, [(new, 22, PRODUCER)])
    finally:
        assert third.stop() == 0


def test_s4_13_shutdown_request_needs_the_token(shared_md: MediaDriverProcess, work: str) -> None:
    """§4.13: wrong or missing tokens are ignored; with the right token the driver drains
    (final announce), publishes ShmDriverShutdown with the request's reason, and exits 0."""
    daemon = _daemon(work, shared_md.dir, policies=GRACE).start().wait_ready()
    cfg = daemon.config_path
    with _client(work, shared_md.dir) as c:
        c.wait_connected()
        cons = _ok(c.attach(10000, 31, CONSUMER))
        c.send(c.shutdown_request_bytes("wrong"))
        c.send(c.shutdown_request_bytes(""))
        wrong = cli("driver", "shutdown", "--config", cfg, "--token", "nope", "--timeout", "1")
        assert wrong.returncode == 1, wrong.stderr
        assert daemon.proc is not None and daemon.proc.poll() is None
        assert _ok(c.attach(10001, 32, CONSUMER))  # still serving
        start = len(c.messages)
        right = cli("driver", "shutdown", "--config", cfg, "--token", "s3cret")
        assert right.returncode == 0, right.stderr
        assert "reason ADMIN" in right.stdout
        notice = c.wait_for(lambda m: m.kind == "shutdown", start=start)
        assert notice["reason"] == SHUTDOWN_ADMIN
        final = [m for m in c.messages[start : notice.index] if m.kind == "announce"]
        assert {m["stream_id"] for m in final} >= {10000}
        assert daemon.wait() == 0
        del cons
    assert read_status(daemon.base_dir)["state"] == "STOPPED"  # type: ignore[index]


def test_embedded_media_driver_serves_clients_and_mlocks(work: str) -> None:
    """driver.embedded_media_driver: the daemon hosts the media driver in the configured
    directory, clients join it; policies.mlock_shm locks the created regions (§17); SIGTERM
    still delivers ShmDriverShutdown before the media driver goes away."""
    aeron_dir = os.path.join(work, "aeron")
    daemon = (
        _daemon(work, aeron_dir, embedded=True, policies={**GRACE, "mlock_shm": True})
        .start()
        .wait_ready()
    )
    with _client(work, aeron_dir) as c:
        c.wait_connected()
        prod = _ok(c.attach(10000, 41, PRODUCER))
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        locked_kb = int(next(ln for ln in status.splitlines() if ln.startswith("VmLck")).split()[1])
        region_bytes = 64 + 16 * 256 + sum(64 + 16 * p[2] for p in prod["payload_pools"])
        assert locked_kb * 1024 >= region_bytes
        start = len(c.messages)
        daemon.signal(signal.SIGTERM)
        c.wait_for(lambda m: m.kind == "shutdown", start=start)
        assert daemon.wait() == 0
    assert not os.path.exists(os.path.join(aeron_dir, "cnc.dat"))


@pytest.mark.parametrize(
    ("snippet", "key"),
    [
        ("anounce_period_ms = 100", "policies.anounce_period_ms"),
        ('prefault_shm = "yes"', "policies.prefault_shm"),
    ],
)
def test_s17_invalid_config_exits_2_names_key_and_creates_nothing(
    work: str, snippet: str, key: str
) -> None:
    """§17: an invalid config is one clear error naming the file and the key, exit 2, and
    nothing is created on disk (no SHM base dir, no lock, no Aeron dir)."""
    base = os.path.join(work, "shm")
    aeron_dir = os.path.join(work, "aeron")
    cfg = os.path.join(work, "bad.toml")
    text = driver_toml(base, aeron_dir, embedded=True).replace(
        "[policies]\n", f"[policies]\n{snippet}\n"
    )
    Path(cfg).write_text(text)
    result = cli("driver", "--config", cfg)
    assert result.returncode == 2
    assert cfg in result.stderr and key in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(base) and not os.path.exists(aeron_dir)


REVOKED_REVOKED = int(drv.LeaseRevokeReason.REVOKED)
LONG_LEASES = {"lease_expiry_grace_intervals": 100}  # 10 s: nothing expires during the test


@pytest.mark.parametrize("forced", [False, True], ids=["drain", "second_signal"])
def test_s4_9_shutdown_revokes_every_lease_before_the_notice(
    shared_md: MediaDriverProcess, work: str, forced: bool
) -> None:
    """#14.3, Driver §4.9: shutdown invalidates the leases, and every invalidation publishes a
    ShmLeaseRevoked: each live lease (producer and consumer) gets one with reason REVOKED, as
    received by a client, before ShmDriverShutdown; also when a second signal skips the drain."""
    policies = {**LONG_LEASES, "shutdown_timeout_ms": 60_000 if forced else 200}
    daemon = _daemon(work, shared_md.dir, policies=policies).start().wait_ready()
    with _client(work, shared_md.dir) as c:
        c.wait_connected()
        prod = _ok(c.attach(10000, 51, PRODUCER))
        cons = _ok(c.attach(10000, 52, CONSUMER))
        start = len(c.messages)
        daemon.signal(signal.SIGTERM)
        if forced:  # the drain has begun (final announce); the second signal ends it now
            c.wait_for(lambda m: m.kind == "announce", start=start)
            daemon.signal(signal.SIGTERM)
        notice = c.wait_for(lambda m: m.kind == "shutdown", start=start, timeout=20)
        if forced:
            assert notice["error_message"] == "forced"
        revoked = [m for m in c.messages[start : notice.index] if m.kind == "revoked"]
        assert sorted((m["lease_id"], m["role"], m["reason"]) for m in revoked) == sorted(
            [
                (prod["lease_id"], PRODUCER, REVOKED_REVOKED),
                (cons["lease_id"], CONSUMER, REVOKED_REVOKED),
            ]
        )
        assert daemon.wait() == 0
