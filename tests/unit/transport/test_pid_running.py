"""``pid_running``: the one liveness probe for pids recorded in files (cnc.dat, superblocks,
status files, spool and demo markers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tensorpool.transport.process import pid_running, proc_stat


def test_ourselves_and_an_exited_reaped_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pid_running(os.getpid()) is True
    assert pid_running(child.pid) is False


def test_pids_that_address_groups_or_cannot_exist_are_not_probed() -> None:
    assert pid_running(0) is False  # kill(0, 0) would address our process group
    assert pid_running(-1) is False  # kill(-1, 0): every process we may signal
    assert pid_running(2**40) is False


def test_a_zombie_is_gone() -> None:
    """Exited but not reaped yet: ``kill(pid, 0)`` still succeeds, the process is gone (a
    media driver killed with -9 whose parent has not waited for it holds no directory)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while (state := proc_stat(child.pid)) is not None and state[0] != b"Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert state is not None  # a zombie until reaped below
        os.kill(child.pid, 0)  # the signal probe alone would call it alive
        assert pid_running(child.pid) is False
    finally:
        child.wait()


def test_a_running_child_runs() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_running(child.pid) is True
    finally:
        child.kill()
        child.wait()
