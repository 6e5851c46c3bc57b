"""Path containment for announced regions (§15.21a.5), including the TOCTOU defence.

A consumer maps files named by a remote party, so it must not be talked into mapping
``/etc/shadow`` through a symlink, blocking forever on a FIFO, or mapping a file that was swapped
between the check and the open. The six steps of §15.21a.5, in order:

1. the announced path is absolute;
2. it is resolved to its canonical form (``os.path.realpath``, strict: it must exist);
3. the allowed base directories were canonicalised once, when the :class:`PathPolicy` was built;
4. the canonical path lies inside one of them — compared by path components
   (``os.path.commonpath``), never by string prefix, so ``/base2/x`` is not inside ``/base``;
5. the canonical path is a regular file (FIFOs, sockets, devices, directories are refused);
6. it is opened with ``O_NOFOLLOW`` (and ``O_NONBLOCK`` so a FIFO swapped in cannot block us), and
   the opened descriptor is ``fstat``-ed: it must be a regular file with the same
   ``(st_dev, st_ino)`` as the file validated in step 5. Only then may it be mapped.

``O_NOFOLLOW`` guards the last component; a directory component swapped for a symlink after
validation is caught by the identity check because it would lead to a different inode.
Any failure raises :class:`PathRejected` with a stable reason and nothing is mapped.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from tensorpool.counters import Reason
from tensorpool.shm.errors import PathRejected

if not hasattr(os, "O_NOFOLLOW"):  # pragma: no cover - POSIX only
    raise ImportError("tensorpool.shm needs O_NOFOLLOW (POSIX); the platform cannot open safely")

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class ValidatedPath:
    """A path that passed steps 1-5, with the identity the opened file must still have."""

    announced: str
    canonical: str
    st_dev: int
    st_ino: int
    st_size: int


def _describe_mode(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISLNK, "symlink"),
    ):
        if test(mode):
            return name
    return "non-regular file"


class PathPolicy:
    """The allow-list of base directories, canonicalised once (§15.21a.5 step 3).

    An empty list allows nothing: containment is mandatory "even in trusted deployments".
    """

    __slots__ = ("_bases",)

    def __init__(self, allowed_base_dirs: Iterable[str | os.PathLike[str]]) -> None:
        bases: list[str] = []
        for base in allowed_base_dirs:
            text = os.fspath(base)
            if not os.path.isabs(text):
                raise ValueError(f"allowed base dir must be absolute: {text!r}")
            canonical = os.path.realpath(text)
            if canonical not in bases:
                bases.append(canonical)
        self._bases: tuple[str, ...] = tuple(bases)

    @property
    def allowed_base_dirs(self) -> tuple[str, ...]:
        return self._bases

    def contains(self, canonical_path: str) -> bool:
        """True when ``canonical_path`` lies strictly below one of the base directories."""
        for base in self._bases:
            try:
                if canonical_path != base and os.path.commonpath([canonical_path, base]) == base:
                    return True
            except ValueError:  # mixed absolute/relative or different drives
                continue
        return False

    def validate(self, path: str) -> ValidatedPath:
        """Steps 1-5: absolute, canonical, contained, regular file. Raises :class:`PathRejected`."""
        if not isinstance(path, str) or not os.path.isabs(path):
            raise PathRejected(Reason.PATH_NOT_ABSOLUTE, repr(path))
        try:
            canonical = os.path.realpath(path, strict=True)
        except OSError as exc:
            raise PathRejected(Reason.PATH_NOT_FOUND, f"{path}: {exc.strerror}") from None
        if not self.contains(canonical):
            raise PathRejected(
                Reason.PATH_OUTSIDE_ALLOWED_BASE,
                f"{path} resolves to {canonical}, outside {list(self._bases)}",
            )
        try:
            st = os.lstat(canonical)
        except OSError as exc:
            raise PathRejected(Reason.PATH_NOT_FOUND, f"{canonical}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise PathRejected(
                Reason.PATH_NOT_REGULAR_FILE, f"{canonical} is a {_describe_mode(st.st_mode)}"
            )
        return ValidatedPath(path, canonical, st.st_dev, st.st_ino, st.st_size)

    def open_validated(self, validated: ValidatedPath, *, writable: bool = False) -> int:
        """Step 6: no-follow open of the canonical path, then identity re-check on the fd.

        Returns an open file descriptor (the caller owns it) or raises :class:`PathRejected`.
        """
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
        flags |= _O_CLOEXEC
        try:
            fd = os.open(validated.canonical, flags)
        except OSError as exc:
            raise PathRejected(
                Reason.PATH_OPEN_FAILED, f"{validated.canonical}: {exc.strerror}"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PathRejected(
                    Reason.PATH_NOT_REGULAR_FILE,
                    f"{validated.canonical} opened as a {_describe_mode(st.st_mode)}",
                )
            if st.st_dev != validated.st_dev or st.st_ino != validated.st_ino:
                raise PathRejected(
                    Reason.PATH_IDENTITY_CHANGED,
                    f"{validated.canonical} changed between validation and open",
                )
            # Regular files ignore O_NONBLOCK, but clear it so later I/O behaves normally.
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open(self, path: str, *, writable: bool = False) -> tuple[int, ValidatedPath]:
        """All six steps; returns ``(fd, validated)``."""
        validated = self.validate(path)
        return self.open_validated(validated, writable=writable), validated
