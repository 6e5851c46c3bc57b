"""Inputs and outputs of the sans-IO driver core.

Inputs are decoded control-plane requests. The core accepts any object with the
snake_case attributes of the generated decoders (the ``*Like`` protocols below), so
the agent can pass its reused decoder flyweights straight in; the core copies out
everything it keeps before returning.

Outputs are *actions*: frozen dataclasses the agent executes in list order. Message
actions carry the fields of the SBE message they stand for, under the encoder's
snake_case keyword names, so encoding is a direct mapping. ``CreateRegions`` and
``RetireEpoch`` and ``ReclaimStream`` are file operations. Execution contract for the agent:

* perform actions in order; a ``CreateRegions`` must be answered, before the agent
  continues, with ``core.on_regions_ready(stream_id, epoch, now_ns)`` or
  ``core.on_regions_failed(stream_id, epoch, reason, now_ns)``, and the actions those
  return are executed next (they hold the attach responses and the epoch announce
  that depend on the files existing);
* ``PublishShutdown`` is the last action the core will ever produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tensorpool.driver.streams import RegionLayout
from tensorpool.specs.generated.driver import (
    LeaseRevokeReason,
    ResponseCode,
    Role,
    ShutdownReason,
)
from tensorpool.specs.generated.wire import ClockDomain

__all__ = [
    "CLOCK_DOMAIN_MONOTONIC",
    "ERROR_MESSAGE_MAX_BYTES",
    "Action",
    "AttachRequestLike",
    "CreateRegions",
    "DetachRequestLike",
    "KeepaliveLike",
    "PublishAnnounce",
    "PublishLeaseRevoked",
    "PublishShutdown",
    "ReclaimStream",
    "RetireEpoch",
    "SendAttachResponse",
    "SendConsumerConfig",
    "SendDetachResponse",
    "ShutdownRequestLike",
    "cap_error_message",
]

#: Driver Model §4.2: a non-empty ``errorMessage`` is at most 1024 bytes.
ERROR_MESSAGE_MAX_BYTES = 1024
#: Announce timestamps come from the driver's monotonic clock (``now_ns``).
CLOCK_DOMAIN_MONOTONIC = ClockDomain.MONOTONIC


def cap_error_message(text: str) -> str:
    """ASCII-only and at most 1024 bytes, so any diagnostic fits the varAscii field."""
    data = text.encode("ascii", "replace")
    if len(data) > ERROR_MESSAGE_MAX_BYTES:
        data = data[: ERROR_MESSAGE_MAX_BYTES - 3] + b"..."
    return data.decode("ascii")


# --------------------------------------------------------------------------- inputs


class AttachRequestLike(Protocol):
    """What the core reads from a ``ShmAttachRequest``."""

    @property
    def correlation_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def client_id(self) -> int: ...
    @property
    def role(self) -> int: ...
    @property
    def expected_layout_version(self) -> int: ...
    @property
    def max_dims(self) -> int: ...
    @property
    def publish_mode(self) -> int | None: ...
    @property
    def require_hugepages(self) -> int: ...


class DetachRequestLike(Protocol):
    """What the core reads from a ``ShmDetachRequest``."""

    @property
    def correlation_id(self) -> int: ...
    @property
    def lease_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def client_id(self) -> int: ...
    @property
    def role(self) -> int: ...


class KeepaliveLike(Protocol):
    """What the core reads from a ``ShmLeaseKeepalive``."""

    @property
    def lease_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def client_id(self) -> int: ...
    @property
    def role(self) -> int: ...
    @property
    def client_timestamp_ns(self) -> int: ...


class ShutdownRequestLike(Protocol):
    """What the core reads from a ``ShmDriverShutdownRequest``."""

    @property
    def correlation_id(self) -> int: ...
    @property
    def reason(self) -> int: ...
    @property
    def token(self) -> str | bytes: ...
    @property
    def error_message(self) -> str | bytes: ...


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class SendAttachResponse:
    """``ShmAttachResponse``; optional fields are None (encoded as their nullValue)."""

    correlation_id: int
    code: ResponseCode
    lease_id: int | None = None
    lease_expiry_timestamp_ns: int | None = None
    stream_id: int | None = None
    epoch: int | None = None
    layout_version: int | None = None
    header_nslots: int | None = None
    header_slot_bytes: int | None = None
    max_dims: int | None = None
    payload_pools: tuple[tuple[int, int, int, str], ...] = ()
    header_region_uri: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class SendDetachResponse:
    """``ShmDetachResponse``."""

    correlation_id: int
    code: ResponseCode
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class PublishLeaseRevoked:
    """``ShmLeaseRevoked``: published for every lease invalidation (§4.9)."""

    timestamp_ns: int
    lease_id: int
    stream_id: int
    client_id: int
    role: Role
    reason: LeaseRevokeReason
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class PublishAnnounce:
    """``ShmPoolAnnounce`` (wire schema): the driver's beacon for one stream (§8)."""

    stream_id: int
    producer_id: int
    epoch: int
    announce_timestamp_ns: int
    announce_clock_domain: ClockDomain
    layout_version: int
    header_nslots: int
    header_slot_bytes: int
    payload_pools: tuple[tuple[int, int, int, str], ...]
    header_region_uri: str
    layout: RegionLayout


@dataclass(frozen=True, slots=True)
class PublishShutdown:
    """``ShmDriverShutdown``: the final notice; the agent stops after sending it."""

    timestamp_ns: int
    reason: ShutdownReason
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class CreateRegions:
    """Create (truncate, prefault, write superblocks of) every file of ``layout``.

    Answer with ``core.on_regions_ready`` or ``core.on_regions_failed``.
    """

    stream_id: int
    epoch: int
    layout: RegionLayout


@dataclass(frozen=True, slots=True)
class RetireEpoch:
    """Delete the epoch directory ``directory`` of a superseded epoch (epoch GC)."""

    stream_id: int
    epoch: int
    directory: str


@dataclass(frozen=True, slots=True)
class ReclaimStream:
    """Forget an idle dynamic stream: unmap its live epoch, delete every epoch directory.

    Unlike ``RetireEpoch`` this includes the current epoch, which the core no longer
    announces. The stream's ``last-epoch`` marker stays, so a stream created again with
    the same id (in this driver or after a restart) starts above every epoch used before.
    """

    stream_id: int
    epochs: tuple[int, ...]
    directories: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SendConsumerConfig:
    """Wire ``ConsumerConfig`` on the control stream (Wire §10.1.3, Driver Model §11): the
    per-consumer descriptor and control streams assigned to a consumer, each a decline when
    its channel is "" and its id 0."""

    stream_id: int
    consumer_id: int
    mode: int
    descriptor_channel: str
    descriptor_stream_id: int
    control_channel: str = ""
    control_stream_id: int = 0


Action = (
    SendAttachResponse
    | SendConsumerConfig
    | SendDetachResponse
    | PublishLeaseRevoked
    | PublishAnnounce
    | PublishShutdown
    | CreateRegions
    | RetireEpoch
    | ReclaimStream
)
