"""`tensorpool tap` against live traffic: a standalone media driver process, a real Producer
in a thread (its own AeronContext), and tap run in-process through ``tensorpool.cli.main``
with its own AeronContext joining the same driver directory.

The producer announces every 20 ms so a few lines arrive within a fraction of a second;
every tap run also has a ``--duration`` backstop so a broken producer fails the test
instead of hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tensorpool.cli import main
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.specs.generated.wire import FrameDescriptorEncoder
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess

PERIOD_NS = 20_000_000
BACKSTOP_S = "30"
CLI = "import sys; from tensorpool.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def driver_dir() -> Iterator[str]:
    with MediaDriverProcess() as md:
        yield md.dir


@pytest.fixture
def shm_base() -> Iterator[str]:
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    base = os.path.realpath(tempfile.mkdtemp(prefix="tp-tap-test-", dir=parent))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def in_thread(aeron_dir: str, step: Callable[[AeronContext], Callable[[], None]]) -> Iterator[None]:
    """Run ``step(ctx)()`` every 5 ms in a thread with its own AeronContext until exit."""
    stop = threading.Event()
    ready = threading.Event()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with AeronContext(TransportConfig(aeron_dir=aeron_dir)) as ctx:
                tick = step(ctx)
                ready.set()
                while not stop.is_set():
                    tick()
                    stop.wait(0.005)
        except BaseException as exc:
            errors.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert ready.wait(20)
    try:
        yield
    finally:
        stop.set()
        thread.join(20)
    assert not errors, errors


@contextmanager
def live_producer(aeron_dir: str, shm_base: str, stream_id: int) -> Iterator[dict[str, Any]]:
    info: dict[str, Any] = {}
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=aeron_dir),
        shm_base_dir=shm_base,
        announce_period_ns=PERIOD_NS,
        qos_period_ns=PERIOD_NS,
    )
    holder: list[Producer] = []

    def step(ctx: AeronContext) -> Callable[[], None]:
        producer = Producer(
            ctx, StreamConfig(stream_id, header_nslots=16, pools=(PoolConfig(1, 4096),)), settings
        )
        holder.append(producer)
        info.update(epoch=producer.epoch, header=producer.header_region_path)
        return lambda: producer.do_work() and None

    try:
        with in_thread(aeron_dir, step):
            yield info
    finally:
        for producer in holder:
            producer.close()


def tap_lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    rc = main(["tap", *argv, "--duration", BACKSTOP_S])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return [json.loads(line) for line in captured.out.splitlines()]


def test_tap_prints_shm_pool_announce_of_a_live_producer(
    driver_dir: str, shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with live_producer(driver_dir, shm_base, 4711) as info:
        lines = tap_lines(capsys, "--aeron-dir", driver_dir, "--stream-id", "1000", "--count", "2")
    assert len(lines) == 2
    for line in lines:
        assert line["message"] == "ShmPoolAnnounce"
        assert (line["stream_id"], line["schema_id"], line["template_id"]) == (1000, 900, 1)
        assert isinstance(line["session_id"], int) and isinstance(line["ts_ns"], int)
        fields = line["fields"]
        assert (fields["stream_id"], fields["epoch"]) == (4711, info["epoch"])
        assert fields["announce_clock_domain"] == "MONOTONIC"
        assert fields["header_region_uri"] == f"shm:file?path={info['header']}"
        assert fields["payload_pools"][0]["stride_bytes"] == 4096
    assert lines[0]["ts_ns"] <= lines[1]["ts_ns"]
    assert lines[0]["fields"]["announce_timestamp_ns"] < lines[1]["fields"]["announce_timestamp_ns"]


def test_tap_several_streams_at_once(
    driver_dir: str, shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with live_producer(driver_dir, shm_base, 4712):
        lines = tap_lines(
            capsys,
            *("--aeron-dir", driver_dir, "--stream-id", "1000", "1200"),
            *("--stream-id", "1300", "--count", "30"),
        )
    assert len(lines) == 30
    seen = {(line["stream_id"], line["message"]) for line in lines}
    assert seen == {
        (1000, "ShmPoolAnnounce"),
        (1200, "QosProducer"),
        (1300, "DataSourceAnnounce"),
    }


def test_tap_reports_undecodable_messages_and_keeps_going(
    driver_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = b"\xde\xad\xbe\xef" * 30
    good = bytearray(FrameDescriptorEncoder.encoded_length())
    FrameDescriptorEncoder.encode(good, 0, stream_id=7, epoch=1, seq=42, header_index=10)

    def step(ctx: AeronContext) -> Callable[[], None]:
        pub = ctx.add_publication("aeron:ipc", 4242)

        def tick() -> None:
            pub.offer(junk)
            pub.offer(good)

        return tick

    with in_thread(driver_dir, step):
        lines = tap_lines(
            capsys,
            *("--aeron-dir", driver_dir, "--channel", "aeron:ipc"),
            *("--stream-id", "4242", "--count", "6"),
        )
    assert len(lines) == 6
    errors = [i for i, line in enumerate(lines) if "error" in line]
    decoded = [i for i, line in enumerate(lines) if line.get("message") == "FrameDescriptor"]
    assert errors and decoded and errors[0] < decoded[-1]  # tap went on after a bad message
    bad = lines[errors[0]]
    assert bad["error"] == "schema_id_mismatch"
    assert bad["hex"] == junk[:64].hex() and bad["length"] == len(junk)
    assert lines[decoded[-1]]["fields"]["seq"] == 42


def test_tap_duration_ends_a_quiet_tap_on_an_embedded_driver(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["tap", "--embedded", "--stream-id", "4343", "--duration", "0.2"])
    captured = capsys.readouterr()
    assert rc == 0 and captured.out == "" and captured.err == ""


def test_tap_process_stops_cleanly_on_sigterm(driver_dir: str, shm_base: str) -> None:
    with live_producer(driver_dir, shm_base, 4713):
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, "tap", "--aeron-dir", driver_dir],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = proc.stdout.readline()  # type: ignore[union-attr]
            assert json.loads(first)["message"] == "ShmPoolAnnounce"
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_tap_process_bad_hex_prints_one_line_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CLI, "tap", "--hex", "0xnothex"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == ["tensorpool tap: error: --hex: not a hex digit: 'n'"]
