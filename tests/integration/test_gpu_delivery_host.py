"""#20 device delivery on CI: the real consumer, producer, SHM files and media driver, with the
CuPy layer replaced by :mod:`host_cuda` (copies deferred until a synchronize, as on a CUDA
stream). These tests pin the rules of :mod:`tensorpool.gpu.delivery` that do not depend on the
GPU itself (Wire §8.3's second load after the copy, counting, staging, pinning across a remap);
``test_gpu_delivery.py`` runs the same paths on a real GPU.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from host_cuda import HostCuda

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.counters import Reason
from tensorpool.endpoints import Endpoints
from tensorpool.gpu.delivery import GpuRegistrationError, pool_ranges
from tensorpool.gpu.registry import REGISTERED, STAGING
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

NSLOTS = 16
STREAM = 25
_ids = itertools.count(43_000, 10)


@pytest.fixture
def host_cuda(monkeypatch: pytest.MonkeyPatch) -> type[HostCuda]:
    monkeypatch.setattr("tensorpool.gpu.delivery.Cuda", HostCuda)
    monkeypatch.setattr(HostCuda, "instances", [])
    monkeypatch.setattr(HostCuda, "fail_register", None)
    return HostCuda


@pytest.fixture
def pair(media_driver, shm_base, host_cuda):
    base = next(_ids)
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        channels=Endpoints(
            control_stream_id=base,
            descriptor_stream_id=base + 1,
            qos_stream_id=base + 2,
            metadata_stream_id=base + 3,
        ),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producers: list[Producer] = [_producer(ctx, settings)]
        consumer = Consumer(ctx, STREAM, settings)
        _wait_mapped(consumer, producers[0])
        yield producers, consumer, ctx, settings
        consumer.close()
        for p in producers:
            p.close()


def _producer(ctx: AeronContext, settings: ClientSettings) -> Producer:
    stream = StreamConfig(
        STREAM, header_nslots=NSLOTS, pools=(PoolConfig(1, 4096), PoolConfig(2, 65536))
    )
    return Producer(ctx, stream, settings, instance_id="cam")


def _wait_mapped(consumer: Consumer, producer: Producer) -> None:
    deadline = time.monotonic() + 10
    while not (consumer.is_mapped and consumer.epoch == producer.epoch):
        assert time.monotonic() < deadline, "the consumer did not map the producer's stream"
        producer.do_work()
        consumer.poll_batch(64)
        time.sleep(0.005)


def _frames(first: int, n: int, shape: tuple[int, ...] = (32, 16)) -> np.ndarray:
    """Frame ``seq`` holds ``seq`` in every element: any mix of two frames is seen."""
    return np.broadcast_to(
        np.arange(first, first + n, dtype=np.uint32).reshape(n, *([1] * len(shape))),
        (n, *shape),
    ).copy()


def _poll_device(consumer: Consumer, want: int, *, wait: bool = True):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        batch = consumer.poll_batch(want, device="cuda:0", wait=wait)
        if len(batch):
            return batch
        time.sleep(0.001)
    raise AssertionError("no batch arrived")


def test_20_stacked_rows_reach_the_device_bit_exact_and_the_pool_is_pinned_once(pair) -> None:
    (producer,), consumer, _, _ = pair
    producer.offer_batch(_frames(0, 8))
    batch = _poll_device(consumer, 64)
    assert batch.seqs.tolist() == list(range(8)) and batch.valid.all()
    assert batch.device_array is not None and batch.device_array.shape == (8, 32, 16)
    np.testing.assert_array_equal(batch.device_array, _frames(0, 8))
    (cuda,) = HostCuda.instances
    assert cuda.streams[0].pending == 0  # wait=True: the copy completed before the return
    producer.offer_batch(_frames(8, 8))
    np.testing.assert_array_equal(_poll_device(consumer, 64).device_array, _frames(8, 8))
    registers = [c for c in cuda.calls if c[0] == "register"]
    (pool,) = pool_ranges(consumer._regions[1:2])  # pool 1 (4 KiB slots) is the one read
    assert len(registers) == len(consumer._regions) - 1  # each payload pool once, not per poll
    page = 4096
    assert any(a <= pool.address and pool.address + pool.length <= a + s for _, a, s in registers)
    assert all(a % page == 0 and s % page == 0 for _, a, s in registers)
    assert consumer.stats.frames == 16


def test_20_s8_3_a_row_overwritten_during_the_copy_is_dropped_as_a_torn_read(pair) -> None:
    """wait=False: the copies are queued; the producer laps three of the eight slots while
    they run (just before, in the stand-in), and confirm() drops exactly those three, counted
    as torn reads. Checking before the copy completes would hand over three newer frames."""
    (producer,), consumer, _, _ = pair
    producer.offer_batch(_frames(0, 8))
    batch = _poll_device(consumer, 64, wait=False)
    assert batch.seqs.tolist() == list(range(8)) and not batch.confirmed
    torn_before = consumer.stats.drops[Reason.TORN_READ]
    producer.offer_batch(_frames(8, NSLOTS - 8))  # seqs 8..15 fill the rest of the ring
    (cuda,) = HostCuda.instances
    # seqs 16..18 overwrite slots 0..2 while the copy is in flight
    cuda.streams[0].before_copy = lambda: producer.offer_batch(_frames(NSLOTS, 3))
    assert batch.confirm() == 5
    assert batch.valid.tolist() == [False] * 3 + [True] * 5
    assert consumer.stats.drops[Reason.TORN_READ] - torn_before == 3
    rows = batch.device_array
    assert rows is not None
    for k in np.flatnonzero(batch.valid).tolist():  # every row handed over is whole
        assert (rows[k] == batch.seqs[k]).all()
    assert (rows[:3] == np.arange(NSLOTS, NSLOTS + 3)[:, None, None]).all()  # what was copied
    assert consumer.stats.frames == 5


def test_20_s8_3_wait_true_checks_after_the_copy_completed(pair) -> None:
    """The same window inside one synchronous poll: the producer laps two slots after the
    copies were queued and before they ran; the poll returns without those two rows."""
    (producer,), consumer, _, _ = pair
    producer.offer_batch(_frames(0, NSLOTS))
    consumer.to_device("cuda:0")
    (cuda,) = HostCuda.instances
    cuda.streams[0].before_copy = lambda: producer.offer_batch(_frames(NSLOTS, 2))
    batch = _poll_device(consumer, 64)
    assert batch.seqs.tolist() == list(range(NSLOTS)) and batch.confirmed
    assert batch.valid.tolist() == [False] * 2 + [True] * (NSLOTS - 2)
    assert consumer.stats.drops[Reason.TORN_READ] == 2
    rows = batch.device_array
    assert rows is not None
    assert all((rows[k] == k).all() for k in range(2, NSLOTS))


def test_20_an_open_batch_is_confirmed_after_its_copy_by_the_next_poll(pair) -> None:
    """A caller that never calls confirm(): the next device poll finishes the open batch first
    (its copy completes, then the second load), so nothing is counted before it is proven."""
    (producer,), consumer, _, _ = pair
    producer.offer_batch(_frames(0, 4))
    first = _poll_device(consumer, 64, wait=False)
    assert consumer.stats.frames == 0
    producer.offer_batch(_frames(4, 4))
    second = _poll_device(consumer, 64, wait=False)
    assert first.host.confirmed and first.event is None and consumer.stats.frames == 4
    np.testing.assert_array_equal(first.device_array, _frames(0, 4))
    assert second.confirm() == 4
    np.testing.assert_array_equal(second.device_array, _frames(4, 4))


def test_20_rows_of_mixed_layouts_come_back_one_device_array_each(pair) -> None:
    (producer,), consumer, _, _ = pair
    producer.offer(np.arange(4, dtype=np.int32))
    producer.offer(np.full((2, 3), 2.5, np.float64))
    producer.offer(np.arange(20_000, dtype=np.uint16))  # pool 2
    arrays: list[np.ndarray] = []
    deadline = time.monotonic() + 5
    while len(arrays) < 3 and time.monotonic() < deadline:
        batch = consumer.poll_batch(64, device="cuda:0")
        if len(batch):
            arrays += (
                [batch.device_array[k] for k in range(len(batch))]
                if batch.device_array is not None
                else batch.device_arrays
            )
    assert [a.shape for a in arrays] == [(4,), (2, 3), (20_000,)]
    np.testing.assert_array_equal(arrays[0], np.arange(4, dtype=np.int32))
    np.testing.assert_array_equal(arrays[1], np.full((2, 3), 2.5))
    np.testing.assert_array_equal(arrays[2], np.arange(20_000, dtype=np.uint16))


def test_20_a_pool_that_cannot_be_pinned_fails_naming_it_or_is_staged(pair) -> None:
    (producer,), consumer, _, _ = pair
    HostCuda.fail_register = "cudaErrorHostMemoryAlreadyRegistered: already registered"
    consumer.to_device("cuda:0", on_register_failure="error")
    producer.offer_batch(_frames(0, 4))
    with pytest.raises(GpuRegistrationError, match=consumer._regions[1].path):
        consumer.poll_batch(64, device="cuda:0")
    gpu = consumer.to_device("cuda:0", on_register_failure="staging")
    producer.offer_batch(_frames(4, 4))
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < 4 and time.monotonic() < deadline:
        batch = consumer.poll_batch(64, device="cuda:0")
        for k in np.flatnonzero(batch.valid).tolist():
            assert (batch.device_array[k] == batch.seqs[k]).all()
            got.append(int(batch.seqs[k]))
    assert got[-4:] == [4, 5, 6, 7]
    assert gpu.core.state(consumer._regions[1].path) == STAGING and gpu.staged_bytes > 0


def test_20_a_producer_restart_unpins_the_old_pools_before_pinning_the_new(pair) -> None:
    producers, consumer, ctx, settings = pair
    producers[0].offer_batch(_frames(0, 4))
    _poll_device(consumer, 64)
    gpu = consumer._gpu
    assert gpu is not None
    old = set(gpu.core.known())
    assert set(old) == {r.path for r in consumer._regions[1:]}
    assert all(state == REGISTERED for state in gpu.core.known().values())
    producers[0].close()
    producers.append(_producer(ctx, settings))
    _wait_mapped(consumer, producers[1])
    producers[1].offer_batch(_frames(0, 4))
    batch = _poll_device(consumer, 64)
    np.testing.assert_array_equal(batch.device_array, _frames(0, 4))
    new = set(gpu.core.known())
    assert new.isdisjoint(old) and len(new) == len(old)
    (cuda,) = HostCuda.instances
    kinds = [c[0] for c in cuda.calls]
    n = len(old)
    assert kinds == ["register"] * n + ["unregister"] * n + ["register"] * n
    assert gpu.core.unregistrations == n and gpu.core.registrations == 2 * n
