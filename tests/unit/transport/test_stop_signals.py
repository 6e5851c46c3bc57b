"""StopSignals: the one stop handler of tensorpool's processes (#13.6: a signal handler must
never keep a process alive)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from tensorpool.transport.process import StopSignals, stop_process

CHILD = textwrap.dedent(
    """
    import sys, time
    from tensorpool.transport.process import StopSignals
    stop = StopSignals().install()
    print("ready", flush=True)
    while not stop.requested:
        time.sleep(0.01)
    print("stopping", stop.signum, flush=True)
    while True:  # a cleanup that never ends (a hung close, a blocked join)
        time.sleep(1)
    """
)


def test_first_signal_asks_to_stop_and_a_second_one_ends_a_stuck_process() -> None:
    """The first SIGTERM only sets the flag (the loop sees it and starts its cleanup); the
    handler then restores the default action, so the second SIGTERM ends the process even
    though its cleanup is stuck."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().split() == ["stopping", str(int(signal.SIGTERM))]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        stop_process(proc, 5)


def test_handler_stores_a_flag_and_restore_puts_back_the_previous_handler() -> None:
    """Runs in the main thread of this process: no lock is taken by the handler (it only
    stores), and restore() returns the process to what it had."""
    before = signal.getsignal(signal.SIGUSR1)
    stop = StopSignals((signal.SIGUSR1,)).install()
    try:
        assert not stop.requested
        signal.raise_signal(signal.SIGUSR1)
        assert stop.requested and stop.signum == signal.SIGUSR1
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGUSR1) == before
