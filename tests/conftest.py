"""Session-wide leak check (issue #13.6): after the suite, nothing it started or created remains.

* Processes: at session start every child of this pytest process (the Spark JVM and its Python
  workers, media drivers, role processes, their children) inherits ``TENSORPOOL_TEST_SESSION=<a
  fresh id>``. After the last fixture is torn down, any live process whose initial environment
  (``/proc/<pid>/environ``) carries that id is a leak: it gets a grace period to exit (shutdowns
  are asynchronous), then the session fails, naming it, and it is killed (SIGKILL) so that
  nothing stays.
* ``/dev/shm``: entries that appear during the session, with a name the tests use
  (``tp-``, ``tensorpool-``, ``aeron-``, and named semaphores ``sem.tp-``/``sem.tensorpool-``),
  and still exist at the end, fail the session (they are reported, not removed: nothing
  proves this session created them).

Limit: ``/dev/shm`` is shared by every run on the host; an entry created meanwhile by another
test run (or a demo) is reported too. ``TENSORPOOL_LEAK_CHECK=0`` turns the check off (e.g. for
concurrent runs on one host), ``TENSORPOOL_LEAK_CHECK=processes`` checks processes only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

SESSION_ENV = "TENSORPOOL_TEST_SESSION"
SWITCH_ENV = "TENSORPOOL_LEAK_CHECK"
SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("tp-", "tensorpool-", "aeron-", "sem.tp-", "sem.tensorpool-")
"""``sem.*``: POSIX named semaphores (the consumers' wake semaphores, transport/wakeup.py)."""
GRACE_S = 15.0  # a stopped JVM's workers notice within a second; a media driver within a few

_state: dict[str, object] = {}


def _mode() -> str:
    """``all`` (default), ``processes`` or ``off`` from ``TENSORPOOL_LEAK_CHECK``."""
    v = os.environ.get(SWITCH_ENV, "1").strip().lower()
    if v in ("0", "off", "no", "false"):
        return "off"
    return "processes" if v == "processes" else "all"


def _shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def marked_processes(marker: str) -> dict[int, str]:
    """Live processes (not this one) whose initial environment carries ``marker``: pid -> cmd."""
    needle = f"{SESSION_ENV}={marker}".encode()
    me = os.getpid()
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            env = (proc / "environ").read_bytes()
            if needle not in env.split(b"\0"):
                continue
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie has released everything; its parent reaps it
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        out[int(proc.name)] = cmd.strip()[:160]
    return out


def _others(name: str, marker: str) -> bool:
    """Whether ``name`` (``tensorpool-aeron-<pid>-...``, a media driver's directory) belongs to a
    live process of another session: its pid is alive and does not carry our marker."""
    parts = name.split("-")
    if len(parts) < 4 or parts[:2] != ["tensorpool", "aeron"] or not parts[2].isdigit():
        return False
    pid = int(parts[2])
    if pid == os.getpid():
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False  # gone: whoever it was, the directory is left behind
    return f"{SESSION_ENV}={marker}".encode() not in env.split(b"\0")


def pytest_sessionstart(session: pytest.Session) -> None:
    mode = _mode()
    _state["mode"] = mode
    if mode == "off":
        return
    marker = uuid.uuid4().hex
    _state["marker"] = marker
    os.environ[SESSION_ENV] = marker  # inherited by every process the tests start
    _state["shm"] = _shm_entries()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Runs after the last fixture (the SparkSession, the media drivers) was torn down."""
    marker = _state.get("marker")
    if not isinstance(marker, str):
        return
    deadline = time.monotonic() + GRACE_S
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked_processes(marker)
    problems = [f"process {pid} still running: {cmd}" for pid, cmd in sorted(left.items())]
    for pid in left:  # started by this session (the marker proves it): nothing may stay
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    before = _state.get("shm")
    if _state.get("mode") == "all" and isinstance(before, set):
        new = sorted(n for n in _shm_entries() - before if not _others(n, marker))
        problems += [f"{SHM_DIR / n} was created during the session and not removed" for n in new]
    if not problems:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        *problems,
        f"(killed the processes; {SWITCH_ENV}=0 turns this check off, e.g. for concurrent runs)",
    ]
    if reporter is not None:
        reporter.write_sep("=", "leak check failed (issue #13.6: nothing is left behind)", red=True)
        for line in lines:
            reporter.write_line(line)
    else:  # pragma: no cover - pytest without its terminal (-p no:terminal)
        print("\n".join(["leak check failed:", *lines]))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
