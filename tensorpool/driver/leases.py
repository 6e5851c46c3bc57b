"""Lease bookkeeping (Driver Model §4.1, §4.7, §4.8).

A lease authorises one client for one stream in one role. Its life:

``PENDING`` (tensorpool-internal: accepted, waiting for the epoch's files) →
``ATTACHED`` (issued in an ``OK`` attach response) → ``ACTIVE`` (a keepalive arrived)
→ one terminal state: ``DETACHED`` (detach request), ``EXPIRED`` (keepalive
timeout) or ``REVOKED`` (driver decision: admin revoke, layout change, shutdown).
These moves are declared once, in :data:`TRANSITIONS`; :meth:`Lease.move_to` is the only way
a lease changes state, and a move the table does not allow raises
:class:`IllegalLeaseTransition` (issue #28 point 3): a closed lease is never closed again, and
only an issued lease can be detached or expire.

Lease ids come from one counter that never goes backwards, so an id is never
reused within a process (§4.8). Across restarts the agent seeds the counter with
:func:`lease_id_seed`, which starts above the wall clock in nanoseconds (and above
any persisted high-water mark): a restarted driver therefore never hands out an
id an old client may still hold, unless more than a billion leases per second
were issued.

Closed leases move to a bounded history so a repeated detach can be answered
idempotently and ``status`` can show recent endings.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tensorpool.specs.generated.driver import Role

__all__ = [
    "LEASE_ID_NULL",
    "TRANSITIONS",
    "IllegalLeaseTransition",
    "Lease",
    "LeaseState",
    "LeaseTable",
    "lease_id_seed",
]

#: ``lease_id_t`` nullValue in the attach response: never a valid lease id.
LEASE_ID_NULL = 0xFFFF_FFFF_FFFF_FFFF


class LeaseState(StrEnum):
    PENDING = "PENDING"
    ATTACHED = "ATTACHED"
    ACTIVE = "ACTIVE"
    DETACHED = "DETACHED"
    EXPIRED = "EXPIRED"
    REVOKED = "REVOKED"


LIVE_STATES = frozenset({LeaseState.PENDING, LeaseState.ATTACHED, LeaseState.ACTIVE})
ISSUED_STATES = frozenset({LeaseState.ATTACHED, LeaseState.ACTIVE})

_S = LeaseState
#: The one declaration of a lease's life: state -> the states it may move to. Terminal states
#: move nowhere. A keepalive moves ATTACHED to ACTIVE and keeps ACTIVE there; only the driver's
#: shutdown revokes a lease still PENDING (its client never learned the id).
TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    _S.PENDING: frozenset({_S.ATTACHED, _S.REVOKED}),
    _S.ATTACHED: frozenset({_S.ACTIVE, _S.DETACHED, _S.EXPIRED, _S.REVOKED}),
    _S.ACTIVE: frozenset({_S.ACTIVE, _S.DETACHED, _S.EXPIRED, _S.REVOKED}),
    _S.DETACHED: frozenset(),
    _S.EXPIRED: frozenset(),
    _S.REVOKED: frozenset(),
}


class IllegalLeaseTransition(RuntimeError):
    """A lease move :data:`TRANSITIONS` does not allow: a bug in the driver core."""


def lease_id_seed(realtime_ns: int, persisted_next: int = 0) -> int:
    """First lease id for a new driver process.

    ``realtime_ns`` is the wall clock (``time.time_ns()``), which keeps moving forward
    across restarts; ``persisted_next`` is an optional high-water mark the agent saved
    (``core.next_lease_id``). The larger wins.
    """
    seed = max(realtime_ns, persisted_next, 1)
    if seed >= LEASE_ID_NULL:
        raise ValueError(f"lease id seed {seed} reaches the null value")
    return seed


@dataclass(slots=True, eq=False)
class Lease:
    """Mutable record of one lease (internal to the core)."""

    lease_id: int
    stream_id: int
    client_id: int
    role: Role
    correlation_id: int
    created_ns: int
    epoch: int = 0
    state: LeaseState = LeaseState.PENDING
    issued_ns: int = 0
    expiry_ns: int = 0
    last_keepalive_ns: int = 0
    closed_ns: int = 0
    requested_stream_id: int = 0  # as asked; differs from stream_id for allocated dynamic ids
    response: Any = None  # the cached OK SendAttachResponse, replayed on a retry

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def move_to(self, state: LeaseState) -> None:
        """Change state along :data:`TRANSITIONS`, or raise."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalLeaseTransition(
                f"lease {self.lease_id}: {self.state.value} -> {state.value} is not allowed"
            )
        self.state = state

    @property
    def issued(self) -> bool:
        return self.state in ISSUED_STATES


class LeaseTable:
    """Live leases indexed for the lookups the protocol needs."""

    def __init__(self, first_id: int, history_limit: int = 4096) -> None:
        if not 0 <= first_id < LEASE_ID_NULL:
            raise ValueError(f"first lease id {first_id} out of range")
        self.next_id = first_id
        self.live: dict[int, Lease] = {}
        self.by_client: dict[int, int] = {}
        self.by_request: dict[tuple[int, int], int] = {}
        self.closed: OrderedDict[int, Lease] = OrderedDict()
        self._history_limit = history_limit

    def allocate_id(self) -> int:
        lease_id = self.next_id
        if lease_id >= LEASE_ID_NULL:
            raise OverflowError("lease id space exhausted")
        self.next_id = lease_id + 1
        return lease_id

    def add(self, lease: Lease) -> None:
        self.live[lease.lease_id] = lease
        self.by_client[lease.client_id] = lease.lease_id
        self.by_request[(lease.client_id, lease.correlation_id)] = lease.lease_id

    def close(self, lease: Lease, state: LeaseState, now_ns: int) -> None:
        """Move a live lease to a terminal state and into the bounded history (raises, and
        changes nothing, if the table does not allow that move)."""
        if TRANSITIONS[state]:
            raise IllegalLeaseTransition(f"lease {lease.lease_id}: {state.value} is not terminal")
        lease.move_to(state)
        lease.closed_ns = now_ns
        lease.response = None
        self.live.pop(lease.lease_id, None)
        if self.by_client.get(lease.client_id) == lease.lease_id:
            del self.by_client[lease.client_id]
        key = (lease.client_id, lease.correlation_id)
        if self.by_request.get(key) == lease.lease_id:
            del self.by_request[key]
        self.closed[lease.lease_id] = lease
        while len(self.closed) > self._history_limit:
            self.closed.popitem(last=False)

    def discard(self, lease: Lease) -> None:
        """Forget a lease that was never issued (its id stays burnt)."""
        self.live.pop(lease.lease_id, None)
        if self.by_client.get(lease.client_id) == lease.lease_id:
            del self.by_client[lease.client_id]
        key = (lease.client_id, lease.correlation_id)
        if self.by_request.get(key) == lease.lease_id:
            del self.by_request[key]

    def for_request(self, client_id: int, correlation_id: int) -> Lease | None:
        lease_id = self.by_request.get((client_id, correlation_id))
        return None if lease_id is None else self.live.get(lease_id)

    def for_client(self, client_id: int) -> Lease | None:
        lease_id = self.by_client.get(client_id)
        return None if lease_id is None else self.live.get(lease_id)

    def expired(self, now_ns: int) -> list[Lease]:
        """Issued leases whose deadline has passed, oldest deadline first."""
        due = [lease for lease in self.live.values() if lease.issued and lease.expiry_ns <= now_ns]
        due.sort(key=lambda lease: (lease.expiry_ns, lease.lease_id))
        return due

    def next_expiry_ns(self) -> int | None:
        deadlines = [lease.expiry_ns for lease in self.live.values() if lease.issued]
        return min(deadlines) if deadlines else None
