"""Directory safety: where tensorpool may create files, and which media driver dirs it may serve.

Deleting is privileged. Two rules live here, in one place, so every entry point applies the
same ones (issue #13.1):

1. **No system or shared roots.** A directory the project creates files in (a media driver's
   ``aeron_dir``, an SHM ``base_dir``, ...) must not be ``/``, ``$HOME``, ``/tmp``, ``/dev/shm``
   or another shared root, nor lie inside a system tree (``/etc``, ``/usr``, ``/proc``, ...).
   :func:`unsafe_root_reason` says why a path is refused; symlinks and ``..`` are resolved first,
   so ``/tmp/link -> /etc`` is refused as ``/etc``.

2. **A media driver directory must be ours to empty.** The Aeron C media driver deletes the
   directory it is given when no live driver heartbeats in it, *whatever*
   ``dir_delete_on_start`` says (measured with pyaeron 0.1.0: a sentinel file in the directory
   is gone after ``MediaDriver(dir_delete_on_start=False)``). So before a driver is started,
   :func:`classify_media_driver_dir` must find the directory absent, empty, or holding nothing
   but an Aeron layout, recognised by content, not by names (#30: ``echo precious > d/cnc.dat``
   was taken for Aeron's and deleted): a ``cnc.dat`` that is an Aeron CnC file
   (:func:`is_aeron_cnc`: CnC major version 0, non-zero, its five buffer lengths positive and
   within the file), and beside it only ``loss-report.dat`` and :data:`AERON_SUBDIRS` holding
   ``*.logbuffer`` files of at least three minimum terms; anything else is
   :attr:`DirState.FOREIGN` and refused. On shutdown only Aeron's own files are
   removed (:func:`remove_aeron_files`), and the directory itself only if this process created
   it. The check and the driver's start are not atomic: a file dropped into the directory in
   between is lost; that window is a few milliseconds and only the operator's own tools race it.

Nothing here imports the rest of tensorpool, so every layer (configs, transport, CLI, Spark
options) can use it.
"""

from __future__ import annotations

import enum
import os
import stat
import struct
from collections.abc import Mapping
from typing import Final

__all__ = [
    "AERON_FILES",
    "AERON_SUBDIRS",
    "CNC_FILE",
    "CNC_METADATA",
    "DirState",
    "UnsafeDirectory",
    "check_creatable_dir",
    "check_media_driver_dir",
    "classify_media_driver_dir",
    "is_aeron_cnc",
    "make_dirs",
    "missing_dirs",
    "remove_aeron_files",
    "remove_empty_dirs",
    "unsafe_root_reason",
    "world_writable_reason",
]

CNC_FILE: Final = "cnc.dat"
AERON_FILES: Final = frozenset({CNC_FILE, "loss-report.dat"})
"""Files an Aeron media driver creates at the top of its directory."""

CNC_METADATA: Final = struct.Struct("<6iqqq")
"""Aeron's CnC metadata (``aeron_cnc_metadata_t``, CnC version 0.2+): ``cnc_version``, the
to-driver, to-clients, counters-metadata, counters-values and error-log buffer lengths (int32),
then ``client_liveness_timeout``, ``start_timestamp`` and ``pid`` (int64)."""

CNC_MAJOR_VERSION: Final = 0
"""The CnC major version of the Aeron this project runs (``cnc_version`` is Aeron's semantic
version, ``major << 16 | minor << 8 | patch``; 0.2.0 today)."""

MIN_LOGBUFFER_BYTES: Final = 3 * 64 * 1024
"""A log buffer holds three terms of at least 64 KiB (Aeron's minimum term length)."""

AERON_SUBDIRS: Final = frozenset({"publications", "images"})
"""Sub-directories an Aeron media driver creates; they hold only ``*.logbuffer`` files."""

LOGBUFFER_SUFFIX: Final = ".logbuffer"

_SYSTEM_TREES: Final = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/proc",
    "/sys",
    "/dev",
)
"""Nothing may be created anywhere inside these (``/dev`` has the exceptions below)."""

_DEV_DATA_MOUNTS: Final = ("/dev/shm", "/dev/hugepages")
"""tmpfs / hugetlbfs mounts under /dev: their sub-directories are where SHM belongs."""

_SHARED_ROOTS: Final = frozenset(
    {
        "/",
        "/home",
        "/root",
        "/var",
        "/var/tmp",
        "/var/lib",
        "/var/log",
        "/var/run",
        "/var/cache",
        "/tmp",
        "/opt",
        "/srv",
        "/mnt",
        "/media",
        "/run",
        "/run/user",
        "/dev/shm",
        "/run/shm",
    }
)
"""Refused as the directory itself (a dedicated sub-directory of them is fine)."""


class UnsafeDirectory(ValueError):
    """A directory tensorpool must not create files in or serve a media driver from."""


class DirState(enum.Enum):
    """What a would-be media driver directory holds."""

    ABSENT = "absent"
    EMPTY = "empty"
    AERON = "aeron"
    """Only an Aeron layout (a live driver's, or one a killed driver left)."""
    FOREIGN = "foreign"
    """Anything else: never started on, never deleted."""


def _resolve(path: str) -> str:
    """Absolute, with symlinks and ``..`` resolved (missing tail components kept as written)."""
    return os.path.realpath(os.path.abspath(path))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def unsafe_root_reason(path: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why ``path`` must not hold files tensorpool creates, or None if it may.

    Refused: ``/`` and shared roots (``/tmp``, ``/dev/shm``, ``/home``, ``/var``, ...) as the
    directory itself, the home directory (``$HOME``) and any ``/home/<user>``, ``/run/user/<uid>``,
    and anything inside a system tree (``/etc``, ``/usr``, ``/proc``, ``/sys``, ``/dev`` except
    below ``/dev/shm`` and ``/dev/hugepages``). Checked on the resolved path.
    """
    environ = os.environ if env is None else env
    resolved = _resolve(path)
    shown = path if resolved == os.path.normpath(path) else f"{path} (resolves to {resolved})"
    if resolved in _SHARED_ROOTS:
        return f"{shown} is a shared system directory; use a dedicated sub-directory"
    home = environ.get("HOME")
    if home and home != "/" and resolved == _resolve(home):
        return f"{shown} is the home directory; use a dedicated sub-directory"
    parent = os.path.dirname(resolved)
    if parent in ("/home", "/run/user"):
        return f"{shown} is a user's home/runtime directory; use a dedicated sub-directory"
    if any(_within(resolved, m) for m in _DEV_DATA_MOUNTS):
        return None  # /dev/shm itself is a shared root, refused above
    for tree in _SYSTEM_TREES:
        if _within(resolved, tree):
            where = "is" if resolved == tree else "is inside"
            return f"{shown} {where} the system directory {tree}"
    return None


def check_creatable_dir(path: str, what: str) -> str:
    """Return ``path`` if tensorpool may create files in it; else raise UnsafeDirectory.

    ``what`` names the option or key in the message (``--dir``, ``shm.base_dir``...).
    """
    reason = unsafe_root_reason(path)
    if reason is not None:
        raise UnsafeDirectory(f"{what}: refusing {reason}")
    return path


def is_aeron_cnc(path: str) -> bool:
    """Whether ``path`` is an Aeron CnC file (not followed if a link): a regular file whose
    metadata has CnC major version :data:`CNC_MAJOR_VERSION` (non-zero: a driver writes the
    version last) and five positive buffer lengths that fit in the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        head = os.pread(fd, CNC_METADATA.size, 0) if stat.S_ISREG(st.st_mode) else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    if len(head) < CNC_METADATA.size:
        return False
    version, *lengths = CNC_METADATA.unpack(head)[:6]
    return (
        version > 0
        and version >> 16 == CNC_MAJOR_VERSION
        and all(n > 0 for n in lengths)
        and CNC_METADATA.size + sum(lengths) <= st.st_size
    )


def _foreign_entry(path: str) -> str | None:
    """The first entry of ``path`` that is not part of an Aeron layout, or None. Names prove
    nothing: without an Aeron ``cnc.dat`` every entry is foreign."""
    cnc = os.path.join(path, CNC_FILE)
    if not is_aeron_cnc(cnc):
        if os.path.lexists(cnc):
            return cnc
        with os.scandir(path) as entries:
            return next((entry.path for entry in entries), None)
    with os.scandir(path) as entries:
        for entry in entries:
            full = entry.path
            if entry.name in AERON_FILES:
                if not entry.is_file(follow_symlinks=False):
                    return full
            elif entry.name in AERON_SUBDIRS:
                if not entry.is_dir(follow_symlinks=False):
                    return full
                with os.scandir(full) as inner:
                    for item in inner:
                        if not (
                            item.name.endswith(LOGBUFFER_SUFFIX)
                            and item.is_file(follow_symlinks=False)
                            and item.stat(follow_symlinks=False).st_size >= MIN_LOGBUFFER_BYTES
                        ):
                            return item.path
            else:
                return full
    return None


def classify_media_driver_dir(path: str) -> tuple[DirState, str | None]:
    """Classify ``path`` as a media driver directory; for FOREIGN also return the culprit.

    A path that exists but is not a directory (or is a symlink to one) is FOREIGN: the driver
    would delete or replace it.
    """
    if not os.path.lexists(path):
        return DirState.ABSENT, None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return DirState.FOREIGN, path
    try:
        culprit = _foreign_entry(path)
    except OSError as exc:
        return DirState.FOREIGN, f"{path} ({exc.strerror or exc})"
    if culprit is not None:
        return DirState.FOREIGN, culprit
    with os.scandir(path) as entries:
        empty = next(entries, None) is None
    return (DirState.EMPTY if empty else DirState.AERON), None


def check_media_driver_dir(path: str, what: str = "media driver directory") -> DirState:
    """Refuse a directory a media driver must not start in; else return its state.

    Raises UnsafeDirectory (one line naming ``what`` and the path) for a system/shared root or
    a directory holding anything but an Aeron layout. Nothing is touched.
    """
    check_creatable_dir(path, what)
    state, culprit = classify_media_driver_dir(path)
    if state is DirState.FOREIGN:
        if culprit == path:
            detail = "it is not a directory"
        elif culprit == os.path.join(path, CNC_FILE):
            detail = f"it holds {culprit}, which is not an Aeron CnC file"
        else:
            detail = f"it holds {culprit}"
        raise UnsafeDirectory(
            f"{what}: refusing {path}: {detail}; a media driver directory must be absent, "
            "empty, or hold only an Aeron media driver's files (cnc.dat, loss-report.dat, "
            "publications/, images/)"
        )
    return state


def remove_aeron_files(path: str) -> bool:
    """Remove Aeron's own files from ``path`` (nothing else); True if ``path`` is now empty.

    Only :data:`AERON_FILES`, ``*.logbuffer`` files in :data:`AERON_SUBDIRS`, and those
    sub-directories once empty are removed; anything else stays where it is.
    """
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return True
    for entry in entries:
        try:
            if entry.name in AERON_FILES and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
            elif entry.name in AERON_SUBDIRS and entry.is_dir(follow_symlinks=False):
                for item in list(os.scandir(entry.path)):
                    if item.name.endswith(LOGBUFFER_SUFFIX) and item.is_file(follow_symlinks=False):
                        os.unlink(item.path)
                os.rmdir(entry.path)  # fails, and is kept, if anything else is inside
        except OSError:
            pass  # gone already, or not ours to remove: left in place
    try:
        with os.scandir(path) as rest:
            return next(rest, None) is None
    except FileNotFoundError:
        return True


def world_writable_reason(mode: int, allow: bool, allow_key: str) -> str | None:
    """Why ``mode`` is refused: any user could replace or corrupt the files (``o+w``)."""
    if mode & stat.S_IWOTH and not allow:
        return (
            f"{mode:o} makes files world-writable (any local user could rewrite frames); "
            f"set {allow_key} = true to allow it"
        )
    return None


def missing_dirs(path: str) -> list[str]:
    """``path`` and those of its ancestors that do not exist yet, deepest first: what creating
    it makes, and so the only directories its creator may remove again."""
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def make_dirs(path: str, mode: int) -> list[str]:
    """``mkdir -p`` giving every directory it creates exactly ``mode`` (the umask neither widens
    nor narrows it). Returns the directories it created, deepest first; one that another process
    made meanwhile is not ours and keeps its mode."""
    made: list[str] = []
    for d in reversed(missing_dirs(path)):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        os.chmod(d, mode)
        made.append(d)
    made.reverse()
    return made


def remove_empty_dirs(dirs: list[str] | tuple[str, ...]) -> None:
    """Remove directories this process created, deepest first, each only while it is empty:
    ``rmdir`` refuses a directory that holds anything, so nobody else's files are at risk."""
    for d in sorted(set(dirs), key=len, reverse=True):
        try:
            os.rmdir(d)
        except OSError:
            continue
