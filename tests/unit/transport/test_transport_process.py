"""stop_process: SIGTERM first (the daemon cleans up), SIGKILL only when it is ignored."""

from __future__ import annotations

import signal
import subprocess
import sys

from tensorpool.transport.process import stop_process

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
