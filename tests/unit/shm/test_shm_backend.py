"""SHM backend validation (§15.22): hugepage verification on the opened file, stride rules."""

from __future__ import annotations

import os

import pytest

from tensorpool.counters import Reason
from tensorpool.shm import (
    HUGETLBFS_MAGIC,
    PAGE_SIZE,
    BackendError,
    validate_stride_bytes,
    verify_hugepages,
)
from tensorpool.shm import backend as backend_mod
from tensorpool.shm.backend import TMPFS_MAGIC, fstatfs_type_and_bsize


def _open_file(path: str) -> int:
    with open(path, "wb") as f:
        f.write(b"\0" * 64)
    return os.open(path, os.O_RDONLY)


def _hugetlbfs_mount() -> str | None:
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "hugetlbfs" and os.access(parts[1], os.W_OK):
                    return parts[1]
    except OSError:
        return None
    return None


def test_fstatfs_reports_the_real_filesystem(shm_base: str) -> None:
    """Positive control: the ctypes statfs read agrees with the kernel (tmpfs magic, bsize)."""
    fd = _open_file(os.path.join(shm_base, "f"))
    try:
        f_type, f_bsize = fstatfs_type_and_bsize(fd)
        assert f_bsize == os.fstatvfs(fd).f_bsize
        if shm_base.startswith("/dev/shm"):
            assert f_type == TMPFS_MAGIC
        assert f_type != HUGETLBFS_MAGIC
    finally:
        os.close(fd)


def test_s15_22_require_hugepages_rejects_non_hugetlbfs_file(shm_base: str) -> None:
    fd = _open_file(os.path.join(shm_base, "f"))
    try:
        with pytest.raises(BackendError) as info:
            verify_hugepages(fd)
        assert info.value.reason == Reason.HUGEPAGES_NOT_VERIFIED
    finally:
        os.close(fd)


def test_s15_22_require_hugepages_fails_closed_without_verification_mechanism(
    shm_base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Platforms that cannot verify (no fstatfs) must reject, not silently downgrade."""
    monkeypatch.setattr(backend_mod, "_fstatfs", None)  # fault injection: mechanism missing
    fd = _open_file(os.path.join(shm_base, "f"))
    try:
        with pytest.raises(BackendError) as info:
            verify_hugepages(fd)
        assert info.value.reason == Reason.HUGEPAGES_NOT_VERIFIED
    finally:
        os.close(fd)


def test_s15_22_hugetlbfs_file_verified_when_available() -> None:
    mount = _hugetlbfs_mount()
    if mount is None:
        pytest.skip("no writable hugetlbfs mount on this host")
    path = os.path.join(mount, f"tp-test-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        size = verify_hugepages(fd)
        assert size > PAGE_SIZE and size & (size - 1) == 0
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.mark.parametrize("stride", [4096, 8192, 1 << 20, 1 << 30])
def test_s15_22_stride_power_of_two_page_multiple_accepted(stride: int) -> None:
    validate_stride_bytes(stride, page_size=4096)


@pytest.mark.parametrize("stride", [0, 3 * 4096, 4096 + 64, 12288, (1 << 20) - 4096])
def test_s15_22_stride_not_power_of_two_rejected(stride: int) -> None:
    with pytest.raises(BackendError) as info:
        validate_stride_bytes(stride, page_size=4096)
    assert info.value.reason == Reason.STRIDE_BYTES_NOT_POWER_OF_TWO


@pytest.mark.parametrize("stride", [64, 256, 2048])
def test_s15_22_stride_below_page_size_rejected(stride: int) -> None:
    with pytest.raises(BackendError) as info:
        validate_stride_bytes(stride, page_size=4096)
    assert info.value.reason == Reason.STRIDE_BYTES_NOT_PAGE_MULTIPLE


def test_s15_22_stride_must_be_hugepage_multiple_when_required() -> None:
    validate_stride_bytes(4 << 20, page_size=4096, hugepage_size=2 << 20)
    with pytest.raises(BackendError) as info:
        validate_stride_bytes(1 << 20, page_size=4096, hugepage_size=2 << 20)
    assert info.value.reason == Reason.STRIDE_BYTES_NOT_HUGEPAGE_MULTIPLE


def test_default_page_size_is_the_host_page_size() -> None:
    assert os.sysconf("SC_PAGE_SIZE") == PAGE_SIZE
    with pytest.raises(BackendError):
        validate_stride_bytes(PAGE_SIZE // 2)
