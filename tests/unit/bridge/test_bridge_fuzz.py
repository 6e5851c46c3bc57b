"""Fuzzing the receiver core with random and mutated ``BridgeFrameChunk`` messages.

Properties (Bridge Spec §5.2, §5.3, §6):

* it never raises, whatever the bytes;
* it never asks for a buffer larger than the validated bounds (max payload, source and
  local strides) — nothing is allocated from an untrusted length;
* every frame it publishes satisfies §6 on its own terms (header seq, values_len equal to
  the payload length, pool id announced, decodable layout covered by values_len), at most
  once per seq, in increasing seq order;
* under loss, duplication, reordering within a frame and truncation — with the payload
  bytes themselves intact — a published frame is byte-identical to what was sent, and a
  frame none of whose chunks was lost is published.

Bit flips inside payload bytes are not "detectable corruption": v1.0 has no checksum
(§5.4, integrity comes from UDP/Aeron), so the payload-equality property is asserted only
for the mutation families that leave payload bytes alone.
"""

from __future__ import annotations

import random
import struct

from bridge_helpers import (
    CHUNK,
    DEST,
    NSLOTS,
    SOURCE_STRIDE,
    SRC,
    announce,
    header_slot,
    make_frame,
    pattern,
    u8_layout,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorpool.bridge.assembler import (
    Dropped,
    FrameComplete,
    ReceiverCore,
    ReceiverMapping,
    ScratchSink,
)
from tensorpool.shm.tensor import TensorLayout
from tensorpool.specs.generated.bridge import BridgeFrameChunkEncoder

LOCAL_STRIDE = 1 << 16
MAX_PAYLOAD = 1 << 15
SMALL_CHUNK = 64
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class BoundedSink(ScratchSink):
    def __init__(self) -> None:
        super().__init__()
        self.max_seen = 0

    def acquire(self, mapping: int, seq: int, payload_length: int) -> memoryview | str:
        self.max_seen = max(self.max_seen, payload_length)
        return super().acquire(mapping, seq, payload_length)


def new_core(chunk_bound: int = SMALL_CHUNK) -> tuple[ReceiverCore, BoundedSink]:
    sink = BoundedSink()
    core = ReceiverCore(
        [ReceiverMapping(0, SRC, DEST)],
        chunk_bound=chunk_bound,
        max_payload_bytes=MAX_PAYLOAD,
        assembly_timeout_ns=250_000_000,
        sink=sink,
    )
    core.on_announce(announce(pools=((1, NSLOTS, 4096), (2, NSLOTS, SOURCE_STRIDE))), 0)
    core.destination_ready(0, header_nslots=NSLOTS, max_stride=LOCAL_STRIDE, dest_stream_id=DEST)
    return core, sink


class Checker:
    """Feeds messages and checks every output against §6 independently of the core."""

    def __init__(self, core: ReceiverCore, sink: BoundedSink) -> None:
        self.core = core
        self.sink = sink
        self.published: list[tuple[int, bytes, bytes]] = []
        self.last_seq = -1

    def feed(self, msgs: list[bytes], now: int = 0) -> None:
        for m in msgs:
            r = self.core.on_chunk(m, now)
            assert r is None or isinstance(r, FrameComplete | Dropped)
            if isinstance(r, FrameComplete):
                self.check(r)
        assert self.sink.max_seen <= min(MAX_PAYLOAD, LOCAL_STRIDE, SOURCE_STRIDE)

    def check(self, c: FrameComplete) -> None:
        payload = bytes(c.payload)
        h = c.header
        assert len(h) == 256 and len(payload) == c.values_len_bytes
        assert struct.unpack_from("<Q", h, 0)[0] >> 1 == c.seq
        values_len, _slot, pool_id, payload_offset = struct.unpack_from("<IIHI", h, 8)
        assert values_len == len(payload) and payload_offset == 0
        assert pool_id in (1, 2) and values_len <= (4096 if pool_id == 1 else SOURCE_STRIDE)
        layout = TensorLayout.from_blob(h[60:])
        assert layout == c.layout
        assert values_len == 0 or values_len >= layout.extent_bytes
        assert c.seq > self.last_seq, "a seq was published twice or out of order"
        self.last_seq = c.seq
        self.published.append((c.seq, payload, h))


# --------------------------------------------------------------------------- random bytes


@FUZZ
@given(msgs=st.lists(st.binary(max_size=400), max_size=30))
def test_s5_2_fuzz_random_bytes_never_crash(msgs: list[bytes]) -> None:
    core, sink = new_core()
    Checker(core, sink).feed(msgs)


# --------------------------------------------------------------------------- random fields
# Generated from a seed with `random` (hypothesis only picks the seed): drawing every field
# through hypothesis costs ~50 ms per example, this ~1 ms, so each example can be longer.

_U32 = 0xFFFFFFFF


def _pick(rng: random.Random, small: list[int], big: int) -> int:
    return rng.choice(small) if rng.random() < 0.8 else rng.randint(0, big)


def random_chunk(rng: random.Random) -> bytes:
    """A well-formed SBE message with adversarial field values (and sometimes a valid header)."""
    plen = _pick(rng, [0, 1, SMALL_CHUNK, 2 * SMALL_CHUNK + 3, 3 * SMALL_CHUNK], _U32)
    seq = _pick(rng, [0, 1, 2, 3, 4], (1 << 63) - 1)
    kind = rng.choice(["none", "valid", "random"])
    if kind == "valid":
        n = plen if plen <= 3 * SMALL_CHUNK else 10
        hdr = header_slot(seq, u8_layout(max(n, 1)), n, pool_id=rng.choice([1, 2, 3]))
    elif kind == "random":
        hdr = rng.randbytes(rng.choice([0, 1, 255, 256]))
    else:
        hdr = b""
    payload = rng.randbytes(rng.choice([0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, SMALL_CHUNK + 1]))
    buf = bytearray(8 + 41 + 8 + len(hdr) + len(payload))
    BridgeFrameChunkEncoder.encode(
        buf,
        0,
        stream_id=rng.choice([SRC, SRC, SRC, 7]),
        epoch=rng.choice([1, 1, 1, 0, 2]),
        seq=seq,
        chunk_index=_pick(rng, [0, 1, 2, 3], _U32),
        chunk_count=_pick(rng, [0, 1, 2, 3, 4, 65535, 65536], _U32),
        chunk_offset=_pick(rng, [0, SMALL_CHUNK, 2 * SMALL_CHUNK, 3 * SMALL_CHUNK - 1], _U32),
        chunk_length=len(payload) if rng.random() < 0.8 else rng.randint(0, _U32),
        payload_length=plen,
        header_included=rng.choice([0, 1]),
        header_bytes=hdr,
        payload_bytes=payload,
    )
    if rng.random() < 0.05:
        buf[48] = rng.randint(2, 255)  # headerIncluded outside the enum
    return bytes(buf)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80))
def test_s5_2_s6_fuzz_random_fields_keep_invariants(seed: int, n: int) -> None:
    rng = random.Random(seed)
    core, sink = new_core()
    Checker(core, sink).feed([random_chunk(rng) for _ in range(n)])


# --------------------------------------------------------------------------- structural mutations


@st.composite
def lossy_stream(draw: st.DrawFn) -> tuple[list[bytes], dict[int, bytes], set[int]]:
    """Frames 1..k; per frame, chunks shuffled, some duplicated, some lost or truncated.

    Returns the messages, the sent payload per seq, and the seqs that lost nothing.
    """
    k = draw(st.integers(1, 5))
    msgs: list[bytes] = []
    sent: dict[int, bytes] = {}
    intact: set[int] = set()
    for seq in range(1, k + 1):
        n = draw(st.integers(0, 6 * SMALL_CHUNK))
        f = make_frame(seq, n, chunk=SMALL_CHUNK, layout=u8_layout(max(n, 1)) if n else
                       TensorLayout.contiguous((0,), "u1"))  # fmt: skip
        sent[seq] = f.payload
        chunks = list(f.chunks)
        order = draw(st.permutations(range(len(chunks))))
        out: list[bytes] = []
        lost = False
        for i in order:
            action = draw(st.sampled_from(["send", "send", "send", "dup", "lose", "truncate"]))
            c = chunks[i]
            if action == "lose":
                lost = True
                continue
            if action == "truncate":
                out.append(c[: draw(st.integers(0, len(c) - 1))])
                lost = True
                continue
            out.append(c)
            if action == "dup":
                out.append(c)
        if draw(st.booleans()):
            out.append(chunks[0] + b"trailing-garbage")  # trailing bytes are ignored
        msgs.extend(out)
        if not lost:
            intact.add(seq)
    return msgs, sent, intact


@FUZZ
@given(case=lossy_stream())
def test_s5_3_fuzz_loss_dup_reorder_never_corrupts(
    case: tuple[list[bytes], dict[int, bytes], set[int]],
) -> None:
    msgs, sent, intact = case
    core, sink = new_core()
    chk = Checker(core, sink)
    chk.feed(msgs)
    got = {seq: payload for seq, payload, _ in chk.published}
    for seq, payload in got.items():
        assert payload == sent[seq]
    # a frame that lost nothing is published (chunks of one frame are never interleaved
    # with another's here, so nothing supersedes it)
    assert intact <= set(got)


# --------------------------------------------------------------------------- field mutations


def mutated_stream(rng: random.Random) -> list[bytes]:
    """Valid frames whose messages get random byte overwrites anywhere (header fields,
    length prefixes, header slot, payload), plus loss and duplication."""
    msgs: list[bytes] = []
    for seq in range(1, rng.randint(1, 6) + 1):
        n = rng.randint(1, 5 * SMALL_CHUNK)
        f = make_frame(seq, n, chunk=SMALL_CHUNK, pool_id=rng.choice([1, 2]))
        for c in f.chunks:
            m = bytearray(c)
            for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
                m[rng.randrange(len(m))] = rng.randint(0, 255)
            if rng.random() < 0.1:
                continue
            msgs.append(bytes(m))
            if rng.random() < 0.1:
                msgs.append(bytes(m))
    return msgs


@FUZZ
@given(seed=st.integers(0, 2**32 - 1))
def test_s6_fuzz_mutated_chunks_keep_invariants(seed: int) -> None:
    core, sink = new_core()
    Checker(core, sink).feed(mutated_stream(random.Random(seed)))


def test_fuzz_checker_accepts_a_clean_stream() -> None:
    """The oracle itself: a clean stream passes it and publishes every frame."""
    core, sink = new_core(chunk_bound=CHUNK)
    chk = Checker(core, sink)
    frames = [make_frame(s, 3000) for s in range(1, 4)]
    chk.feed([c for f in frames for c in f.chunks])
    assert [(s, p) for s, p, _ in chk.published] == [(s, pattern(s, 3000)) for s in range(1, 4)]


def test_fuzz_generators_exercise_both_outcomes() -> None:
    """The mutation generator is not vacuous: over a few seeds frames are both published
    (checked by the oracle) and dropped for many different reasons."""
    published = 0
    reasons: set[str] = set()
    for seed in range(60):
        core, sink = new_core()
        chk = Checker(core, sink)
        chk.feed(mutated_stream(random.Random(seed)))
        published += len(chk.published)
        st = core.stats(0)
        reasons |= set(st.chunk_drops.snapshot()) | set(st.frame_drops.snapshot())
        reasons |= set(core.chunk_drops.snapshot())
    assert published > 20
    assert len(reasons) >= 8, reasons
