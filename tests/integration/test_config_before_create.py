"""#26.6: nothing is created before the configuration is valid.

Each case runs the real command (`python -m tensorpool ...`, a real subprocess) with one bad
setting and checks what an operator sees and what is left behind: exit status 2, one line on
stderr naming the file and the key (or the flag), no traceback, and no file or directory under
the SHM base directory or the media driver directory the command would have used.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None

DRIVER_TOML = """
[driver]
aeron_dir = "{root}/aeron"
{extra}
[shm]
base_dir = "{root}/shm"
allowed_base_dirs = ["{root}/shm"]
namespace = "rt"

[profiles.p]
header_nslots = 16
payload_pools = [{{ pool_id = 1, stride_bytes = 4096 }}]

[streams.s]
stream_id = 10000
profile = "p"
"""


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tp-cfg-", dir=SHM_ROOT))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _tensorpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorpool", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _assert_refused(done: subprocess.CompletedProcess[str], *names: str) -> None:
    """Exit 2, exactly one line on stderr, naming every one of ``names``."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def _left_behind(root: Path, *keep: Path) -> list[str]:
    """Everything under ``root`` except the files the test itself wrote."""
    return sorted(str(p) for p in root.rglob("*") if p not in keep)


def _driver(root: Path, extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    config = root / "driver.toml"
    config.write_text(DRIVER_TOML.format(root=root, extra=extra))
    return _tensorpool("driver", "--config", str(config)), config


def test_26_6_instance_id_too_long_for_a_path_creates_nothing(root: Path) -> None:
    """A 10,000-character instance id: was ENAMETOOLONG (a traceback) after creating shm/rt."""
    done, config = _driver(root, 'instance_id = "' + "a" * 10_000 + '"')
    _assert_refused(done, str(config), "driver.instance_id", "255")
    assert _left_behind(root, config) == []


def test_26_6_deep_base_dir_refused_by_path_length(root: Path) -> None:
    """Each name fits but the region paths below base_dir would exceed PATH_MAX."""
    deep = "/".join(["d" * 200] * 20)  # 20 components of 200 bytes: ~4 KiB
    config = root / "driver.toml"
    config.write_text(
        DRIVER_TOML.format(root=root, extra="").replace(
            f'base_dir = "{root}/shm"', f'base_dir = "{root}/shm/{deep}"'
        )
    )
    done = _tensorpool("driver", "--config", str(config))
    _assert_refused(done, str(config), "shm.base_dir", "4095")
    assert _left_behind(root, config) == []


def test_26_6_udp_channel_without_endpoint_creates_nothing(root: Path) -> None:
    """`aeron:udp?endpoint=`: was a pyaeron traceback after creating shm/rt."""
    done, config = _driver(root, 'control_channel = "aeron:udp?endpoint="')
    _assert_refused(done, str(config), "driver.control_channel", "HOST:PORT")
    assert _left_behind(root, config) == []


def test_26_6_bridge_udp_channel_without_endpoint_creates_nothing(root: Path) -> None:
    """The same channel rule in the bridge's file (one validator for every config)."""
    config = root / "bridge.toml"
    config.write_text(
        f"""
[bridge]
instance_id = "b"
role = "receiver"
payload_channel = "aeron:udp?control-mode=dynamic"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:40999"
control_stream_id = 3001
forward_metadata = false

[local]
embedded_media_driver = true
driver_mode = false
shm_base_dir = "{root}/shm"
allowed_base_dirs = ["{root}/shm"]

[[mappings]]
source_stream_id = 10000
dest_stream_id = 20000
profile = "p"

[profiles.p]
header_nslots = 16
payload_pools = [{{ pool_id = 1, stride_bytes = 4096 }}]
"""
    )
    done = _tensorpool("bridge", "--config", str(config), "--duration", "5")
    _assert_refused(done, str(config), "bridge.payload_channel", "endpoint")
    assert _left_behind(root, config) == []


def _held_tcp_port() -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_26_6_produce_metrics_port_taken_creates_nothing(root: Path) -> None:
    """`produce --metrics-bind` on a taken port: used to leave producer-N/last-epoch."""
    with _held_tcp_port() as holder:
        port = holder.getsockname()[1]
        done = _tensorpool(
            "produce",
            "--stream-id",
            "7",
            "--count",
            "1",
            "--embedded",
            "--shm-base-dir",
            str(root / "shm"),
            "--metrics-bind",
            f"127.0.0.1:{port}",
        )
    _assert_refused(done, "--metrics-bind", str(port))
    assert _left_behind(root) == []


def test_26_6_serve_port_taken_is_one_line(root: Path) -> None:
    """`serve` on a taken port: used to print gRPC's log lines before its own error."""
    with _held_tcp_port() as holder:
        port = holder.getsockname()[1]
        done = _tensorpool(
            "serve",
            "--stream-id",
            "7",
            "--port",
            str(port),
            "--attach-timeout",
            "0",
            "--embedded",
            "--shm-base-dir",
            str(root / "shm"),
        )
    _assert_refused(done, "--port", str(port))
    assert _left_behind(root) == []
