"""Publisher/Subscriber over a real embedded media driver (Aeron IPC, one process)."""

from __future__ import annotations

import os
import struct

import pyaeron
import pytest
from transport_helpers import poll_until

from tensorpool.transport import (
    AeronContext,
    ImageEvent,
    ImageEventKind,
    ManualClock,
    OfferRejected,
    Publisher,
    ipc_channel,
)

SMALL_TERM = ipc_channel(term_length=64 * 1024)


def _collector() -> tuple[list[bytes], object]:
    got: list[bytes] = []

    def handler(buffer: pyaeron.BufferView, header: pyaeron.Header) -> None:
        got.append(bytes(buffer))

    return got, handler


def test_ipc_round_trip_in_order(aeron_ctx: AeronContext, stream_id: int) -> None:
    got, handler = _collector()
    sub = aeron_ctx.add_subscription(SMALL_TERM, stream_id, handler)
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert pub.exclusive
    assert pub.await_connected(5.0)
    sent = [struct.pack("<QI", i, i * 7) + bytes([i % 256]) * (i % 50) for i in range(200)]
    scratch = bytearray(4096)
    for msg in sent:
        scratch[16 : 16 + len(msg)] = msg
        # offset/length select the message inside a reusable scratch buffer
        assert poll_until(lambda: sub.poll(), lambda m=msg: pub.offer(scratch, 16, len(m)))
    assert poll_until(sub.poll, lambda: len(got) == len(sent))
    assert got == sent
    assert pub.counters.ok == len(sent)
    assert sub.counters.fragments == len(sent)


def test_concurrent_publication_round_trip(aeron_ctx: AeronContext, stream_id: int) -> None:
    got, handler = _collector()
    sub = aeron_ctx.add_subscription(SMALL_TERM, stream_id, handler)
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id, exclusive=False)
    assert not pub.exclusive
    assert pub.await_connected(5.0)
    assert pub.offer(b"concurrent")
    assert poll_until(sub.poll, lambda: got == [b"concurrent"])
    assert pub.max_message_length == 64 * 1024 // 8


def test_message_larger_than_mtu_is_reassembled(aeron_ctx: AeronContext, stream_id: int) -> None:
    """200 KiB over IPC with a 1408-byte MTU is ~150 fragments; the handler sees one message."""
    channel = ipc_channel(term_length=4 * 1024 * 1024)
    got, handler = _collector()
    sub = aeron_ctx.add_subscription(channel, stream_id, handler)
    pub = aeron_ctx.add_publication(channel, stream_id)
    assert pub.await_connected(5.0)
    big = os.urandom(200 * 1024 + 13)
    small = b"after-the-big-one"
    assert pub.offer(big)
    assert pub.offer(small)
    assert poll_until(sub.poll, lambda: len(got) == 2)
    assert got[0] == big
    assert got[1] == small
    assert sub.counters.fragments > 100  # it really was fragmented


def test_unassembled_poll_delivers_fragments(aeron_ctx: AeronContext, stream_id: int) -> None:
    channel = ipc_channel(term_length=1024 * 1024)
    frags: list[tuple[int, bytes]] = []

    def handler(buffer: pyaeron.BufferView, header: pyaeron.Header) -> None:
        frags.append((header.flags, bytes(buffer)))

    sub = aeron_ctx.add_subscription(channel, stream_id, handler, assemble=False)
    pub = aeron_ctx.add_publication(channel, stream_id)
    assert pub.await_connected(5.0)
    msg = os.urandom(5000)
    assert pub.offer(msg)
    assert poll_until(sub.poll, lambda: b"".join(f for _, f in frags) == msg)
    assert len(frags) > 1
    assert frags[0][0] & 0x80  # BEGIN
    assert frags[-1][0] & 0x40  # END


def test_not_connected_offer_counted_and_returns_false(
    aeron_ctx: AeronContext, stream_id: int
) -> None:
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    for _ in range(5):
        assert pub.offer(b"nobody listens") is False
    assert pub.counters.not_connected == 5
    assert pub.counters.ok == 0
    assert not pub.is_connected


def test_back_pressure_counted_and_offer_returns(aeron_ctx: AeronContext, stream_id: int) -> None:
    """A subscriber that never polls + a 64 KiB term: the publisher hits the term window."""
    aeron_ctx.add_subscription(SMALL_TERM, stream_id, lambda b, h: None)
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert pub.await_connected(5.0)
    payload = b"z" * 200
    results = [pub.offer(payload) for _ in range(2000)]
    assert results.count(True) == pub.counters.ok
    assert 0 < pub.counters.ok < 2000
    assert pub.counters.back_pressured == results.count(False)
    assert pub.counters.back_pressured > 0
    assert pub.counters.not_connected == 0


def test_closed_publication_offer_counted(aeron_ctx: AeronContext, stream_id: int) -> None:
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    pub.close()
    pub.close()  # idempotent
    assert pub.offer(b"x") is False
    assert pub.try_claim(8) is None
    assert pub.counters.closed == 2


def test_too_long_message_rejected_with_clear_error(
    aeron_ctx: AeronContext, stream_id: int
) -> None:
    aeron_ctx.add_subscription(SMALL_TERM, stream_id, lambda b, h: None)
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert pub.max_message_length == 8192  # 64 KiB term / 8, from the channel URI
    with pytest.raises(OfferRejected, match="8193 bytes"):
        pub.offer(bytes(8193))
    assert pub.counters.rejected == 1
    with pytest.raises(OfferRejected):
        pub.try_claim(1_000_000)


def test_try_claim_round_trip(aeron_ctx: AeronContext, stream_id: int) -> None:
    got, handler = _collector()
    sub = aeron_ctx.add_subscription(SMALL_TERM, stream_id, handler)
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert pub.await_connected(5.0)
    claim = pub.try_claim(16)
    assert claim is not None
    struct.pack_into("<QQ", claim.buffer, 0, 1, 2)
    claim.commit()
    aborted = pub.try_claim(16)
    assert aborted is not None
    aborted.abort()
    with pub.try_claim(4) as c:  # type: ignore[union-attr]
        c.buffer[:] = b"ctx!"
    assert poll_until(sub.poll, lambda: len(got) == 2)
    assert got == [struct.pack("<QQ", 1, 2), b"ctx!"]
    assert pub.counters.ok == 3


def test_handler_exception_is_counted_and_rest_of_batch_delivered(
    aeron_ctx: AeronContext, stream_id: int
) -> None:
    got: list[bytes] = []

    def handler(buffer: pyaeron.BufferView, header: pyaeron.Header) -> None:
        data = bytes(buffer)
        if data == b"poison":
            raise ValueError("bad input")
        got.append(data)

    sub = aeron_ctx.add_subscription(SMALL_TERM, stream_id, handler, fragment_limit=10)
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert pub.await_connected(5.0)
    msgs = [b"a", b"b", b"poison", b"c", b"d"]
    for m in msgs:
        assert pub.offer(m)
    assert poll_until(sub.poll, lambda: len(got) == 4)
    assert got == [b"a", b"b", b"c", b"d"]
    assert sub.counters.handler_errors == 1


def test_buffer_view_is_invalid_after_handler(aeron_ctx: AeronContext, stream_id: int) -> None:
    """Documented contract: the BufferView only lives during the callback."""
    kept: list[pyaeron.BufferView] = []
    sub = aeron_ctx.add_subscription(SMALL_TERM, stream_id, lambda b, h: kept.append(b))
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert pub.await_connected(5.0)
    assert pub.offer(b"short-lived")
    assert poll_until(sub.poll, lambda: bool(kept))
    with pytest.raises(ValueError):
        bytes(kept[0])


def test_s10_1_1_image_events_record_join_time(stream_id: int) -> None:
    """§10.1.1: join_time_ns is the local monotonic time the image became available."""
    clock = ManualClock(1_000)
    available: list[ImageEvent] = []
    with AeronContext(clock=clock) as ctx:
        sub = ctx.add_subscription(
            SMALL_TERM,
            stream_id,
            lambda b, h: None,
            on_image_available=available.append,
        )
        clock.set(5_000)
        pub = ctx.add_publication(SMALL_TERM, stream_id)
        assert poll_until(lambda: None, lambda: bool(available))
        clock.set(9_000)
        (event,) = sub.take_image_events()
        assert event.kind is ImageEventKind.AVAILABLE
        assert event.session_id == pub.session_id
        assert event.stream_id == stream_id
        assert event.timestamp_ns == 5_000
        assert available == [event]
        assert sub.join_time_ns(pub.session_id) == 5_000
        assert sub.known_sessions() == {pub.session_id: 5_000}


def test_image_unavailable_when_publisher_leaves(aeron_ctx: AeronContext, stream_id: int) -> None:
    seen: list[ImageEvent] = []
    sub = aeron_ctx.add_subscription(
        SMALL_TERM,
        stream_id,
        lambda b, h: None,
        on_image_available=seen.append,
        on_image_unavailable=seen.append,
    )
    pub = aeron_ctx.add_publication(SMALL_TERM, stream_id)
    assert poll_until(lambda: None, lambda: len(seen) == 1)
    session = pub.session_id
    assert sub.is_connected
    aeron_ctx.release(pub)
    assert poll_until(sub.poll, lambda: len(seen) == 2)
    assert [(e.kind, e.session_id) for e in seen] == [
        (ImageEventKind.AVAILABLE, session),
        (ImageEventKind.UNAVAILABLE, session),
    ]
    assert [e.kind for e in sub.take_image_events()] == [
        ImageEventKind.AVAILABLE,
        ImageEventKind.UNAVAILABLE,
    ]
    assert sub.known_sessions() == {}
    assert sub.counters.images_available == 1
    assert sub.counters.images_unavailable == 1


def test_join_time_for_unknown_session_is_not_remembered(
    aeron_ctx: AeronContext, stream_id: int
) -> None:
    sub = aeron_ctx.add_subscription(SMALL_TERM, stream_id, lambda b, h: None)
    sub.join_time_ns(12345)
    assert sub.known_sessions() == {}


class _AdminActionPublication:
    """Injects ADMIN_ACTION (a term rotation race, impossible to trigger on demand)."""

    channel = "aeron:ipc"
    stream_id = 1
    session_id = 2
    max_message_length = 1024

    def __init__(self, script: list[object]) -> None:
        self.script = script
        self.calls = 0

    def offer(self, buf: object, *, offset: int = 0, length: int | None = None) -> object:
        self.calls += 1
        return self.script.pop(0)

    def try_claim(self, length: int) -> object:
        self.calls += 1
        return self.script.pop(0)


def test_admin_action_is_retried_a_bounded_number_of_times() -> None:
    admin = pyaeron.ADMIN_ACTION
    fake = _AdminActionPublication([admin, admin, True])
    pub = Publisher(fake, admin_action_retries=3)  # type: ignore[arg-type]
    assert pub.offer(b"x") is True
    assert (fake.calls, pub.counters.admin_action, pub.counters.ok) == (3, 2, 1)

    fake = _AdminActionPublication([admin] * 10)
    pub = Publisher(fake, admin_action_retries=3)  # type: ignore[arg-type]
    assert pub.offer(b"x") is False
    assert fake.calls == 4  # first try + 3 retries, then give up
    assert pub.counters.admin_action == 4
    assert pub.counters.ok == 0

    fake = _AdminActionPublication([admin, pyaeron.BACK_PRESSURED])
    pub = Publisher(fake, admin_action_retries=3)  # type: ignore[arg-type]
    assert pub.offer(b"x") is False
    assert (pub.counters.admin_action, pub.counters.back_pressured) == (1, 1)

    fake = _AdminActionPublication([admin] * 10)
    pub = Publisher(fake, admin_action_retries=1)  # type: ignore[arg-type]
    assert pub.try_claim(8) is None
    assert fake.calls == 2


def test_max_position_exceeded_counted() -> None:
    class Exhausted(_AdminActionPublication):
        def offer(self, buf: object, *, offset: int = 0, length: int | None = None) -> object:
            raise pyaeron.MaxPositionExceeded("log exhausted")

    pub = Publisher(Exhausted([]))  # type: ignore[arg-type]
    assert pub.offer(b"x") is False
    assert pub.counters.max_position_exceeded == 1
    assert pub.counters.snapshot()["max_position_exceeded"] == 1


def test_s10_1_1_join_time_agrees_between_query_and_callback(stream_id: int) -> None:
    """A message can be polled before its image callback ran; both must report one join time."""
    clock = ManualClock(1_000)
    with AeronContext(clock=clock) as ctx:
        sub = ctx.add_subscription(SMALL_TERM, stream_id, lambda b, h: None)
        pub = ctx.add_publication(SMALL_TERM, stream_id)
        assert poll_until(lambda: None, lambda: sub.image_count == 1)
        clock.set(2_000)  # the callback may or may not have run yet
        joined = sub.join_time_ns(pub.session_id)
        clock.set(3_000)
        assert poll_until(lambda: None, lambda: sub.counters.images_available == 1)
        (event,) = sub.take_image_events()
        assert event.timestamp_ns == joined
        assert sub.join_time_ns(pub.session_id) == joined
