"""The SHM driver's protocol logic, without I/O (Driver Model v1.0 §4–§11).

:class:`DriverCore` is a state machine fed by the agent with decoded control-plane
requests, file-operation outcomes and ``now_ns`` from one monotonic clock; it
returns *actions* (:mod:`tensorpool.driver.actions`) for the agent to execute in
order. It never touches Aeron, files or clocks, so every rule is unit-testable.

What it owns:

* the stream registry: statically configured streams, plus dynamic streams created
  from ``policies.default_profile`` with ids from ``driver.stream_id_range`` (§11);
* leases (:mod:`tensorpool.driver.leases`): attach, keepalive, detach, expiry,
  revocation, exclusive producer per stream (§5), one live lease per ``clientId``,
  attach retries recognised by ``(clientId, correlationId)`` (§4.8);
* epochs (:mod:`tensorpool.driver.epochs`): a new epoch — with new files — whenever a
  producer attaches to a stream without one, a producer lease ends for any reason,
  the layout changes or the files are recreated (§6); the first attach after the
  driver starts also opens a new epoch above the floor found on disk (§10);
* announces: every stream with ready regions is announced every
  ``policies.announce_period_ms`` and immediately after an epoch change (the timer
  lives here so that "revocation before the epoch-bumped announce" is guaranteed in
  one place, §4.9);
* epoch GC, and graceful shutdown (§4.13): RUNNING → DRAINING → STOPPED;
* limits on dynamic streams (issue #13.5), so that an attach flood with fresh stream ids
  cannot use up the space configured streams need: at most
  ``policies.max_dynamic_streams_per_client`` streams created per ``clientId`` and
  ``policies.max_dynamic_streams`` in all; with
  ``policies.reserve_shm_for_configured_streams`` a creation is refused unless one epoch
  of every configured stream still fits in ``shm.base_dir`` afterwards (the agent passes
  the free bytes it measured); a dynamic stream without any lease for
  ``policies.dynamic_stream_idle_reclaim_ms`` is reclaimed (``ReclaimStream``: files
  deleted, stream forgotten, its epoch history kept so the id never reuses an epoch);
  so are the dynamic streams a previous driver left on disk (ids in the range, not
  configured), unless a client creates them again within that time.

Two-phase region creation: when an epoch needs files the core returns
``CreateRegions`` and holds the dependent attach responses and announce until the
agent reports ``on_regions_ready`` (or ``on_regions_failed``, which turns pending
attaches into ``INTERNAL_ERROR``). Clients therefore never learn URIs whose files
do not exist yet.

Response codes (§4.6): ``UNSUPPORTED`` for a schema version or publish mode the
driver does not implement; ``INVALID_PARAMS`` for malformed fields (unknown role or
hugepages policy), a zero-pool stream (§4.3) or dynamic creation without a
configured range (§11); ``REJECTED`` for valid requests denied by state or policy
(second producer, duplicate clientId, layout version mismatch, hugepages not
satisfiable, stream not provisioned, range exhausted, a dynamic-stream limit or the
space reserved for configured streams, draining);
``INTERNAL_ERROR`` when the files could not be created.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tensorpool.driver.actions import (
    CLOCK_DOMAIN_MONOTONIC,
    Action,
    AttachRequestLike,
    CreateRegions,
    DetachRequestLike,
    KeepaliveLike,
    PublishAnnounce,
    PublishLeaseRevoked,
    PublishShutdown,
    ReclaimStream,
    RetireEpoch,
    SendAttachResponse,
    SendConsumerConfig,
    SendDetachResponse,
    ShutdownRequestLike,
    cap_error_message,
)
from tensorpool.driver.config import DriverConfig, ProfileConfig
from tensorpool.driver.epochs import EpochHistory
from tensorpool.driver.leases import Lease, LeaseState, LeaseTable
from tensorpool.driver.streams import (
    LAYOUT_VERSION,
    MAX_DIMS,
    RegionLayout,
    allocate_stream_id,
    build_layout,
    epoch_bytes,
    epoch_dir,
)
from tensorpool.specs.generated.driver import (
    SCHEMA_VERSION,
    HugepagesPolicy,
    LeaseRevokeReason,
    PublishMode,
    ResponseCode,
    Role,
    ShmAttachRequestDecoder,
    ShmDetachRequestDecoder,
    ShutdownReason,
)
from tensorpool.stream_ids import StreamIdPool, grant, read_control_request, read_request

__all__ = [
    "DRIVER_SCHEMA_VERSION",
    "TEMPLATE_ATTACH_REQUEST",
    "TEMPLATE_DETACH_REQUEST",
    "DriverCore",
    "DriverState",
    "DriverStatus",
    "LeaseStatus",
    "StreamStatus",
]

#: The one driver control schema version this core speaks (schema id 901). Requests in
#: any other version are answered ``UNSUPPORTED`` (§4.4a): version 1 is the only one
#: published, so there is no older version to fall back to.
DRIVER_SCHEMA_VERSION = SCHEMA_VERSION
TEMPLATE_ATTACH_REQUEST = ShmAttachRequestDecoder.TEMPLATE_ID
TEMPLATE_DETACH_REQUEST = ShmDetachRequestDecoder.TEMPLATE_ID

_NEVER = 1 << 127  # "no deadline": larger than any uint64 timestamp


class DriverState(StrEnum):
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"


@dataclass(slots=True, eq=False)
class _Stream:
    stream_id: int
    name: str
    profile: ProfileConfig
    dynamic: bool
    history: EpochHistory
    layout: RegionLayout | None = None  # ready regions of the current epoch (announced)
    creating: RegionLayout | None = None  # files requested, not yet confirmed
    producer: Lease | None = None  # pending or issued producer lease
    consumers: dict[int, Lease] = field(default_factory=dict)  # issued consumer leases
    pending: list[Lease] = field(default_factory=list)  # waiting for ``creating``
    next_announce_ns: int = _NEVER
    created_ns: int = 0
    creator_client_id: int | None = None  # dynamic streams: whose attach created it
    idle_since_ns: int | None = None  # dynamic streams: when its last lease ended


# --------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    lease_id: int
    stream_id: int
    client_id: int
    role: str
    state: str
    epoch: int
    age_ns: int
    expires_in_ns: int | None


@dataclass(frozen=True, slots=True)
class StreamStatus:
    stream_id: int
    name: str
    profile: str
    dynamic: bool
    epoch: int
    regions_ready: bool
    producer_client_id: int | None
    producer_lease_id: int | None
    consumer_count: int
    pending_attaches: int
    header_region_uri: str


@dataclass(frozen=True, slots=True)
class DriverStatus:
    """Snapshot for ``tensorpool driver status``."""

    instance_id: str
    state: str
    now_ns: int
    next_lease_id: int
    streams: tuple[StreamStatus, ...]
    leases: tuple[LeaseStatus, ...]
    counters: Mapping[str, int]


# --------------------------------------------------------------------------- core


class DriverCore:
    """Sans-IO SHM driver.

    Parameters
    ----------
    config:
        Validated driver configuration.
    now_ns:
        Monotonic time at construction (start of the announce/GC clocks).
    lease_id_start:
        First lease id; seed it with :func:`tensorpool.driver.leases.lease_id_seed`
        so ids are not reused across restarts.
    epoch_floors:
        Per stream id, the highest epoch already used on disk; the next epoch of
        that stream is strictly greater (§10).
    known_epochs:
        Per stream id, epochs whose directories exist on disk, for epoch GC (and
        they raise the floor too).
    hugepages_backed:
        Whether the regions this driver creates are hugepage-backed (the agent
        knows whether ``shm.base_dir`` is on hugetlbfs); defaults to
        ``shm.require_hugepages``.
    """

    def __init__(
        self,
        config: DriverConfig,
        *,
        now_ns: int,
        lease_id_start: int = 1,
        epoch_floors: Mapping[int, int] | None = None,
        known_epochs: Mapping[int, Iterable[int]] | None = None,
        hugepages_backed: bool | None = None,
        lease_history: int = 4096,
    ) -> None:
        self.config = config
        self._policies = config.policies
        self._ttl_ns = config.policies.lease_ttl_ns
        self._announce_ns = config.policies.announce_period_ns
        self._hugepages = (
            config.shm.require_hugepages if hugepages_backed is None else hugepages_backed
        )
        self._leases = LeaseTable(lease_id_start, lease_history)
        self.counters: Counter[str] = Counter()
        self.state = DriverState.RUNNING
        self._shutdown_deadline_ns = _NEVER
        self._shutdown_reason = ShutdownReason.NORMAL
        self._shutdown_message = ""
        self._wake_ns = _NEVER
        self._dyn_cursor = 0
        # per-consumer descriptor and control streams (Driver Model §11), by (stream id,
        # consumer id)
        self._descriptor_ids = StreamIdPool(config.driver.descriptor_stream_id_range)
        self._control_ids = StreamIdPool(config.driver.control_stream_id_range)
        floors = dict(epoch_floors or {})
        known = {sid: list(epochs) for sid, epochs in (known_epochs or {}).items()}
        # Histories of stream ids seen on disk; adopted when such a stream is (re)created.
        self._histories: dict[int, EpochHistory] = {
            sid: EpochHistory(floors.get(sid, 0), known.get(sid, ()), now_ns)
            for sid in set(floors) | set(known)
        }
        self._streams: dict[int, _Stream] = {}
        self._reclaim_ns = config.policies.dynamic_stream_idle_reclaim_ns
        #: One epoch of every configured stream: what a dynamic creation must leave free.
        self._reserve_bytes = sum(
            epoch_bytes(config.profiles[sc.profile], config.shm.page_size_bytes)
            for sc in config.streams
        )
        for sc in config.streams:
            self._streams[sc.stream_id] = self._make_stream(
                sc.stream_id, sc.name, config.profiles[sc.profile], False, now_ns
            )
        if config.policies.epoch_gc_enabled and self._histories:
            self._wake(now_ns + config.policies.epoch_gc_min_age_ns)
        # Dynamic streams a previous driver left on disk have had no lease since it died:
        # they are reclaimed like idle ones unless a client creates them again in time.
        self._orphans: dict[int, int] = {}
        id_range = config.driver.stream_id_range
        if self._reclaim_ns and id_range is not None:
            for sid, history in self._histories.items():
                if sid in id_range and sid not in self._streams and history.on_disk():
                    self._orphans[sid] = now_ns
            if self._orphans:
                self._wake(now_ns + self._reclaim_ns)

    # ------------------------------------------------------------------ queries

    @property
    def next_lease_id(self) -> int:
        """The next lease id; persist it if you want a high-water mark across restarts."""
        return self._leases.next_id

    def next_deadline_ns(self) -> int | None:
        """Earliest time at which :meth:`tick` has work (None once stopped)."""
        if self.state is DriverState.STOPPED:
            return None
        return None if self._wake_ns == _NEVER else self._wake_ns

    def stream_epoch(self, stream_id: int) -> int:
        """Current epoch of a stream (0 if it has none yet in this process)."""
        stream = self._streams.get(stream_id)
        return stream.history.current if stream else 0

    def status(self, now_ns: int) -> DriverStatus:
        """Snapshot of streams, leases (with age and role) and counters."""
        streams = []
        for s in sorted(self._streams.values(), key=lambda s: s.stream_id):
            producer = s.producer if s.producer is not None and s.producer.issued else None
            layout = s.layout
            streams.append(
                StreamStatus(
                    stream_id=s.stream_id,
                    name=s.name,
                    profile=s.profile.name,
                    dynamic=s.dynamic,
                    epoch=s.history.current,
                    regions_ready=layout is not None,
                    producer_client_id=producer.client_id if producer else None,
                    producer_lease_id=producer.lease_id if producer else None,
                    consumer_count=len(s.consumers),
                    pending_attaches=len(s.pending),
                    header_region_uri=layout.header_region_uri if layout else "",
                )
            )
        leases = tuple(
            LeaseStatus(
                lease_id=lease.lease_id,
                stream_id=lease.stream_id,
                client_id=lease.client_id,
                role=lease.role.name,
                state=lease.state.value,
                epoch=lease.epoch,
                age_ns=now_ns - (lease.issued_ns if lease.issued else lease.created_ns),
                expires_in_ns=lease.expiry_ns - now_ns if lease.issued else None,
            )
            for lease in sorted(self._leases.live.values(), key=lambda x: x.lease_id)
        )
        return DriverStatus(
            instance_id=self.config.driver.instance_id,
            state=self.state.value,
            now_ns=now_ns,
            next_lease_id=self._leases.next_id,
            streams=tuple(streams),
            leases=leases,
            counters=dict(self.counters),
        )

    # ------------------------------------------------------------------ attach

    def on_attach_request(
        self,
        req: AttachRequestLike,
        now_ns: int,
        *,
        schema_version: int = DRIVER_SCHEMA_VERSION,
        shm_free_bytes: int | None = None,
    ) -> list[Action]:
        """Handle ``ShmAttachRequest`` (§4.2, §4.3, §4.8, §5).

        Every check runs before any state changes, so a refused request leaves no
        trace but a counter. ``shm_free_bytes`` is the space the agent measured in
        ``shm.base_dir`` (None: unknown, the space reservation is not checked).
        """
        correlation_id = int(req.correlation_id)
        if schema_version != DRIVER_SCHEMA_VERSION:
            return self.on_incompatible_version(
                TEMPLATE_ATTACH_REQUEST, correlation_id, schema_version
            )
        try:
            if self.state is not DriverState.RUNNING:
                raise _Refusal(ResponseCode.REJECTED, "driver is shutting down", "draining")
            request = _read_attach(req, correlation_id)
            # §4.8: a repeated correlationId from the same client is a retry, not a new lease.
            previous = self._leases.for_request(request.client_id, correlation_id)
            if (
                previous is not None
                and previous.requested_stream_id == request.stream_id
                and previous.role is request.role
            ):
                if previous.response is not None:
                    self.counters["attach_retry"] += 1
                    return [previous.response]
                self.counters["attach_retry_pending"] += 1
                return []
            role = request.checked_role()
            stream, profile, new_stream_id = self._check_attach(request, role, shm_free_bytes)
        except _Refusal as refusal:
            return self._attach_error(
                correlation_id, refusal.code, refusal.message, refusal.counter
            )

        if stream is None:
            stream = self._make_stream(
                new_stream_id, f"dynamic-{new_stream_id}", profile, True, now_ns
            )
            stream.creator_client_id = request.client_id
            self._orphans.pop(new_stream_id, None)
            self._streams[new_stream_id] = stream
            self._dyn_cursor = new_stream_id + 1
            self.counters["dynamic_streams_created"] += 1
        stream.idle_since_ns = None
        lease = Lease(
            lease_id=self._leases.allocate_id(),
            stream_id=stream.stream_id,
            client_id=request.client_id,
            role=role,
            correlation_id=correlation_id,
            created_ns=now_ns,
            requested_stream_id=request.stream_id,
        )
        self._leases.add(lease)
        if role is Role.PRODUCER:
            # §6: a producer attaching to a stream without one opens a new epoch.
            stream.producer = lease
            stream.pending.append(lease)
            return [self._advance_epoch(stream, now_ns)]
        if stream.layout is not None and stream.creating is None:
            return [self._issue(stream, lease, now_ns)]
        stream.pending.append(lease)
        if stream.creating is None:
            # First use of the stream in this driver process: a fresh epoch (§10).
            return [self._advance_epoch(stream, now_ns)]
        return []

    def _check_attach(
        self, request: _AttachRequest, role: Role, shm_free_bytes: int | None
    ) -> tuple[_Stream | None, ProfileConfig, int]:
        """Validate against driver state; returns (existing stream, profile, new dynamic id)."""
        if request.mode is None:
            raise _Refusal(ResponseCode.UNSUPPORTED, "unsupported publish mode", "bad_mode")
        if request.hugepages is None:
            raise _Refusal(ResponseCode.INVALID_PARAMS, "unknown hugepages policy", "bad_hugepages")
        holder = self._leases.for_client(request.client_id)
        if holder is not None:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"client id {request.client_id} already holds lease {holder.lease_id} "
                f"({holder.role.name} on stream {holder.stream_id})",
                "duplicate_client",
            )
        stream = self._streams.get(request.stream_id)
        new_stream_id = 0
        if stream is not None:
            profile = stream.profile
        else:
            profile, new_stream_id = self._plan_dynamic_stream(request, shm_free_bytes)
        if request.expected_layout_version not in (0, LAYOUT_VERSION):
            raise _Refusal(
                ResponseCode.REJECTED,
                f"layout version {request.expected_layout_version} requested, "
                f"driver provides {LAYOUT_VERSION}",
                "layout_mismatch",
            )
        if not profile.payload_pools:
            raise _Refusal(
                ResponseCode.INVALID_PARAMS,
                f"stream {request.stream_id} has no payload pools",
                "no_pools",
            )
        problem = self._hugepages_problem(request.hugepages)
        if problem:
            raise _Refusal(ResponseCode.REJECTED, problem, "hugepages_unavailable")
        if role is Role.PRODUCER and stream is not None and stream.producer is not None:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"stream {request.stream_id} already has a producer "
                f"(lease {stream.producer.lease_id}, client {stream.producer.client_id})",
                "producer_exists",
            )
        return stream, profile, new_stream_id

    def _plan_dynamic_stream(
        self, request: _AttachRequest, shm_free_bytes: int | None
    ) -> tuple[ProfileConfig, int]:
        """§4.3/§11: may this attach create a stream, and with which profile and id?

        The limits of issue #13.5 are policy refusals, hence ``REJECTED`` (§4.6).
        """
        if request.mode is not PublishMode.EXISTING_OR_CREATE:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"stream {request.stream_id} is not provisioned",
                "not_provisioned",
            )
        if not self._policies.allow_dynamic_streams:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"stream {request.stream_id} is not provisioned and dynamic streams are disabled",
                "not_provisioned",
            )
        id_range = self.config.driver.stream_id_range
        if id_range is None:
            raise _Refusal(
                ResponseCode.INVALID_PARAMS,
                "dynamic stream creation needs driver.stream_id_range",
                "no_stream_range",
            )
        profile = self.config.default_profile
        if profile is None:  # pragma: no cover - the config loader guarantees one
            raise _Refusal(ResponseCode.INTERNAL_ERROR, "no default profile", "internal")
        self._check_dynamic_limits(request.client_id, profile, shm_free_bytes)
        allocated = allocate_stream_id(id_range, self._streams, request.stream_id, self._dyn_cursor)
        if allocated is None:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"driver.stream_id_range {id_range} is exhausted",
                "range_exhausted",
            )
        return profile, allocated

    def _check_dynamic_limits(
        self, client_id: int, profile: ProfileConfig, shm_free_bytes: int | None
    ) -> None:
        """Issue #13.5: per-client and total limits, and room kept for configured streams."""
        policies = self._policies
        dynamic = [s for s in self._streams.values() if s.dynamic]
        per_client = policies.max_dynamic_streams_per_client
        if sum(1 for s in dynamic if s.creator_client_id == client_id) >= per_client:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"client id {client_id} already created {per_client} dynamic streams "
                f"(policies.max_dynamic_streams_per_client)",
                "dynamic_client_limit",
            )
        if len(dynamic) >= policies.max_dynamic_streams:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"{len(dynamic)} dynamic streams exist, the limit is "
                f"{policies.max_dynamic_streams} (policies.max_dynamic_streams)",
                "dynamic_total_limit",
            )
        if shm_free_bytes is None or not policies.reserve_shm_for_configured_streams:
            return
        needed = epoch_bytes(profile, self.config.shm.page_size_bytes)
        if shm_free_bytes - needed < self._reserve_bytes:
            raise _Refusal(
                ResponseCode.REJECTED,
                f"no room for a dynamic stream in {self.config.shm.base_dir}: it needs "
                f"{needed} bytes and {self._reserve_bytes} bytes are kept for the configured "
                f"streams, {shm_free_bytes} bytes are free",
                "dynamic_no_space",
            )

    def on_incompatible_version(
        self, template_id: int, correlation_id: int, schema_version: int
    ) -> list[Action]:
        """§4.4a: a request in a schema version the driver cannot speak → ``UNSUPPORTED``.

        The agent calls this when the decoder refuses a request's version; it can read
        ``correlationId`` (the first field, right after the 8-byte header) itself.
        """
        message = (
            f"driver control schema version {schema_version} is not supported "
            f"(driver speaks version {DRIVER_SCHEMA_VERSION})"
        )
        self.counters["unsupported_version"] += 1
        if template_id == TEMPLATE_ATTACH_REQUEST:
            return [
                SendAttachResponse(correlation_id, ResponseCode.UNSUPPORTED, error_message=message)
            ]
        if template_id == TEMPLATE_DETACH_REQUEST:
            return [SendDetachResponse(correlation_id, ResponseCode.UNSUPPORTED, message)]
        return []

    def _hugepages_problem(self, policy: HugepagesPolicy) -> str | None:
        """§4.3 ``requireHugepages``: can this driver's regions satisfy the request?"""
        if policy is HugepagesPolicy.HUGEPAGES and not self._hugepages:
            return "hugepage-backed regions are not available from this driver"
        if policy is HugepagesPolicy.STANDARD and self._hugepages:
            return "this driver only provides hugepage-backed regions"
        if (
            policy is HugepagesPolicy.UNSPECIFIED
            and self.config.shm.require_hugepages
            and not self._hugepages
        ):
            return "driver policy requires hugepages but none are available"
        return None

    def _attach_error(
        self, correlation_id: int, code: ResponseCode, message: str, counter: str
    ) -> list[Action]:
        self.counters[f"attach_{code.name.lower()}"] += 1
        self.counters[f"attach_error_{counter}"] += 1
        return [SendAttachResponse(correlation_id, code, error_message=cap_error_message(message))]

    # ------------------------------------------------------------------ regions

    def on_regions_ready(self, stream_id: int, epoch: int, now_ns: int) -> list[Action]:
        """The agent created the files of ``CreateRegions(stream_id, epoch)``."""
        stream = self._streams.get(stream_id)
        if (
            self.state is DriverState.STOPPED
            or stream is None
            or stream.creating is None
            or stream.creating.epoch != epoch
        ):
            self.counters["regions_ready_stale"] += 1
            return []
        stream.layout = stream.creating
        stream.creating = None
        for lease in stream.consumers.values():
            lease.epoch = epoch  # consumers follow the announce to the new epoch
        actions: list[Action] = [self._issue(stream, lease, now_ns) for lease in stream.pending]
        stream.pending.clear()
        actions.append(self._announce(stream, now_ns))
        return actions

    def on_regions_failed(
        self, stream_id: int, epoch: int, reason: str, now_ns: int
    ) -> list[Action]:
        """Creating the files failed: waiting attaches get ``INTERNAL_ERROR``.

        The stream stops being announced until a later attach opens another epoch;
        the failed epoch number is never reused.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.creating is None or stream.creating.epoch != epoch:
            self.counters["regions_failed_stale"] += 1
            return []
        stream.creating = None
        stream.layout = None
        stream.next_announce_ns = _NEVER
        self.counters["regions_failed"] += 1
        message = cap_error_message(
            f"failed to create SHM regions for stream {stream_id} epoch {epoch}: {reason}"
        )
        actions: list[Action] = []
        for lease in stream.pending:
            self._leases.discard(lease)
            if stream.producer is lease:
                stream.producer = None
            self.counters["attach_internal_error"] += 1
            actions.append(
                SendAttachResponse(
                    lease.correlation_id, ResponseCode.INTERNAL_ERROR, error_message=message
                )
            )
        stream.pending.clear()
        self._note_idle(stream, now_ns)
        if self._policies.epoch_gc_enabled:
            self._wake(now_ns + self._policies.epoch_gc_min_age_ns)
        return actions

    # ------------------------------------------------------------------ per-consumer streams

    def on_consumer_hello(
        self,
        stream_id: int,
        consumer_id: int,
        mode: int,
        max_rate_hz: int,
        descriptor_channel: str,
        descriptor_stream_id: int,
        *,
        supports_progress: bool = False,
        control_channel: str = "",
        control_stream_id: int = 0,
    ) -> list[Action]:
        """A wire ``ConsumerHello`` seen on the control stream (Driver Model §11).

        Per-consumer stream requests (``client/per_consumer.py``) from the holder of a consumer
        lease on ``stream_id`` get ids of ``driver.descriptor_stream_id_range`` and (a control
        stream for its ``FrameProgress``, with a descriptor stream only: see
        :func:`~tensorpool.stream_ids.grant`) ``driver.control_stream_id_range``, kept while
        the lease lives and released when it ends, in a ``ConsumerConfig``; the stream's
        producer, if it offers per-consumer streams, follows that answer. Declines: a half
        request (Wire §10.1.2), no lease, no range configured or an exhausted one -- empty
        channel, id 0 (Wire §10.1.3). Driver Model §11 words the unset-range decline as
        "return the shared descriptor/control channel and stream IDs": the driver's shared ids
        are not every consumer's (a rate limiter's destination consumers read descriptors on
        the rate limiter's stream), so naming them would move such a consumer onto a stream
        that never carries its frames; the Wire encoding of a decline means "stay where you
        are" for every consumer, and the Julia driver answers the same. A hello
        that asks for nothing gets no answer here (the producer answers it) and gives back
        what the consumer held.
        """
        key = (stream_id, consumer_id)
        desc = read_request(mode, max_rate_hz, descriptor_channel, descriptor_stream_id)
        ctl = read_control_request(supports_progress, desc, control_channel, control_stream_id)
        if desc is None and ctl is None:
            if self._descriptor_ids.release(key):
                self.counters["per_consumer_released"] += 1
            if self._control_ids.release(key):
                self.counters["per_consumer_control_released"] += 1
            return []
        stream = self._streams.get(stream_id)
        if stream is None or not any(
            lease.client_id == consumer_id for lease in stream.consumers.values()
        ):
            self.counters["per_consumer_declined_no_lease"] += 1
            return [SendConsumerConfig(stream_id, consumer_id, mode, "", 0)]
        d = self.config.driver
        g = grant(
            key,
            desc,
            ctl,
            self._descriptor_ids,
            self._control_ids,
            d.descriptor_channel,
            d.control_channel,
        )
        if g.descriptor_outcome:
            self.counters[f"per_consumer_{g.descriptor_outcome}"] += 1
        if g.control_outcome:
            self.counters[f"per_consumer_control_{g.control_outcome}"] += 1
        return [SendConsumerConfig(stream_id, consumer_id, mode, *g.descriptor, *g.control)]

    # ------------------------------------------------------------------ keepalive / detach

    def on_keepalive(self, msg: KeepaliveLike, now_ns: int) -> list[Action]:
        """``ShmLeaseKeepalive`` (§4.4): extend a matching live lease.

        A keepalive that arrives at or after the lease's deadline does not revive it:
        the lease expires right here, whether or not :meth:`tick` ran in between.
        """
        if self.state is DriverState.STOPPED:
            self.counters["keepalive_after_stop"] += 1
            return []
        try:
            lease_id = int(msg.lease_id)
            stream_id = int(msg.stream_id)
            client_id = int(msg.client_id)
            role_raw = int(msg.role)
        except (ValueError, TypeError):
            self.counters["keepalive_malformed"] += 1
            return []
        lease = self._leases.live.get(lease_id)
        if lease is None or not lease.issued:
            self.counters["keepalive_unknown_lease"] += 1
            return []
        if lease.stream_id != stream_id or lease.client_id != client_id or lease.role != role_raw:
            self.counters["keepalive_mismatch"] += 1
            return []
        if now_ns >= lease.expiry_ns:
            return self._invalidate(
                lease, LeaseState.EXPIRED, LeaseRevokeReason.EXPIRED, now_ns, "lease expired"
            )
        lease.expiry_ns = now_ns + self._ttl_ns
        lease.last_keepalive_ns = now_ns
        lease.move_to(LeaseState.ACTIVE)
        self.counters["keepalive"] += 1
        return []

    def on_detach_request(
        self,
        req: DetachRequestLike,
        now_ns: int,
        *,
        schema_version: int = DRIVER_SCHEMA_VERSION,
    ) -> list[Action]:
        """``ShmDetachRequest`` (§4.9): best-effort and idempotent.

        A repeated detach of a lease this client already detached answers ``OK``
        again without a second revocation; unknown, expired or revoked leases and
        identity mismatches get ``REJECTED``.
        """
        correlation_id = int(req.correlation_id)
        if schema_version != DRIVER_SCHEMA_VERSION:
            return self.on_incompatible_version(
                TEMPLATE_DETACH_REQUEST, correlation_id, schema_version
            )
        if self.state is DriverState.STOPPED:
            return self._detach_reply(correlation_id, ResponseCode.REJECTED, "driver stopped")
        try:
            lease_id = int(req.lease_id)
            stream_id = int(req.stream_id)
            client_id = int(req.client_id)
        except (ValueError, TypeError) as exc:
            return self._detach_reply(
                correlation_id, ResponseCode.INVALID_PARAMS, f"malformed request: {exc}"
            )
        role = _enum_or_none(Role, lambda: req.role)
        if role is None:
            return self._detach_reply(correlation_id, ResponseCode.INVALID_PARAMS, "unknown role")

        lease = self._leases.live.get(lease_id)
        if lease is not None and lease.issued:
            if not _same_identity(lease, stream_id, client_id, role):
                return self._detach_reply(
                    correlation_id,
                    ResponseCode.REJECTED,
                    f"lease {lease_id} does not match stream/client/role of the request",
                )
            reply = self._detach_reply(correlation_id, ResponseCode.OK, "")
            return reply + self._invalidate(
                lease, LeaseState.DETACHED, LeaseRevokeReason.DETACHED, now_ns, ""
            )
        closed = self._leases.closed.get(lease_id)
        if closed is not None and _same_identity(closed, stream_id, client_id, role):
            if closed.state is LeaseState.DETACHED:
                self.counters["detach_repeat"] += 1
                return self._detach_reply(correlation_id, ResponseCode.OK, "")
            return self._detach_reply(
                correlation_id,
                ResponseCode.REJECTED,
                f"lease {lease_id} already ended ({closed.state.value})",
            )
        return self._detach_reply(
            correlation_id, ResponseCode.REJECTED, f"unknown lease {lease_id}"
        )

    def _detach_reply(self, correlation_id: int, code: ResponseCode, message: str) -> list[Action]:
        self.counters[f"detach_{code.name.lower()}"] += 1
        return [SendDetachResponse(correlation_id, code, cap_error_message(message))]

    # ------------------------------------------------------------------ administration

    def revoke_lease(
        self, lease_id: int, now_ns: int, message: str = "revoked by the driver"
    ) -> list[Action]:
        """Administrative revocation (``REVOKED``); a producer's stream gets a new epoch."""
        lease = self._leases.live.get(lease_id)
        if lease is None or not lease.issued or self.state is DriverState.STOPPED:
            self.counters["revoke_unknown_lease"] += 1
            return []
        return self._invalidate(
            lease, LeaseState.REVOKED, LeaseRevokeReason.REVOKED, now_ns, message
        )

    def change_stream_profile(self, stream_id: int, profile: str, now_ns: int) -> list[Action]:
        """Change a stream's layout (§6: new epoch; the producer must reattach)."""
        stream = self._streams[stream_id]
        new_profile = self.config.profiles.get(profile)
        if new_profile is None:
            raise ValueError(f"unknown profile {profile!r}")
        if new_profile == stream.profile:
            return []
        stream.profile = new_profile
        return self._relayout(stream, now_ns, f"stream {stream_id} layout changed")

    def recreate_regions(
        self, stream_id: int, now_ns: int, message: str = "SHM regions recreated"
    ) -> list[Action]:
        """The files must be recreated/reinitialised (e.g. found damaged): new epoch (§6)."""
        return self._relayout(self._streams[stream_id], now_ns, message)

    def _relayout(self, stream: _Stream, now_ns: int, message: str) -> list[Action]:
        if self.state is DriverState.STOPPED:
            return []
        producer = stream.producer
        if producer is not None and producer.issued:
            return self._invalidate(
                producer, LeaseState.REVOKED, LeaseRevokeReason.REVOKED, now_ns, message
            )
        if stream.layout is not None or stream.creating is not None:
            return [self._advance_epoch(stream, now_ns)]
        return []

    # ------------------------------------------------------------------ shutdown

    def on_shutdown_request(self, req: ShutdownRequestLike, now_ns: int) -> list[Action]:
        """``ShmDriverShutdownRequest`` (§4.13): honoured only with the configured token.

        Requests with a missing or wrong token — or any request while no token is
        configured — are ignored without a reply (the schema has no shutdown
        response) and counted.
        """
        if self.state is not DriverState.RUNNING:
            self.counters["shutdown_request_ignored"] += 1
            return []
        expected = self._policies.shutdown_token
        if not expected:
            self.counters["shutdown_request_disabled"] += 1
            return []
        try:
            token = _as_bytes(req.token)
        except (ValueError, TypeError):
            token = b""
        if not token or not hmac.compare_digest(token, expected.encode("ascii")):
            self.counters["shutdown_request_bad_token"] += 1
            return []
        reason = _enum_or_none(ShutdownReason, lambda: req.reason) or ShutdownReason.ADMIN
        try:
            message = _as_bytes(req.error_message).decode("ascii", "replace")
        except (ValueError, TypeError):
            message = ""
        self.counters["shutdown_request_accepted"] += 1
        return self.begin_shutdown(now_ns, reason, message)

    def begin_shutdown(
        self, now_ns: int, reason: ShutdownReason = ShutdownReason.NORMAL, message: str = ""
    ) -> list[Action]:
        """Enter DRAINING: final announces now, ``ShmDriverShutdown`` after the timeout.

        Also the entry point for a local stop (signal). New attaches are rejected while
        draining; keepalives, detaches and expiries are still handled.
        """
        if self.state is not DriverState.RUNNING:
            return []
        self.state = DriverState.DRAINING
        self._shutdown_reason = reason
        self._shutdown_message = cap_error_message(message)
        self._shutdown_deadline_ns = now_ns + self._policies.shutdown_timeout_ns
        self._wake(self._shutdown_deadline_ns)
        actions: list[Action] = [
            self._announce(stream, now_ns)
            for stream in self._streams.values()
            if stream.layout is not None
        ]
        if now_ns >= self._shutdown_deadline_ns:
            actions += self._finish_shutdown(now_ns)
        return actions

    def stop_now(
        self, now_ns: int, reason: ShutdownReason = ShutdownReason.NORMAL, message: str = ""
    ) -> list[Action]:
        """Skip the drain (a second signal): end every lease and send the notice now."""
        if self.state is DriverState.STOPPED:
            return []
        self._shutdown_reason = reason
        self._shutdown_message = cap_error_message(message)
        return self._finish_shutdown(now_ns)

    def _finish_shutdown(self, now_ns: int) -> list[Action]:
        """STOPPED: every live lease ends REVOKED, then the shutdown notice (§4.9, §4.13).

        §4.9: "For any lease invalidation event (DETACHED, EXPIRED, or REVOKED), the driver
        MUST publish a ``ShmLeaseRevoked`` notice" -- shutdown is such an event, so each live
        lease gets its own notice (reason REVOKED) before the ``ShmDriverShutdown`` that
        tells every client at once (#14.3). No new epoch is opened: the driver is stopping.
        """
        self.state = DriverState.STOPPED
        actions: list[Action] = []
        for stream in self._streams.values():
            for lease in stream.pending:
                self._leases.discard(lease)
                actions.append(
                    SendAttachResponse(
                        lease.correlation_id,
                        ResponseCode.REJECTED,
                        error_message="driver shut down",
                    )
                )
            stream.pending.clear()
            stream.creating = None
            stream.producer = None
            stream.consumers.clear()
        for lease in list(self._leases.live.values()):
            self._leases.close(lease, LeaseState.REVOKED, now_ns)
            self.counters["lease_revoked"] += 1
            actions.append(
                PublishLeaseRevoked(
                    timestamp_ns=now_ns,
                    lease_id=lease.lease_id,
                    stream_id=lease.stream_id,
                    client_id=lease.client_id,
                    role=lease.role,
                    reason=LeaseRevokeReason.REVOKED,
                    error_message="driver shut down",
                )
            )
        actions.append(PublishShutdown(now_ns, self._shutdown_reason, self._shutdown_message))
        return actions

    # ------------------------------------------------------------------ timers

    def tick(self, now_ns: int) -> list[Action]:
        """Expire leases, send due announces, collect epochs, finish shutdown."""
        if self.state is DriverState.STOPPED or now_ns < self._wake_ns:
            return []
        actions: list[Action] = []
        for lease in self._leases.expired(now_ns):
            if lease.live:  # an earlier invalidation in this sweep may have closed it
                actions += self._invalidate(
                    lease,
                    LeaseState.EXPIRED,
                    LeaseRevokeReason.EXPIRED,
                    now_ns,
                    "keepalive timeout",
                )
        if self.state is DriverState.RUNNING:
            actions += self._reclaim_idle_streams(now_ns)
        for stream in self._streams.values():
            if stream.layout is not None and now_ns >= stream.next_announce_ns:
                actions.append(self._announce(stream, now_ns))
        if self._policies.epoch_gc_enabled:
            actions += self._collect_epochs(now_ns, ignore_age=False)
        if self.state is DriverState.DRAINING and now_ns >= self._shutdown_deadline_ns:
            actions += self._finish_shutdown(now_ns)
            return actions
        self._recompute_wake()
        return actions

    def startup_gc(self, now_ns: int) -> list[Action]:
        """``policies.epoch_gc_on_startup``: drop old epochs left by a previous run now.

        Keeps the newest ``epoch_gc_keep`` epochs of each stream; skips the age check
        because the previous driver's leases are gone (§10).
        """
        if not (self._policies.epoch_gc_enabled and self._policies.epoch_gc_on_startup):
            return []
        return self._collect_epochs(now_ns, ignore_age=True)

    def reclaim_space(self, now_ns: int) -> list[Action]:
        """Out of SHM space: collect every superseded epoch beyond ``keep`` regardless of age.

        EPOCH_GC_POLICY: on allocation failure run GC once, retry, then fail with
        ``INTERNAL_ERROR`` (via :meth:`on_regions_failed`).
        """
        return self._collect_epochs(now_ns, ignore_age=True)

    def _collect_epochs(self, now_ns: int, *, ignore_age: bool) -> list[Action]:
        keep = self._policies.epoch_gc_keep
        min_age = self._policies.epoch_gc_min_age_ns
        actions: list[Action] = []
        for stream_id, history in self._histories.items():
            for epoch in history.gc_candidates(
                now_ns,
                keep=keep,
                min_age_ns=min_age,
                referenced=self._referenced_epochs(stream_id),
                ignore_age=ignore_age,
            ):
                actions.append(
                    RetireEpoch(stream_id, epoch, epoch_dir(self.config, stream_id, epoch))
                )
        self.counters["epochs_retired"] += len(actions)
        return actions

    def _referenced_epochs(self, stream_id: int) -> set[int]:
        """Epochs a live lease (or a creation in flight) still uses."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return set()
        referenced = {lease.epoch for lease in stream.consumers.values()}
        if stream.producer is not None and stream.producer.issued:
            referenced.add(stream.producer.epoch)
        if stream.creating is not None:
            referenced.add(stream.creating.epoch)
        if stream.layout is not None:
            referenced.add(stream.layout.epoch)
        return referenced

    # ------------------------------------------------------------------ internals

    def _make_stream(
        self, stream_id: int, name: str, profile: ProfileConfig, dynamic: bool, now_ns: int
    ) -> _Stream:
        history = self._histories.get(stream_id)
        if history is None:
            history = self._histories[stream_id] = EpochHistory()
        return _Stream(
            stream_id=stream_id,
            name=name,
            profile=profile,
            dynamic=dynamic,
            history=history,
            created_ns=now_ns,
        )

    def _advance_epoch(self, stream: _Stream, now_ns: int) -> CreateRegions:
        """Open the next epoch: nothing is announced until its files exist."""
        epoch = stream.history.advance(now_ns)
        layout = build_layout(
            self.config, stream.stream_id, epoch, stream.profile, hugepages=self._hugepages
        )
        stream.layout = None
        stream.creating = layout
        stream.next_announce_ns = _NEVER
        self.counters["epochs_opened"] += 1
        if self._policies.epoch_gc_enabled:
            self._wake(now_ns + self._policies.epoch_gc_min_age_ns)
        return CreateRegions(stream.stream_id, epoch, layout)

    def _issue(self, stream: _Stream, lease: Lease, now_ns: int) -> SendAttachResponse:
        layout = stream.layout
        assert layout is not None
        lease.move_to(LeaseState.ATTACHED)
        lease.issued_ns = now_ns
        lease.last_keepalive_ns = now_ns
        lease.expiry_ns = now_ns + self._ttl_ns
        lease.epoch = layout.epoch
        if lease.role is Role.CONSUMER:
            stream.consumers[lease.lease_id] = lease
        response = SendAttachResponse(
            correlation_id=lease.correlation_id,
            code=ResponseCode.OK,
            lease_id=lease.lease_id,
            lease_expiry_timestamp_ns=lease.expiry_ns,
            stream_id=stream.stream_id,
            epoch=layout.epoch,
            layout_version=layout.layout_version,
            header_nslots=layout.header_nslots,
            header_slot_bytes=layout.header_slot_bytes,
            max_dims=MAX_DIMS,
            payload_pools=layout.wire_pools,
            header_region_uri=layout.header_region_uri,
        )
        lease.response = response
        self._wake(lease.expiry_ns)
        self.counters["attach_ok"] += 1
        return response

    def _invalidate(
        self,
        lease: Lease,
        state: LeaseState,
        reason: LeaseRevokeReason,
        now_ns: int,
        message: str,
    ) -> list[Action]:
        """End a lease: always a ``ShmLeaseRevoked``; a producer's stream gets a new epoch.

        The revocation is emitted before the epoch's ``CreateRegions`` and therefore
        before the epoch-bumped announce (§4.7a, §4.9, §7).
        """
        stream = self._streams[lease.stream_id]
        self._leases.close(lease, state, now_ns)
        self.counters[f"lease_{state.value.lower()}"] += 1
        actions: list[Action] = [
            PublishLeaseRevoked(
                timestamp_ns=now_ns,
                lease_id=lease.lease_id,
                stream_id=lease.stream_id,
                client_id=lease.client_id,
                role=lease.role,
                reason=reason,
                error_message=cap_error_message(message),
            )
        ]
        if lease.role is Role.PRODUCER:
            if stream.producer is lease:
                stream.producer = None
            if self.state is not DriverState.STOPPED:
                actions.append(self._advance_epoch(stream, now_ns))
        else:
            stream.consumers.pop(lease.lease_id, None)
            # the consumer left: its per-consumer stream ids are free again (§11, §10.1.3)
            key = (lease.stream_id, lease.client_id)
            if self._descriptor_ids.release(key):
                self.counters["per_consumer_released"] += 1
            if self._control_ids.release(key):
                self.counters["per_consumer_control_released"] += 1
        self._note_idle(stream, now_ns)
        return actions

    def _note_idle(self, stream: _Stream, now_ns: int) -> None:
        """A dynamic stream whose last lease just ended starts its reclaim clock.

        Configured streams never get one: they are never reclaimed.
        """
        if not stream.dynamic or stream.idle_since_ns is not None:
            return
        if stream.producer is not None or stream.consumers or stream.pending:
            return
        stream.idle_since_ns = now_ns
        if self._reclaim_ns:
            self._wake(now_ns + self._reclaim_ns)

    def _reclaim_idle_streams(self, now_ns: int) -> list[Action]:
        """Issue #13.5: forget dynamic streams that had no lease for the reclaim time.

        Configured streams are never reclaimed, nor a stream with a live or pending
        lease or files being created. The epoch history stays in ``_histories``, so
        a stream created again with this id continues above its last epoch.
        """
        if not self._reclaim_ns:
            return []
        actions: list[Action] = []
        for stream in list(self._streams.values()):
            since = stream.idle_since_ns
            # idle_since_ns is only ever set on dynamic streams (_note_idle)
            if since is None or now_ns < since + self._reclaim_ns or stream.creating is not None:
                continue
            del self._streams[stream.stream_id]
            self.counters["dynamic_streams_reclaimed"] += 1
            actions.append(self._reclaim(stream.stream_id, stream.history))
        for stream_id, since in list(self._orphans.items()):
            if now_ns >= since + self._reclaim_ns:
                del self._orphans[stream_id]
                self.counters["orphan_streams_reclaimed"] += 1
                actions.append(self._reclaim(stream_id, self._histories[stream_id]))
        return actions

    def _reclaim(self, stream_id: int, history: EpochHistory) -> ReclaimStream:
        epochs = tuple(history.forget_all())
        directories = tuple(epoch_dir(self.config, stream_id, e) for e in epochs)
        return ReclaimStream(stream_id, epochs, directories)

    def _announce(self, stream: _Stream, now_ns: int) -> PublishAnnounce:
        layout = stream.layout
        assert layout is not None
        producer = stream.producer
        stream.next_announce_ns = now_ns + self._announce_ns
        self._wake(stream.next_announce_ns)
        self.counters["announces"] += 1
        return PublishAnnounce(
            stream_id=stream.stream_id,
            producer_id=producer.client_id if producer is not None and producer.issued else 0,
            epoch=layout.epoch,
            announce_timestamp_ns=now_ns,
            announce_clock_domain=CLOCK_DOMAIN_MONOTONIC,
            layout_version=layout.layout_version,
            header_nslots=layout.header_nslots,
            header_slot_bytes=layout.header_slot_bytes,
            payload_pools=layout.wire_pools,
            header_region_uri=layout.header_region_uri,
            layout=layout,
        )

    def _wake(self, deadline_ns: int) -> None:
        if deadline_ns < self._wake_ns:
            self._wake_ns = deadline_ns

    def _recompute_wake(self) -> None:
        wake = _NEVER
        expiry = self._leases.next_expiry_ns()
        if expiry is not None:
            wake = expiry
        for stream in self._streams.values():
            if stream.layout is not None:
                wake = min(wake, stream.next_announce_ns)
            if (
                stream.idle_since_ns is not None
                and stream.creating is None
                and self._reclaim_ns
                and self.state is DriverState.RUNNING
            ):
                wake = min(wake, stream.idle_since_ns + self._reclaim_ns)
        if self._orphans and self.state is DriverState.RUNNING:
            wake = min(wake, min(self._orphans.values()) + self._reclaim_ns)
        if self._policies.epoch_gc_enabled:
            keep = self._policies.epoch_gc_keep
            min_age = self._policies.epoch_gc_min_age_ns
            for stream_id, history in self._histories.items():
                due = history.next_gc_ns(
                    keep=keep, min_age_ns=min_age, referenced=self._referenced_epochs(stream_id)
                )
                if due is not None:
                    wake = min(wake, due)
        if self.state is DriverState.DRAINING:
            wake = min(wake, self._shutdown_deadline_ns)
        self._wake_ns = wake


class _Refusal(Exception):
    """An attach refused with ``code``; ``counter`` names the reason in ``counters``."""

    def __init__(self, code: ResponseCode, message: str, counter: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.counter = counter


@dataclass(frozen=True, slots=True)
class _AttachRequest:
    """Fields copied out of the (reused) decoder flyweight; None marks an unknown enum."""

    correlation_id: int
    stream_id: int
    client_id: int
    role: Role | None
    expected_layout_version: int
    mode: PublishMode | None
    hugepages: HugepagesPolicy | None

    def checked_role(self) -> Role:
        if self.role is None:
            raise _Refusal(ResponseCode.INVALID_PARAMS, "unknown role", "bad_role")
        return self.role


def _read_attach(req: AttachRequestLike, correlation_id: int) -> _AttachRequest:
    """Copy the request out; a null ``publishMode`` means REQUIRE_EXISTING (§4.3).

    ``maxDims`` is not read: §4.3 says to ignore it, the response carries MAX_DIMS.
    """
    try:
        stream_id = int(req.stream_id)
        client_id = int(req.client_id)
        expected_layout = int(req.expected_layout_version)
    except (ValueError, TypeError) as exc:
        raise _Refusal(ResponseCode.INVALID_PARAMS, f"malformed request: {exc}", "bad") from None
    try:
        raw_mode = req.publish_mode
        mode: PublishMode | None = (
            PublishMode.REQUIRE_EXISTING if raw_mode is None else PublishMode(int(raw_mode))
        )
    except (ValueError, TypeError):
        mode = None
    return _AttachRequest(
        correlation_id=correlation_id,
        stream_id=stream_id,
        client_id=client_id,
        role=_enum_or_none(Role, lambda: req.role),
        expected_layout_version=expected_layout,
        mode=mode,
        hugepages=_enum_or_none(HugepagesPolicy, lambda: req.require_hugepages),
    )


def _enum_or_none[E: (Role, PublishMode, HugepagesPolicy, ShutdownReason)](
    enum: type[E], read: Callable[[], object]
) -> E | None:
    """Read a decoder enum property; None if it holds (or raises for) an unknown value."""
    try:
        raw = read()
        if raw is None:
            return None
        return enum(int(raw))  # type: ignore[call-overload]
    except (ValueError, TypeError):
        return None


def _same_identity(lease: Lease, stream_id: int, client_id: int, role: Role) -> bool:
    return lease.stream_id == stream_id and lease.client_id == client_id and lease.role is role


def _as_bytes(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("ascii", "replace")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"expected text, got {type(value).__name__}")
