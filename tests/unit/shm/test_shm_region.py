"""Region files: creation (§15.14, §15.21a.3, §15.21a.6), mapping (§15.1, §15.21a.5, §15.22),
unmapping with live views."""

from __future__ import annotations

import gc
import os
import stat
import time

import numpy as np
import pytest

from tensorpool.counters import Reason
from tensorpool.shm import (
    EpochLayout,
    ExpectedRegion,
    PathPolicy,
    PathRejected,
    ShmError,
    SuperblockError,
    SuperblockFields,
    UriError,
    create_region,
    format_shm_uri,
    map_region,
    read_superblock,
    try_map_region,
)
from tensorpool.shm.errors import BackendError
from tensorpool.shm.superblock import write_superblock

EPOCH, STREAM = 4, 1000


def _hdr(nslots: int = 16, **kw: int) -> SuperblockFields:
    return SuperblockFields.header_ring(
        epoch=EPOCH, stream_id=STREAM, nslots=nslots, now_ns=50, **kw
    )


def _pool(pool_id: int = 1, nslots: int = 16, stride: int = 4096) -> SuperblockFields:
    return SuperblockFields.payload_pool(
        epoch=EPOCH,
        stream_id=STREAM,
        pool_id=pool_id,
        nslots=nslots,
        stride_bytes=stride,
        now_ns=50,
    )


def _exp_hdr(nslots: int = 16) -> ExpectedRegion:
    return ExpectedRegion.header_ring(epoch=EPOCH, stream_id=STREAM, nslots=nslots)


def _exp_pool(pool_id: int = 1, nslots: int = 16, stride: int = 4096) -> ExpectedRegion:
    return ExpectedRegion.payload_pool(
        epoch=EPOCH, stream_id=STREAM, pool_id=pool_id, nslots=nslots, stride_bytes=stride
    )


def test_s15_21a_3_epoch_directory_layout(shm_base: str) -> None:
    lay = EpochLayout(shm_base, "tensorpool", "3f2a-uuid", 12)
    assert lay.directory == os.path.join(shm_base, "tensorpool", "3f2a-uuid", "epoch-12")
    assert lay.header_path == os.path.join(lay.directory, "header.ring")
    assert lay.pool_path(2) == os.path.join(lay.directory, "payload-2.pool")


@pytest.mark.parametrize(
    ("base", "ns", "pid"),
    [("rel", "ns", "p"), ("/b", "a/b", "p"), ("/b", "ns", ".."), ("/b", "", "p")],
)
def test_s15_21a_3_layout_rejects_unsafe_components(base: str, ns: str, pid: str) -> None:
    with pytest.raises(ValueError):
        EpochLayout(base, ns, pid, 1)


def test_s15_21a_6_created_with_private_modes_and_sizes(shm_base: str) -> None:
    lay = EpochLayout(shm_base, "tensorpool", "p", EPOCH)
    old = os.umask(0)
    try:
        h = create_region(lay.header_path, _hdr())
        p = create_region(lay.pool_path(1), _pool())
    finally:
        os.umask(old)
    try:
        for d in (lay.directory, os.path.dirname(lay.directory)):
            assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        for path, size in ((lay.header_path, 64 + 16 * 256), (lay.pool_path(1), 64 + 16 * 4096)):
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o600
            assert st.st_size == size
        assert h.size == 64 + 16 * 256 and h.writable and h.is_header_ring
        with open(lay.header_path, "rb") as f:
            assert read_superblock(f.read(64)) == _hdr()
    finally:
        h.close()
        p.close()


def test_s15_14_create_refuses_existing_file_unless_replace(shm_base: str) -> None:
    lay = EpochLayout(shm_base, "tensorpool", "p", EPOCH)
    first = create_region(lay.header_path, _hdr())
    ino = os.stat(lay.header_path).st_ino
    with pytest.raises(FileExistsError):
        create_region(lay.header_path, _hdr())
    second = create_region(lay.header_path, _hdr(nslots=32), replace=True)
    try:
        assert os.stat(lay.header_path).st_ino != ino, "replace creates a new inode"
        assert first.current_superblock().nslots == 16, "old mapping keeps the old file"
        assert second.nslots == 32
    finally:
        first.close()
        second.close()


def test_s15_14_create_does_not_follow_planted_symlink(shm_base: str) -> None:
    lay = EpochLayout(shm_base, "tensorpool", "p", EPOCH)
    os.makedirs(lay.directory)
    victim = os.path.join(shm_base, "victim")
    with open(victim, "wb") as f:
        f.write(b"keep")
    os.symlink(victim, lay.header_path)
    with pytest.raises(OSError):
        create_region(lay.header_path, _hdr())
    with open(victim, "rb") as f:
        assert f.read() == b"keep"


def test_create_confined_by_policy(shm_base: str) -> None:
    allowed = os.path.join(shm_base, "allowed")
    os.mkdir(allowed)
    with pytest.raises(PathRejected) as info:
        create_region(
            os.path.join(shm_base, "other", "h.ring"), _hdr(), policy=PathPolicy([allowed])
        )
    assert info.value.reason == Reason.PATH_OUTSIDE_ALLOWED_BASE
    assert not os.path.exists(os.path.join(shm_base, "other")), "nothing created outside"
    r = create_region(os.path.join(allowed, "h.ring"), _hdr(), policy=PathPolicy([allowed]))
    r.close()


def test_s15_22_create_rejects_bad_pool_stride(shm_base: str) -> None:
    with pytest.raises(BackendError) as info:
        create_region(os.path.join(shm_base, "p.pool"), _pool(stride=3 * 4096))
    assert info.value.reason == Reason.STRIDE_BYTES_NOT_POWER_OF_TWO
    assert not os.path.exists(os.path.join(shm_base, "p.pool"))


def test_s15_22_create_with_require_hugepages_on_tmpfs_fails_and_cleans_up(shm_base: str) -> None:
    path = os.path.join(shm_base, "p.pool")
    with pytest.raises(BackendError) as info:
        create_region(path, _pool(), require_hugepages=True)
    assert info.value.reason == Reason.HUGEPAGES_NOT_VERIFIED
    assert not os.path.exists(path)


def test_create_prefault(shm_base: str) -> None:
    r = create_region(os.path.join(shm_base, "p.pool"), _pool(), prefault=True)
    try:
        assert read_superblock(r.mmap) == _pool()
    finally:
        r.close()


@pytest.fixture
def regions(shm_base: str):  # type: ignore[no-untyped-def]
    lay = EpochLayout(shm_base, "tensorpool", "p", EPOCH)
    h = create_region(lay.header_path, _hdr())
    p = create_region(lay.pool_path(1), _pool())
    yield lay, PathPolicy([shm_base])
    h.close()
    p.close()


def test_s15_1_map_validates_and_maps_read_only(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    h = map_region(format_shm_uri(lay.header_path), _exp_hdr(), policy)
    try:
        assert not h.writable and h.size == 64 + 16 * 256 and h.epoch == EPOCH
        with pytest.raises(TypeError):
            h.mmap[100] = 1
        view = np.frombuffer(h.mmap, np.uint8)
        assert not view.flags.writeable
        with pytest.raises(PermissionError):
            h.refresh_activity(5)
        del view
    finally:
        h.close()


def test_map_writable_for_the_single_writer(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    h = map_region(format_shm_uri(lay.header_path), _exp_hdr(), policy, writable=True)
    try:
        h.refresh_activity(999)
        assert h.activity_timestamp_ns() == 999
    finally:
        h.close()
    with open(lay.header_path, "rb") as f:
        assert read_superblock(f.read(64)).activity_timestamp_ns == 999


@pytest.mark.parametrize(
    ("expected", "reason"),
    [
        (
            ExpectedRegion.header_ring(epoch=EPOCH + 1, stream_id=STREAM, nslots=16),
            Reason.SUPERBLOCK_EPOCH_MISMATCH,
        ),
        (
            ExpectedRegion.header_ring(epoch=EPOCH, stream_id=STREAM, nslots=32),
            Reason.SUPERBLOCK_NSLOTS_MISMATCH,
        ),
        (_exp_pool(), Reason.SUPERBLOCK_REGION_TYPE_MISMATCH),
    ],
)
def test_s15_1_map_rejects_superblock_mismatch(regions, expected, reason) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    with pytest.raises(SuperblockError) as info:
        map_region(format_shm_uri(lay.header_path), expected, policy)
    assert info.value.reason == reason


def test_s15_1_map_rejects_pool_with_wrong_stride(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    with pytest.raises(SuperblockError) as info:
        map_region(format_shm_uri(lay.pool_path(1)), _exp_pool(stride=8192), policy)
    assert info.value.reason == Reason.SUPERBLOCK_STRIDE_BYTES_MISMATCH


def test_s15_22_map_rejects_stride_not_page_multiple(shm_base: str) -> None:
    """A foreign producer's pool with a sub-page stride is rejected by the consumer."""
    path = os.path.join(shm_base, "small.pool")
    fields = _pool(stride=1024)
    with open(path, "wb") as f:
        buf = bytearray(fields.region_bytes)
        write_superblock(buf, fields)
        f.write(buf)
    with pytest.raises(BackendError) as info:
        map_region(format_shm_uri(path), _exp_pool(stride=1024), PathPolicy([shm_base]))
    assert info.value.reason == Reason.STRIDE_BYTES_NOT_PAGE_MULTIPLE


def test_s15_22_map_rejects_unverifiable_hugepages(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    uri = format_shm_uri(lay.pool_path(1), require_hugepages=True)
    with pytest.raises(BackendError) as info:
        map_region(uri, _exp_pool(), policy)
    assert info.value.reason == Reason.HUGEPAGES_NOT_VERIFIED
    # deployment-wide policy forces the check even without the URI flag
    with pytest.raises(BackendError):
        map_region(format_shm_uri(lay.pool_path(1)), _exp_pool(), policy, require_hugepages=True)


def test_s15_22_map_rejects_unknown_scheme(regions) -> None:  # type: ignore[no-untyped-def]
    _, policy = regions
    with pytest.raises(UriError) as info:
        map_region("shm:memfd?path=/x", _exp_hdr(), policy)
    assert info.value.reason == Reason.URI_UNKNOWN_SCHEME


def test_s15_21a_5_map_rejects_path_outside_base(regions, shm_base: str) -> None:  # type: ignore[no-untyped-def]
    lay, _ = regions
    other = PathPolicy([os.path.join(shm_base, "elsewhere")])
    with pytest.raises(PathRejected) as info:
        map_region(format_shm_uri(lay.header_path), _exp_hdr(), other)
    assert info.value.reason == Reason.PATH_OUTSIDE_ALLOWED_BASE


def test_s15_13_map_rejects_truncated_files(shm_base: str) -> None:
    policy = PathPolicy([shm_base])
    tiny = os.path.join(shm_base, "tiny.ring")
    with open(tiny, "wb") as f:
        f.write(b"\0" * 10)
    with pytest.raises(SuperblockError) as info:
        map_region(format_shm_uri(tiny), _exp_hdr(), policy)
    assert info.value.reason == Reason.REGION_TOO_SMALL
    short = os.path.join(shm_base, "short.ring")
    with open(short, "wb") as f:
        buf = bytearray(64 + 15 * 256)  # superblock says 16 slots, file holds 15
        write_superblock(buf, _hdr())
        f.write(buf)
    with pytest.raises(SuperblockError) as info:
        map_region(format_shm_uri(short), _exp_hdr(), policy)
    assert info.value.reason == Reason.REGION_TOO_SMALL


def test_s15_1_map_rejects_stale_activity(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    uri = format_shm_uri(lay.header_path)
    ok = map_region(uri, _exp_hdr(), policy, now_ns=60, freshness_window_ns=100)
    ok.close()
    with pytest.raises(SuperblockError) as info:
        map_region(uri, _exp_hdr(), policy, now_ns=1_000, freshness_window_ns=100)
    assert info.value.reason == Reason.SUPERBLOCK_ACTIVITY_STALE


def test_try_map_region_reports_instead_of_raising(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    seen: list[ShmError] = []
    assert try_map_region(format_shm_uri(lay.pool_path(1)), _exp_hdr(), policy, seen.append) is None
    assert seen and seen[0].reason == Reason.SUPERBLOCK_REGION_TYPE_MISMATCH


def test_map_leaks_no_file_descriptor(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        map_region(format_shm_uri(lay.header_path), _exp_hdr(), policy).close()
        try_map_region(format_shm_uri(lay.header_path), _exp_pool(), policy)
    assert len(os.listdir("/proc/self/fd")) == before


def test_close_with_live_numpy_view_defers_unmap(regions) -> None:  # type: ignore[no-untyped-def]
    """mmap.close() raises BufferError while views exist; close() must not, and the view
    stays valid until it is dropped."""
    lay, policy = regions
    h = map_region(format_shm_uri(lay.header_path), _exp_hdr(), policy)
    view = np.frombuffer(h.mmap, np.uint8)
    assert h.close() is False
    assert h.closed
    with pytest.raises(ValueError):
        _ = h.mmap
    assert bytes(view[:8]) == (0x544F504C53484D31).to_bytes(8, "little")
    del view
    gc.collect()
    assert h.close() is True  # idempotent


def test_close_without_views_unmaps(regions) -> None:  # type: ignore[no-untyped-def]
    lay, policy = regions
    with map_region(format_shm_uri(lay.header_path), _exp_hdr(), policy) as h:
        mm = h.mmap
    assert mm.closed
    time.sleep(0)
