"""The driver's lease states as one table (issue #28 point 3; Driver Model §4.1, §4.7, §4.8)."""

from __future__ import annotations

import pytest

from tensorpool.driver.leases import (
    TRANSITIONS,
    IllegalLeaseTransition,
    Lease,
    LeaseState,
    LeaseTable,
)
from tensorpool.specs.generated.driver import Role

S = LeaseState
#: The life a lease has in driver/leases.py's docstring, written out independently of the code:
#: issued, kept alive, then one terminal state; only shutdown revokes a PENDING lease.
ALLOWED = {
    (S.PENDING, S.ATTACHED),
    (S.PENDING, S.REVOKED),
    (S.ATTACHED, S.ACTIVE),
    (S.ACTIVE, S.ACTIVE),
    *{(s, end) for s in (S.ATTACHED, S.ACTIVE) for end in (S.DETACHED, S.EXPIRED, S.REVOKED)},
}
TERMINAL = (S.DETACHED, S.EXPIRED, S.REVOKED)
PAIRS = [(a, b) for a in LeaseState for b in LeaseState]


def _lease(state: LeaseState) -> Lease:
    return Lease(7, 1, 42, Role.PRODUCER, 900, created_ns=0, state=state)


def test_28_3_the_lease_table_is_the_documented_life() -> None:
    """#28 point 3: the lease states and their moves are declared once, as documented."""
    assert {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts} == ALLOWED


@pytest.mark.parametrize(("state", "target"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_28_3_every_lease_move_follows_the_table_or_raises(
    state: LeaseState, target: LeaseState
) -> None:
    """#28 point 3: every (state, next state) pair of a lease: allowed ones move, the others
    raise and leave the lease as it was."""
    lease = _lease(state)
    if (state, target) in ALLOWED:
        lease.move_to(target)
        assert lease.state is target
    else:
        with pytest.raises(IllegalLeaseTransition, match=f"{state.value} -> {target.value}"):
            lease.move_to(target)
        assert lease.state is state


@pytest.mark.parametrize(("state", "target"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_28_3_lease_table_close_only_from_a_state_that_allows_it(
    state: LeaseState, target: LeaseState
) -> None:
    """#28 point 3: ``LeaseTable.close`` ends a lease only in a terminal state the table
    allows from where it stands (a closed lease is not closed again, a PENDING lease is not
    detached); a refused close changes nothing in the table."""
    table = LeaseTable(first_id=7)
    lease = _lease(state)
    table.add(lease)
    if target in TERMINAL and (state, target) in ALLOWED:
        table.close(lease, target, now_ns=5)
        assert lease.state is target and lease.closed_ns == 5
        assert table.live == {} and table.closed[7] is lease and table.for_client(42) is None
    else:
        with pytest.raises(IllegalLeaseTransition):
            table.close(lease, target, now_ns=5)
        assert lease.state is state and lease.closed_ns == 0
        assert table.live == {7: lease} and not table.closed and table.for_client(42) is lease
