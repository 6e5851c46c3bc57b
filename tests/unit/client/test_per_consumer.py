"""Per-consumer descriptor streams, the sans-IO rules (issue #29.1; Wire Spec §10.1.2,
§10.1.3, §11; Driver Model §11): what a hello asks for, the id pool, the producer's table
(:class:`ConsumerStreams` through :class:`ProducerCore`), and the consumer core's side."""

from __future__ import annotations

import pytest

from tensorpool.client.consumer_core import ConsumerCore
from tensorpool.client.per_consumer import (
    CloseConsumerStream,
    ConsumerStreams,
    OpenConsumerStream,
    SendConsumerConfig,
    check_per_consumer_ids,
)
from tensorpool.client.producer_core import ProducerCore
from tensorpool.config_util import IdRange
from tensorpool.endpoints import Endpoints
from tensorpool.stream_ids import INVALID, StreamIdPool, StreamRequest, read_request

STREAM, LIMITED = 1, 2
SHARED = ("aeron:ipc", 1100)
MS = 1_000_000
STALE = 500 * MS


# --- what a hello asks for (Wire §10.1.2, §11) -------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "rate", "channel", "sid", "expected"),
    [
        (LIMITED, 10, "", 0, StreamRequest("", 0)),  # §11: RATE_LIMITED asks implicitly
        (STREAM, 0, "aeron:ipc", 31005, StreamRequest("aeron:ipc", 31005)),  # named
        (STREAM, 0, "aeron:ipc", 0, INVALID),  # §10.1.2: channel without id
        (STREAM, 0, "", 31005, INVALID),  # §10.1.3: id without channel
        (STREAM, 0, "", 0, None),  # asks for nothing
        (LIMITED, 0, "", 0, None),  # unlimited: nothing to reduce
        (LIMITED, 0xFFFF_FFFF, "", 0, None),  # null rate
        (STREAM, 0, "aeron:ipc", 0xFFFF_FFFF, INVALID),  # null id = not given
        (STREAM, 0, "aeron:udp?endpoint=h:1", 31005, INVALID),  # not this host's: declined
    ],
)
def test_s10_1_2_read_request(mode: int, rate: int, channel: str, sid: int, expected) -> None:
    assert read_request(mode, rate, channel, sid) == expected


def test_s11_id_pool_keeps_ids_declines_when_exhausted_or_unset_and_reuses_released() -> None:
    pool = StreamIdPool(IdRange(31000, 31001))
    assert pool.assign("a") == 31000
    assert pool.assign("a") == 31000  # kept while it asks again
    assert pool.assign("b", 31001) == 31001
    assert pool.assign("c") == 0  # exhausted: declined
    assert pool.release("a") == 31000
    assert pool.assign("c") == 31000
    assert StreamIdPool(None).assign("a") == 0  # unset: declined


# --- the producer's table, through ProducerCore -------------------------------------------------


TWO_IDS = IdRange(31000, 31001)


def _core(ids: IdRange | None = TWO_IDS, *, driver: bool = False) -> ProducerCore:
    streams = ConsumerStreams(
        ids=None if driver else StreamIdPool(ids),
        default_channel=SHARED[0],
        shared=SHARED,
        stale_ns=STALE,
    )
    core = ProducerCore(
        1,
        driver_mode=driver,
        announce_period_ns=10**12,
        qos_period_ns=10**12,
        freshness_ns=10**13,
        per_consumer=streams,
    )
    core.tick(0)  # the first announce and QoS are out of the way
    return core


def _pc(actions: list[object]) -> list[object]:
    kinds = (SendConsumerConfig, OpenConsumerStream, CloseConsumerStream)
    return [a for a in actions if isinstance(a, kinds)]


def _hello(core: ProducerCore, cid: int, now: int, **kw: object) -> list[object]:
    mode = kw.pop("mode", LIMITED)
    core.on_consumer_hello(1, cid, mode, now, max_rate_hz=kw.pop("rate", 10), **kw)  # type: ignore[arg-type]
    return _pc(core.tick(now))


def test_s10_1_3_standalone_assigns_from_own_range_and_opens_the_stream() -> None:
    core = _core()
    assert _hello(core, 7, 1) == [
        OpenConsumerStream(7, SHARED[0], 31000),
        SendConsumerConfig(7, LIMITED, SHARED[0], 31000),
    ]
    streams = core.per_consumer
    assert streams is not None and streams.streams[7].gate.rate_hz == 10  # the hello's rate
    # renewed: the same id, no second publication
    assert _hello(core, 7, 2) == [SendConsumerConfig(7, LIMITED, SHARED[0], 31000)]


def test_s10_1_3_off_by_default_declines_every_hello() -> None:
    core = ProducerCore(1, driver_mode=False, announce_period_ns=1, qos_period_ns=1, freshness_ns=1)
    core.on_consumer_hello(1, 7, LIMITED, 0, max_rate_hz=10)
    assert _pc(core.tick(0)) == [SendConsumerConfig(7, LIMITED)]


def test_s10_1_3_unset_range_declines() -> None:
    assert _hello(_core(None), 7, 1) == [SendConsumerConfig(7, LIMITED)]


def test_s10_1_3_exhausted_range_declines() -> None:
    core = _core(IdRange(31000, 31000))
    _hello(core, 7, 1)
    assert _hello(core, 8, 1) == [SendConsumerConfig(8, LIMITED)]


def test_s10_1_2_half_request_declined_by_producer() -> None:
    core = _core()
    actions = _hello(core, 7, 1, mode=STREAM, rate=0, descriptor_channel="aeron:ipc")
    assert actions == [SendConsumerConfig(7, STREAM)]


def test_s10_1_3_stale_consumer_stream_closed_and_id_released() -> None:
    """§10.1.3: no hello and no QoS for stale_ns: the publication is closed and the id is free."""
    core = _core(IdRange(31000, 31000))
    _hello(core, 7, 0)
    assert _pc(core.tick(STALE)) == []  # not yet
    assert _pc(core.tick(STALE + 1)) == [CloseConsumerStream(7, "stale")]
    assert _hello(core, 8, STALE + 2)[0] == OpenConsumerStream(8, SHARED[0], 31000)


def test_s10_1_3_qos_keeps_the_stream_without_another_hello() -> None:
    """§10.1.3 ("stale" is judged on the hello/QoS interval): a consumer that said hello once
    and keeps sending QosConsumer keeps its stream; when its QoS stops, the stale window runs
    from its last QoS. QoS of another stream or of another consumer does not count."""
    core = _core(IdRange(31000, 31000))
    _hello(core, 7, 0)
    for t in range(STALE // 2, 4 * STALE, STALE // 2):
        core.on_consumer_qos(1, 7, t)
        core.on_consumer_qos(2, 8, t + STALE)  # not ours: ignored
        assert _pc(core.tick(t)) == [], t
    last = 4 * STALE - STALE // 2
    core.on_consumer_qos(2, 7, last + STALE)  # the same consumer id on another stream
    core.on_consumer_qos(1, 8, last + STALE)  # another consumer of ours
    assert _pc(core.tick(last + STALE)) == []
    assert _pc(core.tick(last + STALE + 1)) == [CloseConsumerStream(7, "stale")]


def test_driver_s11_qos_keeps_a_driver_assigned_stream() -> None:
    """Driver mode: the producer follows the driver's assignment, and the consumer's QoS keeps
    it open as in standalone mode (§10.1.3)."""
    core = _core(driver=True)
    _hello(core, 7, 0)
    core.on_consumer_config(1, 7, "aeron:ipc", 31000, 0)
    assert _pc(core.tick(0)) == [OpenConsumerStream(7, "aeron:ipc", 31000)]
    core.on_consumer_qos(1, 7, STALE)
    assert _pc(core.tick(2 * STALE)) == []
    assert _pc(core.tick(2 * STALE + 1)) == [CloseConsumerStream(7, "stale")]


def test_s10_1_3_consumer_that_stops_asking_is_released() -> None:
    core = _core()
    _hello(core, 7, 0)
    assert _hello(core, 7, 1, mode=STREAM, rate=0) == [
        CloseConsumerStream(7, "not_requested"),
        SendConsumerConfig(7, STREAM),
    ]


def test_driver_s11_producer_follows_the_drivers_config_and_never_answers_requests() -> None:
    """Driver mode: the driver answers requests (Driver Model §11); the producer opens what the
    driver's ConsumerConfig assigns, at the rate of the consumer's hello, and closes on a
    decline -- also a decline that names the shared stream (§11, unset range)."""
    core = _core(driver=True)
    assert _hello(core, 7, 1) == []  # no answer of ours
    core.on_consumer_config(1, 7, "aeron:ipc", 31000, 2)
    assert _pc(core.tick(2)) == [OpenConsumerStream(7, "aeron:ipc", 31000)]
    assert core.per_consumer.streams[7].gate.rate_hz == 10  # type: ignore[union-attr]
    core.on_consumer_config(1, 7, *SHARED, 3)
    assert _pc(core.tick(3)) == [CloseConsumerStream(7, "declined")]
    core.on_consumer_config(1, 7, *SHARED, 4)
    assert _pc(core.tick(4)) == []  # the shared stream is never a second publication


def test_driver_s11_non_offering_producer_leaves_requests_to_the_driver() -> None:
    """A driver-mode producer without per-consumer streams must not decline a request the
    driver answers (two answers would race at the consumer); other hellos it declines."""
    core = ProducerCore(1, driver_mode=True, announce_period_ns=1, qos_period_ns=1, freshness_ns=9)
    core.on_consumer_hello(1, 7, LIMITED, 0, max_rate_hz=10)
    core.on_consumer_hello(1, 8, STREAM, 0)
    assert _pc(core.tick(0)) == [SendConsumerConfig(8, STREAM)]


def test_s11_admitted_frames_follow_the_rate_gate_grid() -> None:
    """§11: on the consumer's stream at most one frame per slot of the RateGate grid (the
    agent offers only while ``is_open`` and calls ``published`` after the offer)."""
    core = _core()
    _hello(core, 7, 0, rate=10)
    gate = core.per_consumer.streams[7].gate  # type: ignore[union-attr]
    sent = []
    for t in range(0, 1_000 * MS, MS):  # a 1 kHz source for one second
        if gate.is_open(t):
            gate.published(t)
            sent.append(t)
    assert sent == [k * 100 * MS for k in range(10)]


# --- the consumer core ---------------------------------------------------------------------------


def _consumer(mode: int = LIMITED, rate: int = 10) -> ConsumerCore:
    return ConsumerCore(
        1,
        9,
        freshness_ns=10**12,
        qos_period_ns=100 * MS,
        mode=mode,
        max_rate_hz=rate,
        realtime_clock=lambda: 0,
    )


def test_s10_1_3_hello_asks_again_until_own_stream_then_qos_keeps_it() -> None:
    """§10.1.3: QoS, every period, is what keeps a per-consumer stream, so a consumer on its
    own stream says hello no more; a RATE_LIMITED one without it (declined: range exhausted,
    no lease yet; or released) asks again every QoS period; a STREAM consumer says hello once."""
    for mode, expected in ((LIMITED, 3), (STREAM, 1)):
        core = _consumer(mode)
        hellos = qos = 0
        for t in range(0, 250 * MS, 10 * MS):
            actions = core.tick(t)
            hellos += sum(type(a).__name__ == "SendHello" for a in actions)
            qos += sum(type(a).__name__ == "SendQos" for a in actions)
            core.hello_sent()
        assert (hellos, qos) == (expected, 3), mode
    core = _consumer(LIMITED)
    core.on_consumer_config(True)  # on its own stream
    kinds = []
    for t in range(0, 250 * MS, 10 * MS):
        kinds += [type(a).__name__ for a in core.tick(t)]
        core.hello_sent()
    assert kinds.count("SendHello") == 1 and kinds.count("SendQos") == 3, kinds  # the first
    core.on_consumer_config(False)  # released: asks again
    assert "SendHello" in [type(a).__name__ for a in core.tick(300 * MS)]


def test_s11_standalone_range_must_not_hold_the_shared_stream_ids() -> None:
    """Like the driver's ranges (Driver Model §11): refused before anything is acquired."""
    check_per_consumer_ids(IdRange(31000, 31009), Endpoints())
    with pytest.raises(ValueError, match=r"shared stream ids \[1000, 1100, 1200\]"):
        check_per_consumer_ids(IdRange(1000, 1200), Endpoints())
