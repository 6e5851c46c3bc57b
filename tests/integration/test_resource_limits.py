"""#13.4 Resources run out with a clear error, not a crash.

Real parts throughout: a real (small) tmpfs mounted for the test, real `tensorpool produce`
subprocesses, a real media driver, real region files truncated by a real `truncate(1)` process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.counters import Reason
from tensorpool.shm.errors import NoSpaceError, WireLimitError
from tensorpool.shm.region import create_region
from tensorpool.shm.superblock import SuperblockFields
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

SIGBUS_RC = -7
TMPFS_BYTES = 8 << 20


@pytest.fixture
def small_tmpfs() -> Iterator[str]:
    """An 8 MiB tmpfs of our own (needs root / CAP_SYS_ADMIN; skipped otherwise)."""
    path = tempfile.mkdtemp(prefix="tp-tmpfs-")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", path],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a test tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=False)
        os.rmdir(path)


@pytest.fixture
def aeron_tmp() -> Iterator[str]:
    path = tempfile.mkdtemp(
        prefix="tp-aeron-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    yield os.path.join(path, "md")
    shutil.rmtree(path, ignore_errors=True)


def _used_bytes(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _produce(aeron_dir: str, base: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tensorpool", "produce", "--embedded", "--aeron-dir", aeron_dir]
    cmd += ["--shm-base-dir", base, "--rate", "0", "--quiet", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_standalone_ring_larger_than_tmpfs_is_one_line_not_sigbus(
    small_tmpfs: str, aeron_tmp: str
) -> None:
    """#13.4: a ring (64 x 1 MiB) that does not fit an 8 MiB tmpfs: exit 2 with one line naming
    needed and free bytes, no SIGBUS, and the tmpfs left exactly as before (empty)."""
    res = _produce(aeron_tmp, small_tmpfs, "--shape", "480,640", "--count", "200")
    assert res.returncode != SIGBUS_RC
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "needs 67125376 bytes for stream 1 regions" in lines[0]
    assert re.search(rf"{re.escape(small_tmpfs)}\S* has \d+ free$", lines[0]), lines[0]
    # nothing of the stream is left: the tmpfs is as empty as before, not a directory remains
    assert os.listdir(small_tmpfs) == []
    assert _used_bytes(small_tmpfs) == 0


def _fill(path: str) -> str:
    """Fill the file system at ``path`` to the last byte (a file of its own)."""
    filler = os.path.join(path, "filler")
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    assert os.statvfs(path).f_bavail == 0
    return filler


def test_30_a_full_tmpfs_leaves_no_stream_lock(small_tmpfs: str, aeron_tmp: str) -> None:
    """#30: on a tmpfs with no byte free a producer cannot even record who holds the stream
    lock; the start fails with one line and leaves nothing (``stream-1.producer.lock`` and its
    namespace directory were left behind)."""
    filler = _fill(small_tmpfs)
    res = _produce(aeron_tmp, small_tmpfs, "--shape", "4", "--count", "1")
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    left = sorted(str(p.relative_to(small_tmpfs)) for p in Path(small_tmpfs).rglob("*"))
    assert left == [os.path.basename(filler)], left


def test_fallocate_enospc_removes_the_file(small_tmpfs: str) -> None:
    """#13.4: the authoritative check is posix_fallocate (the free-space check is advisory:
    someone may fill the tmpfs in between). A region that cannot be backed raises
    NoSpaceError and leaves no file; without the reservation it would be created sparse and
    the first write past the free space would SIGBUS."""
    path = os.path.join(small_tmpfs, "epoch-1", "payload-1.pool")
    sb = SuperblockFields.payload_pool(
        epoch=1, stream_id=1, pool_id=1, nslots=4, stride_bytes=4 << 20, now_ns=1
    )
    with pytest.raises(NoSpaceError) as info:
        create_region(path, sb)
    assert "needs 16777280 bytes" in str(info.value)
    assert not os.path.exists(path)
    assert _used_bytes(small_tmpfs) == 0


def test_shape_beyond_wire_limit_is_one_line_and_creates_nothing(aeron_tmp: str) -> None:
    """#13.4: 100000x100000 float64 (80 GB a frame) cannot be described by a u32 stride:
    exit 2 with one line naming shape, dtype and limit, and no file (it used to leave an
    8 TiB sparse file and a struct.error traceback)."""
    base = tempfile.mkdtemp(prefix="tp-wire-")
    try:
        res = _produce(aeron_tmp, base, "--shape", "100000,100000", "--dtype", "float64")
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert "--shape 100000,100000 --dtype float64" in lines[0]
        assert "2147483648" in lines[0] and "Traceback" not in res.stderr
        assert os.listdir(base) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_wire_limits_raise_value_errors_before_any_file(tmp_path) -> None:
    """#13.4: the Python API refuses the same sizes with a ValueError subclass, up front."""
    with pytest.raises(WireLimitError) as info:
        StreamConfig.for_frame_bytes(1, 100000 * 100000 * 8)
    assert isinstance(info.value, ValueError) and info.value.reason == Reason.WIRE_LIMIT_EXCEEDED
    with pytest.raises(WireLimitError):
        StreamConfig(1, pools=(PoolConfig(1, 1 << 32),))
    with pytest.raises(WireLimitError):
        StreamConfig(1, header_nslots=1 << 32)
    # the region layer refuses an unencodable superblock before creating the file
    path = str(tmp_path / "e" / "payload-1.pool")
    sb = SuperblockFields.payload_pool(
        epoch=1, stream_id=1, pool_id=1, nslots=64, stride_bytes=1 << 37, now_ns=1
    )
    with pytest.raises(WireLimitError):
        create_region(path, sb)
    assert not os.path.exists(tmp_path / "e")


def test_standalone_region_files_are_private_unless_configured(media_driver, shm_base) -> None:
    """#13.4: region files are 0600 by default whatever the umask (no group/world write: a
    writer could truncate them under every reader); `file_mode` widens them on purpose."""
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir), shm_base_dir=shm_base
    )
    old_umask = os.umask(0)
    try:
        with AeronContext(settings.transport) as ctx:
            ctx.start()
            for sid, mode, want_file, want_dir in (
                (31, None, 0o600, 0o700),
                (32, 0o640, 0o640, 0o750),
            ):
                kw = {} if mode is None else {"file_mode": mode}
                producer = Producer(ctx, StreamConfig(sid, header_nslots=4), settings, **kw)
                try:
                    for path in (producer.header_region_path, *_pool_paths(producer)):
                        assert stat.S_IMODE(os.stat(path).st_mode) == want_file, path
                    epoch_dir = producer.epoch_directory
                    assert epoch_dir is not None
                    assert stat.S_IMODE(os.stat(epoch_dir).st_mode) == want_dir
                finally:
                    producer.close()
    finally:
        os.umask(old_umask)


def _pool_paths(producer: Producer) -> list[str]:
    return [uri.removeprefix("shm:file?path=") for *_, uri in producer._pool_uris]


def test_truncated_region_is_unmapped_on_announce_and_the_producer_moves_on(
    media_driver, shm_base
) -> None:
    """#13.4: a third process truncates the payload file of a live epoch. The consumer checks
    the mapped files' size on the next announce of that epoch and unmaps (counted as
    `region_truncated`) instead of reading past the end (SIGBUS); the producer sees it at its
    next announce, opens a new epoch, and the consumer maps that and gets frames again."""
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=50_000_000,
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(ctx, StreamConfig(33, header_nslots=8), settings)
        consumer = Consumer(ctx, 33, settings)
        try:
            got: list[int] = []

            def take(frame) -> None:
                got.append(int(frame.array.sum()))

            _until(lambda: _pump(producer, consumer, take) or consumer.is_mapped)
            first_epoch = consumer.epoch
            _until(lambda: _offer(producer, consumer, take) or bool(got))

            # The producer announces the (still intact) epoch; before the consumer reads that
            # announce, another process truncates the payload file under both of them.
            producer._core.request_announce()  # announce at the next do_work
            producer.do_work()
            pool = _pool_paths(producer)[0]
            subprocess.run(["truncate", "-s", "0", pool], check=True)
            _until(lambda: consumer.poll(take) >= 0 and not consumer.is_mapped)
            assert consumer.stats.control[Reason.REGION_TRUNCATED] == 1

            # The producer never writes into the truncated file: its next announce moves on.
            got.clear()
            _until(
                lambda: _pump(producer, consumer, take) or consumer.epoch not in (None, first_epoch)
            )
            assert producer.stats.drops[Reason.REGION_TRUNCATED] == 1
            assert producer.epoch == consumer.epoch != first_epoch
            _until(lambda: _offer(producer, consumer, take) or bool(got))
            assert got[-1] == 7 * 1024
        finally:
            consumer.close()
            producer.close()


def _pump(producer: Producer, consumer: Consumer, handler) -> bool:
    producer.do_work()
    consumer.poll(handler)
    time.sleep(0.002)
    return False


def _offer(producer: Producer, consumer: Consumer, handler) -> bool:
    producer.offer(np.full(1024, 7, np.uint8))
    return _pump(producer, consumer, handler)


def _until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
