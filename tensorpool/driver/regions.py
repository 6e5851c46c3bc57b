"""The driver's file side: create epoch regions, keep them alive, retire them, find them again.

The sans-IO core decides *which* epoch gets files and *where* (:mod:`tensorpool.driver.streams`,
Wire Spec §15.21a layout ``<base>/<namespace>/<instance>/stream-<id>/epoch-<E>/``); this module
performs those decisions on disk:

* :meth:`RegionFiles.create` executes ``CreateRegions``: records the epoch in the stream's
  ``last-epoch`` marker *first* (so a crash half-way can never lead to the epoch being reused),
  then creates the header ring and every payload pool with
  :func:`tensorpool.shm.region.create_region` (path containment, ``O_EXCL|O_NOFOLLOW``,
  superblock written before anyone is told the URI), with the configured permissions. With
  ``policies.prefault_shm`` the files are allocated with ``posix_fallocate``: on tmpfs that
  both pre-allocates and zeroes every page, and — unlike touching pages through a mapping —
  fails with a clean ``ENOSPC`` instead of a ``SIGBUS`` when ``/dev/shm`` is full. A free-space
  check before anything is created gives the same answer earlier. With ``policies.mlock_shm``
  every mapping is ``mlock``-ed in the driver process and a failure is fatal (§17).
* :meth:`RegionFiles.refresh` stores ``activity_timestamp_ns`` in the superblocks of a
  stream's current epoch; the agent calls it with every announce, so the liveness rule of the
  Wire Spec holds even while no producer is attached (Driver Model §3).
* :meth:`RegionFiles.retire` executes ``RetireEpoch`` (epoch GC): the directory must be exactly
  an ``epoch-<E>`` directory inside this instance's tree before it is removed.
  :meth:`RegionFiles.reclaim_stream` executes ``ReclaimStream`` (an idle dynamic stream): it
  unmaps the stream's live epoch, then removes every epoch directory under the same checks; the
  ``last-epoch`` marker stays. :meth:`RegionFiles.free_bytes` is the ``statvfs`` figure the
  core's space reservation for configured streams uses.
* :func:`scan_epochs` is the start-up scan: per stream, the highest epoch ever used (from the
  epoch directories *and* the ``last-epoch`` marker, which survives GC and
  ``cleanup_shm_on_exit``) and the epoch directories still on disk. The core turns those into
  epoch floors, so epochs keep increasing across driver restarts (§10).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import shutil
import stat
from dataclasses import dataclass, field

from tensorpool.driver.actions import CreateRegions, ReclaimStream, RetireEpoch
from tensorpool.driver.config import DriverConfig
from tensorpool.driver.streams import (
    instance_root,
    parse_stream_dirname,
    stream_root,
)
from tensorpool.fsafety import make_dirs
from tensorpool.shm.backend import HUGETLBFS_MAGIC, fstatfs_type_and_bsize
from tensorpool.shm.epochs import (
    LAST_EPOCH_FILE,
    epochs_in,
    parse_epoch_dirname,
    read_last_epoch,
    record_last_epoch,
)
from tensorpool.shm.errors import NoSpaceError, ShmError
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import ShmRegion, create_region
from tensorpool.shm.superblock import SuperblockFields

__all__ = [
    "LAST_EPOCH_FILE",
    "DiskEpochs",
    "RegionError",
    "RegionFiles",
    "dir_mode_for",
    "probe_hugepage_size",
    "read_last_epoch",
    "scan_epochs",
]

log = logging.getLogger(__name__)


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def dir_mode_for(file_mode: int) -> int:
    """Directory mode matching a file mode: search permission wherever read is granted.

    ``"660"`` (group-shared files) gives ``0770`` directories; ``"600"`` gives ``0700``.
    """
    return file_mode | ((file_mode & 0o444) >> 2)


def probe_hugepage_size(path: str) -> int:
    """Hugepage size of the filesystem holding ``path`` (or its nearest existing parent); 0
    if it is not hugetlbfs or cannot be told."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return 0
        probe = parent
    try:
        fd = os.open(probe, os.O_RDONLY | _O_CLOEXEC)
    except OSError:
        return 0
    try:
        f_type, f_bsize = fstatfs_type_and_bsize(fd)
    except OSError:
        return 0
    finally:
        os.close(fd)
    return f_bsize if f_type == HUGETLBFS_MAGIC else 0


# --------------------------------------------------------------------------- start-up scan


@dataclass(frozen=True, slots=True)
class DiskEpochs:
    """What a previous driver left: per stream id, the epoch floor and the epoch dirs."""

    floors: dict[int, int] = field(default_factory=dict)
    known: dict[int, list[int]] = field(default_factory=dict)


def scan_epochs(config: DriverConfig) -> DiskEpochs:
    """Walk ``<base>/<namespace>/<instance>/stream-*/`` for epoch dirs and markers."""
    root = instance_root(config)
    floors: dict[int, int] = {}
    known: dict[int, list[int]] = {}
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return DiskEpochs()
    for entry in entries:
        stream_id = parse_stream_dirname(entry.name)
        if stream_id is None or not entry.is_dir(follow_symlinks=False):
            continue
        epochs = epochs_in(entry.path)
        floor = max([read_last_epoch(entry.path), *epochs])
        if floor:
            floors[stream_id] = floor
        if epochs:
            known[stream_id] = epochs
    return DiskEpochs(floors, known)


# --------------------------------------------------------------------------- files


class RegionError(Exception):
    """Creating an epoch's files failed; ``reason`` is a stable counter name."""

    def __init__(
        self, reason: str, detail: str, *, no_space: bool = False, fatal: bool = False
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.no_space = no_space
        self.fatal = fatal


def _load_mlock():  # type: ignore[no-untyped-def]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.mlock
    except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    fn.restype = ctypes.c_int
    return fn


_mlock = _load_mlock()


def _mlock_mapping(mm: mmap.mmap) -> None:
    """``mlock(2)`` a whole mapping; OSError on failure (or when mlock is unavailable)."""
    if _mlock is None:  # pragma: no cover
        raise OSError(errno.ENOSYS, "mlock is not available on this platform")
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        if _mlock(ctypes.addressof(anchor), len(mm)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        del anchor  # release the buffer export so the mapping can be closed later


@dataclass(slots=True)
class _Live:
    epoch: int
    regions: list[ShmRegion]


class RegionFiles:
    """Creates, refreshes and deletes the regions of one driver instance (single thread)."""

    def __init__(self, config: DriverConfig, *, hugepage_size: int = 0) -> None:
        self.config = config
        self._policy = PathPolicy(config.shm.allowed_base_dirs)
        self._file_mode = config.shm.permissions_mode
        self._dir_mode = dir_mode_for(config.shm.permissions_mode)
        self._prefault = config.policies.prefault_shm
        self._mlock = config.policies.mlock_shm
        self._hugepage_size = hugepage_size
        self._root = os.path.realpath(instance_root(config))
        self._live: dict[int, _Live] = {}
        self.created_epochs = 0
        self.deleted_epochs = 0
        self.truncated_regions = 0

    # ------------------------------------------------------------------ create

    def create(self, action: CreateRegions, now_ns: int) -> None:
        """Create every file of ``action.layout``; raise :class:`RegionError` on failure.

        Nothing of a failed epoch is left behind except its (burnt) number in the marker.
        """
        layout = action.layout
        needed = layout.header_size_bytes + sum(p.size_bytes for p in layout.payload_pools)
        self._check_space(needed)
        stream_dir = stream_root(self.config, action.stream_id)
        try:
            make_dirs(stream_dir, self._dir_mode)
            self._record_last_epoch(stream_dir, action.epoch)
        except OSError as exc:
            raise RegionError(
                "region_marker_failed", f"{stream_dir}: {exc}", no_space=_is_enospc(exc)
            ) from exc
        regions: list[ShmRegion] = []
        try:
            regions.append(
                self._create_one(
                    layout.header_path,
                    SuperblockFields.header_ring(
                        epoch=action.epoch,
                        stream_id=action.stream_id,
                        nslots=layout.header_nslots,
                        now_ns=now_ns,
                        layout_version=layout.layout_version,
                    ),
                    layout.hugepages,
                )
            )
            for pool in layout.payload_pools:
                regions.append(
                    self._create_one(
                        pool.path,
                        SuperblockFields.payload_pool(
                            epoch=action.epoch,
                            stream_id=action.stream_id,
                            pool_id=pool.pool_id,
                            nslots=pool.pool_nslots,
                            stride_bytes=pool.stride_bytes,
                            now_ns=now_ns,
                            layout_version=layout.layout_version,
                        ),
                        layout.hugepages,
                    )
                )
        except BaseException:
            for region in regions:
                region.close()
            shutil.rmtree(layout.directory, ignore_errors=True)
            raise
        previous = self._live.pop(action.stream_id, None)
        if previous is not None:
            _close_all(previous.regions)  # the old epoch stops being refreshed: it goes stale
        self._live[action.stream_id] = _Live(action.epoch, regions)
        self.created_epochs += 1

    def _create_one(self, path: str, superblock: SuperblockFields, hugepages: bool) -> ShmRegion:
        try:
            region = create_region(
                path,
                superblock,
                policy=self._policy,
                replace=True,
                prefault=False,
                require_hugepages=hugepages,
                dir_mode=self._dir_mode,
                file_mode=self._file_mode,
            )
        except ShmError as exc:
            raise RegionError(exc.reason, str(exc)) from exc
        except NoSpaceError as exc:  # #13.4: posix_fallocate said ENOSPC; the file is gone
            raise RegionError(exc.reason, str(exc), no_space=True) from exc
        except OSError as exc:
            raise RegionError(
                "region_create_failed", f"{path}: {exc}", no_space=_is_enospc(exc)
            ) from exc
        try:
            if self._prefault:
                self._allocate(region)
            if self._mlock:
                try:
                    _mlock_mapping(region.mmap)
                except OSError as exc:
                    raise RegionError(
                        "mlock_failed", f"mlock of {path} ({region.size} bytes): {exc}", fatal=True
                    ) from exc
        except BaseException:
            region.close()
            raise
        return region

    def _allocate(self, region: ShmRegion) -> None:
        """Reserve (and zero) every byte now, so a full tmpfs fails here and not later."""
        try:
            fd = os.open(region.path, os.O_RDWR | os.O_NOFOLLOW | _O_CLOEXEC)
        except OSError as exc:
            raise RegionError("region_create_failed", f"{region.path}: {exc}") from exc
        try:
            os.posix_fallocate(fd, 0, region.size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return  # the filesystem cannot pre-allocate; pages come on first touch
            raise RegionError(
                "region_allocate_failed",
                f"{region.path} ({region.size} bytes): {exc}",
                no_space=_is_enospc(exc),
            ) from exc
        finally:
            os.close(fd)

    def free_bytes(self) -> int | None:
        """Bytes free for this process under ``shm.base_dir`` (None: cannot be told)."""
        found = self._statvfs()
        return None if found is None else found[1]

    def _statvfs(self) -> tuple[str, int] | None:
        """(nearest existing directory of ``shm.base_dir``, bytes available there)."""
        probe = self.config.shm.base_dir
        while not os.path.exists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                return None
            probe = parent
        try:
            st = os.statvfs(probe)
        except OSError:
            return None
        if not st.f_blocks:  # no block accounting (some pseudo filesystems)
            return None
        return probe, st.f_bavail * st.f_frsize

    def _check_space(self, needed: int) -> None:
        found = self._statvfs()
        if found is None:
            return
        probe, available = found
        if available < needed:
            raise RegionError(
                "region_no_space",
                f"{needed} bytes needed, {available} available under {probe}",
                no_space=True,
            )

    def _record_last_epoch(self, stream_dir: str, epoch: int) -> None:
        record_last_epoch(stream_dir, epoch, self._file_mode)

    # ------------------------------------------------------------------ keep alive

    def refresh(self, stream_id: int, epoch: int, now_ns: int) -> int:
        """Store ``now_ns`` as the activity timestamp of the stream's current regions."""
        live = self._live.get(stream_id)
        if live is None or live.epoch != epoch:
            return 0
        refreshed = 0
        for region in live.regions:
            # #13.4: a file someone truncated must not be written (SIGBUS for the driver);
            # its superblock goes stale and clients unmap it on this very announce
            if region.truncated():
                self.truncated_regions += 1
                if self.truncated_regions & (self.truncated_regions - 1) == 0:
                    log.error("region %s was truncated under the driver", region.path)
                continue
            region.refresh_activity(now_ns)
            refreshed += 1
        return refreshed

    def live_epochs(self) -> dict[int, int]:
        """Stream id -> epoch whose files this process created and keeps alive."""
        return {sid: live.epoch for sid, live in self._live.items()}

    # ------------------------------------------------------------------ delete

    def retire(self, action: RetireEpoch) -> bool:
        """Remove one superseded epoch directory; False if it was already gone or refused."""
        live = self._live.get(action.stream_id)
        if live is not None and live.epoch == action.epoch:
            log.warning(
                "refusing to retire the live epoch %d of stream %d", action.epoch, action.stream_id
            )
            return False
        directory = action.directory
        if parse_epoch_dirname(os.path.basename(directory)) != action.epoch:
            log.warning("refusing to retire %s: not an epoch directory", directory)
            return False
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            log.warning("refusing to retire %s: not a directory", directory)
            return False
        canonical = os.path.realpath(directory)
        if os.path.commonpath([canonical, self._root]) != self._root or canonical == self._root:
            log.warning("refusing to retire %s: outside %s", directory, self._root)
            return False
        shutil.rmtree(canonical, ignore_errors=True)
        removed = not os.path.exists(canonical)
        if removed:
            self.deleted_epochs += 1
        return removed

    def reclaim_stream(self, action: ReclaimStream) -> int:
        """Unmap the stream's live epoch and remove each epoch directory; returns how many.

        The mapping must go first: tmpfs frees a deleted file's pages only once nothing
        maps it any more.
        """
        live = self._live.pop(action.stream_id, None)
        if live is not None:
            _close_all(live.regions)
        return sum(
            self.retire(RetireEpoch(action.stream_id, epoch, directory))
            for epoch, directory in zip(action.epochs, action.directories, strict=True)
        )

    def remove_all_epochs(self) -> int:
        """``cleanup_shm_on_exit``: delete every epoch directory of this instance.

        The ``last-epoch`` markers stay, so the next driver still starts above them.
        """
        self.close()
        removed = 0
        try:
            streams = list(os.scandir(self._root))
        except FileNotFoundError:
            return 0
        for entry in streams:
            if parse_stream_dirname(entry.name) is None or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for sub in os.scandir(entry.path):
                    if parse_epoch_dirname(sub.name) is not None and sub.is_dir(
                        follow_symlinks=False
                    ):
                        shutil.rmtree(sub.path, ignore_errors=True)
                        removed += 1
        self.deleted_epochs += removed
        return removed

    def close(self) -> None:
        """Unmap everything (files stay)."""
        for live in self._live.values():
            _close_all(live.regions)
        self._live.clear()


def _close_all(regions: list[ShmRegion]) -> None:
    for region in regions:
        region.close()


def _is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM)
