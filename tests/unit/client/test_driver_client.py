"""LeaseMachine: the client side of the Driver Model (§4.2, §4.4, §4.7a, §4.9, §4.12, §4.13)."""

from __future__ import annotations

import pytest

from tensorpool.client.lease import (
    ROLE_CONSUMER,
    ROLE_PRODUCER,
    Attached,
    AttachFailed,
    AttachPhase,
    IllegalTransition,
    LeaseEvent,
    LeaseLost,
    LeaseMachine,
    LeaseTimings,
    NoticeNotConfirmed,
    ProducerRevoked,
    SendAttach,
    SendDetach,
    SendKeepalive,
    is_transient_refusal,
)
from tensorpool.client.lease import TRANSITIONS as TABLE
from tensorpool.specs import CodecError
from tensorpool.specs.generated import driver as dp

MS = 1_000_000
T = LeaseTimings(
    keepalive_interval_ns=100 * MS,
    attach_timeout_ns=500 * MS,
    backoff_initial_ns=50 * MS,
    backoff_max_ns=400 * MS,
)


def _response(corr: int, **over: object) -> dp.ShmAttachResponseDecoder:
    fields: dict[str, object] = dict(
        correlation_id=corr,
        code=dp.ResponseCode.OK,
        lease_id=77,
        lease_expiry_timestamp_ns=None,
        stream_id=5,
        epoch=3,
        layout_version=1,
        header_nslots=8,
        header_slot_bytes=256,
        max_dims=8,
        payload_pools=[(1, 8, 4096, "shm:file?path=/dev/shm/x/payload-1.pool")],
        header_region_uri="shm:file?path=/dev/shm/x/header.ring",
    )
    fields.update(over)
    buf = bytearray(4096)
    dp.ShmAttachResponseEncoder.encode(buf, 0, **fields)
    return dp.ShmAttachResponseDecoder().wrap(buf)


def _revoked(lease_id: int, role: int, stream: int = 5, reason: int = 2) -> object:
    buf = bytearray(256)
    dp.ShmLeaseRevokedEncoder.encode(
        buf,
        0,
        timestamp_ns=1,
        lease_id=lease_id,
        stream_id=stream,
        client_id=9,
        role=role,
        reason=reason,
        error_message="",
    )
    return dp.ShmLeaseRevokedDecoder().wrap(buf)


def _refusal(corr: int, message: str) -> dp.ShmAttachResponseDecoder:
    return _response(
        corr, code=dp.ResponseCode.REJECTED, lease_id=None, epoch=None, error_message=message
    )


def _attached(role: int = ROLE_CONSUMER) -> tuple[LeaseMachine, int]:
    m = LeaseMachine(5, role, client_id=42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    assert isinstance(req, SendAttach)
    (ev,) = m.on_attach_response(_response(req.correlation_id), 0)
    assert isinstance(ev, Attached)
    return m, req.correlation_id


def test_s4_2_ok_response_attaches_with_layout_and_lease() -> None:
    m, _ = _attached()
    assert m.state is AttachPhase.ATTACHED and m.lease_id == 77
    assert m.layout is not None and m.layout.epoch == 3 and m.layout.pools[0].stride_bytes == 4096


def test_s4_2_response_with_other_correlation_id_ignored() -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    assert m.on_attach_response(_response(req.correlation_id + 5), 0) == []
    assert m.state is AttachPhase.ATTACHING


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"lease_id": None}, "null required"),
        ({"epoch": None}, "null required"),
        ({"header_slot_bytes": 128}, "headerSlotBytes"),
        ({"max_dims": 4}, "maxDims"),
        ({"payload_pools": []}, "empty payloadPools"),
        ({"payload_pools": [(1, 16, 4096, "shm:file?path=/dev/shm/x/p")]}, "nslots"),
        ({"header_region_uri": ""}, "empty headerRegionUri"),
        ({"payload_pools": [(1, 8, 4096, "  ")]}, "empty regionUri"),
        ({"header_region_uri": "shm:file?path=/x|bogus=1"}, "uri_unknown_parameter"),
    ],
)
def test_s4_7a_malformed_ok_response_is_a_protocol_error_and_reattaches(over, why) -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    evs = m.on_attach_response(_response(req.correlation_id, **over), 0)
    assert len(evs) == 1 and isinstance(evs[0], AttachFailed) and evs[0].code is None
    assert why in evs[0].message
    assert m.state is AttachPhase.BACKOFF and m.lease_id is None
    assert m.tick(10 * MS) == []  # still backing off
    (again,) = m.tick(60 * MS)
    assert isinstance(again, SendAttach) and again.correlation_id != req.correlation_id


def test_s4_12_rejected_attach_backs_off_exponentially() -> None:
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    r = _response(
        req.correlation_id,
        code=dp.ResponseCode.REJECTED,
        lease_id=None,
        epoch=None,
        error_message="layout version 9 requested, driver provides 1",
    )
    (failed,) = m.on_attach_response(r, 0)
    assert isinstance(failed, AttachFailed) and failed.code == int(dp.ResponseCode.REJECTED)
    assert "layout version" in failed.message
    (req2,) = m.tick(50 * MS)
    m.on_attach_response(_response(req2.correlation_id, code=3, lease_id=None), 50 * MS)
    assert m.tick(50 * MS + 99 * MS) == []  # second backoff is twice as long
    assert isinstance(m.tick(50 * MS + 100 * MS)[0], SendAttach)


def test_s4_2_attach_timeout_retries() -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=1)
    m.attach(0)
    evs = m.tick(500 * MS)
    assert isinstance(evs[0], AttachFailed) and m.state is AttachPhase.BACKOFF


def test_s4_4_keepalives_at_the_configured_interval() -> None:
    m, _ = _attached()
    assert m.tick(99 * MS) == []
    (ka,) = m.tick(100 * MS)
    assert isinstance(ka, SendKeepalive) and ka.lease_id == 77
    assert ka.client_timestamp_ns == 100 * MS
    assert m.tick(150 * MS) == []
    assert isinstance(m.tick(200 * MS)[0], SendKeepalive)


def test_s4_4_keepalive_send_failure_is_fatal_and_reattaches() -> None:
    m, _ = _attached()
    (lost,) = m.on_keepalive_failed(0)
    assert isinstance(lost, LeaseLost) and m.state is AttachPhase.BACKOFF


def test_s4_9_own_lease_revoked_stops_and_reattaches() -> None:
    """§4.9 (with the #14 §2 confirmation): a revoke the driver does not contradict ends the
    lease once the confirmation window passes without an answer."""
    m, _ = _attached()
    (probe,) = m.on_lease_revoked(_revoked(77, ROLE_CONSUMER), 0)
    assert isinstance(probe, SendAttach) and m.state is AttachPhase.CONFIRMING
    assert m.on_lease_revoked(_revoked(77, ROLE_CONSUMER), 0) == []  # duplicates are harmless
    lost, *_ = m.tick(T.confirm_timeout_ns)
    assert isinstance(lost, LeaseLost) and lost.reason == "revoked:expired"
    assert m.state is AttachPhase.BACKOFF and m.layout is None
    assert m.on_lease_revoked(_revoked(77, ROLE_CONSUMER), 0) == []  # duplicates are harmless


def test_s4_9_producer_revoked_on_consumed_stream_waits_for_new_epoch() -> None:
    m, _ = _attached(ROLE_CONSUMER)
    (ev,) = m.on_lease_revoked(_revoked(12, ROLE_PRODUCER), 0)
    assert isinstance(ev, ProducerRevoked) and m.state is AttachPhase.ATTACHED
    assert m.on_lease_revoked(_revoked(12, ROLE_PRODUCER, stream=6), 0) == []  # other stream
    assert m.on_lease_revoked(_revoked(13, ROLE_CONSUMER), 0) == []  # someone else's lease


def test_s4_9_revoked_with_unknown_reason_rejected() -> None:
    m, _ = _attached()
    with pytest.raises(CodecError):
        m.on_lease_revoked(_revoked(77, ROLE_CONSUMER, reason=99), 0)
    assert m.state is AttachPhase.ATTACHED


def test_s4_13_driver_shutdown_invalidates_the_lease() -> None:
    """§4.13 (with the #14 §2 confirmation): a draining driver answers the probe "shutting
    down": the notice is confirmed at once, the lease is gone."""
    m, _ = _attached()
    (probe,) = m.on_driver_shutdown(0)
    assert isinstance(probe, SendAttach) and m.state is AttachPhase.CONFIRMING
    (lost,) = m.on_attach_response(
        _refusal(probe.correlation_id, "driver is shutting down"), 1 * MS
    )
    assert isinstance(lost, LeaseLost) and lost.reason == "driver_shutdown"
    assert m.state is AttachPhase.BACKOFF


def test_s4_9_detach_round_trip() -> None:
    m, _ = _attached()
    (d,) = m.detach(0)
    assert isinstance(d, SendDetach) and d.lease_id == 77 and m.state is AttachPhase.DETACHING
    buf = bytearray(64)
    dp.ShmDetachResponseEncoder.encode(
        buf, 0, correlation_id=d.correlation_id, code=0, error_message=""
    )
    m.on_detach_response(dp.ShmDetachResponseDecoder().wrap(buf), 0)
    assert m.state is AttachPhase.CLOSED


def test_s4_4_keepalives_move_the_local_lease_deadline() -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    m.on_attach_response(_response(req.correlation_id, lease_expiry_timestamp_ns=300 * MS), 0)
    for t in range(100, 2000, 100):  # keepalives every 100 ms keep a 300 ms lease alive
        evs = m.tick(t * MS)
        assert [type(e) for e in evs] == [SendKeepalive]
    assert m.state is AttachPhase.ATTACHED and m.lease_expiry_ns == 1900 * MS + 300 * MS


def test_s4_2_lease_expiry_is_a_hard_deadline_when_keepalives_stall() -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    m.on_attach_response(_response(req.correlation_id, lease_expiry_timestamp_ns=300 * MS), 0)
    (lost,) = m.tick(300 * MS)  # the process stalled: no keepalive went out before 300 ms
    assert isinstance(lost, LeaseLost) and lost.reason == "lease_expired"


def test_s4_13_shutdown_notice_older_than_our_attach_is_ignored() -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(1000 * MS)
    m.on_attach_response(_response(req.correlation_id), 1000 * MS)
    assert m.on_driver_shutdown(1001 * MS, timestamp_ns=500 * MS) == []  # a previous driver's
    assert m.state is AttachPhase.ATTACHED
    (probe,) = m.on_driver_shutdown(1002 * MS, timestamp_ns=1001 * MS)
    assert isinstance(probe, SendAttach) and m.state is AttachPhase.CONFIRMING


def test_s4_2_keepalives_adapt_to_a_short_lease() -> None:
    """A driver granting 90 ms leases gets keepalives every 30 ms, not the configured 100 ms."""
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    m.on_attach_response(_response(req.correlation_id, lease_expiry_timestamp_ns=90 * MS), 0)
    assert m.tick(29 * MS) == []
    (ka,) = m.tick(30 * MS)
    assert isinstance(ka, SendKeepalive)
    for t in range(60, 600, 30):
        assert isinstance(m.tick(t * MS)[0], SendKeepalive)
    assert m.state is AttachPhase.ATTACHED


def test_13_3_refusal_for_a_held_lease_is_retried_at_a_steady_short_period() -> None:
    """#13.3: "already has a producer" ends when the crashed holder's lease expires: the
    machine retries every ``busy_retry_ns`` instead of backing off exponentially, so the
    attach lands soon after the expiry."""
    timings = LeaseTimings(
        attach_timeout_ns=500 * MS, backoff_initial_ns=50 * MS, backoff_max_ns=5000 * MS,
        busy_retry_ns=200 * MS,
    )  # fmt: skip
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=timings, correlation_seed=100)
    (req,) = m.attach(0)
    now = 0
    for _ in range(6):  # exponential backoff would be at 1.6 s by the 6th refusal
        r = _response(
            req.correlation_id,
            code=dp.ResponseCode.REJECTED,
            lease_id=None,
            epoch=None,
            error_message="stream 5 already has a producer (lease 7, client 9)",
        )
        (failed,) = m.on_attach_response(r, now)
        assert is_transient_refusal(failed.code, failed.message)
        assert m.tick(now + 199 * MS) == []
        now += 200 * MS
        (req,) = m.tick(now)
        assert isinstance(req, SendAttach)
    assert not is_transient_refusal(int(dp.ResponseCode.REJECTED), "stream 5 is not provisioned")
    assert not is_transient_refusal(int(dp.ResponseCode.INVALID_PARAMS), "already has a producer")


def test_13_2_transport_reset_drops_the_lease_and_reattaches_at_once() -> None:
    """#13.2: after the Aeron client was re-created on a new media driver the lease is
    reported lost and an attach goes out on the next tick, whatever the backoff was."""
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    (att,) = m.on_attach_response(_response(req.correlation_id), 0)
    assert isinstance(att, Attached)
    (lost,) = m.on_transport_reset(10 * MS)
    assert isinstance(lost, LeaseLost) and lost.reason == "media_driver_restarted"
    assert m.lease_id is None
    (again,) = m.tick(10 * MS)
    assert isinstance(again, SendAttach)
    for _ in range(5):  # attach timeouts grow the backoff while the driver is away...
        m.tick(m._deadline)
    assert m.state is AttachPhase.BACKOFF
    assert m.on_transport_reset(5000 * MS) == []  # ...a reset does not wait it out
    assert isinstance(m.tick(5000 * MS)[0], SendAttach)


# --- #14 §2: a revoke / shutdown notice for our lease is confirmed with the driver first ------

_HELD = "client id 42 already holds lease 77 (CONSUMER on stream 5)"


@pytest.mark.parametrize("role", [ROLE_PRODUCER, ROLE_CONSUMER])
@pytest.mark.parametrize("notice", ["revoke", "shutdown"])
def test_14_2_notice_contradicted_by_the_driver_keeps_the_lease(role: int, notice: str) -> None:
    """#14 §2: a forged ShmLeaseRevoked / ShmDriverShutdown is answered by the driver's
    "already holds lease 77" for our probe: no LeaseLost, same lease, counted."""
    m, _ = _attached(role)
    if notice == "revoke":
        (probe,) = m.on_lease_revoked(_revoked(77, role), 10 * MS)
    else:
        (probe,) = m.on_driver_shutdown(10 * MS, timestamp_ns=5 * MS)
    assert isinstance(probe, SendAttach) and probe.client_id == 42 and probe.role == role
    assert m.state is AttachPhase.CONFIRMING and m.holds_lease and m.lease_id == 77
    (ok,) = m.on_attach_response(_refusal(probe.correlation_id, _HELD), 11 * MS)
    assert isinstance(ok, NoticeNotConfirmed)
    assert m.state is AttachPhase.ATTACHED and m.lease_id == 77 and m.layout is not None
    assert m.counters["notice_not_confirmed"] == 1
    assert m.tick(10 * T.confirm_timeout_ns)[0] == SendKeepalive(77, 5, 42, role, 10 * 500 * MS)


def test_14_2_held_lease_of_another_id_confirms_the_notice() -> None:
    """#14 §2: "already holds lease 78" is not our lease 77: the notice stands."""
    m, _ = _attached()
    (probe,) = m.on_lease_revoked(_revoked(77, ROLE_CONSUMER), 0)
    other = _HELD.replace("lease 77", "lease 78")
    (lost,) = m.on_attach_response(_refusal(probe.correlation_id, other), 1 * MS)
    assert isinstance(lost, LeaseLost) and m.state is AttachPhase.BACKOFF


def test_14_2_probe_granted_means_the_revoke_was_real_and_is_the_reattach() -> None:
    """#14 §2: the driver grants the probe (our lease was really gone): LeaseLost, then the
    new lease at once, with no backoff in between (a real revoke recovers as fast as before)."""
    m, _ = _attached(ROLE_PRODUCER)
    (probe,) = m.on_lease_revoked(_revoked(77, ROLE_PRODUCER), 0)
    lost, att = m.on_attach_response(_response(probe.correlation_id, lease_id=80, epoch=4), 1)
    assert isinstance(lost, LeaseLost) and lost.reason == "revoked:expired"
    assert isinstance(att, Attached) and att.lease_id == 80 and att.layout.epoch == 4
    assert m.state is AttachPhase.ATTACHED and m.lease_id == 80


def test_30_doubted_lease_is_confirmed_with_the_driver_like_a_notice() -> None:
    """#30 soak defect (a): the owner doubts the lease (a newer epoch announced). The probe
    goes out; a grant replaces the lease at once (LeaseLost, then Attached at the new epoch);
    "already holds lease 77" (a forged announce) keeps it; doubting while not attached (or
    while a probe is out) sends nothing."""
    m, _ = _attached(ROLE_PRODUCER)
    (probe,) = m.on_lease_doubted("superseded_epoch", 0)
    assert isinstance(probe, SendAttach) and m.state is AttachPhase.CONFIRMING
    assert m.on_lease_doubted("superseded_epoch", 1) == []
    lost, att = m.on_attach_response(_response(probe.correlation_id, lease_id=80, epoch=7), 2)
    assert isinstance(lost, LeaseLost) and lost.reason == "superseded_epoch"
    assert isinstance(att, Attached) and att.layout.epoch == 7 and m.lease_id == 80
    m, _ = _attached(ROLE_PRODUCER)
    (probe,) = m.on_lease_doubted("superseded_epoch", 0)
    held = _HELD.replace("CONSUMER", "PRODUCER")
    (kept,) = m.on_attach_response(_refusal(probe.correlation_id, held), 1)
    assert isinstance(kept, NoticeNotConfirmed) and m.lease_id == 77
    m.on_lease_revoked(_revoked(77, ROLE_PRODUCER), 2)
    m.tick(10 * T.confirm_timeout_ns)  # confirmed: lease lost, backoff
    assert m.state is AttachPhase.BACKOFF and m.on_lease_doubted("superseded_epoch", 3) == []


def test_14_2_unanswered_probe_confirms_the_notice_after_the_window() -> None:
    """#14 §2: a driver that really shut down does not answer: the lease is dropped when the
    confirmation window ends, not before; keepalives continue meanwhile."""
    m, _ = _attached()
    (probe,) = m.on_driver_shutdown(0)
    assert m.state is AttachPhase.CONFIRMING
    assert [type(e) for e in m.tick(T.confirm_timeout_ns - 1)] == [SendKeepalive]
    lost, *rest = m.tick(T.confirm_timeout_ns)
    assert isinstance(lost, LeaseLost) and lost.reason == "driver_shutdown" and rest == []
    assert m.state is AttachPhase.BACKOFF and m.lease_id is None
    # the answer that comes too late is ignored
    assert m.on_attach_response(_refusal(probe.correlation_id, _HELD), T.confirm_timeout_ns) == []


def test_14_2_lease_loss_while_confirming_is_not_delayed() -> None:
    """#14 §2: while a notice is confirmed, the other loss rules still act at once."""
    m, _ = _attached()
    m.on_driver_shutdown(0)
    (lost,) = m.on_keepalive_failed(1)
    assert isinstance(lost, LeaseLost) and lost.reason == "keepalive_send_failed"
    m, _ = _attached()
    m.on_driver_shutdown(0)
    (lost,) = m.on_transport_reset(1)
    assert isinstance(lost, LeaseLost) and lost.reason == "media_driver_restarted"


def _timed_out_then_retried(m: LeaseMachine) -> tuple[int, int]:
    """The first request times out (the driver stalled); the retry goes out. Returns both
    correlation ids."""
    (req1,) = m.attach(0)
    failed = m.tick(500 * MS)
    assert isinstance(failed[-1], AttachFailed) and m.state is AttachPhase.BACKOFF
    (req2,) = m.tick(550 * MS)
    assert isinstance(req2, SendAttach)
    return req1.correlation_id, req2.correlation_id


def _held(corr: int, lease: int) -> dp.ShmAttachResponseDecoder:
    return _refusal(corr, f"client id 42 already holds lease {lease} (PRODUCER on stream 5)")


def test_s4_8_a_late_grant_of_a_timed_out_attach_is_taken() -> None:
    """The resumed driver grants the first request and refuses the retry (one lease per
    client id): the grant is taken, the refusal of the retry is ignored."""
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    corr1, corr2 = _timed_out_then_retried(m)
    (ev,) = m.on_attach_response(_response(corr1, lease_id=70), 600 * MS)
    assert isinstance(ev, Attached) and ev.lease_id == 70
    assert m.state is AttachPhase.ATTACHED and m.lease_id == 70
    assert m.on_attach_response(_held(corr2, 70), 600 * MS) == []
    assert m.state is AttachPhase.ATTACHED and m.lease_id == 70
    assert m.counters["late_grant_taken"] == 1
    assert isinstance(m.tick(700 * MS)[0], SendKeepalive)


def test_s4_8_a_late_grant_while_backing_off_is_taken() -> None:
    m = LeaseMachine(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
    (req1,) = m.attach(0)
    m.tick(500 * MS)
    assert m.state is AttachPhase.BACKOFF
    (ev,) = m.on_attach_response(_response(req1.correlation_id), 520 * MS)
    assert isinstance(ev, Attached) and m.state is AttachPhase.ATTACHED
    assert m.tick(550 * MS) == []  # no retry once attached


def test_s4_8_a_late_grant_we_no_longer_need_is_released() -> None:
    """The retry was granted first (the old lease had expired meanwhile), then the late grant
    of the first request arrives: it is detached, the lease in use is kept."""
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    corr1, corr2 = _timed_out_then_retried(m)
    (ev,) = m.on_attach_response(_response(corr2, lease_id=71), 600 * MS)
    assert isinstance(ev, Attached) and m.lease_id == 71
    (detach,) = m.on_attach_response(_response(corr1, lease_id=70), 610 * MS)
    assert isinstance(detach, SendDetach) and detach.lease_id == 70
    assert m.state is AttachPhase.ATTACHED and m.lease_id == 71
    assert m.counters["late_grant_released"] == 1
    assert m.on_attach_response(_response(corr1, lease_id=70), 620 * MS) == []  # once only


def test_s4_8_the_retry_granted_after_a_taken_late_grant_is_released() -> None:
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    corr1, corr2 = _timed_out_then_retried(m)
    m.on_attach_response(_response(corr1, lease_id=70), 600 * MS)
    (detach,) = m.on_attach_response(_response(corr2, lease_id=72), 610 * MS)
    assert isinstance(detach, SendDetach) and detach.lease_id == 72 and m.lease_id == 70


def test_s4_8_a_late_refusal_changes_nothing() -> None:
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    corr1, corr2 = _timed_out_then_retried(m)
    assert m.on_attach_response(_refusal(corr1, "shutting down"), 600 * MS) == []
    assert m.state is AttachPhase.ATTACHING and m.pending_correlation_id == corr2


def test_s4_8_a_late_grant_after_close_is_released() -> None:
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    (req1,) = m.attach(0)
    m.tick(500 * MS)
    assert m.detach(510 * MS) == [] and m.state is AttachPhase.CLOSED
    (detach,) = m.on_attach_response(_response(req1.correlation_id, lease_id=70), 600 * MS)
    assert isinstance(detach, SendDetach) and detach.lease_id == 70
    assert m.state is AttachPhase.CLOSED


def test_s4_8_a_lease_the_driver_holds_for_us_unknown_is_released_and_retried() -> None:
    """The refusal names a lease for our client id we never heard of (its grant was lost):
    it is detached and the attach retried at the short busy period, not after a backoff."""
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    (req,) = m.attach(0)
    (detach,) = m.on_attach_response(_held(req.correlation_id, 66), 10 * MS)
    assert isinstance(detach, SendDetach) and detach.lease_id == 66
    assert detach.client_id == 42 and detach.role == ROLE_PRODUCER
    assert m.state is AttachPhase.BACKOFF and m.counters["unknown_lease_released"] == 1
    assert m.tick(10 * MS + T.busy_retry_ns - 1) == []
    (again,) = m.tick(10 * MS + T.busy_retry_ns)
    assert isinstance(again, SendAttach)


# --- issue #28 point 3: one transition table ------------------------------------------------

P, E = AttachPhase, LeaseEvent
#: The machine of client/lease.py's docstring (§4.12.1 with #14 §2's confirmation and §4.8's
#: late grants), written out independently of the code: the oracle for TRANSITIONS.
EXPECTED = {
    (P.UNATTACHED, E.ATTACH): P.ATTACHING,
    (P.ATTACHING, E.GRANTED): P.ATTACHED,
    (P.ATTACHING, E.ATTACH_FAILED): P.BACKOFF,
    (P.ATTACHED, E.NOTICE): P.CONFIRMING,
    (P.ATTACHED, E.LEASE_LOST): P.BACKOFF,
    (P.ATTACHED, E.DETACH): P.DETACHING,
    (P.CONFIRMING, E.NOTICE_DENIED): P.ATTACHED,
    (P.CONFIRMING, E.PROBE_GRANTED): P.ATTACHING,
    (P.CONFIRMING, E.LEASE_LOST): P.BACKOFF,
    (P.CONFIRMING, E.DETACH): P.DETACHING,
    (P.DETACHING, E.DETACH_DONE): P.CLOSED,
    (P.DETACHING, E.LEASE_LOST): P.BACKOFF,
    (P.BACKOFF, E.ATTACH): P.ATTACHING,
    (P.BACKOFF, E.GRANTED): P.ATTACHED,
    **{(state, E.CLOSE): P.CLOSED for state in P},
}


def test_28_3_the_table_is_the_documented_machine() -> None:
    """#28 point 3: the attach states and transitions are declared once, as drawn."""
    assert TABLE == EXPECTED


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s in AttachPhase for e in LeaseEvent],
    ids=[f"{s.name}-{e.name}" for s in AttachPhase for e in LeaseEvent],
)
def test_28_3_every_state_event_pair_moves_as_the_table_says_or_raises(
    state: AttachPhase, event: LeaseEvent
) -> None:
    """#28 point 3: every (state, event) pair: a legal one moves to the state the table
    names, an illegal one raises and leaves the state as it was."""
    m = LeaseMachine(5, ROLE_PRODUCER, 42, timings=T, correlation_seed=100)
    m._state = state  # white box: put the machine in each state directly
    if (state, event) in EXPECTED:
        m._fire(event)
        assert m.state is EXPECTED[state, event]
    else:
        with pytest.raises(IllegalTransition, match=f"{event.name} is not allowed in {state.name}"):
            m._fire(event)
        assert m.state is state


class _Recording(LeaseMachine):
    """Records the events the machine fires, to check each change of state against them."""

    def __init__(self) -> None:
        super().__init__(5, ROLE_CONSUMER, 42, timings=T, correlation_seed=100)
        self.fired: list[LeaseEvent] = []

    def _fire(self, event: LeaseEvent) -> None:
        self.fired.append(event)
        super()._fire(event)


def _machine_in(state: AttachPhase) -> _Recording:
    """A machine brought to ``state`` through its public inputs only."""
    m = _Recording()
    if state is P.CLOSED:
        m.detach(0)  # nothing held: closed at once
    elif state is not P.UNATTACHED:
        (req,) = m.attach(0)
        if state is P.BACKOFF:
            m.on_attach_response(_refusal(req.correlation_id, "no such stream"), 0)
        elif state is not P.ATTACHING:
            m.on_attach_response(_response(req.correlation_id), 0)
            if state is P.CONFIRMING:
                m.on_lease_revoked(_revoked(77, ROLE_CONSUMER), 0)  # type: ignore[arg-type]
            elif state is P.DETACHING:
                m.detach(0)
    assert m.state is state
    m.fired.clear()
    return m


def _detach_answer(corr: int) -> dp.ShmDetachResponseDecoder:
    buf = bytearray(64)
    dp.ShmDetachResponseEncoder.encode(buf, 0, correlation_id=corr, code=0, error_message="")
    return dp.ShmDetachResponseDecoder().wrap(buf)


#: Every public input of the machine, applied at 1 ms (or, for ``tick``, past every deadline).
INPUTS = {
    "attach": lambda m: m.attach(MS),
    "detach": lambda m: m.detach(MS),
    "close": lambda m: m.close(),
    "tick_late": lambda m: m.tick(100 * 1_000 * MS),
    "grant": lambda m: m.on_attach_response(_response(m.pending_correlation_id or 0), MS),
    "refusal": lambda m: m.on_attach_response(
        _refusal(m.pending_correlation_id or 0, "no such stream"), MS
    ),
    "held_ours": lambda m: m.on_attach_response(_held(m.pending_correlation_id or 0, 77), MS),
    "detach_answer": lambda m: m.on_detach_response(
        _detach_answer(m.pending_correlation_id or 0), MS
    ),
    "revoke_ours": lambda m: m.on_lease_revoked(_revoked(77, ROLE_CONSUMER), MS),
    "driver_shutdown": lambda m: m.on_driver_shutdown(MS),
    "driver_silent": lambda m: m.on_driver_silent(MS),
    "transport_reset": lambda m: m.on_transport_reset(MS),
    "keepalive_failed": lambda m: m.on_keepalive_failed(MS),
}


@pytest.mark.parametrize("state", list(AttachPhase), ids=[s.name for s in AttachPhase])
@pytest.mark.parametrize("name", list(INPUTS))
def test_28_3_every_input_moves_the_machine_only_through_the_table(
    state: AttachPhase, name: str
) -> None:
    """#28 point 3: whatever input arrives in whatever state, the state the machine ends in
    is the one its fired events lead to through the table: no state is written around it,
    and no input (a driver message, a timer, the owner's command) reaches an illegal pair."""
    m = _machine_in(state)
    INPUTS[name](m)
    expected = state
    for event in m.fired:
        expected = EXPECTED[expected, event]
    assert m.state is expected, (state, m.fired, m.state)


def test_28_3_the_state_cannot_be_written_from_outside() -> None:
    """#28 point 3: the owner (DriverClient.close) ends the machine with the CLOSE event;
    writing the state directly is refused."""
    m, _ = _attached()
    with pytest.raises(AttributeError):
        m.state = AttachPhase.CLOSED  # type: ignore[misc]
    m.close()
    assert m.state is AttachPhase.CLOSED and m.pending_correlation_id is None
