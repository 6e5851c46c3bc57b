"""The sender's chunk writer over a real Aeron publication (Bridge Spec §5.1, §5.2, §5.3).

An embedded media driver and an IPC channel stand in for UDP (the bytes on the wire are the
same); everything the sender publishes is fed to a real receiver core, so these tests check
the two halves agree.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
from bridge_helpers import DEST, NSLOTS, SRC, announce, header_slot, pattern, u8_layout

from tensorpool.bridge.assembler import FrameComplete, ReceiverCore, ReceiverMapping
from tensorpool.bridge.reasons import SendDrop
from tensorpool.bridge.sender import PENDING, ChunkSender
from tensorpool.specs import peek_header
from tensorpool.transport import AeronContext

CHANNEL = "aeron:ipc?term-length=4m"
_ids = itertools.count(7401)


@pytest.fixture(scope="module")
def ctx() -> Iterator[AeronContext]:
    with AeronContext() as c:
        yield c


class Wire:
    """A publication plus a subscriber that keeps every message it gets."""

    def __init__(self, ctx: AeronContext, *, connect: bool = True) -> None:
        sid = next(_ids)
        self.pub = ctx.add_publication(CHANNEL, sid, exclusive=False)
        self.msgs: list[bytes] = []
        self.sub = (
            ctx.add_subscription(CHANNEL, sid, lambda b, h: self.msgs.append(bytes(b)))
            if connect
            else None
        )
        deadline = time.monotonic() + 5
        while connect and not self.pub.is_connected:
            assert time.monotonic() < deadline
            time.sleep(0.001)

    def drain(self) -> list[bytes]:
        assert self.sub is not None
        while self.sub.poll(1000):
            pass
        out, self.msgs = self.msgs, []
        return out

    @property
    def max_claim(self) -> int:
        return int(self.pub.publication.max_payload_length)  # type: ignore[union-attr]


def receiver(chunk: int) -> ReceiverCore:
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST)], chunk_bound=chunk, max_payload_bytes=1 << 30,
        assembly_timeout_ns=10**9,
    )  # fmt: skip
    core.on_announce(announce(), 0)
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=1 << 20, dest_stream_id=DEST)
    return core


def send(cs: ChunkSender, seq: int, n: int, current: bool = True) -> tuple[str | None, bytes]:
    data = pattern(seq, n)
    hdr = header_slot(seq, u8_layout(max(n, 1)) if n else u8_layout(1), n)
    return cs.send(SRC, 1, seq, memoryview(hdr), memoryview(data), lambda: current), data


@pytest.mark.parametrize("strategy", ["staging", "claim"])
@pytest.mark.parametrize("chunk", [100, 1000])
def test_s5_2_sent_chunks_reassemble_for_every_length(
    ctx: AeronContext, strategy: str, chunk: int
) -> None:
    """0, 1, c-1, c, c+1, k*c and k*c+1 bytes: chunk 0 carries the header slot, chunks are
    uniform and in order, and the receiver core rebuilds the exact bytes."""
    wire = Wire(ctx)
    cs = ChunkSender(wire.pub, chunk, wire.max_claim, stream_id=SRC, strategy=strategy)
    core = receiver(chunk)
    lengths = [1, chunk - 1, chunk, chunk + 1, 7 * chunk, 7 * chunk + 1, 3 * chunk, 5]
    lengths += [7 * chunk + 1, 3 * chunk, 7 * chunk + 1]  # cached layouts, headers re-stamped
    for seq, n in enumerate(lengths, start=1):
        reason, data = send(cs, seq, n)
        assert reason is None
        msgs = wire.drain()
        assert len(msgs) == max(1, -(-n // chunk))
        # §7: only BridgeFrameChunk messages (schema 902, template 1) leave the sender
        assert {peek_header(m)[1:3] for m in msgs} == {(1, 902)}
        # §5.2: published in order, uniform chunks
        assert [int.from_bytes(m[28:32], "little") for m in msgs] == list(range(len(msgs)))
        assert [int.from_bytes(m[36:40], "little") for m in msgs] == [
            i * chunk for i in range(len(msgs))
        ]
        done = [r for m in msgs if isinstance(r := core.on_chunk(m, 0), FrameComplete)]
        assert len(done) == 1 and bytes(done[0].payload) == data and done[0].seq == seq


def test_s5_2_empty_payload_is_one_chunk(ctx: AeronContext) -> None:
    wire = Wire(ctx)
    cs = ChunkSender(wire.pub, 1280, wire.max_claim, stream_id=SRC)
    import numpy as np

    from tensorpool.shm.tensor import TensorLayout

    hdr = header_slot(1, TensorLayout.contiguous((0,), np.uint8), 0)
    assert cs.send(SRC, 1, 1, memoryview(hdr), memoryview(b""), lambda: True) is None
    (msg,) = wire.drain()
    done = receiver(1280).on_chunk(msg, 0)
    assert isinstance(done, FrameComplete) and done.values_len_bytes == 0


@pytest.mark.parametrize("strategy", ["staging", "claim"])
def test_s5_3_frame_overwritten_during_send_never_completes(
    ctx: AeronContext, strategy: str
) -> None:
    """If the slot changed while the frame was being copied out, the receiver never gets a
    complete frame: staging sends nothing, claim withholds the last chunk."""
    wire = Wire(ctx)
    cs = ChunkSender(wire.pub, 1000, wire.max_claim, stream_id=SRC, strategy=strategy)
    reason, _ = send(cs, 1, 5000, current=False)
    assert reason == SendDrop.SOURCE_OVERWRITTEN
    msgs = wire.drain()
    assert len(msgs) < 5
    core = receiver(1000)
    assert not any(isinstance(core.on_chunk(m, 0), FrameComplete) for m in msgs)
    # the next frame goes through normally
    reason, data = send(cs, 2, 5000)
    assert reason is None
    done = [r for m in wire.drain() if isinstance(r := core.on_chunk(m, 0), FrameComplete)]
    assert [bytes(d.payload) for d in done] == [data]


def test_s5_2_no_subscriber_drops_without_blocking(ctx: AeronContext) -> None:
    """Nobody listening: the frame is dropped and counted at once, never waited on."""
    wire = Wire(ctx, connect=False)
    cs = ChunkSender(wire.pub, 1000, 1376, stream_id=SRC)
    reason, _ = send(cs, 1, 50_000)
    assert reason == SendDrop.NOT_CONNECTED
    assert wire.pub.counters.not_connected >= 1


@pytest.mark.parametrize("strategy", ["staging", "claim"])
def test_s5_2_back_pressure_drops_frames_and_cut_frames_never_complete(
    ctx: AeronContext, strategy: str
) -> None:
    """A subscriber that never reads: once the window is full, frames are dropped
    (back_pressured) without waiting; a frame cut short never completes at the receiver,
    and the frames reported sent arrive whole."""
    wire = Wire(ctx)  # subscribed, never drained
    cs = ChunkSender(wire.pub, 1000, wire.max_claim, stream_id=SRC, strategy=strategy)
    results = [send(cs, seq, 600_000)[0] for seq in range(1, 12)]
    assert results[0] is None
    assert SendDrop.BACK_PRESSURED in results
    assert cs.stats.drops[SendDrop.BACK_PRESSURED] == results.count(SendDrop.BACK_PRESSURED)
    core = receiver(1000)
    done = [
        (r.seq, bytes(r.payload))  # the payload view is only valid until the next chunk
        for m in wire.drain()
        if isinstance(r := core.on_chunk(m, 0), FrameComplete)
    ]
    assert [seq for seq, _ in done] == [i + 1 for i, r in enumerate(results) if r is None]
    assert all(data == pattern(seq, 600_000) for seq, data in done)


def test_claim_strategy_falls_back_to_staging_when_chunks_exceed_one_frame(
    ctx: AeronContext,
) -> None:
    wire = Wire(ctx)
    big = wire.max_claim + 100  # a chunk that cannot be claimed in one piece
    cs = ChunkSender(wire.pub, big, wire.max_claim, stream_id=SRC, strategy="claim")
    reason, data = send(cs, 1, 3 * big)
    assert reason is None
    core = receiver(big)
    done = [r for m in wire.drain() if isinstance(r := core.on_chunk(m, 0), FrameComplete)]
    assert [bytes(d.payload) for d in done] == [data]


def test_s5_2_full_window_keeps_one_staged_frame_and_sends_it_when_room_appears(
    ctx: AeronContext,
) -> None:
    """Staging strategy: a frame that finds the window full is held (its private copy was
    validated already) and goes out whole once the receiver catches up; frames arriving
    meanwhile are dropped and counted; nothing ever blocks."""
    wire = Wire(ctx)  # subscribed, not drained yet
    cs = ChunkSender(wire.pub, 1000, wire.max_claim, stream_id=SRC)
    core = receiver(1000)
    results: list[str | None] = []
    for seq in range(1, 12):
        data = pattern(seq, 600_000)
        hdr = header_slot(seq, u8_layout(600_000), 600_000)
        results.append(cs.submit(SRC, 1, seq, memoryview(hdr), memoryview(data), lambda: True))
    held = results.index(PENDING) + 1  # seq of the first frame that found no room
    assert results[: held - 1] == [None] * (held - 1)
    assert all(r == SendDrop.BACK_PRESSURED for r in results[held:])
    assert cs.pending and cs.stats.drops[SendDrop.BACK_PRESSURED] == 11 - held
    done: list[int] = []
    deadline = time.monotonic() + 10
    while cs.pending:
        assert time.monotonic() < deadline
        done += [r.seq for m in wire.drain() if isinstance(r := core.on_chunk(m, 0), FrameComplete)]
        cs.flush(0)
    done += [r.seq for m in wire.drain() if isinstance(r := core.on_chunk(m, 0), FrameComplete)]
    assert done == list(range(1, held + 1))  # the held frame arrived whole, after the others
    assert cs.stats.frames == held


def test_s5_2_staged_frame_is_dropped_after_max_hold(ctx: AeronContext) -> None:
    wire = Wire(ctx)
    cs = ChunkSender(wire.pub, 1000, wire.max_claim, stream_id=SRC, max_hold_ns=1000)
    now = 0
    while True:
        data = pattern(1, 600_000)
        hdr = header_slot(1, u8_layout(600_000), 600_000)
        if cs.submit(SRC, 1, 1, memoryview(hdr), memoryview(data), lambda: True, now) == PENDING:
            break
    assert cs.flush(now + 1000) == PENDING
    assert cs.flush(now + 1001) == SendDrop.BACK_PRESSURED and not cs.pending


def test_frame_raw_views_expose_the_header_slot_and_payload_bytes(ctx: AeronContext) -> None:
    """The consumer hook the sender chunks from: the 256 header-slot bytes (seq_commit,
    SlotHeader fields, embedded TensorHeader) and exactly values_len_bytes of payload."""
    import os
    import shutil
    import tempfile

    import numpy as np

    from tensorpool.client.consumer import Consumer, Frame
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.client.settings import ClientSettings
    from tensorpool.endpoints import Endpoints
    from tensorpool.shm.tensor import TensorLayout

    base = tempfile.mkdtemp(
        prefix="tp-bridge-hook-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    sid = next(_ids)
    settings = ClientSettings(
        shm_base_dir=base,
        channels=Endpoints(control_stream_id=sid, descriptor_stream_id=sid + 1),
        announce_period_ns=50_000_000,
    )
    try:
        with Producer(ctx, StreamConfig(sid, header_nslots=8, pools=(PoolConfig(1, 4096),)),
                      settings) as prod, Consumer(ctx, sid, settings) as cons:  # fmt: skip
            arr = np.arange(300, dtype="<u2").reshape(20, 15)
            got: list[tuple[bytes, bytes, int]] = []

            def take(f: Frame) -> None:
                hdr, pay = f.raw_views()
                got.append((bytes(hdr), bytes(pay), f.seq))
                assert f.is_current()

            deadline = time.monotonic() + 10
            while not got:
                assert time.monotonic() < deadline
                prod.do_work()
                if cons.is_mapped:
                    prod.offer(arr, timestamp_ns=77)
                cons.poll(take)
            hdr, pay, seq = got[0]
            assert len(hdr) == 256 and pay == arr.tobytes()
            assert int.from_bytes(hdr[:8], "little") == (seq << 1) | 1
            assert TensorLayout.from_blob(hdr[60:]) == TensorLayout.contiguous((20, 15), "<u2")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("strategy", ["staging", "claim"])
@pytest.mark.parametrize("chunk", [100, 1000])
def test_s5_1_sent_messages_are_byte_identical_to_the_straightforward_encoding(
    ctx: AeronContext, strategy: str, chunk: int
) -> None:
    """The fast senders (pre-stamped staging rows, per-frame epoch/seq patch, vectorized
    payload copy, C-level offer loop; or try_claim) publish exactly the bytes that
    ``Chunker.encode_frame`` — one plain ``pack_into`` per chunk, itself checked against the
    generated codec — writes for the same frame: same messages, same order, same bytes.
    Lengths change between frames (cached layouts are re-stamped), so do the stream id, the
    epoch and seq (u64 values above 2**32) and the payload."""
    from tensorpool.bridge.chunker import Chunker

    wire = Wire(ctx)
    cs = ChunkSender(wire.pub, chunk, wire.max_claim, stream_id=SRC, strategy=strategy)
    plain = Chunker(chunk)
    big = 1 << 40
    frames = [  # (stream id, epoch, seq, length)
        (SRC, 1, 1, 7 * chunk + 1),
        (SRC, 1, 2, 7 * chunk + 1),  # same layout again: only epoch/seq/payload change
        (SRC, big + 3, big + 9, 7 * chunk + 1),
        (SRC, big + 3, big + 10, 3 * chunk),
        (SRC + 1, 5, 11, 3 * chunk),  # same length, another stream: headers re-stamped
        (SRC, 2, 12, chunk - 1),
        (SRC, 2, 13, 7 * chunk + 1),
        (SRC, 2, 14, 1),
    ]
    for stream, epoch, seq, n in frames:
        data = pattern(seq, n)
        hdr = header_slot(seq, u8_layout(n), n)
        assert cs.send(stream, epoch, seq, memoryview(hdr), memoryview(data), lambda: True) is None
        want = plain.encode_frame(stream_id=stream, epoch=epoch, seq=seq, header=hdr, payload=data)
        assert wire.drain() == want, (stream, epoch, seq, n)


def test_part_of_a_staged_frame_going_out_is_work_for_the_idle_strategy(
    ctx: AeronContext,
) -> None:
    """A staged frame larger than the window goes out over several duty cycles. Each cycle
    in which some of its chunks went out reports work, even though the frame is not done:
    the window is moving, so the runner's idle strategy polls again soon instead of parking
    (up to ``--idle-max-park-us``) between the steps. Frames arriving meanwhile are dropped
    (back_pressured)."""
    import os
    import shutil
    import tempfile

    import numpy as np

    from tensorpool.bridge.config import parse_bridge_config
    from tensorpool.bridge.sender import BridgeSender
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig

    base = tempfile.mkdtemp(
        prefix="tp-bridge-idle-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    src, payload_sid = next(_ids), next(_ids)
    small_window = "aeron:ipc?term-length=64k"  # IPC window: half a term
    doc = {
        "bridge": {
            "instance_id": "idle-test", "role": "sender",
            "payload_channel": small_window, "payload_stream_id": payload_sid,
            "control_channel": CHANNEL, "control_stream_id": next(_ids),
            "metadata_channel": CHANNEL, "metadata_stream_id": next(_ids),
            "forward_metadata": False, "mtu_bytes": 1408,
        },
        "local": {"aeron_dir": ctx.dir, "driver_mode": False, "shm_base_dir": base,
                  "announce_period_ms": 50},
        "profiles": {"p": {"header_nslots": 8, "payload_pools": [
            {"pool_id": 1, "stride_bytes": 1 << 20}]}},
        "mappings": [{"source_stream_id": src, "dest_stream_id": src + 1, "profile": "p"}],
    }  # fmt: skip
    config = parse_bridge_config(doc)
    # a subscriber that never reads: after the first frame or two the window stays full
    stuck = ctx.add_subscription(small_window, payload_sid, lambda b, h: None)
    announces = ctx.add_subscription(CHANNEL, doc["bridge"]["control_stream_id"], lambda b, h: None)
    sender = BridgeSender(ctx, config)
    settings = config.local.client_settings()
    frame = np.zeros(600_000, np.uint8)
    try:
        with Producer(ctx, StreamConfig(src, header_nslots=8, pools=(PoolConfig(1, 1 << 20),)),
                      settings) as prod:  # fmt: skip
            sm = sender.mappings[0]
            drops = sm.stats.drops
            deadline = time.monotonic() + 10
            while not sm.chunks.pending:  # until a staged frame waits for window
                assert time.monotonic() < deadline
                prod.do_work()
                if sm.consumer.is_mapped:
                    prod.offer(frame)
                sender.do_work()
            for _ in range(5):  # more frames while the window is full: dropped, counted
                prod.offer(frame)
                sender.do_work()
            assert sm.chunks.pending and drops[SendDrop.BACK_PRESSURED] > 0
            # the receiver reads a little: part of the staged frame goes out, which is work
            while True:
                assert time.monotonic() < deadline + 10
                stuck.poll(8)  # the window is 32 KiB, the frame 600 KB: a small step
                work = sender.do_work()
                if sm.chunks.moved and sm.chunks.pending:
                    assert work > 0
                    break
    finally:
        sender.close()
        ctx.release(stuck)
        ctx.release(announces)
        shutil.rmtree(base, ignore_errors=True)
