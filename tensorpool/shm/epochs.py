"""Epoch directories on disk, once for every writer of regions (Wire Spec §15.2, §15.21a).

Both the standalone producer (``<base>/<namespace>/<instance>/epoch-<E>/``) and the driver
(``<base>/<namespace>/<instance>/stream-<id>/epoch-<E>/``) keep one directory per epoch next
to a ``last-epoch`` marker, the high-water mark that survives the directories' removal, so a
restart never reuses an epoch (§15.2, Driver Model §10). This module is the one place that
names, recognises and counts those directories; docs/architecture.md shows who uses it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil

__all__ = [
    "EPOCH_DIR_PREFIX",
    "LAST_EPOCH_FILE",
    "epoch_dirname",
    "epochs_in",
    "gc_epoch_dirs",
    "next_epoch",
    "parse_epoch_dirname",
    "read_last_epoch",
    "record_last_epoch",
]

EPOCH_DIR_PREFIX = "epoch-"
#: The per-directory high-water mark of epochs, kept next to the epoch directories.
LAST_EPOCH_FILE = "last-epoch"
#: Epochs are u64, never 0, written without leading zeros.
_EPOCH_DIR = re.compile(r"^epoch-([1-9][0-9]{0,19})$")
_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def epoch_dirname(epoch: int) -> str:
    return f"{EPOCH_DIR_PREFIX}{epoch}"


def parse_epoch_dirname(name: str) -> int | None:
    """``"epoch-7"`` → 7; anything else (leading zeros, 0, over u64) → None."""
    match = _EPOCH_DIR.fullmatch(name)
    if not match:
        return None
    value = int(match.group(1))
    return value if value < _U64_MAX else None


def epochs_in(directory: str) -> list[int]:
    """The epochs with a directory (not a symlink) in ``directory``, ascending."""
    epochs: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            epoch = parse_epoch_dirname(entry.name)
            if epoch is not None and entry.is_dir(follow_symlinks=False):
                epochs.append(epoch)
    return sorted(epochs)


def read_last_epoch(directory: str) -> int:
    """The ``last-epoch`` marker of ``directory`` (0 when absent or unreadable)."""
    try:
        with open(os.path.join(directory, LAST_EPOCH_FILE), encoding="ascii") as f:
            text = f.read(32).strip()
    except (OSError, UnicodeDecodeError):
        return 0
    return int(text) if text.isdigit() else 0


def record_last_epoch(directory: str, epoch: int, file_mode: int = 0o600) -> None:
    """Atomically replace the marker (temporary file, then rename; no symlink followed)."""
    final = os.path.join(directory, LAST_EPOCH_FILE)
    tmp = final + ".tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(tmp, flags, file_mode)
    try:
        os.write(fd, f"{epoch}\n".encode("ascii"))
    finally:
        os.close(fd)
    os.replace(tmp, final)


def next_epoch(directory: str) -> int:
    """One more than any epoch used in ``directory`` (directories and marker); 1 when none."""
    return max([read_last_epoch(directory), *epochs_in(directory)]) + 1


def gc_epoch_dirs(directory: str, keep: int) -> list[int]:
    """Remove all but the newest ``keep`` epoch directories of ``directory``; returns the
    epochs removed. Only names this module recognises are touched (it created them)."""
    epochs = epochs_in(directory)
    old = epochs[: max(0, len(epochs) - keep)]
    for epoch in old:
        shutil.rmtree(os.path.join(directory, epoch_dirname(epoch)), ignore_errors=True)
    return old
