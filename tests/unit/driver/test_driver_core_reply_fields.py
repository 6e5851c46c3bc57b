"""Driver core reply and notice fields the mutation check (#14.4, docs/compliance/mutation.md)
found unasserted: a reply that loses its ``correlationId`` is never matched by the client
(§4.2, §4.9), and a revocation or shutdown notice without its timestamp cannot be ordered
against announces (§4.9, §4.13)."""

from __future__ import annotations

from driver_helpers import (
    CAM,
    TTL_NS,
    Harness,
    attach_req,
    detach_req,
    make_config,
    only,
    shutdown_req,
)

from tensorpool.driver.actions import (
    PublishLeaseRevoked,
    PublishShutdown,
    SendAttachResponse,
    SendDetachResponse,
)
from tensorpool.driver.core import DriverCore
from tensorpool.specs.generated.driver import (
    PublishMode,
    ResponseCode,
    Role,
    ShmDetachRequestDecoder,
    ShutdownReason,
)

P, C = Role.PRODUCER, Role.CONSUMER
T = 5_000_000


def _detach(core: DriverCore, req: ShmDetachRequestDecoder, **kw: object) -> SendDetachResponse:
    (reply,) = [
        a for a in core.on_detach_request(req, T, **kw) if isinstance(a, SendDetachResponse)
    ]  # type: ignore[arg-type]
    return reply


def test_s4_9_every_detach_reply_carries_the_request_correlation_id_and_its_code(
    harness: Harness,
) -> None:
    """§4.9: OK, repeat OK, unknown lease, identity mismatch, unknown role, newer schema and a
    stopped driver each answer with the request's ``correlationId`` and their own code."""
    core = harness.core
    resp = harness.attach_ok(1, CAM, 1, C)
    lease = resp.lease_id
    assert lease is not None
    cases = [
        (detach_req(201, lease, CAM, 2, C), ResponseCode.REJECTED),  # identity mismatch
        (detach_req(202, lease, CAM, 1, C), ResponseCode.OK),
        (detach_req(203, lease, CAM, 1, C), ResponseCode.OK),  # repeat: OK again
        (detach_req(204, 987_654, CAM, 1, C), ResponseCode.REJECTED),  # unknown lease
    ]
    for req, code in cases:
        reply = _detach(core, req)
        assert (reply.correlation_id, reply.code) == (req.correlation_id, code)
    bad_role = detach_req(205, lease, CAM, 1, C)
    bad_role.buffer[8 + ShmDetachRequestDecoder.ROLE_OFFSET] = 0  # no such Role
    reply = _detach(core, ShmDetachRequestDecoder().wrap(bad_role.buffer, 0))
    assert (reply.correlation_id, reply.code) == (205, ResponseCode.INVALID_PARAMS)
    reply = _detach(core, detach_req(206, lease, CAM, 1, C), schema_version=2)
    assert (reply.correlation_id, reply.code) == (206, ResponseCode.UNSUPPORTED)
    core.stop_now(T)
    reply = _detach(core, detach_req(207, lease, CAM, 1, C))
    assert (reply.correlation_id, reply.code) == (207, ResponseCode.REJECTED)


def test_s4_9_s4_13_shutdown_notices_are_stamped_and_pending_attaches_answered() -> None:
    """§4.9/§4.13: each per-lease revocation and the shutdown notice carry the time of the
    shutdown; an attach still waiting for its regions gets ``REJECTED`` with its own
    ``correlationId``; a shutdown request without a reason means ADMIN."""
    core = DriverCore(make_config(shutdown_timeout_ms=0), now_ns=0)
    harness = Harness(core)
    harness.attach_ok(1, CAM, 1, P)
    # a dynamic-stream attach whose CreateRegions the agent has not answered yet
    pending = core.on_attach_request(
        attach_req(42, 20001, 9, C, publish_mode=PublishMode.EXISTING_OR_CREATE), T
    )
    assert pending and not any(isinstance(a, SendAttachResponse) for a in pending)
    actions = core.on_shutdown_request(shutdown_req("s3cret", message="bye"), 2 * T)
    assert only(actions, PublishLeaseRevoked)
    assert {a.timestamp_ns for a in only(actions, PublishLeaseRevoked)} == {2 * T}
    (notice,) = only(actions, PublishShutdown)
    assert notice.timestamp_ns == 2 * T
    assert (notice.reason, notice.error_message) == (ShutdownReason.ADMIN, "bye")
    rejected = [a for a in actions if isinstance(a, SendAttachResponse)]
    assert [(a.correlation_id, a.code) for a in rejected] == [(42, ResponseCode.REJECTED)]


def test_s4_4_next_deadline_is_the_earliest_due_work_and_none_when_idle() -> None:
    """The agent sleeps until ``next_deadline_ns``: with a live lease it is at most the lease
    expiry (§4.4) and the next announce; with nothing to do it is None (sleep until a
    message), never a sentinel."""
    core = DriverCore(make_config(epoch_gc_enabled=False), now_ns=0)
    assert core.next_deadline_ns() is None
    harness = Harness(core)
    harness.attach_ok(1, CAM, 1, C)
    deadline = core.next_deadline_ns()
    assert deadline is not None and 0 < deadline <= harness.now + TTL_NS
