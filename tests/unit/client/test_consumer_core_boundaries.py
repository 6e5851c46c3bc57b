"""ConsumerCore edges the mutation check (#14.4, docs/compliance/mutation.md) found untested.

Each test pins one edge of a consumer rule that a surviving mutant moved (helpers and
constants from ``test_consumer_core.py``; the only fake is the clock).
"""

from __future__ import annotations

import pytest
from test_consumer_core import MS, SEC, STREAM, T0, _announce, _core, _feed, _mapped

from tensorpool.client.consumer_core import (
    MODE_RATE_LIMITED,
    MODE_STREAM,
    READ,
    RESYNC,
    SKIP,
    DriverSilent,
    MapEpoch,
    SendHello,
    SendQos,
    Unmap,
)
from tensorpool.client.lease import LeaseLost, ProducerRevoked
from tensorpool.counters import Reason


def test_s15_4_max_outstanding_seq_gap_of_1_is_valid_and_exactly_max_gap_behind_is_read() -> None:
    """§15.4: resync only when *more than* ``max_outstanding_seq_gap`` behind the head."""
    core = _mapped(max_outstanding_seq_gap=1)
    assert core.max_gap == 1
    core = _mapped(max_outstanding_seq_gap=4)
    _feed(core, 0)
    core.on_read_miss(1, 5, Reason.SEQ_MISMATCH)  # the producer is at seq 5
    assert _feed(core, 1) == READ  # exactly 4 behind: still read
    core = _mapped(max_outstanding_seq_gap=4)
    _feed(core, 0)
    core.on_read_miss(1, 7, Reason.SEQ_MISMATCH)  # the producer is at seq 7
    assert _feed(core, 3) == READ  # after a gap (the checked path): exactly 4 behind
    assert core.drops[RESYNC] == 0


def test_s11_stream_mode_ignores_max_rate_hz_and_1_hz_is_a_real_limit() -> None:
    """§11: only RATE_LIMITED mode drops frames on the local grid; 1 Hz is a valid rate."""
    stream = _mapped(mode=MODE_STREAM, max_rate_hz=10)
    assert [_feed(stream, s, now=T0 + s * MS) for s in range(4)] == [READ] * 4
    limited = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=1)
    assert _feed(limited, 0, now=T0) == READ
    assert _feed(limited, 1, now=T0 + 500 * MS) == SKIP
    assert _feed(limited, 2, now=T0 + SEC) == READ
    unlimited = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=0)  # 0: no local limit
    assert [_feed(unlimited, s, now=T0 + s) for s in range(3)] == [READ] * 3


def test_s11_a_frame_up_to_a_quarter_period_early_takes_its_slot() -> None:
    """§11 jitter tolerance: at 10 Hz (100 ms slots) a frame 24 ms early still counts."""
    core = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=10)
    assert _feed(core, 0, now=T0) == READ
    assert _feed(core, 1, now=T0 + 76 * MS) == READ


def test_s15_4_slot_in_progress_for_the_same_seq_is_late_not_forged() -> None:
    """A read miss whose slot holds the descriptor's own seq (being rewritten, or its commit
    not yet visible) is a late read: the seq stays seen and nothing is re-counted."""
    core = _mapped()
    _feed(core, 0)
    assert _feed(core, 1) == READ
    core.on_read_miss(1, 1, Reason.NOT_COMMITTED)
    assert core.last_seq == 1
    assert core.drops["seq_implausible"] == 0


def test_driver_4_9_revoke_while_unmapped_still_waits_for_the_bumped_epoch() -> None:
    """Driver Model §4.9: a ``ShmLeaseRevoked`` for the producer that arrives while the
    consumer holds no mapping (e.g. between a lease loss and the next announce) still makes the
    revoked epoch dead: its replayed announce is refused, the bumped one maps."""
    core = _mapped(epoch=5, driver_mode=True)
    assert core.on_lease_event(LeaseLost("expired")) == Unmap("expired")
    assert core.on_lease_event(LeaseLost("expired")) is None  # nothing left to unmap
    assert core.on_lease_event(ProducerRevoked(STREAM)) is None
    assert core.on_announce(_announce(5), None, T0) is None
    assert isinstance(core.on_announce(_announce(6), None, T0), MapEpoch)
    fresh = _core(driver_mode=True)  # a revoke read before any announce
    assert fresh.on_lease_event(ProducerRevoked(STREAM, T0)) is None


def test_14_2_forged_revoke_while_unmapped_is_contradicted_by_a_later_announce() -> None:
    """#14 §2 for an unmapped consumer: the revoke's stamp is kept, so an announce of the
    same epoch stamped after it proves the revoke forged and maps the epoch again."""
    core = _mapped(epoch=5, driver_mode=True)
    core.on_lease_event(LeaseLost("expired"))
    assert core.on_lease_event(ProducerRevoked(STREAM, T0 + 10)) is None
    assert isinstance(core.on_announce(_announce(5, ts=T0 + SEC), None, T0 + SEC), MapEpoch)


def test_s15_21_a_consumer_unmapped_by_its_agent_maps_the_same_epoch_again() -> None:
    """Only a revoke or a foreign writer (§15.14) makes an epoch dead: after the agent dropped
    the mapping on its own (close, truncation), the next announce of that epoch maps it."""
    core = _mapped(epoch=5)
    core.unmapped("truncated")
    assert not core.mapped
    assert isinstance(core.on_announce(_announce(5, ts=T0 + SEC), None, T0 + SEC), MapEpoch)


def test_s10_2_1_first_descriptor_the_ring_never_held_is_implausible() -> None:
    """#14 §2: the first descriptor after the join whose slot holds an older seq is counted as
    ``seq_implausible`` (not as a gap, not under another name)."""
    core = _mapped(head=10)
    assert _feed(core, 20, slot=12) == SKIP
    assert core.drops["seq_implausible"] == 1 and core.drops_gap == 0


def test_s10_1_2_hello_before_the_first_mapping_and_qos_of_an_unmapped_consumer() -> None:
    """§10.1.2/§10.4.1: a new consumer says hello at once; its QoS before any mapping reports
    epoch 0 and last seq 0 (the wire fields are unsigned), and remaps are counted."""
    core = _core()
    actions = list(core.tick(T0))
    assert SendHello(STREAM, 11, 1, 0) in actions
    qos = next(a for a in actions if isinstance(a, SendQos))
    assert (qos.epoch, qos.last_seq_seen) == (0, 0)
    core = _mapped()
    action = core.on_announce(_announce(2), None, T0)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, -1, T0)
    assert core.stats.remaps == 2
    assert core.layout is action.layout and core.mask == action.layout.header_nslots - 1


def test_s15_21_announce_timeout_and_a_pending_hello_in_one_tick() -> None:
    """The announce-timeout unmap is not lost when a hello is due in the same tick."""
    core = _mapped()  # hello not sent yet
    actions = list(core.tick(T0 + 3 * SEC + 1))
    assert Unmap("announce_timeout") in actions
    assert any(isinstance(a, SendHello) for a in actions)
    assert not any(isinstance(a, DriverSilent) for a in actions)  # standalone: no driver
    assert core.stats.control["announce_timeout"] == 1


@pytest.mark.parametrize("gap", [0, -1])
def test_max_outstanding_seq_gap_below_1_is_refused(gap: int) -> None:
    with pytest.raises(ValueError):
        _core(max_outstanding_seq_gap=gap)
