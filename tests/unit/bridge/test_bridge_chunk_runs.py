"""Staged chunk runs (``ReceiverCore.on_chunk_run``) decide exactly as one ``on_chunk`` per chunk.

The receiver agent copies every full-size middle chunk into a staging row and hands the rows
to the core after each poll (any other message first flushes what is staged). The property:
fed the same polls, a core driven that way and a core fed one chunk at a time produce the
same events in the same order (completed frames byte for byte, every drop with its reason),
the same counters and the same assembly state after every poll — under several chunk sizes,
payloads that are exact multiples of the chunk size, interleaved streams, duplicates,
reordering, loss, corrupt fields in the middle of a run, epoch changes and timeouts.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import numpy as np
import pytest
from bridge_helpers import (
    DEST,
    MS,
    NSLOTS,
    OFF_COUNT,
    OFF_EPOCH,
    OFF_HINC,
    OFF_HLEN,
    OFF_INDEX,
    OFF_LENGTH,
    OFF_OFFSET,
    OFF_PLEN,
    OFF_SEQ,
    OFF_STREAM,
    SRC,
    TIMEOUT_NS,
    announce,
    make_frame,
    patch,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorpool.bridge.assembler import (
    RUN_HEAD,
    Dropped,
    FrameComplete,
    OpenDestination,
    ReceiverCore,
    ReceiverMapping,
    ScratchSink,
)
from tensorpool.bridge.reasons import ChunkDrop, FrameDrop

SRC2 = SRC + 1
DEST2 = DEST + 1
LOCAL_STRIDE = 1 << 20
# head fields a corruption may hit: SBE header words, stream, epoch, seq, index, count, offset,
# lengths, headerIncluded, headerBytes length, payloadBytes length
CORRUPT_AT = [0, 2, 4, 6, OFF_STREAM, OFF_EPOCH, OFF_SEQ, OFF_INDEX, OFF_COUNT, OFF_OFFSET,
              OFF_LENGTH, OFF_PLEN, OFF_HINC, OFF_HLEN, 53]  # fmt: skip


@dataclass
class Poll:
    """One agent duty cycle: control messages first, then the payload poll, then tick."""

    now: int
    announces: list[tuple[int, int]] = field(default_factory=list)  # (mapping, epoch)
    msgs: list[bytes] = field(default_factory=list)


def new_core(chunk_bound: int) -> tuple[ReceiverCore, ScratchSink]:
    sink = ScratchSink()
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST), ReceiverMapping(1, SRC2, DEST2)],
        chunk_bound=chunk_bound,
        max_payload_bytes=1 << 20,
        assembly_timeout_ns=TIMEOUT_NS,
        sink=sink,
    )
    for m in (0, 1):
        apply_announce(core, m, 1, 0)
    return core, sink


def apply_announce(core: ReceiverCore, mapping: int, epoch: int, now: int) -> list[object]:
    """What the agent does: the announce, then (re)open the destination it asks for."""
    events: list[object] = list(core.on_announce(announce(epoch, stream_id=SRC + mapping), now))
    if any(isinstance(e, OpenDestination) for e in events):
        core.destination_ready(
            mapping,
            header_nslots=NSLOTS,
            max_stride=LOCAL_STRIDE,
            dest_stream_id=DEST + mapping,
        )
    return events


def event(r: object) -> object:
    """Comparable, and copied out: a FrameComplete's payload is the reusable sink buffer."""
    if isinstance(r, FrameComplete):
        return ("complete", r.mapping, r.source_stream_id, r.dest_stream_id, r.epoch, r.seq,
                r.layout.blob, r.values_len_bytes, r.timestamp_ns, r.meta_version,
                r.source_pool_id, r.header, bytes(r.payload))  # fmt: skip
    return r


def state(core: ReceiverCore, sink: ScratchSink) -> object:
    """Everything a later chunk's fate or an operator's view depends on."""
    out: list[object] = [core.chunk_drops.snapshot(), sink.acquired, sink.released]
    for m in (0, 1):
        s = core._by_index[m]
        out += [core.stats(m).snapshot(), s.floor, s.epoch]
        a = s.asm
        if a is None:
            out.append(None)
            continue
        starts = dict(a.starts)
        for start, end, clen in a.runs:
            starts.update(dict.fromkeys(range(start, end, clen), clen))
        out.append((a.seq, a.count, a.plen, a.first_ns, a.prefix, list(a.pending),
                    sorted(starts.items()), bytes(a.received), a.nrecv, a.header,
                    bytes(a.buf)))  # fmt: skip
    return out


class Scalar:
    """One on_chunk per message: the reference."""

    def __init__(self, chunk_bound: int) -> None:
        self.core, self.sink = new_core(chunk_bound)

    def poll(self, p: Poll) -> list[object]:
        out: list[object] = []
        for m, epoch in p.announces:
            out += apply_announce(self.core, m, epoch, p.now)
        for msg in p.msgs:
            r = self.core.on_chunk(msg, p.now)
            if r is not None:
                out.append(event(r))
        out += self.core.tick(p.now)
        return out


class Staged:
    """The agent's split (BridgeReceiver._chunk_handler / _flush_run), without Aeron."""

    def __init__(self, chunk_bound: int, capacity: int) -> None:
        self.core, self.sink = new_core(chunk_bound)
        self.rows = np.zeros((capacity, RUN_HEAD + chunk_bound), np.uint8)
        self.k = 0
        self.bulk_rows = 0
        bulk = self.core._bulk

        def counting(*args: object) -> tuple[int, object]:
            n, r = bulk(*args)  # type: ignore[arg-type]
            self.bulk_rows += n
            return n, r

        self.core._bulk = counting  # type: ignore[method-assign]

    def flush(self, now: int, out: list[object]) -> None:
        k, self.k = self.k, 0
        for r in self.core.on_chunk_run(self.rows, k, now):  # lazily, as the agent
            out.append(event(r))

    def poll(self, p: Poll) -> list[object]:
        out: list[object] = []
        for m, epoch in p.announces:
            out += apply_announce(self.core, m, epoch, p.now)
        stride = self.rows.shape[1]
        for msg in p.msgs:
            if len(msg) == stride and self.k < self.rows.shape[0]:
                self.rows[self.k] = np.frombuffer(msg, np.uint8)
                self.k += 1
                continue
            if self.k:
                self.flush(p.now, out)
            r = self.core.on_chunk(msg, p.now)
            if r is not None:
                out.append(event(r))
        if self.k:
            self.flush(p.now, out)
        out += self.core.tick(p.now)
        return out


def run_both(polls: list[Poll], chunk_bound: int, capacity: int) -> tuple[Staged, list[object]]:
    ref = Scalar(chunk_bound)
    staged = Staged(chunk_bound, capacity)
    events: list[object] = []
    for i, p in enumerate(polls):
        want = ref.poll(p)
        got = staged.poll(p)
        assert got == want, f"poll {i}: events differ"
        assert state(staged.core, staged.sink) == state(ref.core, ref.sink), f"poll {i}: state"
        events += want
    return staged, events


# --------------------------------------------------------------------------- scenarios


def corrupt(rng: random.Random, msg: bytes) -> bytes:
    b = bytearray(msg)
    at = rng.choice(CORRUPT_AT)
    if at == OFF_HINC:
        b[at] ^= rng.choice([1, 2])
    else:
        width = 4 if at >= 8 and at not in (OFF_EPOCH, OFF_SEQ) else (8 if at >= 8 else 2)
        fmt = {2: "<H", 4: "<I", 8: "<Q"}[width]
        old = struct.unpack_from(fmt, b, at)[0]
        new = rng.choice([old + 1, old - 1, 0, old + 1280, (1 << (8 * width)) - 1])
        struct.pack_into(fmt, b, at, new % (1 << (8 * width)))
    return bytes(b)


def scenario(rng: random.Random, force: str = "") -> tuple[list[Poll], int, int]:
    """Random polls over two streams: (polls, chunk_bound, staging capacity)."""
    chunk_bound = rng.choice([64, 80, 128])
    capacity = rng.choice([1, 3, 8, 64])
    streams: list[list[bytes]] = []
    switch: dict[int, int] = {}  # mapping -> message position (in its stream) of epoch 2
    for m in (0, 1):
        msgs: list[bytes] = []
        epoch = 1
        for seq in range(1, rng.randint(2, 5) + 1):
            flip = (force == "epoch" and m == 0 and seq == 3) or (not force and rng.random() < 0.1)
            if flip and epoch == 1:
                epoch = 2
                switch[m] = len(msgs)
            chunk = chunk_bound if rng.random() < 0.85 else rng.randint(16, chunk_bound)
            kind = rng.random()
            if kind < 0.4 or force == "multiple":
                nbytes = chunk * rng.randint(1, 24)  # ends on a full chunk
            elif kind < 0.9:
                nbytes = chunk * rng.randint(0, 24) + rng.randint(1, chunk - 1)
            else:
                nbytes = rng.choice([0, 1])
            f = make_frame(seq, nbytes, epoch=epoch, chunk=chunk, stream_id=SRC + m)
            msgs += f.chunks
        streams.append(msgs)
    # interleave the two streams in blocks (block 1 = chunk by chunk)
    merged: list[tuple[int, int, bytes]] = []
    pos = [0, 0]
    while pos[0] < len(streams[0]) or pos[1] < len(streams[1]):
        m = rng.randrange(2) if force != "interleave" else (len(merged) // 3) % 2
        if pos[m] >= len(streams[m]):
            m = 1 - m
        block = rng.randint(1, 40) if force != "interleave" else 3
        for msg in streams[m][pos[m] : pos[m] + block]:
            merged.append((m, pos[m], msg))
            pos[m] += 1
    # faults, mostly inside runs of full-size chunks
    rate = 0.02 if not force else 0.0
    out: list[tuple[int, int, bytes]] = []
    forced = False
    for i, (m, p, msg) in enumerate(merged):
        mid_run = len(msg) == RUN_HEAD + chunk_bound and i > 5
        want = force if (force and mid_run and not forced) else ""
        r = rng.random()
        if want == "duplicate" or (r < rate):
            out += [(m, p, msg), (m, p, msg)]
        elif want == "reorder" or r < 2 * rate:
            if out and i + 1 < len(merged):
                out.append(merged[i + 1])
                merged[i + 1] = (m, p, msg)
                forced = forced or want == "reorder"
                continue
            out.append((m, p, msg))
        elif want == "corrupt" or r < 3 * rate:
            out.append((m, p, corrupt(rng, msg)))
        elif want == "loss" or r < 4 * rate:
            pass
        else:
            out.append((m, p, msg))
        forced = forced or bool(want)
    # polls: announces of epoch 2 arrive with (or a little after) that epoch's first chunk
    polls: list[Poll] = []
    now = 0
    pending = dict(switch)
    i = 0
    while i < len(out):
        n = rng.randint(1, 60)
        now += MS if rng.random() > 0.08 and force != "timeout" else TIMEOUT_NS // 2 + MS
        poll = Poll(now)
        for m, at in list(pending.items()):
            if any(mm == m and p >= at + rng.randint(0, 3) for mm, p, _ in out[i : i + n]):
                poll.announces.append((m, 2))
                del pending[m]
        poll.msgs = [msg for _, _, msg in out[i : i + n]]
        polls.append(poll)
        i += n
    polls.append(Poll(now + 2 * TIMEOUT_NS))  # whatever is left in flight times out
    return polls, chunk_bound, capacity


# --------------------------------------------------------------------------- properties


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_staged_runs_decide_exactly_like_one_chunk_at_a_time(seed: int) -> None:
    polls, chunk_bound, capacity = scenario(random.Random(seed))
    run_both(polls, chunk_bound, capacity)


@pytest.mark.parametrize(
    "force",
    ["multiple", "interleave", "duplicate", "reorder", "corrupt", "loss", "epoch", "timeout"],
)
def test_staged_runs_named_cases(force: str) -> None:
    """Each case at least once, on several seeds, and the bulk path really ran."""
    bulk = 0
    for seed in range(12):
        polls, chunk_bound, capacity = scenario(random.Random(seed), force)
        staged, _events = run_both(polls, chunk_bound, max(capacity, 8))
        bulk += staged.bulk_rows
    assert bulk > 100


def test_staged_640k_frames_complete_in_bulk_and_match_the_sender() -> None:
    """The benchmark's shape: 640 KiB at 1280-byte chunks, a payload that ends on a full
    chunk (completed by the bulk path) and one that does not, polls of 256 messages."""
    frames = [make_frame(1, 655360), make_frame(2, 655360 - 100), make_frame(3, 655360)]
    msgs = [c for f in frames for c in f.chunks]
    polls = [Poll(MS, msgs=msgs[i : i + 256]) for i in range(0, len(msgs), 256)]
    staged, events = run_both(polls, 1280, 256)
    done = [e for e in events if isinstance(e, tuple)]
    assert [e[5] for e in done] == [1, 2, 3]
    assert [e[-1] for e in done] == [f.payload for f in frames]
    assert staged.bulk_rows == 511 + 510 + 511
    assert not any(isinstance(e, Dropped) for e in events)


def test_staged_duplicate_after_a_bulk_run_is_still_recognised() -> None:
    """Chunks accepted in bulk are known by offset (asm.runs): a later duplicate of one is
    a counted duplicate, a conflicting copy drops the frame — as one at a time."""
    f = make_frame(1, 40 * 128, chunk=128)
    dup = f.chunks[5]
    bad = bytearray(f.chunks[6])
    bad[-1] ^= 0xFF
    polls = [Poll(MS, msgs=f.chunks[:20]), Poll(2 * MS, msgs=[dup, *f.chunks[20:30]]),
             Poll(3 * MS, msgs=[bytes(bad)])]  # fmt: skip
    staged, events = run_both(polls, 128, 64)
    assert [e.reason for e in events if isinstance(e, Dropped)] == [
        ChunkDrop.DUPLICATE,
        FrameDrop.CHUNK_CONFLICT,
    ]
    assert staged.bulk_rows >= 19


def test_staged_run_stops_at_an_index_already_received() -> None:
    """Placement is by offset, so an index can arrive before its offset's turn: a run that
    reaches it is cut there and the row goes one at a time (a conflict, as on_chunk says)."""
    f = make_frame(1, 10 * 64, chunk=64)
    early = patch(f.chunks[1], OFF_INDEX, "<I", 5)  # offset 64 claims index 5
    polls = [Poll(MS, msgs=[f.chunks[0], early]), Poll(2 * MS, msgs=f.chunks[2:8])]
    staged, events = run_both(polls, 64, 8)
    assert staged.bulk_rows == 3  # indices 2-4 (5 is taken); the early chunk went alone
    assert [e.reason for e in events if isinstance(e, Dropped)] == [
        FrameDrop.CHUNK_CONFLICT,
        ChunkDrop.STALE_SEQ,
        ChunkDrop.STALE_SEQ,
    ]


def test_staged_run_edges() -> None:
    """Nothing staged is nothing to do; rows that cannot hold a chunk head go one at a time."""
    core, _ = new_core(64)
    assert list(core.on_chunk_run(np.zeros((4, 121), np.uint8), 0, 0)) == []
    short = list(core.on_chunk_run(np.zeros((2, 40), np.uint8), 2, 0))
    assert [e.reason for e in short] == [ChunkDrop.TRUNCATED] * 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        list(core.on_chunk_run(np.zeros((4, 121), np.uint16), 2, 0))


def forged_next(msg: bytes, steps: int, clen: int) -> bytes:
    """``msg`` moved ``steps`` chunks on: index and offset advanced, the rest identical."""
    idx, _count, off = struct.unpack_from("<III", msg, OFF_INDEX)
    return patch(patch(msg, OFF_INDEX, "<I", idx + steps), OFF_OFFSET, "<I", off + steps * clen)


def test_staged_run_that_goes_past_the_frame_is_cut_at_its_bounds() -> None:
    """Rows that continue one another beyond chunkCount or payloadLength: bulk stops at the
    frame's last index / last byte, the rest are refused one at a time."""
    f = make_frame(1, 10 * 64, chunk=64)  # ends on a full chunk: the run completes it
    past_count = [forged_next(f.chunks[-1], i, 64) for i in (1, 2)]
    g = make_frame(2, 10 * 64, chunk=64)
    wide = [patch(c, OFF_COUNT, "<I", 12) for c in g.chunks]  # 12 chunks "fit" 640 bytes
    past_plen = [forged_next(wide[-1], i, 64) for i in (1, 2)]
    h = make_frame(3, 10 * 64, chunk=64)  # indices run 2 ahead of offsets: count ends first
    ahead = [patch(c, OFF_INDEX, "<I", i + 2) for i, c in enumerate(h.chunks[1:9], start=1)]
    polls = [
        Poll(MS, msgs=f.chunks + past_count),
        Poll(2 * MS, msgs=wide + past_plen),
        Poll(3 * MS, msgs=[h.chunks[0], *ahead]),
    ]
    staged, events = run_both(polls, 64, 64)
    assert staged.bulk_rows == 9 + 9 + 7
    assert [e.reason for e in events if isinstance(e, Dropped)] == [
        ChunkDrop.CHUNK_INDEX_OUT_OF_RANGE,
        ChunkDrop.CHUNK_INDEX_OUT_OF_RANGE,
        ChunkDrop.CHUNK_OUT_OF_BOUNDS,
        ChunkDrop.CHUNK_OUT_OF_BOUNDS,
        ChunkDrop.CHUNK_INDEX_OUT_OF_RANGE,
    ]
    assert staged.core.stats(0).frame_drops[FrameDrop.SUPERSEDED] == 1  # frame 2, by frame 3
