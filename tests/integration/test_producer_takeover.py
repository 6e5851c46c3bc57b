"""#13.7: two standalone producers on one stream: the second is refused unless told to take over.

Real `tensorpool produce` subprocesses on a real media driver and real SHM files in a temp
dir. The per-stream lock is an flock, so a producer killed with SIGKILL leaves nothing that
blocks its successor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tensorpool.client.producer import Producer, StreamBusy, StreamConfig
from tensorpool.client.settings import DEFAULT_NAMESPACE as NAMESPACE
from tensorpool.client.settings import ClientSettings
from tensorpool.client.stream_lock import stream_lock_path
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.process import stop_process

STREAM = 77


def _produce(md_dir: str, base: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tensorpool", "produce", "--stream-id", str(STREAM),
        "--shape", "16,16", "--dtype", "uint8", "--rate", "50", "--quiet",
        "--aeron-dir", md_dir, "--shm-base-dir", base, *extra,
    ]  # fmt: skip


def _start_first(md_dir: str, base: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        _produce(md_dir, base), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    marker = os.path.join(base, NAMESPACE, f"producer-{STREAM}", "last-epoch")
    deadline = time.monotonic() + 30
    try:
        while not os.path.exists(marker):
            assert proc.poll() is None, "first producer exited"
            assert time.monotonic() < deadline, "first producer did not start"
            time.sleep(0.02)
    except BaseException:
        stop_process(proc)  # the caller never gets it: stop it here
        raise
    return proc


def _epoch_dirs(base: str) -> set[str]:
    d = os.path.join(base, NAMESPACE, f"producer-{STREAM}")
    return {n for n in os.listdir(d) if n.startswith("epoch-")}


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_second_live_producer_refused_unless_takeover(media_driver, shm_base: str) -> None:
    """#13.7: a live standalone producer keeps its stream: a second `produce` exits 2 with
    one line and leaves the first's epoch untouched; the API raises StreamBusy;
    `--takeover` / `takeover=True` replace it."""
    first = _start_first(media_driver.dir, shm_base)
    try:
        before = _epoch_dirs(shm_base)
        second = _run(_produce(media_driver.dir, shm_base, "--count", "3"))
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "--takeover" in lines[0], second.stderr
        assert f"pid={first.pid}" in lines[0]
        assert _epoch_dirs(shm_base) == before  # nothing of the first's was touched
        assert first.poll() is None

        settings = ClientSettings(
            transport=TransportConfig(aeron_dir=media_driver.dir), shm_base_dir=shm_base
        )
        with AeronContext(settings.transport).start() as ctx:
            stream = StreamConfig.for_frame_bytes(STREAM, 256)
            with pytest.raises(StreamBusy):
                Producer(ctx, stream, settings)
            Producer(ctx, stream, settings, takeover=True).close()

        taken = _run(_produce(media_driver.dir, shm_base, "--takeover", "--count", "3"))
        assert taken.returncode == 0, taken.stderr
    finally:
        stop_process(first)


def test_killed_producer_is_replaced_without_flag(media_driver, shm_base: str) -> None:
    """#13.7: a producer killed with SIGKILL holds nothing: the next one starts without
    --takeover, at a higher epoch, and removes its lock on a clean exit."""
    first = _start_first(media_driver.dir, shm_base)
    try:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        stop_process(first)
    (old,) = _epoch_dirs(shm_base)
    second = _run(_produce(media_driver.dir, shm_base, "--count", "3"))
    assert second.returncode == 0, second.stderr
    with open(os.path.join(shm_base, NAMESPACE, f"producer-{STREAM}", "last-epoch")) as f:
        assert int(f.read()) > int(old.removeprefix("epoch-"))
    assert not os.path.exists(stream_lock_path(shm_base, NAMESPACE, STREAM))
