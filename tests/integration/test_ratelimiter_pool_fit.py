"""#13.7: a rate limiter whose destination pools cannot hold the source's frames is refused.

The default deployment: the SHM driver daemon hosting its embedded media driver (real
subprocess), a real `tensorpool produce --driver` on the source stream (64 KiB pools) and the
real `tensorpool ratelimiter` command mapping it to a destination with a 4 KiB profile. Before
#13.7 it ran and dropped every frame as `no_pool_fits`, silently; now it stops with exit
status 2 and one line naming both sizes, at start (without `driver.config`) and at `--check`
(with it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import CONTROL_CHANNEL, DriverProcess, driver_toml

from tensorpool.transport.process import stop_process

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
CONTROL_STREAM = 1081
SOURCE = 10000  # profile "small" of driver_toml: pools of 4 KiB and 64 KiB
DEST = 10009  # profile "tiny" below: one 4 KiB pool
TINY = """
[profiles.tiny]
header_nslots = 16
payload_pools = [{ pool_id = 1, stride_bytes = 4096 }]

[streams.dst]
stream_id = 10009
profile = "tiny"
"""


@pytest.fixture
def work() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-f-rlfit-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _rl_toml(work: str, aeron_dir: str, base: str, driver_config: str) -> str:
    path = os.path.join(work, f"rl-{bool(driver_config)}.toml")
    Path(path).write_text(
        f"""
[rate_limiter]
instance_id = "rl-fit"
descriptor_channel = "aeron:ipc?term-length=16m"
descriptor_stream_id = 2101
max_rate_hz = 10
forward_metadata = false

[[mappings]]
source_stream_id = {SOURCE}
dest_stream_id = {DEST}
profile = "tiny"

[driver]
aeron_dir = "{aeron_dir}"
control_channel = "{CONTROL_CHANNEL}"
control_stream_id = {CONTROL_STREAM}
config = "{driver_config}"

[shm]
base_dir = "{base}"
"""
    )
    return path


def _tensorpool(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorpool", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _assert_one_line_naming_sizes(done: subprocess.CompletedProcess[str]) -> None:
    # the running rate limiter logs INFO lines too; the refusal is one error line
    lines = [ln for ln in done.stderr.splitlines() if "error" in ln.lower()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    assert "4096" in lines[0] and "65536" in lines[0], lines[0]
    assert f"{DEST}" in lines[0] and f"{SOURCE}" in lines[0]


def test_destination_too_small_refused_at_start_and_check(work: str) -> None:
    """#13.7: dest pools (4 KiB) smaller than the source's (64 KiB): `--check` with
    driver.config refuses from the profiles; a start without it refuses once the source's
    layout and the destination's attach are known; both exit 2 with one line."""
    base = os.path.join(work, "shm")
    aeron_dir = os.path.join(work, "aeron")
    cfg = os.path.join(work, "driver.toml")
    text = driver_toml(
        base, aeron_dir, embedded=True, streams=[SOURCE], control_stream_id=CONTROL_STREAM
    )
    Path(cfg).write_text(text + TINY)

    # --check knows the sizes only from the driver's profiles (driver.config): no processes.
    _assert_one_line_naming_sizes(
        _tensorpool("ratelimiter", "--config", _rl_toml(work, aeron_dir, base, cfg), "--check")
    )

    daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log")).start()
    producer: subprocess.Popen[bytes] | None = None
    try:
        daemon.wait_ready()
        with open(os.path.join(work, "producer.log"), "wb") as log:
            producer = subprocess.Popen(
                [sys.executable, "-m", "tensorpool", "produce", "--driver",
                 "--stream-id", str(SOURCE), "--shape", "64,64", "--dtype", "uint8",
                 "--rate", "100", "--quiet", "--aeron-dir", aeron_dir, "--shm-base-dir", base,
                 "--control-channel", CONTROL_CHANNEL, "--control-stream-id", str(CONTROL_STREAM)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip
        # Without driver.config, --check cannot know (it passes); the start refuses.
        no_driver_config = _rl_toml(work, aeron_dir, base, "")
        assert _tensorpool("ratelimiter", "--config", no_driver_config, "--check").returncode == 0
        _assert_one_line_naming_sizes(
            _tensorpool("ratelimiter", "--config", no_driver_config, "--duration", "60")
        )
    finally:
        if producer is not None:
            stop_process(producer)
        daemon.stop()
