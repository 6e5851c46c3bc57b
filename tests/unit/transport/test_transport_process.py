"""stop_process: SIGTERM first (the daemon cleans up), SIGKILL only when it is ignored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tensorpool.transport.process import PARENT_ENV, stop_process

_READY_THEN_SLEEP = "import sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(60)\n"


def _child(setup: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _READY_THEN_SLEEP.format(setup=setup)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_stop_process_terminates_a_cooperative_child_without_kill() -> None:
    proc = _child("")
    rc, killed = stop_process(proc, 10)
    assert (rc, killed) == (-signal.SIGTERM, False)


def test_stop_process_kills_a_child_that_ignores_sigterm() -> None:
    proc = _child("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    rc, killed = stop_process(proc, 0.5)
    assert (rc, killed) == (-signal.SIGKILL, True)


def test_stop_process_on_an_exited_child_returns_its_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    assert stop_process(proc) == (3, False)


# --- exit_with_parent: a part of `tensorpool demo` does not outlive the demo -------------------
_WATCHED = """
import os, sys, time
from tensorpool.transport.process import StopSignals, exit_with_parent
stop = StopSignals().install()
print(os.getpid(), exit_with_parent(0.02), flush=True)
deadline = time.monotonic() + 30
while not stop.requested and time.monotonic() < deadline:
    time.sleep(0.01)
with open(sys.argv[1], "w") as f:
    f.write("stopped" if stop.requested else "timed out")
"""

_PARENT = """
import os, subprocess, sys
from tensorpool.transport.process import child_env
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=child_env(),
                         stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
os._exit(0)  # no stop, no wait: the demo killed
"""


def test_a_child_started_with_child_env_stops_cleanly_when_its_parent_is_gone(tmp_path) -> None:
    out = tmp_path / "outcome"
    got = subprocess.run(
        [sys.executable, "-c", _PARENT, _WATCHED, str(out)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    _pid, watching = got.stdout.split()
    assert watching == "True"
    deadline = time.monotonic() + 20
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.read_text() == "stopped"  # through its own SIGTERM handling: cleanup ran


def test_the_parent_variable_is_ignored_by_a_process_it_does_not_name() -> None:
    """Grandchildren inherit the variable; it counts only for the named process's children."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}  # alive, but not the child's parent
    code = "from tensorpool.transport.process import exit_with_parent; print(exit_with_parent())"
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"
    got = subprocess.run(
        [sys.executable, "-c", grandchild],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert got.stdout.strip() == "False"


def test_the_cli_stops_at_once_when_the_named_parent_died_before_it_started() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = {**os.environ, PARENT_ENV: str(gone.pid)}
    got = subprocess.run(
        [sys.executable, "-m", "tensorpool", "--help"], env=env, capture_output=True, timeout=60
    )
    assert got.returncode == -signal.SIGTERM and b"usage" not in got.stdout
