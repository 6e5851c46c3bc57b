"""FrameProgress from producers, end to end (issue #29 point 2; Wire §10.2.2, §10.1.2, §8.3).

A real producer process (tests/integration/progress_roles.py, driven line by line) writes a
claimed frame in steps and reports each step; the consumer here, on the same real media driver
and SHM files, opts in and reads the filled prefix while the frame is still being written.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from jsonlines_proc import JsonLinesProcess

from tensorpool.client.consumer import Consumer, Frame
from tensorpool.client.progress_core import FrameProgress, ProgressRequest
from tensorpool.client.settings import ClientSettings
from tensorpool.shm.seqlock import PREFIX_SLOT_REUSED
from tensorpool.specs.generated.wire import FrameProgressState
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.process import stop_process

ROLE = str(Path(__file__).with_name("progress_roles.py"))
ROWS, COLS, STEPS, NSLOTS = 16, 4096, 16, 8
_STREAMS = itertools.count(2901)


def row_pattern(seq: int) -> np.ndarray:
    return (
        ((seq + np.arange(ROWS, dtype=np.int64)) % 251)
        .astype(np.uint8)[:, None]
        .repeat(COLS, axis=1)
    )


class ProducerRole(JsonLinesProcess):
    def __init__(self, aeron_dir: str, shm_base: str, stream_id: int, *args: str) -> None:
        super().__init__(
            [
                sys.executable,
                ROLE,
                "--aeron-dir",
                aeron_dir,
                "--shm-base-dir",
                shm_base,
                "--stream-id",
                str(stream_id),
                "--rows",
                str(ROWS),
                "--cols",
                str(COLS),
                "--steps",
                str(STEPS),
                "--nslots",
                str(NSLOTS),
                *args,
            ]
        )

    def do(self, command: str, answer: str) -> dict:
        self.send(command)
        return self.next_event(answer)


@pytest.fixture
def start_producer(media_driver, shm_base) -> Iterator:
    started: list[ProducerRole] = []

    def start(*args: str) -> tuple[ProducerRole, int]:
        stream_id = next(_STREAMS)
        role = ProducerRole(media_driver.dir, shm_base, stream_id, *args)
        started.append(role)
        role.wait_event("ready")
        return role, stream_id

    yield start
    for role in started:
        stop_process(role.proc)


@pytest.fixture
def ctx(media_driver, shm_base) -> Iterator[tuple[AeronContext, ClientSettings]]:
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )
    with AeronContext(settings.transport) as context:
        context.start()
        yield context, settings


def _poll_until(consumer: Consumer, cond, frames: list, what: str, timeout: float = 30.0) -> None:
    def take(frame: Frame) -> None:
        frames.append((frame.seq, frame.copy()))

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        consumer.poll(take)
        time.sleep(0.001)


def _mapped_consumer(ctx, stream_id: int, **kw) -> Consumer:
    context, settings = ctx
    consumer = Consumer(context, stream_id, settings, **kw)
    _poll_until(consumer, lambda: consumer.is_mapped, [], "the consumer to map")
    return consumer


def _wait_interested(producer: ProducerRole, n: int) -> None:
    deadline = time.monotonic() + 30
    while producer.do("stats", "stats")["interested"] < n:
        assert time.monotonic() < deadline, "the producer never saw the progress hello"
        time.sleep(0.02)


def test_s10_2_2_opted_in_consumer_reads_each_filled_prefix_before_the_descriptor(
    start_producer, ctx
) -> None:
    """§10.2.2: STARTED at the claim, one PROGRESS per reported step with the bytes filled,
    COMPLETE after the commit; the consumer reads exactly the filled rows while the frame is
    being written, and a prefix read is never a frame (FrameDescriptor stays canonical)."""
    producer, stream_id = start_producer()
    consumer = _mapped_consumer(ctx, stream_id, progress=ProgressRequest())
    events: list[FrameProgress] = []
    consumer.set_progress_handler(events.append)
    frames: list = []
    try:
        _wait_interested(producer, 1)
        claimed = producer.do("claim", "claimed")
        seq = claimed["seq"]
        _poll_until(consumer, lambda: len(events) >= 1, frames, "STARTED")
        assert events[0].state is FrameProgressState.STARTED
        assert (events[0].frame_id, events[0].bytes_filled) == (seq, 0)
        expected = row_pattern(seq)
        for k in range(STEPS):
            stepped = producer.do(f"step {k}", "stepped")
            assert stepped["sent"], "interval 0 / delta 1: every step is reported"
            _poll_until(consumer, lambda k=k: len(events) >= k + 2, frames, f"PROGRESS {k}")
            ev = events[-1]
            assert ev.state is FrameProgressState.PROGRESS
            assert ev.bytes_filled == stepped["bytes"] == (k + 1) * (ROWS // STEPS) * COLS
            prefix = consumer.read_prefix(ev)
            assert prefix is not None, consumer.last_prefix_drop_reason
            rows = prefix.rows()
            assert rows is not None and rows.shape == (k + 1, COLS)
            np.testing.assert_array_equal(rows, expected[: k + 1])
        # still no frame: every prefix read above left the frame counters alone
        assert frames == [] and consumer.stats.frames == 0
        assert consumer.drops_late == 0 and consumer.drops_gap == 0
        producer.do("commit", "committed")
        _poll_until(
            consumer,
            lambda: frames and events[-1].state is FrameProgressState.COMPLETE,
            frames,
            "the frame and COMPLETE",
        )
        assert [s for s, _ in frames] == [seq]
        np.testing.assert_array_equal(frames[0][1], expected)
        assert events[-1].bytes_filled == ROWS * COLS
        assert consumer.stats.frames == 1
        assert consumer.stats.progress.snapshot() == {}
    finally:
        consumer.close()


def test_s10_2_2_prefix_read_of_a_reused_slot_fails_with_a_reason(start_producer, ctx) -> None:
    """§8.3 / §10.2.2: a prefix read is validated like any read: once the ring has reused the
    slot, reading the prefix an old progress message announced fails as prefix_slot_reused,
    counted apart from frame drops, and returns no bytes."""
    producer, stream_id = start_producer()
    consumer = _mapped_consumer(ctx, stream_id, progress=ProgressRequest())
    events: list[FrameProgress] = []
    consumer.set_progress_handler(events.append)
    frames: list = []
    try:
        _wait_interested(producer, 1)
        seq = producer.do("claim", "claimed")["seq"]
        producer.do("step 0", "stepped")
        _poll_until(consumer, lambda: len(events) >= 2, frames, "PROGRESS 0")
        old = events[-1]
        assert consumer.read_prefix(old) is not None  # the slot still holds the frame
        producer.do("commit", "committed")
        producer.do(f"offer {NSLOTS}", "offered")  # the ring wraps: frame seq's slot is reused
        drops_before = consumer.stats.drops.snapshot()
        assert consumer.read_prefix(old) is None
        assert consumer.last_prefix_drop_reason == PREFIX_SLOT_REUSED
        assert consumer.stats.progress[PREFIX_SLOT_REUSED] == 1
        assert consumer.stats.drops.snapshot() == drops_before
        assert old.frame_id == seq
    finally:
        consumer.close()


def test_s10_2_2_consumer_without_opt_in_sees_no_progress_and_none_is_published(
    start_producer, ctx, media_driver
) -> None:
    """§10.2.2 "only publish when at least one subscriber has supports_progress=true": a
    consumer that did not opt in causes no FrameProgress on the control stream (checked with a
    live ``tensorpool tap``); one that opts in later does, and tap decodes it."""
    producer, stream_id = start_producer()
    plain = _mapped_consumer(ctx, stream_id)
    tap = JsonLinesProcess(
        [
            sys.executable,
            "-u",
            "-m",
            "tensorpool",
            "tap",
            "--aeron-dir",
            media_driver.dir,
            "--duration",
            "120",
        ]
    )
    progress_consumer = None
    try:
        tap.wait_event(None, 60)  # its first line (records have no "event"): it has joined
        producer.do("claim", "claimed")
        producer.do("step 0", "stepped")
        producer.do("commit", "committed")
        assert producer.do("stats", "stats")["interested"] == 0
        progress_consumer = _mapped_consumer(ctx, stream_id, progress=ProgressRequest())
        events: list[FrameProgress] = []
        progress_consumer.set_progress_handler(events.append)
        _wait_interested(producer, 1)
        seq = producer.do("claim", "claimed")["seq"]
        producer.do("step 0", "stepped")
        producer.do("commit", "committed")
        _poll_until(
            progress_consumer,
            lambda: events and events[-1].state is FrameProgressState.COMPLETE,
            [],
            "COMPLETE",
        )
        time.sleep(0.5)
    finally:
        tap.proc.terminate()
        tap.proc.wait(timeout=30)
        # the rest through the same text reader: lines it already buffered are not on the fd
        out = tap.stdout.read()
        tap.stdout.close()
        if tap.proc.stdin is not None:
            tap.proc.stdin.close()
        plain.close()
        if progress_consumer is not None:
            progress_consumer.close()
    records = tap.events + [json.loads(line) for line in out.splitlines() if line.strip()]
    progress = [
        r
        for r in records
        if r.get("message") == "FrameProgress" and r["fields"]["stream_id"] == stream_id
    ]
    assert [r["fields"]["frame_id"] for r in progress] == [seq] * 3
    assert [r["fields"]["state"] for r in progress] == ["STARTED", "PROGRESS", "COMPLETE"]
    assert progress[1]["fields"]["payload_bytes_filled"] == (ROWS // STEPS) * COLS
    assert progress[2]["fields"]["payload_bytes_filled"] == ROWS * COLS
    assert progress[0]["fields"]["header_index"] == seq % NSLOTS


def test_s10_2_2_batch_claim_reports_each_frame_as_it_is_filled(start_producer, ctx) -> None:
    """The batch path (claim_batch -> progress -> commit_batch): STARTED for the first frame at
    the claim, then each report names the frame its byte count lies in, whose rows the consumer
    reads before any descriptor; commit_batch delivers every frame once and COMPLETE closes the
    frame last reported."""
    producer, stream_id = start_producer()
    consumer = _mapped_consumer(ctx, stream_id, progress=ProgressRequest())
    events: list[FrameProgress] = []
    consumer.set_progress_handler(events.append)
    frames: list = []
    n = 3
    try:
        _wait_interested(producer, 1)
        claimed = producer.do(f"bclaim {n}", "bclaimed")
        first = claimed["first"]
        assert claimed["n"] == n
        _poll_until(consumer, lambda: len(events) >= 1, frames, "STARTED")
        assert (events[0].state, events[0].frame_id) == (FrameProgressState.STARTED, first)
        for k in range(n):
            assert producer.do(f"bstep {k}", "bstepped")["sent"]
            _poll_until(consumer, lambda k=k: len(events) >= k + 2, frames, f"PROGRESS {k}")
            ev = events[-1]
            assert (ev.state, ev.frame_id, ev.header_index) == (
                FrameProgressState.PROGRESS,
                first + k,
                (first + k) % NSLOTS,
            )
            assert ev.bytes_filled == ROWS * COLS  # frame k is full; not frame k+1 empty
            prefix = consumer.read_prefix(ev)
            assert prefix is not None, consumer.last_prefix_drop_reason
            np.testing.assert_array_equal(prefix.rows(), row_pattern(first + k))
        assert frames == [] and consumer.stats.frames == 0
        producer.do("bcommit", "bcommitted")
        _poll_until(
            consumer,
            lambda: len(frames) == n and events[-1].state is FrameProgressState.COMPLETE,
            frames,
            "the batch's frames and COMPLETE",
        )
        assert [s for s, _ in frames] == list(range(first, first + n))
        for seq, array in frames:
            np.testing.assert_array_equal(array, row_pattern(seq))
        assert events[-1].frame_id == first + n - 1
        assert consumer.stats.progress.snapshot() == {}
    finally:
        consumer.close()


def test_s10_1_2_consumer_hints_reach_the_producer_policy(start_producer, ctx) -> None:
    """§10.1.2 / §10.2.2: an opted-in consumer's ``progressIntervalUs``/``progressBytesDelta``
    travel in its hello and become the producer's policy (the smallest offered, here above
    the producer's floors); a second consumer with larger hints changes nothing."""
    producer, stream_id = start_producer()
    first = _mapped_consumer(
        ctx, stream_id, progress=ProgressRequest(interval_us=100, bytes_delta=8192)
    )
    second = None
    try:
        _wait_interested(producer, 1)
        stats = producer.do("stats", "stats")
        assert (stats["interval_ns"], stats["bytes_delta"]) == (100_000, 8192)
        second = _mapped_consumer(
            ctx, stream_id, progress=ProgressRequest(interval_us=900, bytes_delta=1 << 20)
        )
        _wait_interested(producer, 2)
        stats = producer.do("stats", "stats")
        assert (stats["interval_ns"], stats["bytes_delta"]) == (100_000, 8192)
    finally:
        first.close()
        if second is not None:
            second.close()
