"""Helpers for the driver core tests: real encoded requests and an agent-like executor.

Requests are encoded with the generated SBE encoders into a bytearray and wrapped
with the generated decoders, exactly as the agent will hand them to the core.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tensorpool.driver.actions import (
    Action,
    CreateRegions,
    PublishAnnounce,
    PublishLeaseRevoked,
    SendAttachResponse,
    SendDetachResponse,
)
from tensorpool.driver.config import DriverConfig, parse_driver_config
from tensorpool.driver.core import DriverCore
from tensorpool.specs.generated.driver import (
    HugepagesPolicy,
    PublishMode,
    ResponseCode,
    Role,
    ShmAttachRequestDecoder,
    ShmAttachRequestEncoder,
    ShmAttachResponseDecoder,
    ShmAttachResponseEncoder,
    ShmDetachRequestDecoder,
    ShmDetachRequestEncoder,
    ShmDriverShutdownRequestDecoder,
    ShmDriverShutdownRequestEncoder,
    ShmLeaseKeepaliveDecoder,
    ShmLeaseKeepaliveEncoder,
    ShutdownReason,
)

MS = 1_000_000

BASE_TOML = """
[driver]
instance_id = "drv-test"
stream_id_range = "20000-20009"

[shm]
base_dir = "/dev/shm/tp-test"

[policies]
allow_dynamic_streams = true
default_profile = "small"
announce_period_ms = 100
lease_keepalive_interval_ms = 10
lease_expiry_grace_intervals = 3
shutdown_timeout_ms = 50
shutdown_token = "s3cret"
epoch_gc_keep = 2
epoch_gc_min_age_ns = 300000000

[profiles.camera]
header_nslots = 256
payload_pools = [
  { pool_id = 1, stride_bytes = 1048576 },
  { pool_id = 2, stride_bytes = 4194304 },
]

[profiles.small]
header_nslots = 16
payload_pools = [{ pool_id = 7, stride_bytes = 4096 }]

[streams.cam]
stream_id = 10000
profile = "camera"

[streams.cam2]
stream_id = 10001
profile = "camera"
"""

TTL_NS = 30 * MS  # 10 ms keepalive interval x 3 grace intervals
ANNOUNCE_NS = 100 * MS
CAM = 10000
CAM2 = 10001


def make_config(toml_text: str = BASE_TOML, **policy_overrides: Any) -> DriverConfig:
    data = tomllib.loads(toml_text)
    data.setdefault("policies", {}).update(policy_overrides)
    return parse_driver_config(data, source="test.toml", env={})


def attach_req(
    correlation_id: int,
    stream_id: int = CAM,
    client_id: int = 1,
    role: Role = Role.CONSUMER,
    *,
    expected_layout_version: int = 0,
    max_dims: int = 0,
    publish_mode: PublishMode | None = None,
    require_hugepages: HugepagesPolicy = HugepagesPolicy.UNSPECIFIED,
    raw_patch: dict[int, int] | None = None,
) -> ShmAttachRequestDecoder:
    """Encode and wrap an attach request; ``raw_patch`` overwrites body bytes first
    (body offset -> byte), to forge values the encoder refuses (unknown enums)."""
    buf = bytearray(64)
    ShmAttachRequestEncoder.encode(
        buf,
        0,
        correlation_id=correlation_id,
        stream_id=stream_id,
        client_id=client_id,
        role=role,
        expected_layout_version=expected_layout_version,
        max_dims=max_dims,
        publish_mode=publish_mode,
        require_hugepages=require_hugepages,
    )
    for body_offset, value in (raw_patch or {}).items():
        buf[8 + body_offset] = value
    return ShmAttachRequestDecoder().wrap(buf, 0)


def detach_req(
    correlation_id: int, lease_id: int, stream_id: int, client_id: int, role: Role
) -> ShmDetachRequestDecoder:
    buf = bytearray(64)
    ShmDetachRequestEncoder.encode(
        buf,
        0,
        correlation_id=correlation_id,
        lease_id=lease_id,
        stream_id=stream_id,
        client_id=client_id,
        role=role,
    )
    return ShmDetachRequestDecoder().wrap(buf, 0)


def keepalive_req(
    lease_id: int, stream_id: int, client_id: int, role: Role, ts: int = 0
) -> ShmLeaseKeepaliveDecoder:
    buf = bytearray(64)
    ShmLeaseKeepaliveEncoder.encode(
        buf,
        0,
        lease_id=lease_id,
        stream_id=stream_id,
        client_id=client_id,
        role=role,
        client_timestamp_ns=ts,
    )
    return ShmLeaseKeepaliveDecoder().wrap(buf, 0)


def shutdown_req(
    token: str | None, reason: ShutdownReason = ShutdownReason.ADMIN, message: str = ""
) -> ShmDriverShutdownRequestDecoder:
    buf = bytearray(256)
    ShmDriverShutdownRequestEncoder.encode(
        buf, 0, correlation_id=99, reason=reason, token=token, error_message=message
    )
    return ShmDriverShutdownRequestDecoder().wrap(buf, 0)


def roundtrip_attach_response(action: SendAttachResponse) -> ShmAttachResponseDecoder:
    """Encode the action with the real encoder and decode it again."""
    buf = bytearray(4096)
    ShmAttachResponseEncoder.encode(
        buf,
        0,
        correlation_id=action.correlation_id,
        code=action.code,
        lease_id=action.lease_id,
        lease_expiry_timestamp_ns=action.lease_expiry_timestamp_ns,
        stream_id=action.stream_id,
        epoch=action.epoch,
        layout_version=action.layout_version,
        header_nslots=action.header_nslots,
        header_slot_bytes=action.header_slot_bytes,
        max_dims=action.max_dims,
        payload_pools=action.payload_pools,
        header_region_uri=action.header_region_uri,
        error_message=action.error_message,
    )
    return ShmAttachResponseDecoder().wrap(buf, 0)


@dataclass
class Harness:
    """Executes actions like the agent: CreateRegions is answered at once.

    ``fail_creation`` makes the next CreateRegions fail with that reason. Every action
    executed, in order, is appended to ``log``.
    """

    core: DriverCore
    now: int = 0
    fail_creation: str | None = None
    log: list[Action] = field(default_factory=list)
    created: list[CreateRegions] = field(default_factory=list)

    def run(self, actions: Iterable[Action]) -> list[Action]:
        out: list[Action] = []
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            out.append(action)
            if isinstance(action, CreateRegions):
                self.created.append(action)
                if self.fail_creation is not None:
                    reason, self.fail_creation = self.fail_creation, None
                    more = self.core.on_regions_failed(
                        action.stream_id, action.epoch, reason, self.now
                    )
                else:
                    more = self.core.on_regions_ready(action.stream_id, action.epoch, self.now)
                queue[0:0] = more
        self.log.extend(out)
        return out

    def attach(self, *args: Any, **kwargs: Any) -> list[Action]:
        return self.run(self.core.on_attach_request(attach_req(*args, **kwargs), self.now))

    def attach_ok(self, *args: Any, **kwargs: Any) -> SendAttachResponse:
        responses = [a for a in self.attach(*args, **kwargs) if isinstance(a, SendAttachResponse)]
        assert len(responses) == 1, responses
        assert responses[0].code == ResponseCode.OK, responses[0]
        return responses[0]

    def detach(self, resp: SendAttachResponse, client_id: int, role: Role, corr: int = 7777):
        assert resp.lease_id is not None and resp.stream_id is not None
        return self.run(
            self.core.on_detach_request(
                detach_req(corr, resp.lease_id, resp.stream_id, client_id, role), self.now
            )
        )

    def keepalive(self, resp: SendAttachResponse, client_id: int, role: Role) -> list[Action]:
        assert resp.lease_id is not None and resp.stream_id is not None
        return self.run(
            self.core.on_keepalive(
                keepalive_req(resp.lease_id, resp.stream_id, client_id, role), self.now
            )
        )

    def advance(self, dt_ns: int) -> list[Action]:
        self.now += dt_ns
        return self.run(self.core.tick(self.now))


def only(actions: Iterable[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def single_response(actions: Iterable[Action]) -> SendAttachResponse | SendDetachResponse:
    responses = [a for a in actions if isinstance(a, (SendAttachResponse, SendDetachResponse))]
    assert len(responses) == 1, responses
    return responses[0]


def kinds(actions: Iterable[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


__all__ = [
    "ANNOUNCE_NS",
    "BASE_TOML",
    "CAM",
    "CAM2",
    "MS",
    "TTL_NS",
    "Harness",
    "PublishAnnounce",
    "PublishLeaseRevoked",
    "attach_req",
    "detach_req",
    "keepalive_req",
    "kinds",
    "make_config",
    "only",
    "roundtrip_attach_response",
    "shutdown_req",
    "single_response",
]
