"""Which host (and view of its files) planned a read, and whether a task sees the same (#16.3).

Shared memory is visible only on its own host, and only to processes whose mount namespace
shows the same ``shmBaseDir``. Spark plans a read on the driver (which must run on the
producer's host: it maps the rings to plan) and runs the tasks wherever it has executors.
Python data sources have no locality API, so an executor on another host -- or in another
container on the same host -- finds the planned region files missing (or finds other files
at the same path). Without a check that looks like data loss: "regions are gone (the producer
exited)" or, with ``failOnDataLoss=false``, an empty result.

Each partition therefore carries a :class:`PlanOrigin`: the planning host's
:class:`HostView` (host name, kernel boot id, mount namespace), the ``shmBaseDir`` and the
identity (``st_dev``/``st_ino``) of the header ring file the plan scanned. A task compares
before it reads (:func:`check_origin`):

* another kernel (boot id; the host name where ``/proc`` is not readable): the wrong host --
  :class:`TensorPoolWrongHostError`, whatever ``failOnDataLoss`` says (it is a deployment
  error, not data loss);
* same kernel, other mount namespace, and the header file missing or a different file: the
  same error, naming the namespaces (a container that does not share ``/dev/shm``);
* same kernel and the file missing or replaced in the *same* namespace: the producer exited
  or restarted -- ordinary data loss of the epoch's frames.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import dataclass
from typing import Final

#: :attr:`PlanOrigin.kind` of a ``spark.read`` snapshot / of a streaming micro-batch
BATCH: Final = "batch"
STREAM: Final = "stream"
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
MNT_NS_PATH: Final = "/proc/self/ns/mnt"


class TensorPoolWrongHostError(RuntimeError):
    """A task runs where the planned shared memory is not visible (another host or view)."""


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _mnt_ns() -> str:
    try:
        return os.readlink(MNT_NS_PATH)
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class HostView:
    """A process's host (name, kernel boot id) and mount namespace ('' = unknown)."""

    hostname: str
    boot_id: str
    mnt_ns: str

    @staticmethod
    def here() -> HostView:
        """This process's view (the mount namespace is read each time: it is per process)."""
        return HostView(_hostname(), _boot_id(), _mnt_ns())

    def same_kernel(self, other: HostView) -> bool:
        """Both run on one kernel (one host): boot ids equal, or host names where unknown."""
        if self.boot_id and other.boot_id:
            return self.boot_id == other.boot_id
        return self.hostname == other.hostname

    def same_view(self, other: HostView) -> bool:
        return self.same_kernel(other) and (
            not self.mnt_ns or not other.mnt_ns or self.mnt_ns == other.mnt_ns
        )

    def describe(self) -> str:
        parts = [f"host {self.hostname or '?'}"]
        if self.boot_id:
            parts.append(f"boot id {self.boot_id}")
        if self.mnt_ns:
            parts.append(f"mount namespace {self.mnt_ns}")
        return f"{parts[0]} ({', '.join(parts[1:])})" if len(parts) > 1 else parts[0]


@functools.cache
def _hostname() -> str:
    return socket.gethostname()


@functools.cache
def _boot_id() -> str:
    return _read(BOOT_ID_PATH)


@dataclass(frozen=True, slots=True)
class PlanOrigin:
    """Where and when a read was planned, and what it mapped (pickled into every partition).

    ``kind`` is ``"batch"`` (a ``spark.read`` snapshot) or ``"stream"`` (a micro-batch): loss
    messages explain a lost frame differently for each (#16.3).
    """

    view: HostView
    shm_base_dir: str
    header_path: str
    header_dev: int
    header_ino: int
    planned_at_ns: int  # wall clock (time.time_ns) when the plan was made
    kind: str

    @staticmethod
    def of(header_path: str, shm_base_dir: str, kind: str) -> PlanOrigin:
        """The origin of a plan that just mapped ``header_path`` (0/0 if it vanished since)."""
        try:
            st = os.stat(header_path)
            dev, ino = st.st_dev, st.st_ino
        except OSError:
            dev = ino = 0
        return PlanOrigin(
            HostView.here(), shm_base_dir, header_path, dev, ino, time.time_ns(), kind
        )

    def age_s(self) -> float:
        return max(0.0, (time.time_ns() - self.planned_at_ns) / 1e9)


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def wrong_host_message(stream_id: int, origin: PlanOrigin, here: HostView, detail: str) -> str:
    """One message: which host planned, which one reads, which directory, what to do."""
    return (
        f"tensorpool: stream {stream_id}: this Spark task runs on {here.describe()}, which "
        f"cannot see the producer's shared memory: the read was planned on "
        f"{origin.view.describe()}, where the stream's regions are under "
        f"{origin.shm_base_dir} ({detail}). Shared memory is only visible on its own host and "
        "mount namespace, and Python data sources cannot pin tasks to a host. Run the Spark "
        f"executors on {origin.view.hostname or 'the producer host'} with {origin.shm_base_dir} "
        "visible (local mode, or one Spark application per producer host; containers must "
        "share that directory), or bring the stream to the executors' host with the tensorpool "
        "bridge (a local producer there)."
    )


def check_origin(stream_id: int, origin: PlanOrigin | None) -> None:
    """Raise :class:`TensorPoolWrongHostError` when this process cannot see what was planned.

    Returns quietly when it can, or when the files are simply gone on the planning host's own
    view (the producer exited or restarted: the caller reports that as data loss).
    """
    if origin is None:
        return
    here = HostView.here()
    if not here.same_kernel(origin.view):
        raise TensorPoolWrongHostError(
            wrong_host_message(stream_id, origin, here, "another kernel: another host")
        )
    if here.same_view(origin.view) or origin.header_ino == 0:
        return
    seen = _file_id(origin.header_path)
    if seen == (origin.header_dev, origin.header_ino):
        return  # another namespace that shares the directory: fine
    what = "missing" if seen is None else "a different file"
    raise TensorPoolWrongHostError(
        wrong_host_message(
            stream_id,
            origin,
            here,
            f"same kernel, another mount namespace: the header ring {origin.header_path} is "
            f"{what} here",
        )
    )


__all__ = [
    "BATCH",
    "STREAM",
    "HostView",
    "PlanOrigin",
    "TensorPoolWrongHostError",
    "check_origin",
    "wrong_host_message",
]
