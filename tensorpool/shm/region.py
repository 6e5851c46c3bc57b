"""Region files: create them (producer/driver side), map them (consumer side), unmap them.

Creating (§15.14, §15.21a.3, §15.21a.6): directories ``0700`` and files ``0600`` (the private
profile; callers may pass the shared-group modes), opened ``O_CREAT|O_EXCL|O_NOFOLLOW`` so a
planted symlink or a leftover file is never written through. ``replace=True`` unlinks a previous
file first — a new inode, so processes still mapping the old epoch keep their (now orphaned)
copy instead of seeing it truncated under them. The file is sized with ``ftruncate``, mapped,
its superblock written and flushed, and optionally prefaulted.

Running out (issue #13.4): sizes the wire cannot express (u32 ``stride_bytes``/``nslots``) are
refused before anything is created, and every file is reserved with ``posix_fallocate`` before
it is mapped. On tmpfs a page that cannot be backed is otherwise only discovered when it is first
written — as a ``SIGBUS`` in the producer, with the tmpfs left full. ``posix_fallocate`` fails
with ``ENOSPC`` instead (:class:`NoSpaceError`), and the half-made file is removed.
:func:`check_space` gives the same answer for a whole epoch before its first file exists.

Mapping (§15.21a.5, §15.22, §15.1): parse the URI, run the six-step path containment and open,
verify hugepages if required, read the superblock with ``pread`` and validate it against the
announce *before* mapping, check the file is large enough, check the stride rules, then map
exactly the announced size read-only (consumers) or read-write (the single writer).

Shrinking (issue #13.4): a mapped file that someone truncates makes every access past its new end
a ``SIGBUS`` in every process mapping it. :meth:`ShmRegion.truncated` compares the file's current
size (``fstat`` of the mapping's own descriptor) with the mapped length, so clients can check on
every announce and unmap before touching it. Private file modes (no group/world write) keep
other users from truncating in the first place.

Unmapping: numpy views handed out over a region export its buffer; ``mmap.close()`` refuses
(``BufferError``) while any exist. :meth:`ShmRegion.close` therefore drops the region's own
references and, if views are still alive, leaves the unmap to the mmap object's finaliser, which
runs when the last view dies. The file descriptor is closed right after mapping (mmap keeps its
own duplicate), so a lingering view never leaks a descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tensorpool.counters import Reason
from tensorpool.fsafety import make_dirs
from tensorpool.shm.backend import PAGE_SIZE, validate_stride_bytes, verify_hugepages
from tensorpool.shm.errors import (
    NoSpaceError,
    PathRejected,
    ShmError,
    SuperblockError,
    WireLimitError,
)
from tensorpool.shm.layout import (
    MAX_NSLOTS,
    MAX_STRIDE_BYTES,
    SUPERBLOCK_SIZE,
    RegionType,
)
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.superblock import (
    ExpectedRegion,
    SuperblockFields,
    check_fresh,
    read_activity,
    read_superblock,
    refresh_activity,
    validate_superblock,
    write_superblock,
)
from tensorpool.shm.uri import ShmUri, parse_shm_uri

PRIVATE_DIR_MODE: Final = 0o700
PRIVATE_FILE_MODE: Final = 0o600
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

HEADER_RING_FILENAME: Final = "header.ring"


def dir_mode_for(file_mode: int) -> int:
    """Directory mode matching a file mode: search permission wherever read is granted.

    ``0o660`` (group-shared files) gives ``0o770`` directories; ``0o600`` gives ``0o700``.
    """
    return file_mode | ((file_mode & 0o444) >> 2)


def payload_pool_filename(pool_id: int) -> str:
    return f"payload-{pool_id}.pool"


@dataclass(frozen=True, slots=True)
class EpochLayout:
    """§15.21a.3: ``<base>/<namespace>/<producer_instance_id>/epoch-<E>/`` and its files.

    Producers use it to decide where to create files; consumers never derive paths (§15.21a.4),
    they map exactly what is announced.
    """

    base_dir: str
    namespace: str
    producer_instance_id: str
    epoch: int

    def __post_init__(self) -> None:
        if not os.path.isabs(self.base_dir):
            raise ValueError(f"shm_base_dir must be absolute: {self.base_dir!r}")
        for name, part in (
            ("namespace", self.namespace),
            ("producer_instance_id", self.producer_instance_id),
        ):
            if not part or part in (".", "..") or "/" in part or "\0" in part:
                raise ValueError(f"{name} must be a single path component: {part!r}")
        if self.epoch < 0:
            raise ValueError("epoch must be non-negative")

    @property
    def directory(self) -> str:
        return os.path.join(
            self.base_dir, self.namespace, self.producer_instance_id, f"epoch-{self.epoch}"
        )

    @property
    def header_path(self) -> str:
        return os.path.join(self.directory, HEADER_RING_FILENAME)

    def pool_path(self, pool_id: int) -> str:
        return os.path.join(self.directory, payload_pool_filename(pool_id))


class ShmRegion:
    """One mapped region (header ring or payload pool) and what its superblock says."""

    __slots__ = ("_closed", "_mm", "_words", "path", "superblock", "uri", "writable")

    def __init__(
        self,
        mm: mmap.mmap,
        *,
        path: str,
        superblock: SuperblockFields,
        writable: bool,
        uri: ShmUri | None = None,
    ) -> None:
        self._mm: mmap.mmap | None = mm
        self._words: memoryview | None = memoryview(mm).cast("Q")
        self._closed = False
        self.path = path
        self.superblock = superblock
        self.writable = writable
        self.uri = uri

    # --- accessors -------------------------------------------------------------------------------
    @property
    def mmap(self) -> mmap.mmap:
        if self._mm is None:
            raise ValueError(f"region {self.path} is closed")
        return self._mm

    @property
    def words(self) -> memoryview:
        """The region as aligned u64 words: the only safe way to touch 8-byte atomic fields."""
        if self._words is None:
            raise ValueError(f"region {self.path} is closed")
        return self._words

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        return len(self.mmap)

    @property
    def region_type(self) -> int:
        return self.superblock.region_type

    @property
    def is_header_ring(self) -> bool:
        return self.superblock.region_type == RegionType.HEADER_RING

    @property
    def nslots(self) -> int:
        return self.superblock.nslots

    @property
    def pool_id(self) -> int:
        return self.superblock.pool_id

    @property
    def stride_bytes(self) -> int:
        return self.superblock.stride_bytes

    @property
    def epoch(self) -> int:
        return self.superblock.epoch

    # --- size ------------------------------------------------------------------------------------
    def file_size(self) -> int:
        """The mapped file's size now: ``fstat`` of the mapping's own descriptor (the inode we
        map, even if the path was replaced since)."""
        return self.mmap.size()

    def truncated(self) -> bool:
        """True if the file shrank below the mapped length: touching the tail would ``SIGBUS``.

        One ``fstat``; call it before trusting the mapping again (clients do on every announce).
        """
        mm = self._mm
        if mm is None:
            return False
        try:
            return mm.size() < len(mm)
        except (OSError, ValueError):
            return True  # cannot tell: treat as unsafe

    # --- liveness --------------------------------------------------------------------------------
    def refresh_activity(self, now_ns: int) -> None:
        """Producer heartbeat (§7.1): one aligned 8-byte store."""
        if not self.writable:
            raise PermissionError(f"region {self.path} is mapped read-only")
        refresh_activity(self.words, now_ns)

    def activity_timestamp_ns(self) -> int:
        return read_activity(self.words)

    def current_superblock(self) -> SuperblockFields:
        """Re-read the live superblock (e.g. to compare ``pid`` or ``epoch`` on announce)."""
        return read_superblock(self.mmap)

    # --- teardown --------------------------------------------------------------------------------
    def close(self) -> bool:
        """Release the mapping. Returns False when live numpy views defer the unmap to GC."""
        if self._closed:
            return True
        self._closed = True
        mm, self._mm = self._mm, None
        words, self._words = self._words, None
        if words is not None:
            words.release()
        if mm is None:
            return True
        try:
            mm.close()
        except BufferError:
            # Views exported to callers keep the pages alive; the mmap object unmaps itself
            # when the last of them is collected. Nothing else holds it after this method.
            return False
        return True

    def __enter__(self) -> ShmRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "header" if self.is_header_ring else f"pool {self.pool_id}"
        state = "closed" if self._closed else ("rw" if self.writable else "ro")
        return f"ShmRegion({kind}, {self.path!r}, nslots={self.nslots}, {state})"


# --- producer side ----------------------------------------------------------------------
def _prefault(mm: mmap.mmap) -> None:
    advice = getattr(mmap, "MADV_POPULATE_WRITE", None)
    if advice is not None:
        try:
            mm.madvise(advice)
            return
        except OSError:
            pass
    view = memoryview(mm)
    try:
        for off in range(PAGE_SIZE, len(mm), PAGE_SIZE):
            view[off] = view[off]  # touch each page after the superblock's
    finally:
        view.release()


def check_wire_limits(superblock: SuperblockFields) -> None:
    """Refuse a region the wire cannot describe, before any file exists.

    ``stride_bytes`` and ``nslots`` are u32 on the wire and powers of two (so at most 2**31),
    and every superblock field must fit its encoded width: an unencodable value used to fail
    only after an (up to 8 TiB, sparse) file had been created.
    """
    if superblock.nslots > MAX_NSLOTS:
        raise WireLimitError(
            Reason.WIRE_LIMIT_EXCEEDED,
            f"nslots {superblock.nslots} exceeds the wire limit {MAX_NSLOTS} (u32, power of two)",
        )
    if superblock.stride_bytes > MAX_STRIDE_BYTES:
        raise WireLimitError(
            Reason.WIRE_LIMIT_EXCEEDED,
            f"stride_bytes {superblock.stride_bytes} exceeds the wire limit {MAX_STRIDE_BYTES} "
            "(u32, power of two)",
        )
    try:
        write_superblock(bytearray(SUPERBLOCK_SIZE), superblock)  # the real encoder, dry run
    except struct.error as exc:
        raise WireLimitError(
            Reason.WIRE_LIMIT_EXCEEDED, f"superblock {superblock}: {exc}"
        ) from None


def existing_ancestor(path: str) -> str:
    """``path`` or its nearest existing parent (where a statvfs can be asked)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still allocate on the filesystem holding ``path`` (or
    its nearest existing parent); None if the filesystem does not say."""
    try:
        st = os.statvfs(existing_ancestor(path))
    except OSError:
        return None
    if not st.f_blocks:  # pseudo filesystems report zeros: no answer
        return None
    return st.f_bavail * st.f_frsize


def check_space(directory: str, needed: int, what: str) -> None:
    """Raise :class:`NoSpaceError` (one line: needed and free bytes) when ``needed`` bytes do
    not fit the free space under ``directory``. Advisory (another writer may take the space
    meanwhile); :func:`create_region`'s ``posix_fallocate`` is the authoritative check."""
    free = free_bytes(directory)
    if free is not None and needed > free:
        raise NoSpaceError(
            f"needs {needed} bytes for {what}, {existing_ancestor(directory)} has {free} free",
            needed=needed,
            free=free,
        )


def _allocate(fd: int, size: int, path: str) -> None:
    """Reserve every byte of the file now (tmpfs: allocate and zero the pages)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return  # the filesystem cannot pre-allocate: pages come on first touch
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = free_bytes(os.path.dirname(path))
            raise NoSpaceError(
                f"needs {size} bytes for {path}, {os.path.dirname(path)} has "
                f"{'unknown' if free is None else free} free",
                needed=size,
                free=free or 0,
            ) from None
        raise


def create_region(
    path: str,
    superblock: SuperblockFields,
    *,
    policy: PathPolicy | None = None,
    replace: bool = False,
    prefault: bool = False,
    require_hugepages: bool = False,
    dir_mode: int = PRIVATE_DIR_MODE,
    file_mode: int = PRIVATE_FILE_MODE,
    allocate: bool = True,
) -> ShmRegion:
    """Create, size and map a region file and write its superblock (writer side).

    ``policy`` (recommended) confines creation to the allowed base directories, the same rule
    consumers will apply. Payload pool strides are checked against §15.22 and the wire's
    limits before anything is created; with ``require_hugepages`` the new file must turn out to
    live on hugetlbfs. ``allocate`` reserves the whole file with ``posix_fallocate`` so a full
    filesystem is a :class:`NoSpaceError` here (the file removed) rather than a ``SIGBUS`` at
    the first write.
    """
    if not os.path.isabs(path):
        raise PathRejected(Reason.PATH_NOT_ABSOLUTE, repr(path))
    check_wire_limits(superblock)
    is_pool = superblock.region_type == RegionType.PAYLOAD_POOL
    if is_pool:
        validate_stride_bytes(superblock.stride_bytes)
    if superblock.nslots <= 0 or superblock.nslots & (superblock.nslots - 1):
        raise SuperblockError(Reason.SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO, str(superblock.nslots))
    # Resolve (non-strictly: missing directories are fine) and check containment *before*
    # creating anything, then create the directories at the canonical location.
    directory = os.path.realpath(os.path.dirname(path))
    canonical = os.path.join(directory, os.path.basename(path))
    if policy is not None and not policy.contains(canonical):
        raise PathRejected(Reason.PATH_OUTSIDE_ALLOWED_BASE, f"{path} -> {canonical}")
    make_dirs(directory, dir_mode)
    if replace:
        try:
            st = os.lstat(canonical)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode):
                raise PathRejected(Reason.PATH_NOT_REGULAR_FILE, f"{canonical} is a directory")
            os.unlink(canonical)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(canonical, flags, file_mode)
    try:
        os.fchmod(fd, file_mode)
        size = superblock.region_bytes
        if require_hugepages:
            hugepage = verify_hugepages(fd)
            if is_pool:
                validate_stride_bytes(superblock.stride_bytes, hugepage_size=hugepage)
            size = -(-size // hugepage) * hugepage  # hugetlbfs files grow in whole pages
        os.ftruncate(fd, size)
        if allocate:
            _allocate(fd, size, canonical)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(canonical)
        raise
    os.close(fd)
    write_superblock(mm, superblock)
    mm.flush(0, PAGE_SIZE if len(mm) >= PAGE_SIZE else len(mm))
    if prefault:
        _prefault(mm)
    return ShmRegion(mm, path=canonical, superblock=superblock, writable=True)


# --- consumer side ----------------------------------------------------------------------
def map_region(
    uri: str | ShmUri,
    expected: ExpectedRegion,
    policy: PathPolicy,
    *,
    writable: bool = False,
    require_hugepages: bool = False,
    now_ns: int | None = None,
    freshness_window_ns: int | None = None,
    page_size: int = PAGE_SIZE,
) -> ShmRegion:
    """Validate and map an announced region; raise a :class:`ShmError` subclass on any failure.

    ``require_hugepages`` forces hugepage verification even if the URI does not ask for it
    (a deployment-wide policy). Pass ``now_ns`` and ``freshness_window_ns`` to also reject a
    region whose producer heartbeat is stale (§15.1).
    """
    parsed = uri if isinstance(uri, ShmUri) else parse_shm_uri(uri)
    fd, validated = policy.open(parsed.path, writable=writable)
    try:
        hugepage = 0
        if parsed.require_hugepages or require_hugepages:
            hugepage = verify_hugepages(fd)
        file_size = os.fstat(fd).st_size
        if file_size < SUPERBLOCK_SIZE:
            raise SuperblockError(Reason.REGION_TOO_SMALL, f"{file_size} bytes")
        raw = os.pread(fd, SUPERBLOCK_SIZE, 0)
        fields = read_superblock(raw)
        validate_superblock(fields, expected)
        if not expected.is_header_ring:
            validate_stride_bytes(fields.stride_bytes, page_size=page_size, hugepage_size=hugepage)
        size = expected.region_bytes
        if file_size < size:
            raise SuperblockError(Reason.REGION_TOO_SMALL, f"{file_size} < {size} bytes")
        if now_ns is not None and freshness_window_ns is not None:
            check_fresh(fields, now_ns, freshness_window_ns)
        if hugepage:
            # hugetlbfs mappings come in whole hugepages; map the rounded length when present.
            rounded = -(-size // hugepage) * hugepage
            if file_size >= rounded:
                size = rounded
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)
    return ShmRegion(mm, path=validated.canonical, superblock=fields, writable=writable, uri=parsed)


def try_map_region(
    uri: str | ShmUri,
    expected: ExpectedRegion,
    policy: PathPolicy,
    on_reject: Callable[[ShmError], None] | None = None,
    **kwargs: object,
) -> ShmRegion | None:
    """:func:`map_region` that returns None (after ``on_reject``) instead of raising."""
    try:
        return map_region(uri, expected, policy, **kwargs)  # type: ignore[arg-type]
    except ShmError as exc:
        if on_reject is not None:
            on_reject(exc)
        return None
