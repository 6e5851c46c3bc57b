"""Media driver lifecycle: a standalone driver shared by several processes; contexts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyaeron
import pytest
from transport_helpers import poll_until

from tensorpool.transport import (
    AeronContext,
    MediaDriverError,
    MediaDriverProcess,
    TransportClosed,
    TransportConfig,
    ipc_channel,
)
from tensorpool.transport.aeronmd import main
from tensorpool.transport.mediadriver import (
    is_active,
    new_private_dir,
    run_media_driver,
    start_media_driver,
)

PEER = Path(__file__).with_name("transport_peer.py")
CHANNEL = ipc_channel(term_length=64 * 1024)


def test_two_processes_exchange_messages_through_one_media_driver() -> None:
    """A driver process, this process and a peer process share IPC through one directory."""
    with MediaDriverProcess(config=TransportConfig(ipc_term_buffer_length=1024 * 1024)) as md:
        assert is_active(md.dir)
        got: list[bytes] = []
        config = TransportConfig(aeron_dir=md.dir, client_name="test")
        with AeronContext(config) as ctx:
            assert not ctx.owns_driver and ctx.dir == md.dir
            echoes = ctx.add_subscription(CHANNEL, 7102, lambda b, h: got.append(bytes(b)))
            out = ctx.add_publication(CHANNEL, 7101)
            peer = subprocess.Popen(
                [sys.executable, str(PEER), md.dir, CHANNEL, "7101", "7102", "50"]
            )
            try:
                assert out.await_connected(20.0), "peer never subscribed"
                sent = [f"msg-{i}".encode() for i in range(50)]
                for m in sent:
                    assert poll_until(echoes.poll, lambda m=m: out.offer(m))
                assert poll_until(echoes.poll, lambda: len(got) == 50, timeout_s=20.0)
                assert peer.wait(20.0) == 0
            finally:
                if peer.poll() is None:
                    peer.kill()
                    peer.wait()
            assert got == [b"echo:" + m for m in sent]
        pid = md.pid
        assert pid is not None
    # SIGTERM gives a clean exit and the driver removed its directory
    assert md.stop() == 0
    assert not os.path.exists(md.dir)


def test_a_live_media_driver_directory_is_never_taken_over(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with AeronContext() as owner:
        with pytest.raises(MediaDriverError, match="already active"):
            MediaDriverProcess(owner.dir).start()
        with pytest.raises(MediaDriverError, match="already active"):
            start_media_driver(owner.dir)
        assert main(["--dir", owner.dir]) == 2
        assert "already active" in capsys.readouterr().err
        # the first driver is untouched and still serves its client
        assert is_active(owner.dir)
        got: list[bytes] = []
        sub = owner.add_subscription(CHANNEL, 7105, lambda b, h: got.append(bytes(b)))
        pub = owner.add_publication(CHANNEL, 7105)
        assert pub.await_connected(5.0)
        assert pub.offer(b"still here")
        assert poll_until(sub.poll, lambda: got == [b"still here"])


def test_run_media_driver_until_stopped(tmp_path: Path) -> None:
    aeron_dir = str(tmp_path / "aeron")
    stop = threading.Event()
    runner = threading.Thread(
        target=run_media_driver, args=(aeron_dir,), kwargs={"stop": stop}, daemon=True
    )
    runner.start()
    try:
        assert poll_until(lambda: None, lambda: is_active(aeron_dir))
        with AeronContext(TransportConfig(aeron_dir=aeron_dir)) as ctx:
            got: list[bytes] = []
            sub = ctx.add_subscription(CHANNEL, 7110, lambda b, h: got.append(bytes(b)))
            pub = ctx.add_publication(CHANNEL, 7110)
            assert pub.await_connected(5.0)
            assert pub.offer(b"hello")
            assert poll_until(sub.poll, lambda: got == [b"hello"])
    finally:
        stop.set()
        runner.join(10.0)
    assert not runner.is_alive()
    assert not os.path.exists(aeron_dir)


def test_aeronmd_cli_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    aeron_dir = str(tmp_path / "cli")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorpool.transport.aeronmd", "--dir", aeron_dir]
    )
    try:
        assert poll_until(lambda: None, lambda: is_active(aeron_dir) or proc.poll() is not None)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10.0) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not os.path.exists(aeron_dir)


_DIES_WITHOUT_STOP = """
import os, sys
from tensorpool.transport import MediaDriverProcess, TransportConfig
md = MediaDriverProcess(config=TransportConfig(embedded_parent_dir=sys.argv[1])).start()
print(md.pid, md.dir, flush=True)
os._exit(0)  # no stop(): killed, or crashed in its own cleanup
"""


def test_a_media_driver_process_stops_and_cleans_up_when_its_parent_is_gone(
    tmp_path: Path,
) -> None:
    """Leave nothing behind: a driver started for one process does not outlive it."""
    got = subprocess.run(
        [sys.executable, "-c", _DIES_WITHOUT_STOP, str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pid_text, aeron_dir = got.stdout.split()
    pid = int(pid_text)

    def gone() -> bool:  # exited (a zombie too: who reaps it is up to the host's init)
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    try:
        assert poll_until(lambda: None, gone, timeout_s=10.0), "driver outlived its parent"
    finally:
        if not gone():
            os.kill(pid, signal.SIGKILL)
    assert not os.path.exists(aeron_dir)  # Aeron's files and the directory made for it
    assert os.listdir(tmp_path) == []


def test_aeronmd_cli_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dir", "/nonexistent-parent/x", "--ipc-term-length", "1000"]) == 2
    assert "ipc_term_buffer_length" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--dir", "x", "--threading", "lots"])


def test_context_embedded_owns_and_removes_its_driver() -> None:
    ctx = AeronContext(TransportConfig(client_name="embedded"))
    with pytest.raises(TransportClosed):
        _ = ctx.aeron
    with ctx:
        assert ctx.owns_driver
        aeron_dir = ctx.dir
        assert is_active(aeron_dir)
        ctx.add_publication(CHANNEL, 7120)
        ctx.add_subscription(CHANNEL, 7120, lambda b, h: None)
    assert ctx.is_closed
    assert not os.path.exists(aeron_dir)
    ctx.close()  # idempotent
    with pytest.raises(TransportClosed):
        ctx.start()
    with pytest.raises(TransportClosed):
        ctx.add_publication(CHANNEL, 7120)


def test_context_fails_clearly_without_a_driver(tmp_path: Path) -> None:
    config = TransportConfig(aeron_dir=str(tmp_path / "nobody-home"), driver_timeout_ms=200)
    with pytest.raises(MediaDriverError, match="cannot connect"):
        AeronContext(config).start()


def test_private_dirs_are_unique_and_under_the_parent(tmp_path: Path) -> None:
    a = new_private_dir(str(tmp_path))
    b = new_private_dir(str(tmp_path))
    assert a != b
    assert Path(a).parent == tmp_path == Path(b).parent
    assert str(os.getpid()) in Path(a).name
    assert pyaeron.is_driver_active(a, 100) is False
