"""The "is a media driver there to join?" check of the client commands on a loaded host.

The C driver refreshes its ``cnc.dat`` heartbeat once per timer interval (1 s). On a loaded
host the refresh comes late, and a 1 s liveness window then refused a live driver: ``view`` /
``consume`` (and ``driver shutdown``, ``top``, a daemon joining an external driver) would not
start. A stopped (SIGSTOP) driver is the late refresh made deterministic: its heartbeat ages
past 1 s while the driver is still there, as a starved conductor thread's does.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

from tensorpool.commands._common import transport_config
from tensorpool.transport.mediadriver import MediaDriverProcess, is_active, serves


def test_a_driver_whose_heartbeat_is_late_is_still_joined(media_driver: MediaDriverProcess):
    pid = media_driver.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while is_active(media_driver.dir):  # the takeover window (1 s) sees it as stale
            assert time.monotonic() < deadline, "the heartbeat of a stopped driver kept going"
            time.sleep(0.05)
        args = argparse.Namespace(embedded=False, aeron_dir=media_driver.dir)
        assert transport_config(args).aeron_dir == media_driver.dir  # view / consume start
        assert serves(media_driver.dir)
    finally:
        os.kill(pid, signal.SIGCONT)
