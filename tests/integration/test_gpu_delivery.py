"""#20 frames straight to the GPU, with real producers in other processes (needs a CUDA GPU).

Marked ``gpu``; skipped with a stated reason where ``tensorpool[gpu]`` (CuPy) is not installed or
no CUDA GPU is visible. The producers are ``roles.py`` processes: every byte of frame ``seq`` is
``seq % 251`` and its first and last 8 bytes hold ``seq``, so any mix of two frames is seen.
Run on a GPU host with ``bench/gpu_device_check.sh`` (or ``pytest -m gpu``).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from roles import check

from tensorpool.client.consumer import Consumer
from tensorpool.client.settings import ClientSettings
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext


def _skip_reason() -> str | None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "tensorpool[gpu] not installed"
    from tensorpool.gpu.cuda import Cuda, GpuUnavailable

    try:
        Cuda(0)
    except GpuUnavailable:
        return "no CUDA GPU visible"
    return None


SKIP = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]
_streams = itertools.count(2000)
HOST_REGISTERED = 1  # cudaMemoryTypeHost: what cudaPointerGetAttributes says of a pinned range


def _consumer(ctx: AeronContext, stream_id: int, settings: ClientSettings) -> Consumer:
    return Consumer(ctx, stream_id, settings, max_outstanding_seq_gap=1 << 30)


def _settings(media_driver, shm_base: str) -> ClientSettings:
    return ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=200_000_000,
    )


def _wait_mapped(consumer: Consumer, epoch: int | None = None, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not (consumer.is_mapped and (epoch is None or consumer.epoch == epoch)):
        consumer.poll_batch(64)
        assert time.monotonic() < deadline, "consumer did not map the producer's stream"
        time.sleep(0.002)


def _warm_up(consumer: Consumer) -> None:
    """CUDA context, stream, pool registration and CuPy's allocator, before the producer starts:
    a first device poll that takes a second would let the producer lap the ring."""
    import cupy as cp

    consumer.to_device("cuda:0")
    consumer.poll_batch(1, device="cuda:0")
    cp.asnumpy(cp.zeros(1, cp.uint8))


def _check_rows(batch, bad: list[int]) -> int:
    """Copy the accepted rows back from the device and check every byte; returns rows seen."""
    import cupy as cp

    if batch.device_array is not None:
        rows = cp.asnumpy(batch.device_array)
        for k in np.flatnonzero(batch.valid).tolist():
            if not check(rows[k].reshape(-1).view(np.uint8), int(batch.seqs[k])):
                bad.append(int(batch.seqs[k]))
    else:
        for k in np.flatnonzero(batch.valid).tolist():
            row = cp.asnumpy(batch.device_arrays[k])
            if not check(row.reshape(-1).view(np.uint8), int(batch.seqs[k])):
                bad.append(int(batch.seqs[k]))
    return int(np.count_nonzero(batch.valid))


def _registered(address: int) -> bool:
    import cupy as cp

    return cp.cuda.runtime.pointerGetAttributes(address).type == HOST_REGISTERED


def test_frames_arrive_on_the_device_bit_exact(roles, media_driver, shm_base) -> None:
    import cupy as cp

    n = 400
    sid = next(_streams)
    shape = ["--shape", "48", "640", "--dtype", "uint16", "--stream-id", str(sid)]
    prod = roles("producer", *shape, "--count", str(n), "--rate", "2000", "--wait-go")
    prod.wait_event("ready")
    settings = _settings(media_driver, shm_base)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        consumer = _consumer(ctx, sid, settings)
        try:
            _wait_mapped(consumer)
            _warm_up(consumer)
            prod.send("go")
            seen: list[int] = []
            last = None
            bad: list[int] = []
            deadline = time.monotonic() + 60
            wait = True
            while len(seen) < n and time.monotonic() < deadline:
                batch = consumer.poll_batch(32, device="cuda:0", wait=wait)
                if not len(batch):
                    time.sleep(0.0005)
                    continue
                batch.confirm()  # a no-op for wait=True; waits for the copy otherwise
                _check_rows(batch, bad)
                seen += batch.seqs[batch.valid].tolist()
                wait = not wait  # both the synchronous and the event path
                last = batch
            assert bad == []
            assert seen == list(range(n))
            try:  # the DLPack hand-off PyTorch users take (the last batch: no poll since)
                import torch
            except ImportError:
                torch = None
            if torch is not None and last is not None and last.device_array is not None:
                arr = last.device_array
                t = torch.from_dlpack(arr)
                assert t.is_cuda and t.data_ptr() == arr.data.ptr  # zero-copy
                assert tuple(t.shape) == arr.shape
                assert bool((t.cpu().numpy() == cp.asnumpy(arr)).all())
            gpu = consumer._gpu
            assert gpu is not None and gpu.core.registrations == 1
            (span,) = gpu.core.spans("registered")
            assert _registered(span[0])
        finally:
            consumer.close()


def test_full_speed_overwrite_yields_zero_torn_frames_on_the_device(
    roles, media_driver, shm_base
) -> None:
    """An 8-slot ring overwritten flat out: rows overwritten while they were copied are dropped
    (counted like torn host reads), and every row delivered is whole."""
    sid = next(_streams)
    prod = roles(
        "producer", "--shape", "16384", "--dtype", "uint32", "--nslots", "8",
        "--duration", "4", "--wait-go", "--stream-id", str(sid),
    )  # fmt: skip
    prod.wait_event("ready")
    settings = _settings(media_driver, shm_base)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        consumer = _consumer(ctx, sid, settings)
        try:
            _wait_mapped(consumer)
            prod.send("go")
            accepted = 0
            bad: list[int] = []
            end = time.monotonic() + 4
            while time.monotonic() < end:
                batch = consumer.poll_batch(8, device="cuda:0")
                if len(batch):
                    accepted += _check_rows(batch, bad)
            assert bad == [], bad[:10]
            assert accepted > 0
            assert consumer.drops_late + consumer.drops_gap > 0  # the guard fired
        finally:
            consumer.close()


def test_producer_restart_unregisters_and_registers_the_new_pool(
    roles, media_driver, shm_base
) -> None:
    sid = next(_streams)
    same = ["--shape", "4096", "--stream-id", str(sid), "--rate", "500", "--wait-go"]
    p1 = roles("producer", *same, "--instance-id", "cam", "--count", "50", "--linger", "0")
    e1 = p1.wait_event("ready")["epoch"]
    settings = _settings(media_driver, shm_base)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        consumer = _consumer(ctx, sid, settings)
        try:
            _wait_mapped(consumer, e1)
            _warm_up(consumer)
            p1.send("go")
            got = 0
            deadline = time.monotonic() + 30
            while got < 20 and time.monotonic() < deadline:
                got += consumer.poll_batch(16, device="cuda:0").count
            assert got >= 20
            gpu = consumer._gpu
            assert gpu is not None
            ((old_addr, _),) = gpu.core.spans("registered")
            old_paths = set(gpu.core.known())
            p1.wait_event("done")
            p1.close()
            p2 = roles("producer", *same, "--instance-id", "cam", "--count", "50")
            e2 = p2.wait_event("ready")["epoch"]
            assert e2 > e1
            deadline = time.monotonic() + 30
            while consumer.epoch != e2 and time.monotonic() < deadline:
                consumer.poll_batch(16, device="cuda:0")
                time.sleep(0.002)
            p2.send("go")
            got2 = 0
            bad: list[int] = []
            while got2 < 20 and time.monotonic() < deadline:
                batch = consumer.poll_batch(16, device="cuda:0")
                if len(batch):
                    got2 += _check_rows(batch, bad)
            assert got2 >= 20 and bad == []
            assert gpu.core.unregistrations >= 1 and gpu.core.registrations == 2
            ((new_addr, _),) = gpu.core.spans("registered")
            assert set(gpu.core.known()).isdisjoint(old_paths)  # the old epoch's pool is gone
            assert _registered(new_addr)
            assert old_addr == new_addr or not _registered(old_addr)
        finally:
            consumer.close()


def test_a_pool_that_cannot_be_pinned_fails_or_is_staged_as_chosen(
    roles, media_driver, shm_base
) -> None:
    """A real registration failure: the pool's range is pinned beforehand (by the test), so the
    consumer's ``cudaHostRegister`` fails (already registered). ``error`` raises naming the
    pool; ``staging`` copies through a pinned buffer and the frames still arrive whole."""
    import cupy as cp

    from tensorpool.gpu.cuda import (
        HOST_REGISTER_PORTABLE,
        HOST_REGISTER_READ_ONLY,
        Cuda,
        page_size,
    )
    from tensorpool.gpu.delivery import GpuRegistrationError, pool_ranges
    from tensorpool.gpu.registry import STAGING, page_span

    sid = next(_streams)
    prod = roles(
        "producer", "--shape", "8192", "--stream-id", str(sid), "--count", "200",
        "--rate", "1000", "--wait-go",
    )  # fmt: skip
    prod.wait_event("ready")
    settings = _settings(media_driver, shm_base)
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        consumer = _consumer(ctx, sid, settings)
        pinned: list[int] = []
        try:
            _wait_mapped(consumer)
            (pool,) = pool_ranges(consumer._regions[1:])
            start, size = page_span(pool.address, pool.length, page_size())
            flags = HOST_REGISTER_PORTABLE
            if Cuda(0).read_only_supported:
                flags |= HOST_REGISTER_READ_ONLY
            cp.cuda.runtime.hostRegister(start, size, flags)
            pinned.append(start)
            consumer.to_device("cuda:0", on_register_failure="error")
            with pytest.raises(GpuRegistrationError, match=pool.path):
                consumer.poll_batch(16, device="cuda:0")
            gpu = consumer.to_device("cuda:0", on_register_failure="staging")
            prod.send("go")
            seen: list[int] = []
            bad: list[int] = []
            deadline = time.monotonic() + 30
            while len(seen) < 100 and time.monotonic() < deadline:
                batch = consumer.poll_batch(16, device="cuda:0")
                if len(batch):
                    _check_rows(batch, bad)
                    seen += batch.seqs[batch.valid].tolist()
            assert bad == [] and len(seen) >= 100
            assert gpu.core.state(pool.path) == STAGING and gpu.staged_bytes > 0
        finally:
            consumer.close()
            for start in pinned:
                cp.cuda.runtime.hostUnregister(start)
