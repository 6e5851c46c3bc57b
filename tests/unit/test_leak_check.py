"""#13.6 the session-wide leak check of ``tests/conftest.py`` fails a run that leaves things behind.

Each test runs pytest in a subprocess on a throwaway test file, next to a copy of the real
``tests/conftest.py``, and looks at the exit status and at what is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

CONFTEST = Path(__file__).parents[1] / "conftest.py"
SHM = Path("/dev/shm")

LEAKY = textwrap.dedent(
    """
    import os, subprocess, sys, tempfile

    def test_leaks():
        out = os.environ["LEAK_OUT"]
        if "process" in os.environ["LEAK_WHAT"]:
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open(os.path.join(out, "pid"), "w").write(str(p.pid))
        if "shm" in os.environ["LEAK_WHAT"]:
            d = tempfile.mkdtemp(prefix="tp-leakcheck-", dir="/dev/shm")
            open(os.path.join(out, "shm"), "w").write(d)
    """
)


@pytest.fixture
def run_inner() -> Iterator:
    work = Path(tempfile.mkdtemp(prefix="tp-leakcheck-run-"))
    (work / "inner").mkdir()
    shutil.copy(CONFTEST, work / "inner" / "conftest.py")
    (work / "inner" / "test_leaky.py").write_text(LEAKY)
    (work / "inner" / "pytest.ini").write_text("[pytest]\n")
    leftovers: list[Path] = []

    def run(what: str, **env: str) -> tuple[int, str, int | None, Path | None]:
        out = work / f"out-{len(leftovers)}"
        out.mkdir()
        e = {k: v for k, v in os.environ.items() if k != "TENSORPOOL_LEAK_CHECK"}  # ours
        e.update(LEAK_OUT=str(out), LEAK_WHAT=what, **env)
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(work / "inner")],
            cwd=work / "inner",
            env=e,
            capture_output=True,
            text=True,
            timeout=120,
        )
        pid = int((out / "pid").read_text()) if (out / "pid").exists() else None
        shm = Path((out / "shm").read_text()) if (out / "shm").exists() else None
        leftovers.append(out)
        if shm is not None:
            leftovers.append(shm)
        return r.returncode, r.stdout + r.stderr, pid, shm

    yield run
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_leaked_process_fails_the_session_and_is_killed(run_inner) -> None:
    """#13.6: a test that leaves a child process running makes the run exit non-zero, names the
    process, and the check kills it."""
    rc, out, pid, _ = run_inner("process")
    assert pid is not None
    try:
        assert rc == 1, out
        assert "1 passed" in out
        assert "leak check failed" in out and f"process {pid} still running" in out, out
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
def test_leaked_shm_entry_fails_the_session(run_inner) -> None:
    """#13.6: a test that leaves a ``/dev/shm/tp-*`` directory makes the run exit non-zero."""
    rc, out, _, shm = run_inner("shm")
    assert shm is not None and shm.exists()
    assert rc == 1, out
    assert f"{shm} was created during the session and not removed" in out, out


def test_clean_session_passes_and_the_switch_turns_the_check_off(run_inner) -> None:
    """#13.6: nothing left -> exit 0; ``TENSORPOOL_LEAK_CHECK=0`` -> a leak does not fail."""
    rc, out, _, _ = run_inner("nothing")
    assert rc == 0, out
    assert "leak check" not in out
    rc, out, pid, _ = run_inner("process shm", TENSORPOOL_LEAK_CHECK="0")
    assert pid is not None
    try:
        assert rc == 0, out
        assert "leak check" not in out
    finally:
        os.kill(pid, signal.SIGKILL)
