"""ProducerCore and AttachWait: one test per rule (#14.1; Wire §10, §15; Driver Model §4)."""

from __future__ import annotations

from tensorpool.client.announce import AnnouncedPool, StreamLayout
from tensorpool.client.lease import Attached, AttachFailed, LeaseLost
from tensorpool.client.producer_core import (
    AttachWait,
    ConfirmLease,
    MapLease,
    OpenEpoch,
    ProducerCore,
    PublishAnnounce,
    PublishMetadata,
    PublishQos,
    ReportDriverSilent,
    RetryStreamLock,
    SendConsumerConfig,
    Unmap,
)
from tensorpool.specs.generated import driver as dp
from tensorpool.specs.generated import wire

MS = 1_000_000
PERIOD = 1000 * MS


def _core(*, driver: bool = False, lock_pending: bool = False) -> ProducerCore:
    core = ProducerCore(
        5,
        driver_mode=driver,
        announce_period_ns=PERIOD,
        qos_period_ns=PERIOD,
        freshness_ns=3 * PERIOD,
        lock_pending=lock_pending,
    )
    if not driver:
        core.on_epoch_opened(0)
    return core


def _layout() -> StreamLayout:
    return StreamLayout(
        5, 0, 3, 1, 8, 256, "shm:file?path=/x/h", (AnnouncedPool(1, 8, 4096, "u"),), 0, 1
    )


def test_14_1_standalone_announces_with_metadata_each_period_and_qos() -> None:
    """Wire §10.1: announce + metadata every announce period, QoS every QoS period."""
    core = _core()
    assert core.tick(0) == [PublishAnnounce(0), PublishMetadata(0), PublishQos(0)]
    assert core.tick(PERIOD - 1) == []
    assert core.tick(PERIOD) == [
        PublishAnnounce(PERIOD),
        PublishMetadata(PERIOD),
        PublishQos(PERIOD),
    ]


def test_14_1_hello_gets_a_declining_config_and_an_announce_now() -> None:
    """§10.1.3: a ConsumerHello is answered by a ConsumerConfig and an immediate announce."""
    core = _core()
    core.tick(0)
    core.on_consumer_hello(5, 77, int(wire.Mode.STREAM), 0)
    assert core.tick(1) == [SendConsumerConfig(77, int(wire.Mode.STREAM)), PublishAnnounce(1),
                            PublishMetadata(1)]  # fmt: skip
    core.on_consumer_hello(6, 78, int(wire.Mode.STREAM), 0)  # another stream's consumer
    assert core.tick(2) == []


def test_14_1_hello_with_an_unknown_mode_is_answered_as_stream() -> None:
    core = _core()
    core.tick(0)
    core.on_consumer_hello(5, 77, 200, 0)
    assert core.tick(1)[0] == SendConsumerConfig(77, int(wire.Mode.STREAM))


def test_13_4_truncated_region_opens_a_new_epoch_before_announcing() -> None:
    """#13.4: a region that shrank is never announced again: a fresh epoch is opened, and its
    announce follows the agent's ``on_epoch_opened``."""
    core = _core()
    assert core.tick(0, regions_truncated=True) == [OpenEpoch("region_truncated"), PublishQos(0)]
    assert not core.attached
    assert core.on_epoch_opened(0) == [PublishAnnounce(0), PublishMetadata(0)]
    assert core.attached


def test_13_4_failed_new_epoch_is_retried_at_the_next_announce() -> None:
    core = _core()
    core.tick(0, regions_truncated=True)
    assert core.on_epoch_failed(0) == [PublishMetadata(0)]
    assert core.tick(PERIOD)[0] == OpenEpoch("no_regions")


def test_13_7_takeover_retries_the_stream_lock_with_each_announce_until_held() -> None:
    core = _core(lock_pending=True)
    assert RetryStreamLock() in core.tick(0)
    core.on_stream_lock(False)
    assert RetryStreamLock() in core.tick(PERIOD)
    core.on_stream_lock(True)
    assert RetryStreamLock() not in core.tick(2 * PERIOD)


def test_14_1_driver_mode_never_announces_regions() -> None:
    """Driver Model §8: in driver mode the driver announces; the producer sends metadata."""
    core = _core(driver=True)
    assert core.tick(0) == [PublishMetadata(0), PublishQos(0)]


def test_s4_9_lease_events_map_and_unmap() -> None:
    """Driver Model §4.9: a granted lease is mapped; a lost one is unmapped at once; the
    mapping is announced (metadata) right away."""
    core = _core(driver=True)
    core.tick(0)
    layout = _layout()
    assert core.on_lease_events([Attached(1, layout, None)], 10) == [MapLease(layout)]
    core.on_mapped(3, 10)
    assert core.attached and core.tick(11) == [PublishMetadata(11)]
    assert core.on_lease_events([LeaseLost("revoked:expired")], 12) == [Unmap("revoked:expired")]
    assert not core.attached


def test_s10_silent_driver_is_reported_once_per_freshness_window() -> None:
    """§10: no announce for our stream for the freshness window while attached."""
    core = _core(driver=True)
    core.on_lease_events([Attached(1, _layout(), None)], 0)
    core.on_mapped(3, 0)
    core.on_driver_announce(5, 3, 2 * PERIOD)
    core.on_driver_announce(6, 3, 4 * PERIOD)  # another stream's announce proves nothing
    assert ReportDriverSilent() not in core.tick(5 * PERIOD)
    assert ReportDriverSilent() in core.tick(5 * PERIOD + 1)
    assert ReportDriverSilent() not in core.tick(6 * PERIOD)
    core.on_lease_events([LeaseLost("driver_silent")], 6 * PERIOD)
    assert ReportDriverSilent() not in core.tick(100 * PERIOD)  # nothing to report unattached


def test_30_announce_of_a_newer_epoch_makes_the_producer_confirm_its_lease() -> None:
    """#30 soak defect (a): after an SHM driver restart a producer went on writing epoch 6
    while the driver announced epoch 7 (its lease gone, the revoke never read): an announce
    of our stream at a newer epoch than our lease's asks the driver (ConfirmLease); our own
    epoch, an older one, another stream's or one while unattached asks nothing."""
    core = _core(driver=True)
    assert core.on_driver_announce(5, 9, 0) == []  # not attached: nothing to doubt
    core.on_lease_events([Attached(1, _layout(), None)], 0)
    core.on_mapped(3, 0)
    assert core.on_driver_announce(5, 3, 1) == []
    assert core.on_driver_announce(5, 2, 2) == []  # a lingering older announce
    assert core.on_driver_announce(6, 9, 3) == []
    assert core.on_driver_announce(5, 4, 4) == [ConfirmLease(4)]
    core.on_lease_events([LeaseLost("superseded_epoch")], 5)
    assert core.on_driver_announce(5, 4, 6) == []


_REJECTED = int(dp.ResponseCode.REJECTED)


def test_13_3_attach_wait_waits_out_a_held_lease_and_says_so_once() -> None:
    wait = AttachWait(5, 10 * PERIOD, 0)
    held = AttachFailed(_REJECTED, "stream 5 already has a producer (lease 7, client 9)")
    fatal, note = wait.on_failure(held, 1)
    assert fatal is None and note is not None and "expires by itself" in note
    assert wait.on_failure(held, 2) == (None, None)
    assert wait.expired(10 * PERIOD, None) is None
    msg = wait.expired(10 * PERIOD + 1, None)
    assert msg is not None and "still refused after 10 s" in msg


def test_13_3_attach_wait_gives_up_at_once_on_other_refusals_or_when_told() -> None:
    fatal, _ = AttachWait(5, PERIOD, 0).on_failure(AttachFailed(_REJECTED, "not provisioned"), 1)
    assert fatal is not None and "REJECTED not provisioned" in fatal
    no_wait = AttachWait(5, PERIOD, 0, wait_for_held_lease=False)
    fatal, _ = no_wait.on_failure(AttachFailed(_REJECTED, "already has a producer"), 1)
    assert fatal is not None
    assert AttachWait(5, PERIOD, 0).on_failure(AttachFailed(None, "attach timed out"), 1) == (
        None,
        None,
    )


def test_14_1_attach_wait_names_the_cause_when_time_runs_out() -> None:
    wait = AttachWait(5, PERIOD, 0)
    assert "is `tensorpool driver` running" in (wait.expired(PERIOD + 1, None) or "")
    assert "cannot map" in (wait.expired(PERIOD + 1, "path_outside_base") or "")
