"""Issue #13.5: an attach flood with fresh stream ids cannot lock out configured streams.

One test per rule of the core (per-client limit, total limit, idle reclaim, what reclaim
spares, space kept for configured streams, counters), driven with real encoded requests
and a driven clock; plus the file side of a reclaim on real files and the config keys.
Every refusal is ``REJECTED``: the request is valid but denied by policy (Driver Model §4.6).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_helpers import (
    BASE_TOML,
    CAM,
    MS,
    Harness,
    attach_req,
    detach_req,
    make_config,
    only,
    single_response,
)

from tensorpool.config_util import ConfigError
from tensorpool.driver.actions import CreateRegions, ReclaimStream, SendAttachResponse
from tensorpool.driver.core import DriverCore
from tensorpool.driver.regions import LAST_EPOCH_FILE, RegionFiles, read_last_epoch, scan_epochs
from tensorpool.driver.streams import epoch_bytes, stream_root
from tensorpool.specs.generated.driver import PublishMode, ResponseCode, Role

P, C = Role.PRODUCER, Role.CONSUMER
CREATE = PublishMode.EXISTING_OR_CREATE


def _core(**policies: object) -> Harness:
    return Harness(DriverCore(make_config(**policies), now_ns=0, lease_id_start=1))


def _create(h: Harness, corr: int, stream_id: int, client_id: int, role: Role = C) -> list:
    return h.attach(corr, stream_id, client_id, role, publish_mode=CREATE)


def _create_and_detach(h: Harness, corr: int, stream_id: int, client_id: int) -> int:
    """A client makes a dynamic stream and leaves it (so its one-lease rule lets it go on)."""
    resp = single_response(_create(h, corr, stream_id, client_id))
    assert isinstance(resp, SendAttachResponse) and resp.code == ResponseCode.OK, resp
    h.detach(resp, client_id, C, corr=corr + 50_000)
    assert resp.stream_id is not None
    return resp.stream_id


def _dynamic_ids(h: Harness) -> list[int]:
    return [s.stream_id for s in h.core.status(h.now).streams if s.dynamic]


# --------------------------------------------------------------------------- limits


def test_13_5_per_client_limit_refuses_the_next_dynamic_stream() -> None:
    """#13.5: one clientId creates at most max_dynamic_streams_per_client streams."""
    h = _core(max_dynamic_streams_per_client=2)
    assert [_create_and_detach(h, i, 20000 + i, 7) for i in range(2)] == [20000, 20001]
    created = len(h.created)
    resp = single_response(_create(h, 10, 20002, 7))
    assert resp.code == ResponseCode.REJECTED
    assert "max_dynamic_streams_per_client" in resp.error_message
    assert len(h.created) == created  # no files for the refused request
    assert _dynamic_ids(h) == [20000, 20001]
    # The limit is about creating: the client may still use existing streams, and other
    # clients may still create.
    assert h.attach_ok(11, 20000, 7, C).stream_id == 20000
    assert h.attach_ok(12, 20002, 8, C, publish_mode=CREATE).stream_id == 20002
    assert h.core.counters["attach_error_dynamic_client_limit"] == 1


def test_13_5_total_limit_refuses_creation_but_not_configured_streams() -> None:
    """#13.5: max_dynamic_streams bounds what forged clientIds can create together."""
    h = _core(max_dynamic_streams=3, max_dynamic_streams_per_client=100)
    for i in range(3):
        _create_and_detach(h, i, 20000 + i, 100 + i)
    resp = single_response(_create(h, 9, 20005, 999))
    assert resp.code == ResponseCode.REJECTED
    assert "max_dynamic_streams" in resp.error_message
    assert _dynamic_ids(h) == [20000, 20001, 20002]
    assert h.attach_ok(10, CAM, 1000, P).stream_id == CAM
    assert h.core.counters["attach_error_dynamic_total_limit"] == 1


# --------------------------------------------------------------------------- reclaim


def test_13_5_idle_dynamic_stream_reclaimed_and_never_reuses_an_epoch() -> None:
    """#13.5: no lease for dynamic_stream_idle_reclaim_ms → files deleted, stream forgotten;
    created again, it continues above its old epochs, and it no longer counts as the
    creator's."""
    h = _core(dynamic_stream_idle_reclaim_ms=1000, max_dynamic_streams_per_client=1)
    prod = h.attach_ok(1, 20004, 5, P, publish_mode=CREATE)
    h.detach(prod, 5, P)  # the producer's leaving opens epoch 2 (§6)
    assert h.core.stream_epoch(20004) == 2
    assert single_response(_create(h, 2, 20006, 5)).code == ResponseCode.REJECTED
    assert not only(h.advance(999 * MS), ReclaimStream)
    (reclaim,) = only(h.advance(1 * MS), ReclaimStream)
    assert reclaim.stream_id == 20004 and reclaim.epochs == (1, 2)
    assert [os.path.basename(d) for d in reclaim.directories] == ["epoch-1", "epoch-2"]
    assert _dynamic_ids(h) == []
    assert h.core.counters["dynamic_streams_reclaimed"] == 1
    assert not only(h.advance(10_000 * MS), ReclaimStream)  # once only
    again = h.attach_ok(3, 20004, 5, P, publish_mode=CREATE)
    assert again.epoch == 3


def test_13_5_reclaim_spares_configured_and_leased_streams() -> None:
    """#13.5: a configured stream is never reclaimed; a dynamic one is not while it has a
    live lease, and its clock starts only when the last lease ends (here: expiry)."""
    h = _core(dynamic_stream_idle_reclaim_ms=50)
    cam = h.attach_ok(1, CAM, 1, P)
    h.detach(cam, 1, P)  # configured and idle
    cons = h.attach_ok(2, 20003, 2, C, publish_mode=CREATE)
    other = h.attach_ok(3, 20003, 3, C)
    h.detach(other, 3, C)  # one lease ends, one is still live
    for _ in range(20):  # 200 ms with keepalives inside the 30 ms TTL
        assert not only(h.advance(10 * MS), ReclaimStream)
        h.keepalive(cons, 2, C)
    h.advance(30 * MS)  # no keepalive: the lease expires now
    assert not only(h.advance(49 * MS), ReclaimStream)
    reclaimed = only(h.advance(1 * MS), ReclaimStream)
    assert [r.stream_id for r in reclaimed] == [20003]
    assert not only(h.advance(60_000 * MS), ReclaimStream)
    assert h.core.stream_epoch(CAM) == 2  # still there, untouched


def test_13_5_dynamic_streams_left_by_a_previous_driver_are_reclaimed() -> None:
    """#13.5: after a restart, dynamic streams found on disk (ids in the range, not configured)
    had no lease since the old driver died: reclaimed after the idle time, unless a client
    creates them again first; configured streams' old epochs are left to the epoch GC."""
    core = DriverCore(
        make_config(dynamic_stream_idle_reclaim_ms=100, epoch_gc_enabled=False),
        now_ns=0,
        known_epochs={20005: [3, 4], 20006: [1], CAM: [1, 2]},
    )
    h = Harness(core)
    again = h.attach_ok(1, 20006, 1, C, publish_mode=CREATE)
    assert again.epoch == 2
    assert not only(h.advance(99 * MS), ReclaimStream)
    reclaimed = only(h.advance(1 * MS), ReclaimStream)
    assert [(r.stream_id, r.epochs) for r in reclaimed] == [(20005, (3, 4))]
    assert core.counters["orphan_streams_reclaimed"] == 1
    # 20006 goes later, as an ordinary idle stream once its own (unrenewed) lease ended.
    assert [r.stream_id for r in only(h.advance(10_000 * MS), ReclaimStream)] == [20006]
    assert core.counters["orphan_streams_reclaimed"] == 1
    assert h.attach_ok(2, 20005, 2, C, publish_mode=CREATE).epoch == 5


def test_13_5_reclaim_disabled_with_zero() -> None:
    """#13.5: dynamic_stream_idle_reclaim_ms = 0 keeps idle dynamic streams."""
    h = _core(dynamic_stream_idle_reclaim_ms=0)
    _create_and_detach(h, 1, 20000, 1)
    assert not only(h.advance(10**12), ReclaimStream)
    assert _dynamic_ids(h) == [20000]


# --------------------------------------------------------------------------- space


def test_13_5_creation_refused_when_it_would_eat_the_configured_streams_space() -> None:
    """#13.5: a dynamic stream is created only if one epoch of every configured stream still
    fits in shm.base_dir afterwards; the message says what was needed."""
    cfg = make_config()
    reserve = 2 * epoch_bytes(cfg.profiles["camera"], 4096)  # streams cam and cam2
    needed = epoch_bytes(cfg.profiles["small"], 4096)
    h = Harness(DriverCore(cfg, now_ns=0))

    def attach(corr: int, client: int, free: int) -> SendAttachResponse:
        req = attach_req(corr, 20000 + corr, client, C, publish_mode=CREATE)
        resp = single_response(h.run(h.core.on_attach_request(req, h.now, shm_free_bytes=free)))
        assert isinstance(resp, SendAttachResponse)
        return resp

    refused = attach(1, 1, reserve + needed - 1)
    assert refused.code == ResponseCode.REJECTED
    assert f"needs {needed} bytes" in refused.error_message
    assert f"{reserve} bytes are kept for the configured streams" in refused.error_message
    assert h.created == []
    assert attach(2, 2, reserve + needed).code == ResponseCode.OK
    assert h.core.counters["attach_error_dynamic_no_space"] == 1
    # Configured streams themselves are not held back by the reservation.
    req = attach_req(3, CAM, 3, P)
    resp = single_response(h.run(h.core.on_attach_request(req, h.now, shm_free_bytes=0)))
    assert resp.code == ResponseCode.OK


def test_13_5_space_reservation_can_be_switched_off() -> None:
    """#13.5: reserve_shm_for_configured_streams = false leaves only the file-level check."""
    h = Harness(DriverCore(make_config(reserve_shm_for_configured_streams=False), now_ns=0))
    req = attach_req(1, 20000, 1, C, publish_mode=CREATE)
    resp = single_response(h.run(h.core.on_attach_request(req, 0, shm_free_bytes=0)))
    assert resp.code == ResponseCode.OK


# --------------------------------------------------------------------------- counters


def test_13_5_every_refusal_counted_by_reason_in_status() -> None:
    """#13.5: a flood from one client shows up in the status counters, by reason."""
    h = _core(max_dynamic_streams_per_client=2)
    for i in range(2):
        _create_and_detach(h, i, 20000 + i, 7)
    for i in range(5):
        _create(h, 100 + i, 20002 + i, 7)
    counters = h.core.status(h.now).counters
    assert counters["attach_error_dynamic_client_limit"] == 5
    assert counters["attach_rejected"] == 5
    assert counters["dynamic_streams_created"] == 2


# --------------------------------------------------------------------------- files


@pytest.fixture
def shm_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(
        prefix="tp-d135-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_13_5_reclaim_unmaps_and_deletes_epochs_but_keeps_the_marker(shm_dir: str) -> None:
    """#13.5 on real files: every epoch directory goes, the last-epoch marker stays, so a
    restarted driver still starts the stream above the reclaimed epochs."""
    text = BASE_TOML.replace('base_dir = "/dev/shm/tp-test"', f'base_dir = "{shm_dir}"')
    cfg = make_config(text, dynamic_stream_idle_reclaim_ms=5)
    core = DriverCore(cfg, now_ns=0)
    files = RegionFiles(cfg)
    free = files.free_bytes()
    assert free is not None and free > 0
    now = 0

    def run(actions: list) -> list:
        out: list = []
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            out.append(action)
            if isinstance(action, CreateRegions):
                files.create(action, now)
                queue[0:0] = core.on_regions_ready(action.stream_id, action.epoch, now)
            elif isinstance(action, ReclaimStream):
                assert files.reclaim_stream(action) == len(action.epochs)
        return out

    try:
        req = attach_req(1, 20001, 1, P, publish_mode=CREATE)
        (resp,) = only(
            run(core.on_attach_request(req, now, shm_free_bytes=free)), SendAttachResponse
        )
        root = stream_root(cfg, 20001)
        assert sorted(os.listdir(root)) == ["epoch-1", LAST_EPOCH_FILE]
        assert files.live_epochs() == {20001: 1}
        run(core.on_detach_request(detach_req(2, resp.lease_id, 20001, 1, P), now))
        now = 10 * MS
        assert only(run(core.tick(now)), ReclaimStream)
        assert os.listdir(root) == [LAST_EPOCH_FILE]
        assert read_last_epoch(root) == 2
        assert files.live_epochs() == {}
        assert scan_epochs(cfg).floors == {20001: 2}
    finally:
        files.close()


# --------------------------------------------------------------------------- config


def test_13_5_config_keys_defaults_and_bad_values(tmp_path: Path) -> None:
    """#13.5: the new [policies] keys have safe defaults; bad values name the key."""
    pol = make_config().policies
    assert (pol.max_dynamic_streams, pol.max_dynamic_streams_per_client) == (64, 4)
    assert pol.dynamic_stream_idle_reclaim_ms == 60_000
    assert pol.reserve_shm_for_configured_streams
    with pytest.raises(ConfigError) as info:
        make_config(max_dynamic_streams_per_client=-1)
    assert info.value.key == "policies.max_dynamic_streams_per_client"
    with pytest.raises(ConfigError) as info:
        make_config(max_dynamic_stream=3)
    assert info.value.key == "policies.max_dynamic_stream"
    assert "max_dynamic_streams" in str(info.value)  # did-you-mean
