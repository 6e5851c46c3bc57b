"""Attaching to the SHM driver: leases, keepalives, revocation (Driver Model §4).

`LeaseMachine` is the sans-IO state machine of §4.12.1 for one (stream, role). Its states
(:class:`AttachPhase`) and the events that move it (:class:`LeaseEvent`) are declared once, in
:data:`TRANSITIONS` (as h11's ``_state.py``): every change of state goes through
:meth:`LeaseMachine._fire`, and a (state, event) pair the table does not list raises
:class:`IllegalTransition`. In short:

    UNATTACHED -> ATTACHING -> ATTACHED -> DETACHING -> CLOSED
                      |            |   ^
                      |            |   | (probe answered: "you already hold lease L")
                      |            v   |
                      |         CONFIRMING  (revoke / shutdown notice for our lease)
                      v            v  (confirmed, expiry, driver silent, keepalive failure)
                   BACKOFF  <------+   -> ATTACHING again after the backoff delay

Inputs are decoded control messages and `now_ns`; outputs are `Send*` actions
(requests to encode and offer) and events (`Attached`, `LeaseLost`,
`ProducerRevoked`, `AttachFailed`). Every check of §4.2 is applied to an OK
response, and any failure is a protocol error: the attach is dropped and retried
(fail closed, §4.7a). `DriverClient` is the thin I/O shell around it.

Forged notices (issue #14 §2). Aeron IPC carries no sender identity: any process that can
write the Aeron directory can publish a `ShmLeaseRevoked` or `ShmDriverShutdown`. Acting on
one blindly drops a good lease, and the driver, which still holds it, refuses the reattach
until it expires (seconds). So a notice about *our* lease is first confirmed with the driver:
the machine enters CONFIRMING (the lease stays in use, keepalives continue) and sends an
attach probe with its own client id. The driver answers it from its lease table (Driver
Model §4.8, one live lease per clientId):

* ``REJECTED "client id C already holds lease L"`` with our L: the lease is alive, the notice
  was not the driver's; it is counted (``notice_not_confirmed``) and ignored;
* ``OK``: the lease really was gone; the probe *is* the reattach (the new lease follows the
  ``LeaseLost`` at once, so a real revoke costs no backoff);
* any other refusal ("shutting down"), no answer within ``confirm_timeout_ns``, or a lost
  media driver: the notice is confirmed and the lease is dropped as §4.9/§4.13 say.

Late grants (§4.2 with §4.8). An attach request that timed out may still be answered: a
driver that stalled (stopped, swapping) past ``attach_timeout_ns`` works through its queue when
it resumes, granting our first request and refusing the retry because our client id now holds
a lease. The machine remembers the requests it gave up on; a late grant is taken while it still
looks for a lease and detached otherwise, and a refusal naming a lease of ours that it never
heard of (a lost answer) detaches that lease and retries at the busy period. Without this the
client would be kept out until the unused lease expired.

The deviation from "immediately" in §4.9/§4.13 is one driver round trip (bounded by
``confirm_timeout_ns``); the regions stay mapped meanwhile, and consumers drop anything the
producer writes to a revoked epoch by the epoch filter (Wire §10.2.1). docs/operator.md
describes the exposure that remains and how directory permissions close it.
"""

from __future__ import annotations

import enum
import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Final

from tensorpool.client.announce import AnnouncedPool, StreamLayout
from tensorpool.shm.errors import ShmError
from tensorpool.shm.uri import parse_shm_uri
from tensorpool.specs import CodecError
from tensorpool.specs.generated import driver as dp
from tensorpool.specs.generated.wire import MAX_DIMS_CONST

SEC = 1_000_000_000
ROLE_PRODUCER = int(dp.Role.PRODUCER)
ROLE_CONSUMER = int(dp.Role.CONSUMER)
_OK = int(dp.ResponseCode.OK)


class AttachPhase(enum.Enum):
    """Where this client stands in attaching to the driver (not the driver's
    ``driver.leases.LeaseState``, which is a lease's lifecycle inside the driver)."""

    UNATTACHED = "unattached"
    ATTACHING = "attaching"
    ATTACHED = "attached"
    CONFIRMING = "confirming"
    DETACHING = "detaching"
    BACKOFF = "backoff"
    CLOSED = "closed"


class LeaseEvent(enum.Enum):
    """What moves a :class:`LeaseMachine` from one :class:`AttachPhase` to another."""

    ATTACH = "attach"
    """An attach request is sent."""
    GRANTED = "granted"
    """A valid OK attach response: ours, or a late one for a request we gave up on."""
    ATTACH_FAILED = "attach_failed"
    """The attach was refused, malformed, timed out, or the driver or media driver went away."""
    NOTICE = "notice"
    """A revoke / shutdown notice names our lease: ask the driver first (#14 §2)."""
    NOTICE_DENIED = "notice_denied"
    """The driver still holds our lease: the notice was not its."""
    PROBE_GRANTED = "probe_granted"
    """The driver granted the confirmation probe: the lease was gone, the probe is an attach."""
    LEASE_LOST = "lease_lost"
    """The lease is gone (expiry, confirmed notice, driver silent, keepalive failure, reset)."""
    DETACH = "detach"
    """A detach request for our lease is sent."""
    DETACH_DONE = "detach_done"
    """The detach was answered, or its answer is no longer waited for."""
    CLOSE = "close"
    """The owner closes: from anywhere, at once (a lease still held expires at the driver)."""


_P = AttachPhase
_E = LeaseEvent
#: The one declaration of the client's attach states: (state, event) -> next state. Anything
#: missing is illegal and raises.
TRANSITIONS: Final[dict[tuple[AttachPhase, LeaseEvent], AttachPhase]] = {
    (_P.UNATTACHED, _E.ATTACH): _P.ATTACHING,
    (_P.ATTACHING, _E.GRANTED): _P.ATTACHED,
    (_P.ATTACHING, _E.ATTACH_FAILED): _P.BACKOFF,
    (_P.ATTACHED, _E.NOTICE): _P.CONFIRMING,
    (_P.ATTACHED, _E.LEASE_LOST): _P.BACKOFF,
    (_P.ATTACHED, _E.DETACH): _P.DETACHING,
    (_P.CONFIRMING, _E.NOTICE_DENIED): _P.ATTACHED,
    (_P.CONFIRMING, _E.PROBE_GRANTED): _P.ATTACHING,
    (_P.CONFIRMING, _E.LEASE_LOST): _P.BACKOFF,
    (_P.CONFIRMING, _E.DETACH): _P.DETACHING,
    (_P.DETACHING, _E.DETACH_DONE): _P.CLOSED,
    (_P.DETACHING, _E.LEASE_LOST): _P.BACKOFF,
    (_P.BACKOFF, _E.ATTACH): _P.ATTACHING,
    (_P.BACKOFF, _E.GRANTED): _P.ATTACHED,
    **{(state, _E.CLOSE): _P.CLOSED for state in AttachPhase},
}


class IllegalTransition(RuntimeError):
    """A (state, event) pair :data:`TRANSITIONS` does not allow: a bug in the machine."""


@dataclass(frozen=True, slots=True)
class SendAttach:
    correlation_id: int
    stream_id: int
    client_id: int
    role: int
    expected_layout_version: int
    publish_mode: int | None
    require_hugepages: int


@dataclass(frozen=True, slots=True)
class SendKeepalive:
    lease_id: int
    stream_id: int
    client_id: int
    role: int
    client_timestamp_ns: int


@dataclass(frozen=True, slots=True)
class SendDetach:
    correlation_id: int
    lease_id: int
    stream_id: int
    client_id: int
    role: int


@dataclass(frozen=True, slots=True)
class Attached:
    lease_id: int
    layout: StreamLayout
    lease_expiry_ns: int | None


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """Our lease is gone: stop using its regions now, drop in-flight frames (§4.9)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ProducerRevoked:
    """The producer of the stream we consume lost its lease: await the new epoch (§4.9)."""

    stream_id: int
    timestamp_ns: int = 0
    """The driver's clock at the revocation (the clock of its announces); 0 if unknown."""


@dataclass(frozen=True, slots=True)
class NoticeNotConfirmed:
    """A revoke/shutdown notice for our lease that the driver contradicted: the lease is
    alive, so the notice did not come from the driver (issue #14 §2). Only worth a log line."""

    notice: str


@dataclass(frozen=True, slots=True)
class AttachFailed:
    """An attach was refused or malformed; retried after backoff. `code` None = protocol."""

    code: int | None
    message: str


Action = (
    SendAttach
    | SendKeepalive
    | SendDetach
    | Attached
    | LeaseLost
    | ProducerRevoked
    | NoticeNotConfirmed
    | AttachFailed
)


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    keepalive_interval_ns: int = SEC
    attach_timeout_ns: int = 2 * SEC
    backoff_initial_ns: int = 100_000_000
    backoff_max_ns: int = 5 * SEC
    busy_retry_ns: int = 250_000_000
    """Retry period while the driver refuses because an old lease is still held (#13.3):
    short, so the attach lands soon after that lease expires."""
    confirm_timeout_ns: int = 500_000_000
    """How long a revoke/shutdown notice for our lease waits for the driver to answer the
    confirmation probe (issue #14 §2); no answer means the driver is gone: the notice holds."""


# REJECTED messages that describe a state which ends by itself: the lease of a previous
# (crashed) holder has not expired yet, or the driver is draining for shutdown. Matched on the
# driver's message text: the protocol has one REJECTED code for every denial (driver/core.py).
_TRANSIENT_REFUSALS = ("already has a producer", "already holds lease", "shutting down")
# The duplicate-clientId refusal names the lease the driver holds for us (driver/core.py).
_HELD_LEASE = re.compile(r"already holds lease (\d+)\b")
#: timed-out attach requests remembered for their late answer (a few attach timeouts' worth)
_ABANDONED_KEPT: Final = 8


def is_transient_refusal(code: int | None, message: str) -> bool:
    """True for an attach refusal that goes away once an old lease expires (#13.3)."""
    return code == int(dp.ResponseCode.REJECTED) and any(t in message for t in _TRANSIENT_REFUSALS)


class LeaseMachine:
    """One client's lease on one stream in one role (sans-IO)."""

    def __init__(
        self,
        stream_id: int,
        role: int,
        client_id: int,
        *,
        timings: LeaseTimings | None = None,
        expected_layout_version: int = 0,
        publish_mode: int | None = None,
        require_hugepages: int = int(dp.HugepagesPolicy.UNSPECIFIED),
        correlation_seed: int | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.role = role
        self.client_id = client_id
        self.timings = timings or LeaseTimings()
        self.expected_layout_version = expected_layout_version
        self.publish_mode = publish_mode
        self.require_hugepages = require_hugepages
        self._state = AttachPhase.UNATTACHED
        self.lease_id: int | None = None
        self.lease_expiry_ns: int | None = None
        self._lease_duration_ns = 0
        self._keepalive_ns = self.timings.keepalive_interval_ns
        self.layout: StreamLayout | None = None
        self._attach_sent_ns = 0
        self._corr = correlation_seed if correlation_seed is not None else random.getrandbits(40)
        self._pending: int | None = None
        self._deadline = 0
        self._next_keepalive = 0
        self._backoff_ns = self.timings.backoff_initial_ns
        self._notice: str | None = None  # the notice being confirmed (CONFIRMING)
        # attach requests given up on (timed out) whose answer may still come: a driver that
        # stalled past our attach timeout grants them when it resumes (see on_attach_response)
        self._abandoned: deque[int] = deque(maxlen=_ABANDONED_KEPT)
        self.counters: dict[str, int] = {}

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    @property
    def state(self) -> AttachPhase:
        """Read-only: the state changes only by an event (:meth:`_fire`)."""
        return self._state

    def _fire(self, event: LeaseEvent) -> None:
        """Move to the state :data:`TRANSITIONS` names for ``event``; raise if it names none."""
        try:
            self._state = TRANSITIONS[self._state, event]
        except KeyError:
            raise IllegalTransition(
                f"stream {self.stream_id}: {event.name} is not allowed in {self._state.name}"
            ) from None

    def _may(self, event: LeaseEvent) -> bool:
        return (self._state, event) in TRANSITIONS

    @property
    def pending_correlation_id(self) -> int | None:
        """The correlation id of the attach or detach awaiting its response."""
        return self._pending

    def _next_corr(self) -> int:
        self._corr = (self._corr + 1) & 0x7FFFFFFFFFFFFFFF
        return self._corr

    # --- commands -----------------------------------------------------------------------------
    def attach(self, now: int) -> list[Action]:
        if not self._may(LeaseEvent.ATTACH):
            return []
        corr = self._next_corr()
        self._pending = corr
        self._fire(LeaseEvent.ATTACH)
        self._attach_sent_ns = now
        self._deadline = now + self.timings.attach_timeout_ns
        return [self._attach_request(corr)]

    def _attach_request(self, corr: int) -> SendAttach:
        """The attach request of this (stream, role): a real attach or a confirmation probe."""
        return SendAttach(
            corr,
            self.stream_id,
            self.client_id,
            self.role,
            self.expected_layout_version,
            self.publish_mode,
            self.require_hugepages,
        )

    @property
    def holds_lease(self) -> bool:
        """The lease is usable: attached, or attached with a notice being confirmed."""
        return self.state in (AttachPhase.ATTACHED, AttachPhase.CONFIRMING)

    def detach(self, now: int) -> list[Action]:
        if not self.holds_lease or self.lease_id is None:
            self.close()
            return []
        request = self._detach_request(self.lease_id)
        self._pending = request.correlation_id
        self._fire(LeaseEvent.DETACH)
        self._deadline = now + self.timings.attach_timeout_ns
        return [request]

    def close(self) -> None:
        """The owner is done with this machine (after a detach, answered or not)."""
        self._pending = None
        self._fire(LeaseEvent.CLOSE)

    # --- inputs -------------------------------------------------------------------------------
    def on_attach_response(self, r: dp.ShmAttachResponseDecoder, now: int) -> list[Action]:
        corr = r.correlation_id
        if corr != self._pending and corr in self._abandoned:
            return self._on_late_response(r, now)
        if corr != self._pending or self.state not in (
            AttachPhase.ATTACHING,
            AttachPhase.CONFIRMING,
        ):
            return []  # someone else's response on the shared control stream
        if self.state is AttachPhase.CONFIRMING:
            return self._on_probe_response(r, now)
        self._pending = None
        code = r.code_raw
        if code != _OK:
            self._count(f"attach_code_{code}")
            message = r.error_message
            held = _HELD_LEASE.search(message)
            if held is not None and int(held.group(1)) != self.lease_id:
                # §4.8: the driver holds a lease for our client id that we never heard of (a
                # grant whose answer was lost): release it and attach again at the busy period
                self._count("unknown_lease_released")
                self._to_backoff(now, LeaseEvent.ATTACH_FAILED)
                self._deadline = now + self.timings.busy_retry_ns
                self._backoff_ns = self.timings.backoff_initial_ns
                return [self._detach_request(int(held.group(1)))]
            self._to_backoff(now, LeaseEvent.ATTACH_FAILED)
            if is_transient_refusal(code, message):
                # an old lease still holds the stream: poll for its expiry, do not back off
                self._deadline = now + self.timings.busy_retry_ns
                self._backoff_ns = self.timings.backoff_initial_ns
            return [AttachFailed(code, message)]
        try:
            lease_id, expiry, layout = _validate_ok_response(r, self.stream_id)
        except (ValueError, CodecError, ShmError) as exc:
            self._count("attach_protocol_error")
            self._to_backoff(now, LeaseEvent.ATTACH_FAILED)
            return [AttachFailed(None, f"protocol error: {exc}")]
        return self._attached(lease_id, expiry, layout, now)

    def _on_late_response(self, r: dp.ShmAttachResponseDecoder, now: int) -> list[Action]:
        """The answer to an attach we gave up on (it timed out while the driver stalled).

        The driver granted it when it resumed, and refuses our newer request because that lease
        exists (one lease per client id, §4.8): ignoring the grant would keep us out until the
        unused lease expires. So a late grant is taken if we are still looking for a lease, and
        released (detached) if we are not; a late refusal says nothing new.
        """
        self._abandoned.remove(r.correlation_id)
        if r.code_raw != _OK:
            return []
        try:
            lease_id, expiry, layout = _validate_ok_response(r, self.stream_id)
        except (ValueError, CodecError, ShmError):
            self._count("late_grant_malformed")  # its lease, unknown to us, expires by itself
            return []
        if self.state in (AttachPhase.ATTACHING, AttachPhase.BACKOFF):
            self._count("late_grant_taken")
            if self._pending is not None:  # the newer request: refused, or released if granted
                self._abandoned.append(self._pending)
            self._pending = None
            self._notice = None
            return self._attached(lease_id, expiry, layout, now)
        self._count("late_grant_released")
        return [self._detach_request(lease_id)]

    def _detach_request(self, lease_id: int) -> SendDetach:
        """A detach of ``lease_id`` with a fresh correlation id (:meth:`detach` waits for its
        answer; a lease this machine does not use is released without waiting)."""
        return SendDetach(self._next_corr(), lease_id, self.stream_id, self.client_id, self.role)

    def _attached(
        self, lease_id: int, expiry: int | None, layout: StreamLayout, now: int
    ) -> list[Action]:
        self._fire(LeaseEvent.GRANTED)
        self.lease_id = lease_id
        self.lease_expiry_ns = expiry
        # The driver extends the lease by the same duration on every keepalive (§4.4); the
        # client tracks that locally so the deadline moves with the keepalives it sends.
        self._lease_duration_ns = max(0, expiry - now) if expiry is not None else 0
        # Keep the lease alive whatever the driver granted: at least three keepalives per
        # lease duration, even if the configured interval is longer (§4.2 hard deadline).
        self._keepalive_ns = self.timings.keepalive_interval_ns
        if self._lease_duration_ns:
            self._keepalive_ns = max(
                1_000_000, min(self._keepalive_ns, self._lease_duration_ns // 3)
            )
        self.layout = layout
        self._backoff_ns = self.timings.backoff_initial_ns
        self._next_keepalive = now + self._keepalive_ns
        return [Attached(lease_id, layout, expiry)]

    def _begin_confirm(self, notice: str, now: int) -> list[Action]:
        """A notice says our lease is gone: ask the driver before believing it (#14 §2).

        The probe is an attach with our client id: the driver answers "already holds lease L"
        while our lease lives (§4.8), and grants a new lease if it does not.
        """
        if self.state is AttachPhase.CONFIRMING:
            return []  # a duplicate notice (§4.9: tolerated idempotently)
        self._count("notice_confirming")
        corr = self._next_corr()
        self._pending = corr
        self._notice = notice
        self._fire(LeaseEvent.NOTICE)
        self._deadline = now + self.timings.confirm_timeout_ns
        return [self._attach_request(corr)]

    def _on_probe_response(self, r: dp.ShmAttachResponseDecoder, now: int) -> list[Action]:
        notice = self._notice or "notice"
        code = r.code_raw
        if code != _OK:
            held = _HELD_LEASE.search(r.error_message)
            if held is not None and int(held.group(1)) == self.lease_id:
                # the driver still has our lease: the notice was not the driver's
                self._count("notice_not_confirmed")
                self._pending = None
                self._notice = None
                self._fire(LeaseEvent.NOTICE_DENIED)
                return [NoticeNotConfirmed(notice)]
            return self._confirmed(now)
        # OK: our lease was really gone and the probe got a new one; report the loss first
        self._count(f"notice_confirmed:{notice}")
        lost = LeaseLost(notice)
        self._fire(LeaseEvent.PROBE_GRANTED)
        self.lease_id = None
        self._notice = None
        return [lost, *self.on_attach_response(r, now)]

    def _confirmed(self, now: int) -> list[Action]:
        notice = self._notice or "notice"
        self._count(f"notice_confirmed:{notice}")
        self._notice = None
        self._to_backoff(now, LeaseEvent.LEASE_LOST)
        return [LeaseLost(notice)]

    def on_detach_response(self, r: dp.ShmDetachResponseDecoder, now: int) -> list[Action]:
        if self.state is AttachPhase.DETACHING and r.correlation_id == self._pending:
            self._pending = None
            self._fire(LeaseEvent.DETACH_DONE)
            self.lease_id = None
        return []

    def on_lease_revoked(self, r: dp.ShmLeaseRevokedDecoder, now: int) -> list[Action]:
        # Required enums are checked first: unknown reason/role values are rejected (§4.9).
        r.reason  # noqa: B018 - raises UnknownEnumValue
        role = int(r.role)
        if self.lease_id is not None and r.lease_id == self.lease_id:
            reason = f"revoked:{r.reason.name.lower()}"
            if self.holds_lease:
                self._count("lease_revoked")
                return self._begin_confirm(reason, now)  # #14 §2: the driver's word first
            if self.state is AttachPhase.DETACHING:  # we are leaving anyway
                self._count("lease_revoked")
                self._to_backoff(now, LeaseEvent.LEASE_LOST)
                return [LeaseLost(reason)]
            return []
        if (
            role == ROLE_PRODUCER
            and self.role == ROLE_CONSUMER
            and r.stream_id == self.stream_id
            and self.holds_lease
        ):
            return [ProducerRevoked(r.stream_id, int(r.timestamp_ns))]
        return []

    def on_driver_shutdown(self, now: int, timestamp_ns: int | None = None) -> list[Action]:
        """§4.13. A notice stamped before our attach request is a previous driver's, left in
        a lingering log (same host, same monotonic clock): it says nothing about our lease."""
        if timestamp_ns is not None and timestamp_ns < self._attach_sent_ns:
            self._count("stale_shutdown_notice")
            return []
        if self.holds_lease:
            self._count("driver_shutdown")
            return self._begin_confirm("driver_shutdown", now)  # #14 §2: the driver's word first
        if self.state is AttachPhase.ATTACHING:
            self._count("driver_shutdown")
            self._to_backoff(now, LeaseEvent.ATTACH_FAILED)
        elif self.state is AttachPhase.DETACHING:
            self._count("driver_shutdown")
            self._to_backoff(now, LeaseEvent.LEASE_LOST)
        return []

    def on_lease_doubted(self, reason: str, now: int) -> list[Action]:
        """The owner saw the driver move the stream on (an announce of a newer epoch while we
        hold a lease of an older one): a revoke we never read, or a forged announce. The
        driver's word decides, as for a notice (#14 §2): a grant replaces the lease, "already
        holds lease L" with our L keeps it."""
        if self.state is AttachPhase.ATTACHED:
            return self._begin_confirm(reason, now)
        return []

    def on_driver_silent(self, now: int) -> list[Action]:
        """§10: no announce from the driver for a freshness window means it died (a crash
        sends no notice); keepalives may still "succeed" into a log other processes read, so
        drop the lease and reattach rather than trust it."""
        if self.holds_lease:
            self._count("driver_silent")
            self._to_backoff(now, LeaseEvent.LEASE_LOST)
            return [LeaseLost("driver_silent")]
        return []

    def on_transport_reset(self, now: int) -> list[Action]:
        """#13.2: our Aeron client was re-created on a new media driver. Whatever the old one
        carried (our lease, a pending attach) may be gone with the driver that hosted it:
        drop the lease and attach again at once, with the backoff reset."""
        self._count("transport_reset")
        lost = [LeaseLost("media_driver_restarted")] if self.holds_lease else []
        if self.state is AttachPhase.ATTACHING:
            self._to_backoff(now, LeaseEvent.ATTACH_FAILED)
        elif lost:
            self._to_backoff(now, LeaseEvent.LEASE_LOST)
        elif self.state is not AttachPhase.BACKOFF:  # closed, detaching or not started
            return lost
        self._deadline = now
        self._backoff_ns = self.timings.backoff_initial_ns
        return lost

    def on_keepalive_failed(self, now: int) -> list[Action]:
        """§4.4: a keepalive that cannot be sent is fatal for the lease: reattach."""
        if self.holds_lease:
            self._count("keepalive_send_failed")
            self._to_backoff(now, LeaseEvent.LEASE_LOST)
            return [LeaseLost("keepalive_send_failed")]
        return []

    def tick(self, now: int) -> list[Action]:
        st = self.state
        if st is AttachPhase.CONFIRMING and now >= self._deadline:
            return self._confirmed(now)  # the driver did not answer: it is gone (#14 §2)
        if st is AttachPhase.ATTACHED or st is AttachPhase.CONFIRMING:
            assert self.lease_id is not None
            if self.lease_expiry_ns is not None and now >= self.lease_expiry_ns:
                # §4.2: a hard deadline; we stalled past it without a keepalive.
                self._count("lease_expired")
                self._to_backoff(now, LeaseEvent.LEASE_LOST)
                return [LeaseLost("lease_expired")]
            if now >= self._next_keepalive:
                self._next_keepalive = now + self._keepalive_ns
                if self.lease_expiry_ns is not None and self._lease_duration_ns:
                    # the driver extends the lease by its duration on each keepalive (§4.4)
                    self.lease_expiry_ns = now + self._lease_duration_ns
                return [
                    SendKeepalive(self.lease_id, self.stream_id, self.client_id, self.role, now)
                ]
        elif st is AttachPhase.ATTACHING and now >= self._deadline:
            self._count("attach_timeout")
            if self._pending is not None:
                self._abandoned.append(self._pending)
            self._to_backoff(now, LeaseEvent.ATTACH_FAILED)
            return [AttachFailed(None, "attach timed out")]
        elif st is AttachPhase.DETACHING and now >= self._deadline:
            self._fire(LeaseEvent.DETACH_DONE)
        elif st is AttachPhase.BACKOFF and now >= self._deadline:
            return self.attach(now)
        return []

    def _to_backoff(self, now: int, event: LeaseEvent) -> None:
        self._fire(event)
        self.lease_id = None
        self.lease_expiry_ns = None
        self.layout = None
        self._pending = None
        self._notice = None
        self._deadline = now + self._backoff_ns
        self._backoff_ns = min(self._backoff_ns * 2, self.timings.backoff_max_ns)


def _validate_ok_response(
    r: dp.ShmAttachResponseDecoder, stream_id: int
) -> tuple[int, int | None, StreamLayout]:
    """Driver Model §4.2: required fields non-null, 256-byte slots, schema maxDims, pools
    present with nslots equal to the header's, URIs non-blank and valid."""
    required = {
        "lease_id": r.lease_id,
        "stream_id": r.stream_id,
        "epoch": r.epoch,
        "layout_version": r.layout_version,
        "header_nslots": r.header_nslots,
        "header_slot_bytes": r.header_slot_bytes,
        "max_dims": r.max_dims,
    }
    missing = [k for k, v in required.items() if v is None]
    if missing:
        raise ValueError(f"null required fields {missing}")
    if r.stream_id != stream_id:
        raise ValueError(f"response for stream {r.stream_id}, asked for {stream_id}")
    if r.header_slot_bytes != 256:
        raise ValueError(f"headerSlotBytes {r.header_slot_bytes} != 256")
    if r.max_dims != MAX_DIMS_CONST:
        raise ValueError(f"maxDims {r.max_dims} != {MAX_DIMS_CONST}")
    header_uri = r.header_region_uri
    if not header_uri.strip():
        raise ValueError("empty headerRegionUri")
    parse_shm_uri(header_uri)
    pools: list[AnnouncedPool] = []
    for p in r.payload_pools:
        uri = p.region_uri
        if not uri.strip():
            raise ValueError(f"empty regionUri for pool {p.pool_id}")
        parse_shm_uri(uri)
        if p.pool_nslots != r.header_nslots:
            raise ValueError(f"pool {p.pool_id} nslots {p.pool_nslots} != {r.header_nslots}")
        pools.append(AnnouncedPool(p.pool_id, p.pool_nslots, p.stride_bytes, uri))
    if not pools:
        raise ValueError("empty payloadPools")
    layout = StreamLayout(
        stream_id=stream_id,
        producer_id=0,
        epoch=int(r.epoch),  # type: ignore[arg-type]
        layout_version=int(r.layout_version),  # type: ignore[arg-type]
        header_nslots=int(r.header_nslots),  # type: ignore[arg-type]
        header_slot_bytes=256,
        header_region_uri=header_uri,
        pools=tuple(pools),
        announce_timestamp_ns=0,
        clock_domain=1,
    )
    return int(r.lease_id), r.lease_expiry_timestamp_ns, layout  # type: ignore[arg-type]
