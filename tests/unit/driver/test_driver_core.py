"""Driver Model v1.0 rules enforced by the sans-IO core, one test per rule.

Test names carry the spec section (``test_s4_3_...`` = Driver Model §4.3).
"""

from __future__ import annotations

import dataclasses

import pytest
from driver_helpers import (
    ANNOUNCE_NS,
    CAM,
    CAM2,
    MS,
    TTL_NS,
    Harness,
    attach_req,
    detach_req,
    keepalive_req,
    kinds,
    make_config,
    only,
    roundtrip_attach_response,
    shutdown_req,
    single_response,
)

from tensorpool.driver.actions import (
    ERROR_MESSAGE_MAX_BYTES,
    CreateRegions,
    PublishAnnounce,
    PublishLeaseRevoked,
    PublishShutdown,
    RetireEpoch,
    SendAttachResponse,
    SendDetachResponse,
    cap_error_message,
)
from tensorpool.driver.config import ProfileConfig
from tensorpool.driver.core import DriverCore, DriverState
from tensorpool.driver.leases import lease_id_seed
from tensorpool.driver.streams import (
    MAX_DIMS,
    SUPERBLOCK_SIZE,
    parse_epoch_dirname,
    parse_stream_dirname,
)
from tensorpool.specs.errors import UnsupportedVersion
from tensorpool.specs.generated.driver import (
    HugepagesPolicy,
    LeaseRevokeReason,
    PublishMode,
    ResponseCode,
    Role,
    ShmAttachRequestDecoder,
    ShutdownReason,
)
from tensorpool.specs.generated.wire import ClockDomain

P, C = Role.PRODUCER, Role.CONSUMER


# --------------------------------------------------------------------------- §4.2 attach


def test_s4_2_consumer_attach_ok_has_every_required_field(harness: Harness) -> None:
    resp = harness.attach_ok(41, CAM, client_id=5, role=C)
    assert resp.correlation_id == 41  # echoed unchanged
    for name in (
        "lease_id",
        "lease_expiry_timestamp_ns",
        "stream_id",
        "epoch",
        "layout_version",
        "header_nslots",
        "header_slot_bytes",
        "max_dims",
    ):
        assert getattr(resp, name) is not None, name
    assert resp.stream_id == CAM
    assert resp.header_slot_bytes == 256
    assert resp.max_dims == MAX_DIMS == 8
    assert resp.layout_version == 1
    assert resp.header_nslots == 256
    assert resp.header_region_uri.startswith("shm:file?path=/dev/shm/tp-test/")
    assert [p[0] for p in resp.payload_pools] == [1, 2]
    # §4.2: every pool has poolNslots == headerNslots and a non-blank URI.
    assert all(p[1] == resp.header_nslots for p in resp.payload_pools)
    assert all(p[3].startswith("shm:file?path=/") for p in resp.payload_pools)
    # The action encodes with the real codec and decodes back with nothing null.
    dec = roundtrip_attach_response(resp)
    assert dec.code == ResponseCode.OK
    assert dec.lease_id == resp.lease_id
    assert dec.epoch == resp.epoch
    assert [p.pool_nslots for p in dec.payload_pools] == [256, 256]
    assert dec.header_region_uri == resp.header_region_uri


def test_s4_2_regions_exist_before_the_ok_response(harness: Harness) -> None:
    """The OK response is only produced after the agent confirms the files."""
    actions = harness.core.on_attach_request(attach_req(1, CAM, 1, C), 0)
    assert kinds(actions) == ["CreateRegions"]
    create = actions[0]
    assert isinstance(create, CreateRegions)
    layout = create.layout
    assert layout.header_size_bytes == SUPERBLOCK_SIZE + 256 * 256
    assert [p.size_bytes for p in layout.payload_pools] == [
        SUPERBLOCK_SIZE + 256 * 1048576,
        SUPERBLOCK_SIZE + 256 * 4194304,
    ]
    assert layout.directory == f"/dev/shm/tp-test/default/drv-test/stream-{CAM}/epoch-1"
    assert layout.header_path == layout.directory + "/header.ring"
    assert layout.payload_pools[0].path == layout.directory + "/payload-1.pool"
    follow = harness.core.on_regions_ready(CAM, create.epoch, 0)
    assert kinds(follow) == ["SendAttachResponse", "PublishAnnounce"]


def test_s4_2_error_response_leaves_optional_fields_null(harness: Harness) -> None:
    resp = single_response(harness.attach(3, 424242, 1, C))
    assert isinstance(resp, SendAttachResponse)
    assert resp.code == ResponseCode.REJECTED
    assert resp.correlation_id == 3
    assert resp.error_message
    dec = roundtrip_attach_response(resp)
    assert dec.lease_id is None
    assert dec.epoch is None
    assert dec.stream_id is None
    assert dec.header_slot_bytes is None
    assert len(dec.payload_pools) == 0
    assert dec.header_region_uri == ""


def test_s4_2_error_message_capped_at_1024_bytes(harness: Harness) -> None:
    harness.fail_creation = "disk full " * 500
    resp = single_response(harness.attach(1, CAM, 1, C))
    assert resp.code == ResponseCode.INTERNAL_ERROR
    assert 0 < len(resp.error_message.encode("ascii")) <= ERROR_MESSAGE_MAX_BYTES
    assert len(cap_error_message("é" * 2000).encode("ascii")) <= ERROR_MESSAGE_MAX_BYTES


def test_s4_2_region_creation_failure_is_internal_error(harness: Harness) -> None:
    harness.fail_creation = "ENOSPC"
    resp = single_response(harness.attach(1, CAM, 1, P))
    assert resp.code == ResponseCode.INTERNAL_ERROR
    assert "ENOSPC" in resp.error_message
    # Nothing was leased: the producer slot is free and the client may retry.
    assert harness.core.status(harness.now).leases == ()
    ok = harness.attach_ok(2, CAM, 1, P)
    assert ok.epoch == 2  # the failed epoch number is never reused


# --------------------------------------------------------------------------- §4.3 request semantics


@pytest.mark.parametrize("expected", [0, 1])
def test_s4_3_expected_layout_version_zero_or_current_accepted(
    harness: Harness, expected: int
) -> None:
    resp = harness.attach_ok(1, CAM, 1, C, expected_layout_version=expected)
    assert resp.layout_version == 1


def test_s4_3_expected_layout_version_mismatch_rejected(harness: Harness) -> None:
    resp = single_response(harness.attach(1, CAM, 1, C, expected_layout_version=2))
    assert resp.code == ResponseCode.REJECTED
    assert "layout version" in resp.error_message


def test_s4_3_nonzero_max_dims_ignored_and_constant_returned(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C, max_dims=3)
    assert resp.max_dims == 8


def test_s4_3_require_existing_unknown_stream_rejected(harness: Harness) -> None:
    resp = single_response(
        harness.attach(1, 20005, 1, P, publish_mode=PublishMode.REQUIRE_EXISTING)
    )
    assert resp.code == ResponseCode.REJECTED
    assert "not provisioned" in resp.error_message
    assert harness.created == []  # nothing was created


def test_s4_3_null_publish_mode_treated_as_require_existing(harness: Harness) -> None:
    resp = single_response(harness.attach(1, 20005, 1, P, publish_mode=None))
    assert resp.code == ResponseCode.REJECTED
    assert harness.created == []


def test_s4_3_existing_or_create_on_provisioned_stream_uses_it(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, P, publish_mode=PublishMode.EXISTING_OR_CREATE)
    assert resp.stream_id == CAM
    assert resp.header_nslots == 256  # the configured profile, not the dynamic default


def test_s4_3_unknown_publish_mode_unsupported(harness: Harness) -> None:
    req = attach_req(1, CAM, 1, C, raw_patch={ShmAttachRequestDecoder.PUBLISH_MODE_OFFSET: 9})
    resp = single_response(harness.run(harness.core.on_attach_request(req, 0)))
    assert resp.code == ResponseCode.UNSUPPORTED


def test_s4_3_hugepages_required_but_unavailable_rejected(harness: Harness) -> None:
    actions = harness.attach(1, CAM, 1, C, require_hugepages=HugepagesPolicy.HUGEPAGES)
    resp = single_response(actions)
    assert resp.code == ResponseCode.REJECTED
    assert "hugepage" in resp.error_message


def test_s4_3_standard_pages_requested_from_hugepage_driver_rejected() -> None:
    h = Harness(DriverCore(make_config(), now_ns=0, hugepages_backed=True))
    resp = single_response(h.attach(1, CAM, 1, C, require_hugepages=HugepagesPolicy.STANDARD))
    assert resp.code == ResponseCode.REJECTED
    ok = h.attach_ok(2, CAM, 2, C, require_hugepages=HugepagesPolicy.HUGEPAGES)
    assert ok.header_region_uri.endswith("|require_hugepages=true")
    assert all(p[3].endswith("|require_hugepages=true") for p in ok.payload_pools)


def test_s4_3_unspecified_hugepages_follows_driver_policy() -> None:
    cfg = make_config()
    cfg = dataclasses.replace(cfg, shm=dataclasses.replace(cfg.shm, require_hugepages=True))
    h = Harness(DriverCore(cfg, now_ns=0, hugepages_backed=False))
    resp = single_response(h.attach(1, CAM, 1, C))
    assert resp.code == ResponseCode.REJECTED
    h2 = Harness(DriverCore(make_config(), now_ns=0))
    assert h2.attach_ok(1, CAM, 1, C).header_region_uri.endswith("header.ring")


def test_s4_3_unknown_hugepages_policy_invalid_params(harness: Harness) -> None:
    req = attach_req(1, CAM, 1, C, raw_patch={ShmAttachRequestDecoder.REQUIRE_HUGEPAGES_OFFSET: 7})
    resp = single_response(harness.run(harness.core.on_attach_request(req, 0)))
    assert resp.code == ResponseCode.INVALID_PARAMS


def test_s4_3_zero_pool_stream_invalid_params() -> None:
    cfg = make_config()
    empty = ProfileConfig(name="camera", header_nslots=256, payload_pools=())
    cfg = dataclasses.replace(cfg, profiles={**cfg.profiles, "camera": empty})
    h = Harness(DriverCore(cfg, now_ns=0))
    resp = single_response(h.attach(1, CAM, 1, P))
    assert resp.code == ResponseCode.INVALID_PARAMS
    assert h.created == []


# --------------------------------------------------------------------------- §4.4 keepalive


def test_s4_4_keepalive_extends_lease_and_activates_it(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    assert resp.lease_expiry_timestamp_ns == TTL_NS
    assert harness.core.status(0).leases[0].state == "ATTACHED"
    for _ in range(10):  # 10 x 20 ms = 200 ms, far beyond one 30 ms lease term
        harness.advance(20 * MS)
        assert harness.keepalive(resp, 1, C) == []
    assert harness.advance(20 * MS) == []
    (lease,) = harness.core.status(harness.now).leases
    assert lease.state == "ACTIVE"
    assert lease.expires_in_ns == TTL_NS - 20 * MS


def test_s4_4_lease_expires_without_keepalive(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    assert harness.advance(TTL_NS - 1) == []
    actions = harness.advance(1)
    (revoked,) = only(actions, PublishLeaseRevoked)
    assert revoked.lease_id == resp.lease_id
    assert revoked.reason == LeaseRevokeReason.EXPIRED
    assert revoked.role == C
    assert harness.core.status(harness.now).leases == ()


def test_s4_4_late_keepalive_does_not_revive_an_expired_lease(harness: Harness) -> None:
    """A keepalive at/after the deadline expires the lease even if no tick ran."""
    resp = harness.attach_ok(1, CAM, 1, C)
    harness.now = TTL_NS
    actions = harness.keepalive(resp, 1, C)
    assert [a.reason for a in only(actions, PublishLeaseRevoked)] == [LeaseRevokeReason.EXPIRED]
    assert harness.advance(1) == []  # and it is not revoked a second time


def test_s4_4_keepalive_with_wrong_identity_ignored(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    assert resp.lease_id is not None
    harness.now = 20 * MS
    core = harness.core
    assert core.on_keepalive(keepalive_req(resp.lease_id, CAM, 2, C), harness.now) == []
    assert core.on_keepalive(keepalive_req(resp.lease_id, CAM2, 1, C), harness.now) == []
    assert core.on_keepalive(keepalive_req(resp.lease_id, CAM, 1, P), harness.now) == []
    assert core.on_keepalive(keepalive_req(999, CAM, 1, C), harness.now) == []
    assert core.counters["keepalive_mismatch"] == 3
    assert core.counters["keepalive_unknown_lease"] == 1
    # None of them extended the lease: it still expires at the original deadline.
    assert only(harness.advance(TTL_NS - 20 * MS), PublishLeaseRevoked)


# --------------------------------------------------------------------------- §4.4a schema versions


def test_s4_4a_schema_version_mismatch_unsupported(harness: Harness) -> None:
    """A request in a newer schema version gets ``UNSUPPORTED`` with its correlationId."""
    req = attach_req(77, CAM, 1, C)
    buf = req.buffer
    buf[6:8] = (2).to_bytes(2, "little")  # header version field
    with pytest.raises(UnsupportedVersion):
        ShmAttachRequestDecoder().wrap(buf, 0)
    correlation_id = int.from_bytes(buf[8:16], "little", signed=True)
    (resp,) = harness.core.on_incompatible_version(1, correlation_id, 2)
    assert isinstance(resp, SendAttachResponse)
    assert (resp.code, resp.correlation_id) == (ResponseCode.UNSUPPORTED, 77)
    (dresp,) = harness.core.on_incompatible_version(3, 78, 2)
    assert isinstance(dresp, SendDetachResponse)
    assert dresp.code == ResponseCode.UNSUPPORTED
    # A decodable request whose acting version is not the driver's: same answer.
    old = single_response(harness.core.on_attach_request(attach_req(79), 0, schema_version=0))
    assert old.code == ResponseCode.UNSUPPORTED
    assert harness.core.status(0).leases == ()


# --------------------------------------------------------------------------- §4.6 codes


def test_s4_6_unknown_role_invalid_params(harness: Harness) -> None:
    req = attach_req(1, CAM, 1, C, raw_patch={ShmAttachRequestDecoder.ROLE_OFFSET: 0})
    resp = single_response(harness.run(harness.core.on_attach_request(req, 0)))
    assert resp.code == ResponseCode.INVALID_PARAMS


# --------------------------------------------------------------------------- §4.7 lifecycle


def test_s4_7_lifecycle_attached_active_detached(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    assert [lease.state for lease in harness.core.status(0).leases] == ["ATTACHED"]
    harness.keepalive(resp, 1, C)
    assert [lease.state for lease in harness.core.status(0).leases] == ["ACTIVE"]
    harness.detach(resp, 1, C)
    assert harness.core.status(0).leases == ()
    assert harness.core.counters["lease_detached"] == 1


def test_s4_7a_producer_revocation_bumps_epoch_and_announces(harness: Harness) -> None:
    harness.attach_ok(1, CAM, 1, C)
    prod = harness.attach_ok(2, CAM, 2, P)
    assert prod.lease_id is not None
    actions = harness.run(harness.core.revoke_lease(prod.lease_id, harness.now, "maintenance"))
    assert kinds(actions) == ["PublishLeaseRevoked", "CreateRegions", "PublishAnnounce"]
    revoked, _, announce = actions
    assert isinstance(revoked, PublishLeaseRevoked) and isinstance(announce, PublishAnnounce)
    assert revoked.reason == LeaseRevokeReason.REVOKED
    assert revoked.error_message == "maintenance"
    assert prod.epoch is not None and announce.epoch == prod.epoch + 1
    assert announce.producer_id == 0


# --------------------------------------------------------------------------- §4.8 identity


def test_s4_8_lease_ids_never_reused(harness: Harness) -> None:
    seen: list[int] = []
    for i in range(20):
        role = P if i % 2 else C
        resp = harness.attach_ok(i, CAM, 100 + i, role)
        assert resp.lease_id is not None
        seen.append(resp.lease_id)
        if i % 3:
            harness.detach(resp, 100 + i, role)
        else:
            harness.advance(TTL_NS)  # let it expire
    assert len(set(seen)) == len(seen)
    assert seen == sorted(seen)


def test_s4_8_lease_ids_not_reused_across_restart() -> None:
    """A restarted driver seeded from the wall clock issues ids above the old ones."""
    wall = 1_700_000_000_000_000_000
    first = Harness(DriverCore(make_config(), now_ns=0, lease_id_start=lease_id_seed(wall)))
    old = {first.attach_ok(i, CAM, i, C).lease_id for i in range(5)}
    later = lease_id_seed(wall + 10**9, persisted_next=first.core.next_lease_id)
    second = Harness(DriverCore(make_config(), now_ns=0, lease_id_start=later))
    new = second.attach_ok(1, CAM, 1, C).lease_id
    assert new is not None and new > max(i for i in old if i is not None)
    # A persisted high-water mark wins over a clock that went backwards.
    assert lease_id_seed(5, persisted_next=first.core.next_lease_id) == first.core.next_lease_id


def test_s4_8_duplicate_client_id_rejected(harness: Harness) -> None:
    first = harness.attach_ok(1, CAM, 9, C)
    resp = single_response(harness.attach(2, CAM2, 9, P))
    assert resp.code == ResponseCode.REJECTED
    assert "client id 9" in resp.error_message
    assert [lease.lease_id for lease in harness.core.status(0).leases] == [first.lease_id]
    # Once the first lease is gone the id may attach again.
    harness.detach(first, 9, C)
    harness.attach_ok(3, CAM2, 9, P)


def test_s4_8_duplicate_correlation_id_is_a_retry(harness: Harness) -> None:
    first = harness.attach_ok(5, CAM, 1, P)
    created = len(harness.created)
    again = harness.attach(5, CAM, 1, P)
    assert again == [first]  # the same response, no new lease, no new epoch
    assert len(harness.created) == created
    assert len(harness.core.status(0).leases) == 1
    # The same correlationId from another client is a different request.
    assert harness.attach_ok(5, CAM, 2, C).lease_id != first.lease_id


def test_s4_8_retry_while_files_are_being_created_is_ignored(harness: Harness) -> None:
    core = harness.core
    (create,) = core.on_attach_request(attach_req(5, CAM, 1, P), 0)
    assert core.on_attach_request(attach_req(5, CAM, 1, P), 0) == []
    assert isinstance(create, CreateRegions)
    follow = core.on_regions_ready(CAM, create.epoch, 0)
    assert kinds(follow) == ["SendAttachResponse", "PublishAnnounce"]


# --------------------------------------------------------------------------- §4.9 detach / revoke


def test_s4_9_detach_consumer_ok_and_revoked(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    actions = harness.detach(resp, 1, C, corr=555)
    assert kinds(actions) == ["SendDetachResponse", "PublishLeaseRevoked"]
    reply, revoked = actions
    assert isinstance(reply, SendDetachResponse) and isinstance(revoked, PublishLeaseRevoked)
    assert (reply.code, reply.correlation_id) == (ResponseCode.OK, 555)
    assert revoked.reason == LeaseRevokeReason.DETACHED
    assert (revoked.lease_id, revoked.stream_id, revoked.client_id) == (resp.lease_id, CAM, 1)


def test_s4_9_detach_idempotent(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, P)
    first = harness.detach(resp, 1, P)
    assert len(only(first, PublishLeaseRevoked)) == 1
    again = harness.detach(resp, 1, P)
    assert kinds(again) == ["SendDetachResponse"]
    assert single_response(again).code == ResponseCode.OK
    assert harness.core.counters["detach_repeat"] == 1


def test_s4_9_detach_unknown_or_foreign_lease_rejected(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    assert resp.lease_id is not None
    core = harness.core
    unknown = single_response(core.on_detach_request(detach_req(1, 12345, CAM, 1, C), 0))
    assert unknown.code == ResponseCode.REJECTED
    foreign = single_response(core.on_detach_request(detach_req(2, resp.lease_id, CAM, 2, C), 0))
    assert foreign.code == ResponseCode.REJECTED
    assert len(core.status(0).leases) == 1  # still attached


def test_s4_9_detach_after_expiry_rejected(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    harness.advance(TTL_NS)
    reply = single_response(harness.detach(resp, 1, C))
    assert reply.code == ResponseCode.REJECTED
    assert "EXPIRED" in reply.error_message


def test_s4_9_producer_detach_revoked_before_epoch_bumped_announce(harness: Harness) -> None:
    prod = harness.attach_ok(1, CAM, 1, P)
    actions = harness.detach(prod, 1, P)
    assert kinds(actions) == [
        "SendDetachResponse",
        "PublishLeaseRevoked",
        "CreateRegions",
        "PublishAnnounce",
    ]
    announce = actions[-1]
    assert isinstance(announce, PublishAnnounce)
    assert prod.epoch is not None and announce.epoch > prod.epoch
    assert announce.stream_id == CAM


def test_s4_9_consumer_keepalive_loss_only_affects_that_lease(harness: Harness) -> None:
    prod = harness.attach_ok(1, CAM, 1, P)
    keep = harness.attach_ok(2, CAM, 2, C)
    lost = harness.attach_ok(3, CAM, 3, C)
    other = harness.attach_ok(4, CAM2, 4, C)
    revoked: list[PublishLeaseRevoked] = []
    for _ in range(4):
        harness.now += 10 * MS
        harness.keepalive(prod, 1, P)
        harness.keepalive(keep, 2, C)
        harness.keepalive(other, 4, C)
        out = harness.run(harness.core.tick(harness.now))
        revoked += only(out, PublishLeaseRevoked)
        assert not only(out, CreateRegions)  # no epoch change for a consumer
    assert [r.lease_id for r in revoked] == [lost.lease_id]
    assert harness.core.stream_epoch(CAM) == prod.epoch
    live = {lease.lease_id for lease in harness.core.status(harness.now).leases}
    assert live == {prod.lease_id, keep.lease_id, other.lease_id}


def test_s4_9_no_duplicate_revocation_per_lease(harness: Harness) -> None:
    resp = harness.attach_ok(1, CAM, 1, C)
    assert resp.lease_id is not None
    harness.advance(TTL_NS)
    harness.advance(TTL_NS)
    assert harness.core.revoke_lease(resp.lease_id, harness.now) == []
    assert len([a for a in harness.log if isinstance(a, PublishLeaseRevoked)]) == 1


# --------------------------------------------------------------------------- §4.13 shutdown


def test_s4_13_shutdown_wrong_token_ignored(harness: Harness) -> None:
    for token in ("wrong", "", None, "s3cret-but-longer"):
        assert harness.core.on_shutdown_request(shutdown_req(token), 0) == []
    assert harness.core.state is DriverState.RUNNING
    assert harness.core.counters["shutdown_request_bad_token"] == 4
    harness.attach_ok(1, CAM, 1, C)  # still serving


def test_s4_13_shutdown_disabled_without_configured_token() -> None:
    h = Harness(DriverCore(make_config(shutdown_token=""), now_ns=0))
    assert h.core.on_shutdown_request(shutdown_req(""), 0) == []
    assert h.core.on_shutdown_request(shutdown_req("anything"), 0) == []
    assert h.core.state is DriverState.RUNNING


def test_s4_13_shutdown_with_token_drains_then_notifies(harness: Harness) -> None:
    cons = harness.attach_ok(1, CAM, 1, C)
    actions = harness.run(
        harness.core.on_shutdown_request(shutdown_req("s3cret", message="maint"), harness.now)
    )
    assert kinds(actions) == ["PublishAnnounce"]  # the final announce
    assert harness.core.state is DriverState.DRAINING
    refused = single_response(harness.attach(2, CAM2, 2, C))
    assert refused.code == ResponseCode.REJECTED
    harness.now += 10 * MS
    assert harness.keepalive(cons, 1, C) == []  # keepalives still served
    assert not only(harness.advance(30 * MS), PublishShutdown)
    out = harness.advance(10 * MS)  # 50 ms shutdown timeout reached
    (notice,) = only(out, PublishShutdown)
    assert notice.reason == ShutdownReason.ADMIN
    assert notice.error_message == "maint"
    assert harness.core.state is DriverState.STOPPED
    assert harness.core.status(harness.now).leases == ()
    assert harness.advance(ANNOUNCE_NS) == []
    assert harness.core.next_deadline_ns() is None


def test_s4_13_local_shutdown_with_zero_timeout_is_immediate() -> None:
    h = Harness(DriverCore(make_config(shutdown_timeout_ms=0), now_ns=0))
    h.attach_ok(1, CAM, 1, P)
    actions = h.run(h.core.begin_shutdown(0))
    assert kinds(actions) == ["PublishAnnounce", "PublishLeaseRevoked", "PublishShutdown"]
    assert h.core.state is DriverState.STOPPED


def test_s4_9_shutdown_revokes_each_lease_before_the_notice() -> None:
    """#14.3, Driver §4.9: shutdown invalidates every lease, and "for any lease invalidation
    event ... the driver MUST publish a ShmLeaseRevoked": one per live lease (producer and
    consumers, every stream), reason REVOKED, all before ``ShmDriverShutdown``; no new epoch."""
    harness = Harness(DriverCore(make_config(shutdown_timeout_ms=0), now_ns=0))
    prod = harness.attach_ok(1, CAM, 1, P)
    cons = harness.attach_ok(2, CAM, 2, C)
    other = harness.attach_ok(3, CAM2, 3, C)
    actions = harness.run(harness.core.begin_shutdown(harness.now))
    assert kinds(actions)[-1] == "PublishShutdown"
    assert "CreateRegions" not in kinds(actions)
    revoked = only(actions, PublishLeaseRevoked)
    assert {(r.lease_id, r.stream_id, r.client_id, r.role) for r in revoked} == {
        (prod.lease_id, CAM, 1, Role.PRODUCER),
        (cons.lease_id, CAM, 2, Role.CONSUMER),
        (other.lease_id, CAM2, 3, Role.CONSUMER),
    }
    assert {r.reason for r in revoked} == {LeaseRevokeReason.REVOKED}
    assert harness.core.status(harness.now).leases == ()


def test_s4_9_forced_stop_also_revokes_each_lease(harness: Harness) -> None:
    """#14.3: a second signal skips the drain, not the per-lease notices (§4.9)."""
    prod = harness.attach_ok(1, CAM, 1, P)
    actions = harness.run(harness.core.stop_now(harness.now, message="forced"))
    assert kinds(actions) == ["PublishLeaseRevoked", "PublishShutdown"]
    assert actions[0].lease_id == prod.lease_id  # type: ignore[union-attr]
    assert harness.core.state is DriverState.STOPPED
    assert harness.core.stop_now(harness.now) == []


def test_s4_9_second_signal_during_the_drain_revokes_and_says_forced(harness: Harness) -> None:
    """#14.3: a drain cut short by a second signal still ends each lease with its own notice,
    and the shutdown notice says "forced" (NORMAL)."""
    cons = harness.attach_ok(1, CAM, 1, C)
    harness.run(harness.core.begin_shutdown(harness.now, ShutdownReason.ADMIN, "maint"))
    assert harness.core.state is DriverState.DRAINING
    actions = harness.run(harness.core.stop_now(harness.now, message="forced"))
    assert kinds(actions) == ["PublishLeaseRevoked", "PublishShutdown"]
    revoked, notice = actions
    assert revoked.lease_id == cons.lease_id  # type: ignore[union-attr]
    assert (notice.reason, notice.error_message) == (ShutdownReason.NORMAL, "forced")  # type: ignore[union-attr]


# --------------------------------------------------------------------------- §5 exclusive producer


def test_s5_second_producer_rejected(harness: Harness) -> None:
    first = harness.attach_ok(1, CAM, 1, P)
    resp = single_response(harness.attach(2, CAM, 2, P))
    assert resp.code == ResponseCode.REJECTED
    assert "producer" in resp.error_message
    # Another stream is independent.
    harness.attach_ok(3, CAM2, 3, P)
    # After the first producer leaves, a new one may attach.
    harness.detach(first, 1, P)
    harness.attach_ok(4, CAM, 2, P)


def test_s5_consumers_unlimited(harness: Harness) -> None:
    harness.attach_ok(0, CAM, 1000, P)
    leases = {harness.attach_ok(i, CAM, i, C).lease_id for i in range(1, 101)}
    assert len(leases) == 100
    (stream,) = [s for s in harness.core.status(0).streams if s.stream_id == CAM]
    assert stream.consumer_count == 100
    assert stream.producer_client_id == 1000


# --------------------------------------------------------------------------- §6 / §7 epochs


def test_s6_epoch_bumps_when_producer_attaches(harness: Harness) -> None:
    cons = harness.attach_ok(1, CAM, 1, C)
    prod = harness.attach_ok(2, CAM, 2, P)
    assert cons.epoch is not None and prod.epoch == cons.epoch + 1
    # More consumers do not change the epoch.
    assert harness.attach_ok(3, CAM, 3, C).epoch == prod.epoch


def test_s6_epoch_bumps_on_producer_expiry(harness: Harness) -> None:
    prod = harness.attach_ok(1, CAM, 1, P)
    cons = harness.attach_ok(2, CAM, 2, C)
    harness.now += 20 * MS
    harness.keepalive(cons, 2, C)
    actions = harness.advance(TTL_NS - 20 * MS)
    assert kinds(actions) == ["PublishLeaseRevoked", "CreateRegions", "PublishAnnounce"]
    revoked, _, announce = actions
    assert isinstance(revoked, PublishLeaseRevoked) and isinstance(announce, PublishAnnounce)
    assert (revoked.lease_id, revoked.reason) == (prod.lease_id, LeaseRevokeReason.EXPIRED)
    assert prod.epoch is not None and announce.epoch == prod.epoch + 1
    # The consumer keeps its lease and is told about the new epoch.
    assert cons.lease_id in {lease.lease_id for lease in harness.core.status(0).leases}


def test_s6_epoch_bumps_on_layout_change(harness: Harness) -> None:
    prod = harness.attach_ok(1, CAM, 1, P)
    actions = harness.run(harness.core.change_stream_profile(CAM, "small", harness.now))
    assert kinds(actions) == ["PublishLeaseRevoked", "CreateRegions", "PublishAnnounce"]
    announce = actions[-1]
    assert isinstance(announce, PublishAnnounce)
    assert prod.epoch is not None and announce.epoch == prod.epoch + 1
    assert announce.header_nslots == 16
    assert [p[0] for p in announce.payload_pools] == [7]
    # Without a producer, a layout change still opens a new epoch.
    again = harness.run(harness.core.change_stream_profile(CAM, "camera", harness.now))
    assert kinds(again) == ["CreateRegions", "PublishAnnounce"]


def test_s6_epoch_bumps_when_files_are_recreated(harness: Harness) -> None:
    cons = harness.attach_ok(1, CAM, 1, C)
    actions = harness.run(harness.core.recreate_regions(CAM, harness.now))
    assert kinds(actions) == ["CreateRegions", "PublishAnnounce"]
    assert cons.epoch is not None and harness.core.stream_epoch(CAM) == cons.epoch + 1


def test_s6_epochs_strictly_increase_per_stream(harness: Harness) -> None:
    epochs = []
    for i in range(5):
        prod = harness.attach_ok(i, CAM, 1, P)
        epochs.append(prod.epoch)
        harness.detach(prod, 1, P)
    created = [c.epoch for c in harness.created if c.stream_id == CAM]
    assert created == sorted(set(created))
    assert epochs == sorted(set(epochs))


def test_s7_new_producer_after_crash_gets_higher_epoch(harness: Harness) -> None:
    crashed = harness.attach_ok(1, CAM, 1, P)
    harness.advance(TTL_NS)  # no keepalives: the producer "crashed"
    successor = harness.attach_ok(2, CAM, 2, P)
    assert crashed.epoch is not None and successor.epoch is not None
    assert successor.epoch >= crashed.epoch + 2  # one bump on expiry, one on attach


# --------------------------------------------------------------------------- §8 announce


def test_s8_announce_producer_id_and_period(harness: Harness) -> None:
    harness.attach_ok(1, CAM, 1, C)
    (announce,) = only(harness.log, PublishAnnounce)
    assert announce.producer_id == 0  # no producer yet
    assert announce.announce_clock_domain == ClockDomain.MONOTONIC
    prod = harness.attach_ok(2, CAM, 77, P)
    latest = only(harness.log, PublishAnnounce)[-1]
    assert (latest.producer_id, latest.epoch) == (77, prod.epoch)
    periodic: list[PublishAnnounce] = []
    for _ in range(25):  # keep the producer alive and watch the periodic beacon
        harness.now += 10 * MS
        harness.keepalive(prod, 77, P)
        periodic += only(harness.run(harness.core.tick(harness.now)), PublishAnnounce)
    assert [a.announce_timestamp_ns for a in periodic] == [ANNOUNCE_NS, 2 * ANNOUNCE_NS]
    assert all(a.producer_id == 77 and a.epoch == prod.epoch for a in periodic)


# --------------------------------------------------------------------------- §10 restart


def test_s10_epoch_floor_respected_after_restart() -> None:
    """Restart → the first epoch handed out is above what is already on disk."""
    cfg = make_config()
    first = Harness(DriverCore(cfg, now_ns=0))
    prod = first.attach_ok(1, CAM, 1, P)
    dirs = {c.layout.directory.rsplit("/", 1)[-1] for c in first.created}
    floor = max(e for e in map(parse_epoch_dirname, dirs) if e is not None)
    assert floor == prod.epoch
    restarted = Harness(DriverCore(cfg, now_ns=0, epoch_floors={CAM: floor}))
    cons = restarted.attach_ok(1, CAM, 1, C)
    assert cons.epoch == floor + 1
    assert restarted.attach_ok(2, CAM, 2, P).epoch == floor + 2


def test_s10_known_epochs_raise_the_floor() -> None:
    h = Harness(DriverCore(make_config(), now_ns=0, known_epochs={CAM: [3, 9, 4]}))
    assert h.attach_ok(1, CAM, 1, C).epoch == 10


# --------------------------------------------------------------------------- §11 dynamic streams


def test_s11_dynamic_stream_created_from_default_profile_in_range(harness: Harness) -> None:
    resp = harness.attach_ok(1, 20003, 1, P, publish_mode=PublishMode.EXISTING_OR_CREATE)
    assert resp.stream_id == 20003
    assert resp.header_nslots == 16  # the "small" default profile
    assert [p[:3] for p in resp.payload_pools] == [(7, 16, 4096)]
    # Once created it is provisioned: REQUIRE_EXISTING now works for consumers.
    cons = harness.attach_ok(2, 20003, 2, C, publish_mode=PublishMode.REQUIRE_EXISTING)
    assert cons.epoch == resp.epoch
    (status,) = [s for s in harness.core.status(0).streams if s.stream_id == 20003]
    assert status.dynamic


def test_s11_dynamic_stream_id_outside_range_is_allocated_from_it(harness: Harness) -> None:
    a = harness.attach_ok(1, 5, 1, P, publish_mode=PublishMode.EXISTING_OR_CREATE)
    b = harness.attach_ok(2, 6, 2, P, publish_mode=PublishMode.EXISTING_OR_CREATE)
    assert a.stream_id == 20000 and b.stream_id == 20001


def test_s11_dynamic_range_exhausted_rejected(harness: Harness) -> None:
    for i in range(10):
        harness.attach_ok(i, 20000 + i, 100 + i, C, publish_mode=PublishMode.EXISTING_OR_CREATE)
    resp = single_response(
        harness.attach(99, 1, 999, C, publish_mode=PublishMode.EXISTING_OR_CREATE)
    )
    assert resp.code == ResponseCode.REJECTED
    assert "exhausted" in resp.error_message


def test_s11_dynamic_creation_without_range_invalid_params() -> None:
    cfg = make_config()
    cfg = dataclasses.replace(cfg, driver=dataclasses.replace(cfg.driver, stream_id_range=None))
    h = Harness(DriverCore(cfg, now_ns=0))
    resp = single_response(h.attach(1, 20001, 1, P, publish_mode=PublishMode.EXISTING_OR_CREATE))
    assert resp.code == ResponseCode.INVALID_PARAMS


def test_s11_dynamic_creation_disabled_rejected() -> None:
    h = Harness(DriverCore(make_config(allow_dynamic_streams=False), now_ns=0))
    resp = single_response(h.attach(1, 20001, 1, P, publish_mode=PublishMode.EXISTING_OR_CREATE))
    assert resp.code == ResponseCode.REJECTED
    assert h.created == []


# --------------------------------------------------------------------------- epoch GC


def test_epoch_gc_keeps_newest_and_waits_min_age(harness: Harness) -> None:
    for i in range(4):  # epochs 1..4 (+ one more from the last detach)
        prod = harness.attach_ok(i, CAM, 1, P)
        harness.detach(prod, 1, P)
    current = harness.core.stream_epoch(CAM)
    assert current == 8
    assert not only(harness.advance(299 * MS), RetireEpoch)  # younger than min age
    retired = only(harness.advance(1 * MS), RetireEpoch)
    assert sorted(r.epoch for r in retired) == list(range(1, current - 1))
    assert all(r.directory.endswith(f"epoch-{r.epoch}") for r in retired)
    assert not only(harness.advance(ANNOUNCE_NS * 10), RetireEpoch)  # never twice


def test_epoch_gc_on_startup_ignores_age() -> None:
    core = DriverCore(
        make_config(epoch_gc_on_startup=True), now_ns=0, known_epochs={CAM: [1, 2, 3, 4]}
    )
    assert sorted(a.epoch for a in core.startup_gc(0) if isinstance(a, RetireEpoch)) == [1, 2]
    off = DriverCore(make_config(), now_ns=0, known_epochs={CAM: [1, 2, 3, 4]})
    assert off.startup_gc(0) == []


def test_epoch_gc_reclaim_space_ignores_age_but_keeps_newest(harness: Harness) -> None:
    """EPOCH_GC_POLICY: on allocation failure collect at once, never the live epochs."""
    for i in range(3):
        prod = harness.attach_ok(i, CAM, 1, P)
        harness.detach(prod, 1, P)
    current = harness.core.stream_epoch(CAM)
    retired = harness.core.reclaim_space(harness.now)
    assert sorted(r.epoch for r in retired if isinstance(r, RetireEpoch)) == list(
        range(1, current - 1)
    )
    assert harness.core.reclaim_space(harness.now) == []


def test_epoch_dir_names_round_trip() -> None:
    assert parse_epoch_dirname("epoch-12") == 12
    for bad in ("epoch-0", "epoch-012", "epoch-", "epoch-1x", "stream-3", "epoch--1"):
        assert parse_epoch_dirname(bad) is None, bad
    assert parse_stream_dirname("stream-10000") == 10000
    assert parse_stream_dirname("stream-4294967295") is None  # the uint32 null value
    assert parse_stream_dirname("stream-10000\n") is None  # a name the driver never writes
    assert parse_stream_dirname("stream-01") is None


def test_epoch_gc_disabled_retires_nothing() -> None:
    h = Harness(DriverCore(make_config(epoch_gc_enabled=False), now_ns=0))
    for i in range(4):
        prod = h.attach_ok(i, CAM, 1, P)
        h.detach(prod, 1, P)
    assert not only(h.advance(10**10), RetireEpoch)


# --------------------------------------------------------------------------- status


def test_status_snapshot_reports_streams_and_leases(harness: Harness) -> None:
    prod = harness.attach_ok(1, CAM, 11, P)
    harness.now = 5 * MS
    harness.attach_ok(2, CAM, 12, C)
    status = harness.core.status(7 * MS)
    assert status.instance_id == "drv-test"
    assert status.state == "RUNNING"
    cam = next(s for s in status.streams if s.stream_id == CAM)
    assert (cam.epoch, cam.producer_client_id, cam.consumer_count) == (prod.epoch, 11, 1)
    assert cam.regions_ready
    cam2 = next(s for s in status.streams if s.stream_id == CAM2)
    assert (cam2.epoch, cam2.regions_ready, cam2.consumer_count) == (0, False, 0)
    roles = {(lease.client_id, lease.role, lease.age_ns) for lease in status.leases}
    assert roles == {(11, "PRODUCER", 7 * MS), (12, "CONSUMER", 2 * MS)}
    assert status.counters["attach_ok"] == 2
