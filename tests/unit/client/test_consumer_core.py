"""ConsumerCore: one test per consumer rule (#14 section 1), sans-IO.

Inputs are real SBE messages (encoded, then decoded by the generated decoders) and plain
numbers for what the ring holds; the only fake is the clock (``now`` values). Each test names
the spec section or the #14 point it pins.
"""

from __future__ import annotations

import pytest

from tensorpool.client.announce import CLOCK_MONOTONIC, CLOCK_REALTIME_SYNCED, StreamLayout
from tensorpool.client.consumer_core import (
    BEFORE_JOIN,
    CHECK,
    EPOCH_MISMATCH,
    MODE_RATE_LIMITED,
    NOT_MAPPED,
    RATE_LIMITED,
    READ,
    REMAP,
    RESYNC,
    REVOKED,
    SEQ_IMPLAUSIBLE,
    SEQ_REGRESSION,
    SEQ_STALE,
    SKIP,
    SUPERBLOCK_MAGIC_CHANGED,
    SUPERBLOCK_PID_CHANGED,
    CheckMapping,
    ConsumerCore,
    DriverSilent,
    MapEpoch,
    SendHello,
    SendQos,
    Unmap,
)
from tensorpool.client.lease import (
    ROLE_CONSUMER,
    ROLE_PRODUCER,
    Attached,
    AttachPhase,
    LeaseLost,
    LeaseMachine,
    LeaseTimings,
    ProducerRevoked,
    SendAttach,
)
from tensorpool.client.rate_gate import RateGate
from tensorpool.counters import Reason
from tensorpool.specs import CodecError
from tensorpool.specs.generated import driver as dp
from tensorpool.specs.generated import wire

SEC = 1_000_000_000
MS = 1_000_000
STREAM = 7
NSLOTS = 64
T0 = 100 * SEC


def _announce(
    epoch: int = 1,
    *,
    ts: int = T0,
    clock: int = CLOCK_MONOTONIC,
    stream: int = STREAM,
    path: str = "/dev/shm/tp/x",
) -> wire.ShmPoolAnnounceDecoder:
    buf = bytearray(4096)
    wire.ShmPoolAnnounceEncoder.encode(
        buf,
        0,
        stream_id=stream,
        producer_id=1,
        epoch=epoch,
        announce_timestamp_ns=ts,
        announce_clock_domain=clock,
        layout_version=1,
        header_nslots=NSLOTS,
        header_slot_bytes=256,
        payload_pools=[(1, NSLOTS, 4096, f"shm:file?path={path}/payload-1.pool")],
        header_region_uri=f"shm:file?path={path}/header.ring",
    )
    return wire.ShmPoolAnnounceDecoder().wrap(buf)


def _core(**kw: object) -> ConsumerCore:
    args: dict[str, object] = dict(
        freshness_ns=3 * SEC,
        qos_period_ns=SEC,
        realtime_clock=lambda: T0,  # the fake clock
    )
    args.update(kw)
    return ConsumerCore(STREAM, 11, **args)  # type: ignore[arg-type]


def _mapped(epoch: int = 1, head: int = -1, **kw: object) -> ConsumerCore:
    core = _core(**kw)
    action = core.on_announce(_announce(epoch), None, T0)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, head, T0)
    return core


def _feed(core: ConsumerCore, seq: int, *, slot: int | None = None, now: int = T0) -> int:
    """One descriptor of the mapped epoch; a CHECK is answered from a ring whose slot of
    ``seq`` holds ``slot`` (default: ``seq``, an honest ring) and whose slot of the last seen
    frame still holds it."""
    v = core.on_descriptor(STREAM, core.epoch, seq, now)
    if v == CHECK:
        v = core.on_slot_check(seq, seq if slot is None else slot, core.last_seq, now)
    return v


# --- announces (§10.1.1, §15.1, §15.14, §15.21) --------------------------------------------------
def test_s10_1_1_fresh_announce_maps_only_once_the_regions_are_proven() -> None:
    core = _core()
    action = core.on_announce(_announce(3), None, T0)
    assert isinstance(action, MapEpoch) and action.layout.epoch == 3
    assert not core.mapped  # nothing is mapped until the agent reports success
    core.on_mapped(action.layout, -1, T0)
    assert core.mapped and core.epoch == 3 and core.stats.remaps == 1


def test_14_2_bogus_higher_epoch_announce_keeps_the_current_mapping() -> None:
    """#14 §2: a higher-epoch announce whose regions fail validation costs no frame: the
    current mapping serves descriptors before, during and after the failed attempt."""
    core = _mapped(epoch=1)
    assert _feed(core, 0) == READ
    action = core.on_announce(_announce(9, path="/nonexistent"), None, T0)
    assert isinstance(action, MapEpoch) and action.layout.epoch == 9
    assert _feed(core, 1) == READ  # the agent maps the new epoch beside the old one
    core.on_map_failed("path_not_found")
    assert core.mapped and core.epoch == 1
    assert _feed(core, 2) == READ
    assert core.stats.control["path_not_found"] == 1
    # the real producer's announces still refresh the mapping
    assert isinstance(core.on_announce(_announce(1), None, T0), CheckMapping)


def test_s15_1_every_announce_of_the_mapped_epoch_revalidates_the_mapping() -> None:
    """§15.1: magic and epoch are checked on every announce (the agent does it on
    CheckMapping); a changed magic means the file was recreated: unmap, remap on the next."""
    core = _mapped(epoch=1)
    action = core.on_announce(_announce(1), None, T0)
    assert action == CheckMapping(1)
    assert core.on_mapping_checked(None) is None and core.mapped
    assert core.on_mapping_checked(SUPERBLOCK_MAGIC_CHANGED) == Unmap(SUPERBLOCK_MAGIC_CHANGED)
    assert not core.mapped and core.stats.control[SUPERBLOCK_MAGIC_CHANGED] == 1
    assert isinstance(core.on_announce(_announce(1), None, T0), MapEpoch)


def test_s15_14_pid_change_unmaps_and_waits_for_a_new_epoch() -> None:
    """§15.14: "if pid changes ... consumers MUST unmap and wait for a new epoch"."""
    core = _mapped(epoch=4)
    assert core.on_mapping_checked(SUPERBLOCK_PID_CHANGED) == Unmap(SUPERBLOCK_PID_CHANGED)
    assert core.on_announce(_announce(4), None, T0) is None  # the same epoch: not again
    assert core.stats.control["announce_old_epoch"] == 1
    assert isinstance(core.on_announce(_announce(5), None, T0), MapEpoch)


def test_s10_1_1_realtime_synced_announce_never_gets_the_join_time_rule() -> None:
    """§10.1.1: REALTIME_SYNCED "MUST NOT apply the join-time drop rule": an announce whose
    timestamp is below the (monotonic) join time still maps when it is fresh in realtime."""
    core = _core(realtime_clock=lambda: T0)
    ann = _announce(1, ts=T0 - SEC, clock=CLOCK_REALTIME_SYNCED)
    assert isinstance(core.on_announce(ann, T0 + 50 * SEC, T0 + 50 * SEC), MapEpoch)
    # the MONOTONIC twin of the same numbers is a replay and is dropped
    mono = _announce(1, ts=T0 + 49 * SEC, clock=CLOCK_MONOTONIC)
    assert core.on_announce(mono, T0 + 50 * SEC, T0 + 50 * SEC) is None
    assert core.stats.control["announce_before_join"] == 1


def test_driver_mode_announce_without_lease_is_ignored() -> None:
    core = _core(driver_mode=True)
    assert core.on_announce(_announce(1), None, T0, lease_held=False) is None
    assert core.stats.control["announce_without_lease"] == 1


# --- descriptors (§10.2.1, §15.2, §15.4) ---------------------------------------------------------
def test_s10_2_1_descriptor_of_another_epoch_is_dropped() -> None:
    """§10.2.1 "Consumers MUST ignore descriptors whose epoch does not match mapped SHM
    regions": a stale-epoch descriptor (in flight across a remap) is never read."""
    core = _mapped(epoch=2)
    assert core.on_descriptor(STREAM, 1, 0, T0) == SKIP
    assert core.on_descriptor(STREAM, 3, 0, T0) == SKIP
    assert core.drops[EPOCH_MISMATCH] == 2
    assert _feed(core, 0) == READ


def test_descriptor_of_another_stream_is_ignored_and_unmapped_ones_counted() -> None:
    core = _core()
    assert core.on_descriptor(STREAM, 1, 0, T0) == SKIP
    assert core.drops[NOT_MAPPED] == 1
    core = _mapped()
    assert core.on_descriptor(STREAM + 1, 1, 0, T0) == SKIP
    assert core.drops.snapshot() == {}


def test_14_2_join_counts_only_frames_after_the_join() -> None:
    """#14 §2: descriptors queued before the mapping (the ring's head was 1000 at join) are
    not gaps: counting starts at the head."""
    core = _mapped(head=1000)
    for seq in range(10, 1000):
        assert _feed(core, seq, slot=seq + NSLOTS * 20) == SKIP  # long overwritten
    assert core.drops[BEFORE_JOIN] == 990
    assert _feed(core, 1000) == READ
    assert _feed(core, 1001) == READ
    assert core.drops_gap == 0 and core.drops_late == 0


def test_14_2_seq_beyond_anything_the_ring_held_is_dropped_without_a_gap() -> None:
    """#14 §2: a forged seq 2**62 (the ring's slot holds an older seq) is implausible: no
    gap of 4.6e18 is counted and the stream goes on."""
    core = _mapped()
    assert _feed(core, 0) == READ
    assert _feed(core, 2**62, slot=0) == SKIP
    assert core.drops[SEQ_IMPLAUSIBLE] == 1 and core.drops_gap == 0
    assert _feed(core, 1) == READ and core.drops_gap == 0
    # a plausible gap still counts (§15.4)
    assert _feed(core, 5) == READ and core.drops_gap == 3


def test_14_2_forged_seq_zero_is_stale_not_a_remap() -> None:
    """#14 §2 / §15.2: a lower seq while the ring still holds our last frame is a stale or
    forged descriptor: dropped, no remap."""
    core = _mapped()
    for seq in range(100, 103):
        assert _feed(core, seq) == READ
    v = core.on_descriptor(STREAM, 1, 0, T0)
    assert v == CHECK
    assert core.on_slot_check(0, 64, 102, T0) == SKIP  # slot of 102 still holds 102
    assert core.mapped and core.drops[SEQ_STALE] == 1
    assert _feed(core, 102) == SKIP  # a duplicate, the same rule
    assert _feed(core, 103) == READ


def test_s15_2_regression_the_ring_confirms_forces_a_remap() -> None:
    """§15.2: when the slot of the last frame seen now holds an older seq, the stream was
    recreated under us: remap."""
    core = _mapped()
    for seq in range(100, 103):
        _feed(core, seq)
    assert core.on_descriptor(STREAM, 1, 0, T0) == CHECK
    assert core.on_slot_check(0, 0, 38, T0) == REMAP  # slot of 102 went back to 38
    assert not core.mapped and core.drops[SEQ_REGRESSION] == 1


def test_14_2_forged_next_seq_does_not_hide_the_real_frame() -> None:
    """A forged ``last + 1`` passes the cheap path; when its slot read finds an older seq it
    is reclassified (not late) and forgotten, so the real descriptor is read."""
    core = _mapped()
    _feed(core, 10)
    assert core.on_descriptor(STREAM, 1, 11, T0) == READ
    core.drops.increment(Reason.SEQ_MISMATCH)  # what the slot reader counted
    core.on_read_miss(11, 11 - NSLOTS, Reason.SEQ_MISMATCH)
    assert core.drops_late == 0 and core.drops[SEQ_IMPLAUSIBLE] == 1
    assert core.on_descriptor(STREAM, 1, 11, T0) == READ
    # a slot already ahead is an overrun: it stays late and teaches the head (§15.4)
    core.on_read_miss(11, 11 + 5 * NSLOTS, Reason.SEQ_MISMATCH)
    assert core.head_seq == 11 + 5 * NSLOTS


def test_s15_4_max_outstanding_seq_gap_resyncs_by_skipping() -> None:
    core = _mapped(max_outstanding_seq_gap=4)
    _feed(core, 0)
    core.on_read_miss(1, 100, Reason.SEQ_MISMATCH)  # the slot of seq 1 holds seq 100
    assert _feed(core, 1) == SKIP
    assert _feed(core, 95) == SKIP
    assert _feed(core, 96) == READ  # within 4 of the head again
    assert core.resyncs == 2 and core.drops[RESYNC] == 2
    assert core.drops_gap == 93 + 2  # 2..94 never seen, plus the two skipped


def test_s15_4_max_gap_is_bounded_by_the_ring() -> None:
    core = _mapped(max_outstanding_seq_gap=10_000)
    assert core.max_gap == NSLOTS - 1
    with pytest.raises(ValueError):
        _core(max_outstanding_seq_gap=0)


def test_s11_rate_limited_mode_uses_the_rate_gate_grid() -> None:
    """§11: RATE_LIMITED drops frames above max_rate_hz locally, on the RateGate grid; a frame
    up to a quarter period early still takes its slot (jitter)."""
    core = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=10)
    assert isinstance(core._gate, RateGate)  # one grid, shared with the rate limiter
    t = T0
    assert _feed(core, 0, now=t) == READ
    assert _feed(core, 1, now=t + 50 * MS) == SKIP
    assert _feed(core, 2, now=t + 90 * MS) == READ  # 10 ms early: inside the tolerance
    assert _feed(core, 3, now=t + 120 * MS) == SKIP
    assert _feed(core, 4, now=t + 200 * MS) == READ
    assert core.drops[RATE_LIMITED] == 2
    # a remap resets the grid: the first frame of the new epoch passes at once
    action = core.on_announce(_announce(2, ts=t + 200 * MS), None, t + 200 * MS)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, -1, t + 210 * MS)
    assert _feed(core, 0, now=t + 210 * MS) == READ


# --- lease (Driver Model §2.3, §4.9) -------------------------------------------------------------
def _layout(epoch: int) -> StreamLayout:
    return StreamLayout.from_announce(_announce(epoch))


def test_driver_lease_attached_maps_and_lost_unmaps() -> None:
    core = _core(driver_mode=True)
    action = core.on_lease_event(Attached(1, _layout(3), None))
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, -1, T0)
    assert core.on_lease_event(LeaseLost("expired")) == Unmap("expired")
    assert core.stats.control["lease_lost"] == 1 and not core.mapped


def test_driver_4_9_after_producer_revoke_waits_for_the_epoch_bumped_announce() -> None:
    """Driver Model §4.9: the revoked producer's epoch is dead; the consumer unmaps and maps
    again only on the announce of the bumped epoch, never on a (replayed) old one."""
    core = _mapped(epoch=5, driver_mode=True)
    assert core.on_lease_event(ProducerRevoked(STREAM)) == Unmap("producer_revoked")
    assert core.on_announce(_announce(5), None, T0) is None
    assert core.stats.control["announce_old_epoch"] == 1
    assert isinstance(core.on_announce(_announce(6), None, T0), MapEpoch)


def test_driver_4_9_revoke_read_after_the_bumped_epoch_was_mapped_keeps_the_new_mapping() -> None:
    """Driver Model §4.9 with two subscriptions: the revoke of the old producer can be read
    after the announce of the bumped epoch was already mapped. A revoke stamped before that
    announce concerns the old epoch and must not unmap the new one (it would then wait for
    an epoch that never comes); one stamped after it still unmaps."""
    core = _core(driver_mode=True)
    action = core.on_announce(_announce(3, ts=T0 + 200), None, T0 + 200)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, -1, T0 + 200)
    assert core.on_lease_event(ProducerRevoked(STREAM, T0 + 150)) is None
    assert core.mapped and core.epoch == 3
    assert core.stats.control["producer_revoked_older_epoch"] == 1
    # the driver stamps the revoke before it creates (and announces) the bumped epoch, so a
    # stamp equal to the announce's is the older epoch's too
    assert core.on_lease_event(ProducerRevoked(STREAM, T0 + 200)) is None
    assert core.on_lease_event(ProducerRevoked(STREAM, T0 + 300)) == Unmap("producer_revoked")


def test_14_2_forged_producer_revoke_is_contradicted_by_the_next_announce_of_the_epoch() -> None:
    """#14 §2, Driver §4.9: a real producer revoke moves the stream to a new epoch at once, so
    the driver never announces the revoked epoch afterwards. An announce of the same epoch
    stamped after the revoke proves it forged: the consumer maps the epoch again instead of
    waiting forever for an epoch that never comes. An announce stamped before the revoke
    (queued on the other subscription) does not."""
    core = _core(driver_mode=True)
    action = core.on_announce(_announce(5, ts=T0), None, T0)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, -1, T0)
    assert core.on_lease_event(ProducerRevoked(STREAM, T0 + 10)) == Unmap("producer_revoked")
    assert core.on_announce(_announce(5, ts=T0 + 5), None, T0 + 20) is None
    assert core.stats.control["announce_old_epoch"] == 1
    again = core.on_announce(_announce(5, ts=T0 + SEC), None, T0 + SEC)
    assert isinstance(again, MapEpoch) and again.layout.epoch == 5
    assert core.stats.control["producer_revoke_contradicted"] == 1


def test_28_4_frames_lost_to_a_forged_revoke_are_revoked_gaps_not_before_join() -> None:
    """#28 point 4: a forged producer revoke unmaps until the next announce of the epoch
    contradicts it; the frames committed meanwhile (their descriptors queued below the new join
    head) were lost to the revoke: ``revoked`` drops counted in ``drops_gap`` and the QoS gap,
    not ``before_join``. Frames before the first join stay ``before_join``."""
    core = _core(driver_mode=True)
    action = core.on_announce(_announce(5, ts=T0), None, T0)
    assert isinstance(action, MapEpoch)
    core.on_mapped(action.layout, 3, T0)  # joined at head 3
    for seq in range(3):
        assert _feed(core, seq) == SKIP
    for seq in range(3, 10):
        assert _feed(core, seq) == READ
    assert core.on_lease_event(ProducerRevoked(STREAM, T0 + 10)) == Unmap("producer_revoked")
    again = core.on_announce(_announce(5, ts=T0 + SEC), None, T0 + SEC)
    assert isinstance(again, MapEpoch)
    core.on_mapped(again.layout, 76, T0 + SEC)  # the producer got to 76 meanwhile
    for seq in range(10, 76):  # the queued descriptors of the frames nobody read
        assert _feed(core, seq, slot=seq + NSLOTS) == SKIP
    assert _feed(core, 76) == READ and _feed(core, 77) == READ
    assert core.drops[REVOKED] == 66 and core.drops_gap == 66
    assert core.drops[BEFORE_JOIN] == 3  # only the frames before the first join
    (qos,) = [a for a in core.tick(T0 + 2 * SEC) if isinstance(a, SendQos)]
    assert qos.drops_gap == 66 and qos.last_seq_seen == 77
    # the window closed with the first frame of the new mapping: a later join is a join
    core.unmapped("close")
    core.on_mapped(again.layout, 200, T0 + 2 * SEC)
    assert _feed(core, 150, slot=150 + NSLOTS) == SKIP
    assert core.drops[BEFORE_JOIN] == 4 and core.drops[REVOKED] == 66


def test_28_4_frames_of_the_revoked_epoch_after_a_real_revoke_are_revoked_gaps() -> None:
    """#28 point 4: after a real revoke the consumer maps the bumped epoch; the old epoch's
    frames it never read (descriptors still queued) are ``revoked`` gaps, each seq once (a
    replayed descriptor is an ordinary ``epoch_mismatch``), until the new epoch's first frame."""
    core = _mapped(epoch=5, driver_mode=True)
    for seq in range(4):
        assert _feed(core, seq) == READ
    assert core.on_lease_event(ProducerRevoked(STREAM)) == Unmap("producer_revoked")
    bumped = core.on_announce(_announce(6), None, T0)
    assert isinstance(bumped, MapEpoch)
    core.on_mapped(bumped.layout, -1, T0)
    for seq in (4, 5, 6, 6):
        assert core.on_descriptor(STREAM, 5, seq, T0) == SKIP
    assert core.drops[REVOKED] == 3 and core.drops_gap == 3
    assert core.drops[EPOCH_MISMATCH] == 1
    assert _feed(core, 0) == READ
    assert core.on_descriptor(STREAM, 5, 7, T0) == SKIP  # after the new epoch's first frame
    assert core.drops[EPOCH_MISMATCH] == 2 and core.drops_gap == 3


def test_14_2_producer_revoke_stamped_in_the_future_is_ignored() -> None:
    """#14 §2: a revoke stamped beyond the driver's clock (newest announce + the freshness
    window) cannot come from the driver: ignored and counted, the mapping stays."""
    core = _mapped(epoch=5, driver_mode=True)
    assert core.on_lease_event(ProducerRevoked(STREAM, 2**62)) is None
    assert core.mapped
    assert core.stats.control["producer_revoke_implausible"] == 1


def _revoked(lease_id: int, role: int, reason: int) -> dp.ShmLeaseRevokedDecoder:
    """A ShmLeaseRevoked as it arrives on the wire. The encoder refuses unknown enum values,
    so a valid message is encoded and the raw role/reason bytes are patched afterwards (what
    a newer or hostile sender could put there)."""
    buf = bytearray(256)
    dp.ShmLeaseRevokedEncoder.encode(
        buf,
        0,
        timestamp_ns=1,
        lease_id=lease_id,
        stream_id=STREAM,
        client_id=9,
        role=ROLE_CONSUMER,
        reason=2,
        error_message="",
    )
    body = dp.MESSAGE_HEADER_LENGTH
    buf[body + dp.ShmLeaseRevokedDecoder.ROLE_OFFSET] = role
    buf[body + dp.ShmLeaseRevokedDecoder.REASON_OFFSET] = reason
    return dp.ShmLeaseRevokedDecoder().wrap(buf)


def _attached_consumer() -> LeaseMachine:
    m = LeaseMachine(STREAM, ROLE_CONSUMER, client_id=42, timings=LeaseTimings())
    (req,) = m.attach(0)
    assert isinstance(req, SendAttach)
    buf = bytearray(4096)
    dp.ShmAttachResponseEncoder.encode(
        buf,
        0,
        correlation_id=req.correlation_id,
        code=dp.ResponseCode.OK,
        lease_id=77,
        lease_expiry_timestamp_ns=None,
        stream_id=STREAM,
        epoch=3,
        layout_version=1,
        header_nslots=8,
        header_slot_bytes=256,
        max_dims=8,
        payload_pools=[(1, 8, 4096, "shm:file?path=/dev/shm/x/payload-1.pool")],
        header_region_uri="shm:file?path=/dev/shm/x/header.ring",
    )
    (ev,) = m.on_attach_response(dp.ShmAttachResponseDecoder().wrap(buf), 0)
    assert isinstance(ev, Attached)
    return m


def test_driver_4_9_producer_revoke_with_unknown_reason_is_rejected() -> None:
    """§4.9 required enums: a ShmLeaseRevoked for the stream's producer whose reason is not a
    known value is rejected -- the consumer keeps its mapping (no ProducerRevoked)."""
    m = _attached_consumer()
    with pytest.raises(CodecError):
        m.on_lease_revoked(_revoked(12, ROLE_PRODUCER, reason=99), 0)
    assert m.on_lease_revoked(_revoked(12, ROLE_PRODUCER, reason=2), 0) == [
        ProducerRevoked(STREAM, 1)
    ]


def test_driver_4_9_revoke_of_our_lease_with_unknown_role_is_rejected() -> None:
    """§4.9 required enums: a revoke naming our lease but an unknown role is rejected; the
    lease is untouched."""
    m = _attached_consumer()
    with pytest.raises(CodecError):
        m.on_lease_revoked(_revoked(77, 99, reason=2), 0)
    assert m.state is AttachPhase.ATTACHED


# --- cadence -------------------------------------------------------------------------------------
def test_hello_after_each_mapping_until_sent_and_qos_every_period() -> None:
    core = _mapped()
    actions = core.tick(T0)
    assert SendHello(STREAM, 11, 1, 0) in actions
    assert any(isinstance(a, SendQos) for a in actions)
    assert list(core.tick(T0 + 1)) == [SendHello(STREAM, 11, 1, 0)]  # offer failed: again
    core.hello_sent()
    assert list(core.tick(T0 + 2)) == []
    _feed(core, 0)
    _feed(core, 4)
    (qos,) = core.tick(T0 + SEC)
    assert qos == SendQos(STREAM, 11, 1, 4, 3, 0, 1)


def test_s15_21_announce_silence_unmaps_and_tells_the_driver_client() -> None:
    core = _mapped(driver_mode=True)
    core.hello_sent()
    actions = core.tick(T0 + 3 * SEC + 1)
    assert actions[0] == Unmap("announce_timeout") and DriverSilent() in actions
    assert not core.mapped


def test_s10_3_2_older_meta_version_is_ignored() -> None:
    core = _core()
    assert core.accept_meta_version(3)
    assert core.accept_meta_version(3)
    assert not core.accept_meta_version(2)
    assert core.meta_version == 3


# --- the batch path (#15): a consecutive run accepted in one call -------------------------------
def test_15_accept_run_takes_a_consecutive_run_like_per_descriptor_reads() -> None:
    core = _mapped()
    _feed(core, 0)
    assert core.accept_run(1, 10) == 0
    assert (core.last_seq, core.head_seq, core.drops_gap) == (10, 10, 0)
    assert _feed(core, 11) == READ  # the per-descriptor path continues from the run


def test_15_s15_4_accept_run_resyncs_the_same_frames_as_one_by_one() -> None:
    """Frames more than max_gap behind the known head are resync drops, per frame."""
    runs, singles = _mapped(max_outstanding_seq_gap=4), _mapped(max_outstanding_seq_gap=4)
    for core in (runs, singles):
        _feed(core, 0)
        core.on_read_miss(1, 100, Reason.SEQ_MISMATCH)  # the slot of seq 1 holds seq 100
    assert runs.accept_run(1, 99) == 95  # 1..95 skipped, 96..99 read
    verdicts = [_feed(singles, seq) for seq in range(1, 100)]
    assert verdicts == [SKIP] * 95 + [READ] * 4
    for core in (runs, singles):
        assert (core.last_seq, core.head_seq, core.resyncs) == (99, 100, 95)
    assert runs.drops.snapshot() == singles.drops.snapshot()
    assert runs.drops_gap == singles.drops_gap == 95


def test_15_s15_4_accept_run_skips_what_the_producer_laps_before_the_batch_is_done() -> None:
    """While a batch consumer is being lapped (its last batch lost rows), the frames the
    producer will overwrite before the batch is used and confirmed are resync drops: it is
    assumed to move as far as since the last batch."""
    core = _mapped()
    _feed(core, 0)
    # first sight of the ring's head (72): only what is overwritten already (> 63 behind)
    assert core.accept_run(1, 16, ring_head=NSLOTS + 8) == 8
    core.note_batch(lost=True)
    # the producer moved 30 since: frames within 30 of being lapped (older than 102 - 33) go
    assert core.accept_run(17, 64, ring_head=102) == 69 - 17
    assert (core.last_seq, core.head_seq) == (80, 102)
    assert core.resyncs == core.drops_gap == 8 + 69 - 17
    # however fast it runs (48 since), the newest quarter of the ring is read: 134..144
    assert core.accept_run(81, 64, ring_head=150) == 150 - NSLOTS // 4 - 81


def test_15_s15_4_a_burst_that_ended_loses_nothing_the_ring_still_holds() -> None:
    """A producer that wrote a whole ring and stopped: however far it moved since the last
    batch, no batch lost rows, so only what is overwritten already is skipped."""
    core = _mapped()
    _feed(core, 0)
    assert core.accept_run(1, 8, ring_head=40) == 0
    assert core.accept_run(9, 64, ring_head=40 + 60) == 100 - 63 - 9  # 9..36 overwritten
    core.note_batch(lost=False)
    assert core.accept_run(73, 64, ring_head=100 + 60) == 160 - 63 - 73  # still only those
    # lapped once, then the producer slows to less than a quarter ring per batch: exact again
    lapped = _mapped()
    _feed(lapped, 0)
    assert lapped.accept_run(1, 8, ring_head=40) == 0
    lapped.note_batch(lost=True)
    assert lapped.accept_run(9, 8, ring_head=40 + NSLOTS // 4 - 1) == 0
    assert lapped.accept_run(17, 8, ring_head=80) == 0  # no longer lapping: none overwritten
    assert lapped.accept_run(25, 8, ring_head=-1) == 0  # no head: max_gap alone


@pytest.mark.parametrize(("first", "why"), [(0, "repeats the last seq"), (3, "leaves a gap")])
def test_15_accept_run_refuses_what_needs_a_per_descriptor_decision(first: int, why: str) -> None:
    core = _mapped()
    _feed(core, 0)
    _feed(core, 1)
    before = (core.last_seq, core.head_seq, core.drops_gap, core.drops.snapshot())
    assert core.accept_run(first, 4) == -1, why
    assert (core.last_seq, core.head_seq, core.drops_gap, core.drops.snapshot()) == before


def test_15_accept_run_refuses_unmapped_and_rate_limited_consumers() -> None:
    core = _core()
    assert core.accept_run(0, 4) == -1
    core = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=10)
    _feed(core, 0)
    assert core.accept_run(1, 4) == -1  # the rate grid decides frame by frame


# --- per-consumer descriptor streams (#29.1, §10.1.3, §11) ---------------------------------------
def test_s10_1_3_on_own_stream_skipped_seqs_are_rate_limited_not_gaps() -> None:
    """On its own stream the producer sends only the frames our rate admits: the seqs between
    are counted as ``rate_limited``, never as ``drops_gap`` (no loss); on the shared stream the
    same jump is a gap."""
    own = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=10)
    own.on_consumer_config(True)
    shared = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=10)
    for core in (own, shared):
        assert _feed(core, 0) == READ
        assert _feed(core, 100, now=T0 + 100 * MS) == READ
    assert own.stats.drops_gap == 0 and own.drops[RATE_LIMITED] == 99
    assert shared.stats.drops_gap == 99


def test_s10_1_3_on_own_stream_the_local_rate_grid_is_off() -> None:
    """The producer's grid already admitted each frame; a second, local grid anchored on
    arrival would drop admitted frames that arrive early by jitter. Declined: it is back."""
    core = _mapped(mode=MODE_RATE_LIMITED, max_rate_hz=10)
    core.on_consumer_config(True)
    assert [_feed(core, s, now=T0 + s * MS) for s in range(3)] == [READ, READ, READ]
    core.on_consumer_config(False)
    assert _feed(core, 3, now=T0 + 3 * MS) == READ  # the grid restarts at the next frame
    assert _feed(core, 4, now=T0 + 4 * MS) == SKIP
