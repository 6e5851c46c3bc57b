"""Semaphore wakeup (#14.1 "use posix-ipc where it serves better"): real named semaphores,
real processes, a real embedded media driver; nothing left in /dev/shm."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorpool.transport import AeronContext, ipc_channel
from tensorpool.transport.wakeup import (
    SEM_DIR,
    SemaphoreIdleStrategy,
    WakePoster,
    wake_prefix,
)

PEER = Path(__file__).with_name("wakeup_peer.py")
CHANNEL = ipc_channel(term_length=64 * 1024)
LONG_NS = 30_000_000_000
"""A wait the tests never sit out when the rule holds: only a post ends it early."""
SHORT_NS = 1_000_000
_ns_ids = itertools.count()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A namespace of this test only; the test must leave none of its semaphores behind."""
    ns = f"t{os.getpid()}_{next(_ns_ids)}"
    yield ns
    left = [n for n in os.listdir(SEM_DIR) if n.startswith(f"sem.tensorpool-wake-{ns}-")]
    assert not left, f"semaphores left behind: {left}"


def _entries(ns: str, stream_id: int) -> list[str]:
    return [n for n in os.listdir(SEM_DIR) if n.startswith("sem." + wake_prefix(ns, stream_id))]


def test_idle_consumer_process_wakes_on_post(
    aeron_ctx: AeronContext, stream_id: int, namespace: str
) -> None:
    """#14.1: a consumer process blocked in its idle strategy wakes on the producer's post
    (not its 30 s timeout) and then finds the descriptor that preceded the post."""
    pub = aeron_ctx.add_publication(CHANNEL, stream_id)
    args = [aeron_ctx.dir, CHANNEL, str(stream_id), namespace, str(LONG_NS)]
    peer = subprocess.Popen(
        [sys.executable, str(PEER), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    poster = WakePoster(namespace, stream_id)
    try:
        assert peer.stdout is not None
        ready = peer.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        assert pub.await_connected(20.0)
        poster.rescan()
        assert poster.consumers == 1
        assert pub.offer(b"frame-1")
        poster.post()
        got = peer.stdout.readline().split()
        assert got[:2] == ["got", "frame-1"], got
        assert int(got[2]) >= 1, "the consumer woke by its timeout, not by the post"
        assert peer.wait(20.0) == 0
    finally:
        poster.close()
        if peer.poll() is None:
            peer.kill()
            peer.wait()
        pub.close()
    assert _entries(namespace, stream_id) == []  # the consumer unlinked its own semaphore


def test_every_consumer_of_a_stream_is_woken(namespace: str) -> None:
    """#14.1: one semaphore per consumer, so one post per descriptor wakes every consumer of
    the stream (a shared semaphore would wake one), and only consumers of that stream."""
    with (
        SemaphoreIdleStrategy(namespace, 5, LONG_NS) as a,
        SemaphoreIdleStrategy(namespace, 5, LONG_NS) as b,
        SemaphoreIdleStrategy(namespace, 6, SHORT_NS) as other,
    ):
        poster = WakePoster(namespace, 5)
        try:
            poster.rescan()
            assert poster.consumers == 2
            poster.post()
            a.idle(0)
            b.idle(0)
            other.idle(0)
        finally:
            poster.close()
        assert (a.wakeups, b.wakeups, other.wakeups) == (1, 1, 0)


def test_s10_1_3_consumer_on_its_own_stream_is_posted_only_for_its_own_descriptors(
    namespace: str,
) -> None:
    """#29 / §10.1.3: a consumer reading its own descriptor stream (its semaphore named with
    its consumer id) is not woken by the shared stream's descriptors, only by its own stream's
    (a 10 Hz consumer of a 1 kHz stream: 10 wakeups a second, not 1000); the others still are;
    once its stream is released it is posted with the shared stream again."""
    with (
        SemaphoreIdleStrategy(namespace, 5, SHORT_NS, consumer_id=0xABCD) as own,
        SemaphoreIdleStrategy(namespace, 5, SHORT_NS, consumer_id=0xABCD) as again,
        SemaphoreIdleStrategy(namespace, 5, SHORT_NS, consumer_id=7) as shared,
    ):
        assert own.sem_name.endswith("-0000abcd") and again.sem_name != own.sem_name
        poster = WakePoster(namespace, 5)
        try:
            poster.rescan()
            poster.set_own_streams(frozenset({0xABCD}))
            poster.post()  # a shared-stream descriptor
            own.idle(0)
            shared.idle(0)
            assert (own.wakeups, shared.wakeups) == (0, 1)
            poster.post_consumer(0xABCD)  # a descriptor on its own stream
            poster.post_consumer(7)  # not on its own stream: nothing
            own.idle(0)
            shared.idle(0)
            assert (own.wakeups, shared.wakeups) == (1, 1)
            poster.set_own_streams(frozenset())  # released: back on the shared stream
            poster.post()
            own.idle(0)
            assert own.wakeups == 2
        finally:
            poster.close()


def test_posts_do_not_accumulate_while_the_consumer_is_busy(namespace: str) -> None:
    """#14.1: the producer posts only while the value is 0, so frames published while the
    consumer was busy cost it one spurious wakeup at most, not one per frame."""
    with SemaphoreIdleStrategy(namespace, 1, SHORT_NS) as idle:
        poster = WakePoster(namespace, 1)
        try:
            poster.rescan()
            for _ in range(5):
                poster.post()
        finally:
            poster.close()
        for _ in range(3):
            idle.idle(0)
        assert idle.wakeups == 1


def test_work_never_waits(namespace: str) -> None:
    """#14.1: a cycle that did work returns at once without taking a pending post (the wait
    and the post are for idle cycles only)."""
    with SemaphoreIdleStrategy(namespace, 1, LONG_NS) as idle:
        poster = WakePoster(namespace, 1)
        try:
            poster.rescan()
            poster.post()
        finally:
            poster.close()
        idle.idle(1)
        assert idle.wakeups == 0
        idle.idle(0)  # the post is still there for the next idle cycle
        assert idle.wakeups == 1


def test_close_unlinks_only_its_own_semaphore(namespace: str) -> None:
    """#14.1: the consumer unlinks the semaphore it created; the producer never unlinks and
    drops a closed consumer at its next rescan."""
    idle = SemaphoreIdleStrategy(namespace, 3, SHORT_NS)
    poster = WakePoster(namespace, 3)
    try:
        assert idle.path.exists()
        poster.rescan()
        poster.close()  # closes its handle only
        assert idle.path.exists()
        poster = WakePoster(namespace, 3)
        poster.rescan()
        idle.close()
        idle.close()  # idempotent
        assert not idle.path.exists()
        poster.rescan()
        assert poster.consumers == 0
    finally:
        poster.close()
        idle.close()


def test_a_dashed_namespace_is_not_mistaken_for_another_stream(namespace: str) -> None:
    """#14.1: namespaces may contain ``-`` (SHM directory rule), so the producer of
    ``<ns>`` stream 1 must not post the consumer of ``<ns>-1`` stream 5, whose name also
    starts with ``tensorpool-wake-<ns>-1-``."""
    with (
        SemaphoreIdleStrategy(f"{namespace}-1", 5, SHORT_NS) as other,
        SemaphoreIdleStrategy(namespace, 1, SHORT_NS) as mine,
    ):
        assert other.sem_name.startswith(f"/{wake_prefix(namespace, 1)}")
        poster = WakePoster(namespace, 1)
        try:
            poster.rescan()
            assert poster.consumers == 1
            poster.post()
        finally:
            poster.close()
        other.idle(0)
        mine.idle(0)
        assert (other.wakeups, mine.wakeups) == (0, 1)


@pytest.mark.parametrize(
    ("namespace_arg", "stream", "message"),
    [
        (
            "a/b",
            1,
            "wake semaphore namespace 'a/b' must be a single directory name of letters, "
            "digits, '.', '_' or '-'",
        ),
        ("ok", -1, "stream_id must be a uint32, got -1"),
    ],
)
def test_bad_names_are_refused(namespace_arg: str, stream: int, message: str) -> None:
    """#14.1: a namespace that is not one path component is refused in one line."""
    with pytest.raises(ValueError) as err:
        SemaphoreIdleStrategy(namespace_arg, stream)
    assert str(err.value) == message


def test_bad_max_wait_is_refused(namespace: str) -> None:
    with pytest.raises(ValueError, match="max_wait_ns must be > 0, got 0"):
        SemaphoreIdleStrategy(namespace, 1, 0)
