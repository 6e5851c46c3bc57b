"""Random attach/detach/keepalive/revoke/tick sequences never break the core's invariants.

Checked after every step, against an independent model built from the actions:

* §5: at most one producer lease per stream;
* §6: per stream, epochs of created regions strictly increase and announced epochs
  never go down; a producer's end is followed, in the same batch, by a revocation
  and then an announce with a higher epoch (§4.7a, §4.9 ordering);
* §4.8: an OK attach response carries a never-seen lease id unless it is the exact
  retry of an earlier request;
* §4.4/§4.9: a lease is revoked at most once; it is revoked as EXPIRED no earlier
  than its deadline, and every lease whose deadline has passed by a tick is revoked
  by that tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from driver_helpers import (
    CAM,
    CAM2,
    MS,
    TTL_NS,
    Harness,
    attach_req,
    detach_req,
    keepalive_req,
    make_config,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.driver.actions import (
    Action,
    CreateRegions,
    PublishAnnounce,
    PublishLeaseRevoked,
    SendAttachResponse,
)
from tensorpool.driver.core import DriverCore
from tensorpool.specs.generated.driver import (
    LeaseRevokeReason,
    PublishMode,
    ResponseCode,
    Role,
)

STREAMS = [CAM, CAM2, 20001, 5]

attach_op = st.tuples(
    st.just("attach"),
    st.integers(1, 6),  # client id
    st.sampled_from(STREAMS),
    st.sampled_from([Role.PRODUCER, Role.CONSUMER]),
    st.sampled_from([None, PublishMode.REQUIRE_EXISTING, PublishMode.EXISTING_OR_CREATE]),
    st.integers(0, 3),  # correlation id: small, so retries happen
)
detach_op = st.tuples(st.just("detach"), st.integers(0, 30), st.booleans())
keepalive_op = st.tuples(st.just("keepalive"), st.integers(0, 30))
revoke_op = st.tuples(st.just("revoke"), st.integers(0, 30))
advance_op = st.tuples(st.just("advance"), st.integers(0, 45))
fail_op = st.tuples(st.just("fail_next_creation"))
relayout_op = st.tuples(st.just("relayout"), st.sampled_from([CAM, CAM2]))
ops = st.lists(
    st.one_of(attach_op, detach_op, keepalive_op, revoke_op, advance_op, fail_op, relayout_op),
    max_size=60,
)


@dataclass
class ModelLease:
    lease_id: int
    client_id: int
    stream_id: int
    role: Role
    epoch: int
    correlation_id: int
    deadline: int
    ended: bool = False


@dataclass
class Model:
    leases: dict[int, ModelLease] = field(default_factory=dict)
    revocations: dict[int, int] = field(default_factory=dict)
    created_epochs: dict[int, int] = field(default_factory=dict)
    announced_epochs: dict[int, int] = field(default_factory=dict)

    def live(self) -> list[ModelLease]:
        return [lease for lease in self.leases.values() if not lease.ended]

    def observe(
        self, actions: list[Action], now: int, request: tuple[int, Role] | None = None
    ) -> None:
        """Update the model from one batch and check per-batch invariants."""
        for i, action in enumerate(actions):
            if isinstance(action, CreateRegions):
                prev = self.created_epochs.get(action.stream_id, 0)
                assert action.epoch > prev, "§6: epochs strictly increase"
                self.created_epochs[action.stream_id] = action.epoch
            elif isinstance(action, PublishAnnounce):
                prev = self.announced_epochs.get(action.stream_id, 0)
                assert action.epoch >= prev, "announced epoch went down"
                self.announced_epochs[action.stream_id] = action.epoch
            elif isinstance(action, PublishLeaseRevoked):
                count = self.revocations.get(action.lease_id, 0) + 1
                assert count == 1, "§4.9: a lease is revoked at most once"
                self.revocations[action.lease_id] = count
                lease = self.leases[action.lease_id]
                assert not lease.ended
                if action.reason == LeaseRevokeReason.EXPIRED:
                    assert now >= lease.deadline, "expired before its deadline"
                lease.ended = True
                if lease.role is Role.PRODUCER:
                    later = [
                        a
                        for a in actions[i + 1 :]
                        if isinstance(a, PublishAnnounce) and a.stream_id == lease.stream_id
                    ]
                    created = [
                        a
                        for a in actions[i + 1 :]
                        if isinstance(a, CreateRegions) and a.stream_id == lease.stream_id
                    ]
                    # The epoch-bumped announce follows the revocation in this batch
                    # (unless the new epoch's files could not be created).
                    assert created, "§6: producer end opens a new epoch"
                    if later:
                        assert later[0].epoch > lease.epoch
            elif isinstance(action, SendAttachResponse) and action.code == ResponseCode.OK:
                assert action.lease_id is not None and action.epoch is not None
                assert request is not None, "OK response without a request"
                client_id, role = request
                known = self.leases.get(action.lease_id)
                if known is not None:
                    # Only an exact retry may repeat a lease id.
                    assert not known.ended
                    assert (known.client_id, known.correlation_id) == (
                        client_id,
                        action.correlation_id,
                    )
                    continue
                assert action.lease_id not in self.revocations
                assert action.lease_expiry_timestamp_ns is not None
                assert action.stream_id is not None
                self.leases[action.lease_id] = ModelLease(
                    lease_id=action.lease_id,
                    client_id=client_id,
                    stream_id=action.stream_id,
                    role=role,
                    epoch=action.epoch,
                    correlation_id=action.correlation_id,
                    deadline=action.lease_expiry_timestamp_ns,
                )
        for lease in self.live():
            if lease.role is Role.CONSUMER and lease.stream_id in self.announced_epochs:
                lease.epoch = self.announced_epochs[lease.stream_id]
        producers: dict[int, int] = {}
        for lease in self.live():
            if lease.role is Role.PRODUCER:
                producers[lease.stream_id] = producers.get(lease.stream_id, 0) + 1
        assert all(n <= 1 for n in producers.values()), "§5: one producer per stream"


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_sequences_keep_invariants(sequence: list[tuple]) -> None:
    h = Harness(DriverCore(make_config(), now_ns=0, lease_id_start=1))
    core = h.core
    model = Model()
    for op in sequence:
        kind = op[0]
        if kind == "attach":
            _, client, stream, role, mode, corr = op
            req = attach_req(corr, stream, client, role, publish_mode=mode)
            batch = h.run(core.on_attach_request(req, h.now))
            model.observe(batch, h.now, request=(client, role))
        elif kind in ("detach", "keepalive", "revoke"):
            leases = list(model.leases.values())
            if not leases:
                continue
            lease = leases[op[1] % len(leases)]
            if kind == "detach":
                client = lease.client_id if op[2] else lease.client_id + 100
                req = detach_req(9, lease.lease_id, lease.stream_id, client, lease.role)
                batch = h.run(core.on_detach_request(req, h.now))
            elif kind == "keepalive":
                was_live = not lease.ended
                late = h.now >= lease.deadline
                req = keepalive_req(lease.lease_id, lease.stream_id, lease.client_id, lease.role)
                batch = h.run(core.on_keepalive(req, h.now))
                if was_live and not late:
                    assert batch == []
                    lease.deadline = h.now + TTL_NS
            else:
                batch = h.run(core.revoke_lease(lease.lease_id, h.now))
            model.observe(batch, h.now)
        elif kind == "advance":
            h.now += op[1] * MS
            batch = h.run(core.tick(h.now))
            model.observe(batch, h.now)
            overdue = [lease.lease_id for lease in model.live() if lease.deadline <= h.now]
            assert overdue == [], "every lease past its deadline is revoked by the tick"
        elif kind == "fail_next_creation":
            h.fail_creation = "injected failure"
        elif kind == "relayout":
            batch = h.run(core.recreate_regions(op[1], h.now))
            model.observe(batch, h.now)
        # The core's own view agrees with the model.
        live_core = {lease.lease_id for lease in core.status(h.now).leases}
        assert live_core == {lease.lease_id for lease in model.live()}
        for stream in core.status(h.now).streams:
            producers = [
                lease
                for lease in model.live()
                if lease.role is Role.PRODUCER and lease.stream_id == stream.stream_id
            ]
            expected = producers[0].client_id if producers else None
            assert stream.producer_client_id == expected
