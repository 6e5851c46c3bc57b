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

import pytest

from tensorpool.commands._common import transport_config
from tensorpool.transport.cnc import read_cnc_identity
from tensorpool.transport.mediadriver import (
    JOIN_CHECK_TIMEOUT_MS,
    MediaDriverError,
    MediaDriverProcess,
    held,
    is_active,
    serves,
    start_media_driver,
)


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


def test_s13_1_a_starved_live_driver_is_never_taken_over_a_dead_one_at_once(tmp_path) -> None:
    """Starting a media driver empties its directory, so "is the old one gone?" must not be
    answered by the 1 s heartbeat window alone: a starved live driver would lose its files.
    While the pid in ``cnc.dat`` runs the directory stays held (up to Aeron's 10 s client
    timeout); once it is gone (here SIGKILL, not reaped yet: a zombie) it is free at once."""
    aeron_dir = str(tmp_path / "aeron")
    md = MediaDriverProcess(aeron_dir).start()
    try:
        pid = md.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while is_active(aeron_dir):
            assert time.monotonic() < deadline, "the heartbeat of a stopped driver kept going"
            time.sleep(0.05)
        before = read_cnc_identity(aeron_dir)
        assert held(aeron_dir)
        with pytest.raises(MediaDriverError, match="already active"):
            start_media_driver(aeron_dir)
        assert read_cnc_identity(aeron_dir) == before  # the live driver's files untouched
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while held(aeron_dir):  # the kill lands asynchronously; no heartbeat window to wait
            assert time.monotonic() < deadline, "a killed driver still holds its directory"
            time.sleep(0.01)
        assert is_active(aeron_dir, JOIN_CHECK_TIMEOUT_MS)  # its heartbeat is still recent
    finally:
        md.stop()
