"""Semaphore wakeup wired into the producer and `tensorpool consume` (#14.1 "use posix-ipc
where it serves better"): real media driver, real SHM, real named semaphores, real processes.

The producer posts each consumer's semaphore after a descriptor went out; `consume --idle
semaphore` blocks on it. The consumers here wait far longer than the tests' bounded waits
(`LONG_MS`), so frames that arrive at all arrived through a post.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.process import stop_process
from tensorpool.transport.wakeup import SEM_DIR, SemaphoreIdleStrategy

LONG_MS = 600_000
"""The consumer process's longest block per empty poll: ten minutes, never sat out when the
producer posts (the test waits at most `WAIT_S` for everything)."""
WAIT_S = 60.0
SHORT_NS = 1_000_000
"""In-process checks: a post makes `idle(0)` return at once with `wakeups` + 1; without one it
times out after this long with `wakeups` unchanged."""
_ids = itertools.count()


def _tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorpool", *args]


def _wake_entries(stream_id: int, pid: int | None = None) -> list[str]:
    """`/dev/shm/sem.tensorpool-wake-<namespace>-<stream>-<pid>-<token>` entries (any namespace)."""
    tail = f"-{stream_id}-{pid}-" if pid is not None else f"-{stream_id}-"
    return [n for n in os.listdir(SEM_DIR) if n.startswith("sem.tensorpool-wake-") and tail in n]


@pytest.mark.slow
def test_consume_idle_semaphore_receives_frames_through_the_post(media_driver, shm_base) -> None:
    """#14.1 wakeup: `tensorpool produce` (standalone) posts, `tensorpool consume --idle
    semaphore` with a 10-minute max wait receives every frame within the bounded wait and
    counts wakeups; the consumer unlinks its semaphore when it exits."""
    stream_id = 7700 + os.getpid() % 200
    common = ("--aeron-dir", media_driver.dir, "--shm-base-dir", shm_base)
    count = 100
    consumer = subprocess.Popen(
        _tp(
            "consume",
            *common,
            "--stream-id",
            str(stream_id),
            "--idle",
            "semaphore",
            "--idle-max-wait-ms",
            str(LONG_MS),
            "--count",
            str(count),
            "--report-interval",
            "3600",
            "--json",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    producer = None
    try:
        deadline = time.monotonic() + WAIT_S
        while not _wake_entries(stream_id, consumer.pid):  # its semaphore, before any frame
            assert consumer.poll() is None, consumer.communicate()
            assert time.monotonic() < deadline, "consumer created no wake semaphore"
            time.sleep(0.02)
        producer = subprocess.Popen(
            _tp(
                "produce",
                *common,
                "--stream-id",
                str(stream_id),
                "--shape",
                "64",
                "--dtype",
                "uint8",
                "--rate",
                "50",
                "--quiet",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = consumer.communicate(timeout=WAIT_S)
        assert consumer.returncode == 0, err
        final = json.loads(out.strip().splitlines()[-1])
        assert final["final"] is True
        assert final["frames"] >= count
        assert final["idle_wakeups"] >= 1  # idle polls ended by the producer's post
        assert not _wake_entries(stream_id, consumer.pid)  # closed with the consumer
    finally:
        stop_process(consumer)
        if producer is not None:
            stop_process(producer)


def test_consume_idle_semaphore_stops_on_sigterm_while_blocked(media_driver, shm_base) -> None:
    """#14.1 wakeup: SIGTERM while `consume --idle semaphore` blocks in the wait (no producer,
    10-minute max wait) ends the wait: exit 0, a final report, the semaphore unlinked."""
    stream_id = 7900 + os.getpid() % 100
    consumer = subprocess.Popen(
        _tp(
            "consume",
            "--aeron-dir",
            media_driver.dir,
            "--shm-base-dir",
            shm_base,
            "--stream-id",
            str(stream_id),
            "--idle",
            "semaphore",
            "--idle-max-wait-ms",
            str(LONG_MS),
            "--json",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not _wake_entries(stream_id, consumer.pid):
            assert consumer.poll() is None, consumer.communicate()
            assert time.monotonic() < deadline, "consumer created no wake semaphore"
            time.sleep(0.02)
        time.sleep(0.5)  # into the blocking wait (it polls once, finds nothing, blocks)
        consumer.terminate()
        out, err = consumer.communicate(timeout=WAIT_S)
        assert consumer.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["final"] is True
        assert not _wake_entries(stream_id, consumer.pid)
    finally:
        stop_process(consumer)


@pytest.fixture
def wake_setup(media_driver, shm_base) -> Iterator[tuple[AeronContext, ClientSettings, int]]:
    """A context, settings with a namespace and a descriptor stream of this test only (an
    earlier test's released subscription may still count as connected), and a stream id."""
    n = next(_ids)
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        channels=Endpoints(descriptor_stream_id=1900 + n),
        shm_base_dir=shm_base,
        namespace=f"w{os.getpid()}_{n}",
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        yield ctx, settings, 12
    left = [n for n in os.listdir(SEM_DIR) if f"-{settings.namespace}-" in n]
    assert not left, f"semaphores left behind: {left}"


def _offer_until_sent(ctx: AeronContext, settings: ClientSettings, producer: Producer) -> object:
    """Subscribe to the descriptor stream and offer until one descriptor went out."""
    ch = settings.channels
    sub = ctx.add_subscription(ch.descriptor_channel, ch.descriptor_stream_id, lambda b, h: None)
    arr = np.zeros(16, np.uint8)
    deadline = time.monotonic() + WAIT_S
    while producer.stats.frames == producer.stats.descriptors_not_sent:
        assert time.monotonic() < deadline, "descriptor publication never connected"
        producer.offer(arr)
        sub.poll()
        time.sleep(0.01)
    return sub


def _stream(stream_id: int) -> StreamConfig:
    return StreamConfig(stream_id, header_nslots=64, pools=(PoolConfig(1, 4096),))


def test_wake_consumers_false_never_posts(wake_setup) -> None:
    """#14.1 wakeup: `Producer(wake_consumers=False)` posts no consumer semaphore, even for
    descriptors that went out (no WakePoster is made)."""
    ctx, settings, stream_id = wake_setup
    with SemaphoreIdleStrategy(settings.namespace, stream_id, SHORT_NS) as idle:
        producer = Producer(ctx, _stream(stream_id), settings, wake_consumers=False)
        try:
            producer.do_work()  # where a poster would find `idle`'s semaphore
            sub = _offer_until_sent(ctx, settings, producer)
            for _ in range(5):
                producer.offer(np.zeros(16, np.uint8))
            idle.idle(0)
            assert idle.wakeups == 0
            ctx.release(sub)
        finally:
            producer.close()


def test_failed_descriptor_offer_does_not_post(wake_setup) -> None:
    """#14.1 wakeup: the producer posts only after a descriptor offer that succeeded: with no
    descriptor subscriber every offer fails and the consumer's semaphore stays unposted; once
    one goes out, it is posted."""
    ctx, settings, stream_id = wake_setup
    with SemaphoreIdleStrategy(settings.namespace, stream_id, SHORT_NS) as idle:
        producer = Producer(ctx, _stream(stream_id), settings)
        try:
            producer.do_work()  # the poster finds `idle`'s semaphore
            for _ in range(5):
                producer.offer(np.zeros(16, np.uint8))
            assert producer.stats.descriptors_not_sent == producer.stats.frames == 5
            idle.idle(0)
            assert idle.wakeups == 0
            sub = _offer_until_sent(ctx, settings, producer)  # control: a sent one posts
            idle.idle(0)
            assert idle.wakeups == 1
            ctx.release(sub)
        finally:
            producer.close()


def _semaphore_holder(namespace: str, stream_id: int) -> tuple[subprocess.Popen[str], str]:
    """A process holding a wake semaphore of `stream_id` (as a consumer does); its file."""
    code = (
        "import time\n"
        "from tensorpool.transport.wakeup import SemaphoreIdleStrategy\n"
        f"s = SemaphoreIdleStrategy({namespace!r}, {stream_id})\n"
        "print(s.path, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, child.stdout.readline().strip()


def test_killed_consumers_semaphores_are_removed_and_counted(wake_setup) -> None:
    """Leave nothing behind: consumer processes are SIGKILLed (their semaphores outlive them).
    The producer's duty cycle removes its stream's at the next rescan (within 1 s) and counts
    it in `stats.wake_sems_removed`; another stream's is left to that stream's sweepers, and
    goes when a consumer of the namespace makes its wake strategy (counted in its stats)."""
    ctx, settings, stream_id = wake_setup
    holders = [_semaphore_holder(settings.namespace, s) for s in (stream_id, stream_id + 1)]
    mine_path, other_path = (path for _, path in holders)
    producer = Producer(ctx, _stream(stream_id), settings)
    consumer = None
    try:
        producer.do_work()  # live: kept (and posted)
        assert os.path.exists(mine_path)
        assert producer.stats.wake_sems_removed == 0
        for child, _ in holders:
            child.kill()
            child.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while os.path.exists(mine_path):
            assert time.monotonic() < deadline, f"{mine_path} never removed"
            producer.do_work()
            time.sleep(0.01)
        assert producer.stats.wake_sems_removed == 1
        assert os.path.exists(other_path)  # not the producer's stream
        consumer = Consumer(ctx, stream_id, settings)
        consumer.wake_idle_strategy(SHORT_NS)
        assert consumer.stats.wake_sems_removed == 1
        assert not os.path.exists(other_path)
    finally:
        if consumer is not None:
            consumer.close()
        producer.close()
        for child, path in holders:
            if child.poll() is None:
                child.kill()
                child.wait()
            if path:  # this test made them (through its children)
                Path(path).unlink(missing_ok=True)
