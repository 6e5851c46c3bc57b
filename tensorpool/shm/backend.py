"""Backing-store checks of §15.22: hugepage verification and ``stride_bytes`` rules.

``require_hugepages=true`` must be *verified on the opened file*, not inferred from its name.
Linux reports the filesystem of an open descriptor through ``fstatfs(2)``: ``f_type`` is
``HUGETLBFS_MAGIC`` for hugetlbfs and ``f_bsize`` is that mount's hugepage size. Python's
``os.statvfs`` omits ``f_type``, so we call ``fstatfs`` through ctypes. If the call is
unavailable (non-Linux, no libc symbol) the requirement cannot be verified and the region is
rejected — no silent downgrade.

``stride_bytes`` is explicit (never inferred). It must be a power of two and a multiple of the
backing page size, and of the hugepage size when hugepages are required.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Callable

from tensorpool.counters import Reason
from tensorpool.shm.errors import BackendError

HUGETLBFS_MAGIC = 0x958458F6
TMPFS_MAGIC = 0x01021994

#: The base page size of this host.
PAGE_SIZE: int = mmap.PAGESIZE

# struct statfs starts with two __fsword_t (C long): f_type, f_bsize. The full struct is 120 bytes
# on 64-bit Linux; a larger scratch buffer keeps us safe on any ABI variant.
_STATFS_BUF_BYTES = 256


def _load_fstatfs() -> Callable[[int, object], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    # The running interpreter already links libc: CDLL(None) finds fstatfs without spawning
    # ``ldconfig`` the way ctypes.util.find_library would.
    for name in (None, "libc.so.6"):
        try:
            fn = ctypes.CDLL(name, use_errno=True).fstatfs
            break
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            continue
    else:  # pragma: no cover
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


_fstatfs = _load_fstatfs()


def fstatfs_type_and_bsize(fd: int) -> tuple[int, int]:
    """``(f_type, f_bsize)`` of the filesystem holding ``fd``; raises OSError on failure."""
    if _fstatfs is None:
        raise OSError("fstatfs is not available on this platform")
    buf = ctypes.create_string_buffer(_STATFS_BUF_BYTES)
    if _fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    words = (ctypes.c_long * 2).from_buffer(buf)
    return words[0] & 0xFFFFFFFF, int(words[1])


def verify_hugepages(fd: int) -> int:
    """Return the hugepage size backing ``fd`` or raise :class:`BackendError` (fail closed)."""
    try:
        f_type, f_bsize = fstatfs_type_and_bsize(fd)
    except OSError as exc:
        raise BackendError(Reason.HUGEPAGES_NOT_VERIFIED, f"cannot verify: {exc}") from None
    if f_type != HUGETLBFS_MAGIC:
        raise BackendError(
            Reason.HUGEPAGES_NOT_VERIFIED, f"filesystem type {f_type:#x} is not hugetlbfs"
        )
    if f_bsize <= PAGE_SIZE or f_bsize & (f_bsize - 1):
        raise BackendError(Reason.HUGEPAGES_NOT_VERIFIED, f"implausible hugepage size {f_bsize}")
    return f_bsize


def is_power_of_two(value: int) -> bool:
    return value > 0 and (value & (value - 1)) == 0


def validate_stride_bytes(
    stride_bytes: int, *, page_size: int = PAGE_SIZE, hugepage_size: int = 0
) -> None:
    """Apply the §15.22 stride rules; raise :class:`BackendError` naming the broken one."""
    if not is_power_of_two(stride_bytes):
        raise BackendError(Reason.STRIDE_BYTES_NOT_POWER_OF_TWO, str(stride_bytes))
    if stride_bytes % page_size:
        raise BackendError(
            Reason.STRIDE_BYTES_NOT_PAGE_MULTIPLE, f"{stride_bytes} % {page_size} != 0"
        )
    if hugepage_size and stride_bytes % hugepage_size:
        raise BackendError(
            Reason.STRIDE_BYTES_NOT_HUGEPAGE_MULTIPLE, f"{stride_bytes} % {hugepage_size} != 0"
        )
