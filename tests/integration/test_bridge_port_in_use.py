"""#13.7: a bridge whose UDP endpoint is already bound fails with one line, not a traceback.

A real UDP socket holds a loopback port; the real `tensorpool bridge` command (a receiver with
its own embedded media driver, standalone SHM in a temp dir) is pointed at that port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


@pytest.fixture
def tmp_shm() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-f-bridge-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _receiver_toml(shm: str, payload_port: int, control_port: int) -> str:
    return f"""
[bridge]
instance_id = "bridge-port-test"
role = "receiver"
payload_channel = "aeron:udp?endpoint=127.0.0.1:{payload_port}"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:{control_port}"
control_stream_id = 3001
forward_metadata = false

[local]
embedded_media_driver = true
driver_mode = false
shm_base_dir = "{shm}"
allowed_base_dirs = ["{shm}"]

[[mappings]]
source_stream_id = 10000
dest_stream_id = 20000
profile = "p"

[profiles.p]
header_nslots = 16
payload_pools = [{{ pool_id = 1, stride_bytes = 4096 }}]
"""


def test_udp_port_in_use_is_one_line(tmp_shm: str) -> None:
    """#13.7: the bridge refuses a bound UDP endpoint with one line naming it, exit status 2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        config = os.path.join(tmp_shm, "bridge.toml")
        with open(config, "w") as f:
            f.write(_receiver_toml(tmp_shm, port, _free_udp_port()))
        done = subprocess.run(
            [sys.executable, "-m", "tensorpool", "bridge", "--config", config, "--duration", "5"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    assert "receive_payload_channel" in lines[0]
    assert "in use" in lines[0]
