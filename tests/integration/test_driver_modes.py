"""#13.7: the namespace directory, lock file and status file get the modes docs/operator.md
promises (`shm.permissions_mode` for files, the matching search bits for directories),
whatever the umask, from a real driver daemon with its embedded media driver.

The same running driver serves the BrokenPipe check for `driver status` (#13.7).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import DriverProcess, driver_toml, status_file

from tensorpool.cli import EXIT_BROKEN_PIPE

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


@pytest.fixture
def work() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-f-modes-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("perm", "file_mode", "dir_mode"), [("660", 0o660, 0o770)])
def test_namespace_lock_and_status_modes_follow_permissions_mode(
    work: str, perm: str, file_mode: int, dir_mode: int
) -> None:
    """#13.7: with permissions_mode "660" and umask 022 the driver creates the namespace
    directory 0770 and driver.lock / driver-status.json 0660 (the umask used to make them
    0750 / 0640); `driver status` into a closed pipe exits 141 without a traceback."""
    base = os.path.join(work, "shm")
    aeron_dir = os.path.join(work, "aeron")
    cfg = os.path.join(work, "driver.toml")
    text = driver_toml(base, aeron_dir, embedded=True, control_stream_id=1077)
    Path(cfg).write_text(text.replace('permissions_mode = "600"', f'permissions_mode = "{perm}"'))
    old_umask = os.umask(0o022)  # inherited by the daemon: the common default
    try:
        daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start()
    finally:
        os.umask(old_umask)
    try:
        daemon.wait_ready()
        namespace = os.path.join(base, "default")
        assert _mode(namespace) == dir_mode
        assert _mode(base) == dir_mode  # created by the driver too
        assert _mode(os.path.join(namespace, "driver.lock")) == file_mode
        assert _mode(status_file(base)) == file_mode

        r, w = os.pipe()
        os.close(r)  # `driver status | head` whose reader has gone
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tensorpool", "driver", "status", "--config", cfg],
                stdin=subprocess.DEVNULL,
                stdout=w,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(w)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    finally:
        daemon.stop()
