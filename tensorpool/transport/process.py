"""Stopping child processes the one way every tensorpool daemon expects.

Daemons (media driver, SHM driver, rate limiter, bridge) clean up on SIGTERM: announce
shutdown, release leases, remove their directories. So a stop is SIGTERM first and SIGKILL
only when the child ignores it for ``timeout_s`` -- a kill skips that cleanup, and the
caller must then clean up for it (e.g. remove an Aeron directory).
"""

from __future__ import annotations

import logging
import signal
import subprocess

log = logging.getLogger(__name__)


def stop_process(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    timeout_s: float = 15.0,
    *,
    sig: int = signal.SIGTERM,
) -> tuple[int, bool]:
    """Signal ``proc`` (if still running), wait, kill on timeout.

    Returns ``(returncode, killed)``: ``killed`` is True when SIGKILL was needed, i.e. the
    child did not run its own cleanup.
    """
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout_s), False
    except subprocess.TimeoutExpired:
        log.warning("pid %d ignored signal %d for %.0f s; killing it", proc.pid, sig, timeout_s)
        proc.kill()
        return proc.wait(), True


__all__ = ["stop_process"]
