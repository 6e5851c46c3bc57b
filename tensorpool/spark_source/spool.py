"""Read-time loss reports from executors to the reader on the Spark driver (same host).

Executors find frames overwritten between planning and reading; with ``failOnDataLoss=false``
the count must reach the next offset (``lostLate``), but a task cannot talk to the driver-side
reader. Executors run on the SHM host, so each task drops a small JSON file into a per-reader
directory under ``<shmBaseDir>/.spark-loss/``; the reader folds the files into its next offset
and removes them only once an offset records them. Written with a temp file + rename so a
reader never sees half a record. Directories of readers that died without ``stop()`` are
removed by the next reader.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Sequence

log = logging.getLogger("tensorpool.spark_source")


def make_spool(shm_base_dir: str, kind: str = "") -> str:
    """A fresh spool directory ``<pid>-[<kind>-]<random>``, after clearing dead readers' ones."""
    root = os.path.join(shm_base_dir, ".spark-loss")
    os.makedirs(root, mode=0o700, exist_ok=True)
    for name in os.listdir(root):
        pid = name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tag = f"{kind}-" if kind else ""
    path = os.path.join(root, f"{os.getpid()}-{tag}{uuid.uuid4().hex[:12]}")
    os.mkdir(path, 0o700)
    return path


def remove_spool(spool: str | None) -> None:
    if spool is not None:
        shutil.rmtree(spool, ignore_errors=True)


def report(spool: str, stream_id: int, epoch: int, count: int) -> None:
    """Executor side: record ``count`` frames of ``stream_id`` lost at reading."""
    try:
        fd, tmp = tempfile.mkstemp(dir=spool, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"stream": stream_id, "epoch": epoch, "count": count}, f)
        name = f"{stream_id}-{epoch}-{os.getpid()}-{uuid.uuid4().hex}.json"
        os.replace(tmp, os.path.join(spool, name))
    except OSError as exc:  # the spool vanished (query stopped): the log line remains
        log.warning("tensorpool: could not report loss to %s: %s", spool, exc)


def collect(spool: str | None, streams: Sequence[int]) -> tuple[dict[int, int], list[str]]:
    """Driver side: loss counts per stream, and the files holding them (see :func:`forget`)."""
    late: dict[int, int] = {}
    paths: list[str] = []
    if spool is None:
        return late, paths
    try:
        names = os.listdir(spool)
    except FileNotFoundError:
        return late, paths
    for name in sorted(names):
        if name.startswith("."):
            continue
        path = os.path.join(spool, name)
        try:
            with open(path) as f:
                rec = json.load(f)
            sid, n = int(rec["stream"]), int(rec["count"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        paths.append(path)
        if sid in streams and n > 0:
            late[sid] = late.get(sid, 0) + n
    return late, paths


def forget(paths: Iterable[str]) -> None:
    """Remove reports once an offset has recorded them."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["collect", "forget", "make_spool", "remove_spool", "report"]
