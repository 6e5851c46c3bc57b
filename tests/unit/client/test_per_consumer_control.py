"""Per-consumer control streams, the sans-IO rules (issue #29.1; Wire Spec §10.1.2, §10.1.3;
Driver Model §11): what a hello asks for, the one grant rule the driver and the standalone
producer share (:func:`tensorpool.stream_ids.grant`), the producer's table, and where a frame's
``FrameProgress`` goes (:meth:`ProgressThrottle.start`)."""

from __future__ import annotations

import pytest

from tensorpool.client.per_consumer import (
    CloseConsumerStream,
    ConsumerStreams,
    OpenConsumerStream,
    SendConsumerConfig,
    check_per_consumer_ids,
)
from tensorpool.client.producer_core import ProducerCore
from tensorpool.client.progress_core import ProgressSettings, ProgressThrottle
from tensorpool.config_util import IdRange
from tensorpool.endpoints import Endpoints
from tensorpool.stream_ids import (
    INVALID,
    StreamIdPool,
    StreamRequest,
    grant,
    read_control_request,
)

STREAM, LIMITED = 1, 2
DESC = ("aeron:ipc", 1100)
CTL = "aeron:ipc?alias=ctl"
MS = 1_000_000
STALE = 500 * MS
IMPLICIT = StreamRequest("", 0)


@pytest.mark.parametrize(
    ("progress", "descriptor", "channel", "sid", "expected"),
    [
        (True, IMPLICIT, "", 0, IMPLICIT),  # own descriptor stream + progress: implicit
        (False, IMPLICIT, "", 0, None),  # no progress wanted: nothing to carry
        (True, None, "", 0, None),  # on the shared descriptor stream: nothing asked
        (True, INVALID, "", 0, None),
        (False, None, "aeron:ipc", 32005, StreamRequest("aeron:ipc", 32005)),  # named
        (True, IMPLICIT, "aeron:ipc", 0, INVALID),  # §10.1.2: channel without id
        (True, IMPLICIT, "", 32005, INVALID),  # §10.1.2: id without channel
        (True, IMPLICIT, "aeron:udp?endpoint=h:1", 32005, INVALID),  # not this host's
    ],
)
def test_s10_1_2_read_control_request(progress, descriptor, channel, sid, expected) -> None:
    assert read_control_request(progress, descriptor, channel, sid) == expected


def _pools(desc: IdRange | None, ctl: IdRange | None) -> tuple[StreamIdPool, StreamIdPool]:
    return StreamIdPool(desc), StreamIdPool(ctl)


def test_s11_grant_assigns_both_streams_from_their_ranges() -> None:
    d, c = _pools(IdRange(31000, 31001), IdRange(32000, 32001))
    g = grant("a", IMPLICIT, IMPLICIT, d, c, *DESC[:1], CTL)
    assert (g.descriptor, g.control) == (("aeron:ipc", 31000), (CTL, 32000))
    assert (g.descriptor_outcome, g.control_outcome) == ("assigned", "assigned")
    again = grant("a", IMPLICIT, IMPLICIT, d, c, *DESC[:1], CTL)
    assert again.control == (CTL, 32000)  # kept while it asks again


def test_s11_unset_control_range_declines_control_but_grants_the_descriptor_stream() -> None:
    """Driver Model §11: an unset range declines that request; the descriptor stream stands."""
    g = grant("a", IMPLICIT, IMPLICIT, *_pools(IdRange(31000, 31001), None), "aeron:ipc", CTL)
    assert (g.descriptor, g.control) == (("aeron:ipc", 31000), ("", 0))
    assert g.control_outcome == "declined_no_range"


def test_s11_exhausted_control_range_declines_control_and_release_reuses_the_id() -> None:
    d, c = _pools(IdRange(31000, 31001), IdRange(32000, 32000))
    assert grant("a", IMPLICIT, IMPLICIT, d, c, "aeron:ipc", CTL).control == (CTL, 32000)
    g = grant("b", IMPLICIT, IMPLICIT, d, c, "aeron:ipc", CTL)
    assert g.descriptor[1] == 31001 and g.control == ("", 0)
    assert g.control_outcome == "declined_exhausted"
    assert grant("a", None, None, d, c, "aeron:ipc", CTL).control == ("", 0)  # a asks no more
    assert grant("b", IMPLICIT, IMPLICIT, d, c, "aeron:ipc", CTL).control == (CTL, 32000)


def test_s10_1_3_control_goes_only_with_a_descriptor_stream_of_its_own() -> None:
    """A consumer on the shared descriptor stream sees every frame: its progress is the shared
    control stream's, so a control request without a granted descriptor stream is declined."""
    d, c = _pools(IdRange(31000, 31000), IdRange(32000, 32001))
    grant("a", IMPLICIT, IMPLICIT, d, c, "aeron:ipc", CTL)
    g = grant("b", IMPLICIT, IMPLICIT, d, c, "aeron:ipc", CTL)  # descriptor range exhausted
    assert (g.descriptor, g.control) == (("", 0), ("", 0))
    assert g.control_outcome == "declined_no_descriptor"
    named = StreamRequest("aeron:ipc", 32001)
    assert grant("c", None, named, d, c, "aeron:ipc", CTL).control == ("", 0)
    assert c.held() == {"a": 32000}  # nothing taken by the declines


def test_s10_1_2_half_control_request_is_declined() -> None:
    d, c = _pools(IdRange(31000, 31001), IdRange(32000, 32001))
    g = grant("a", IMPLICIT, INVALID, d, c, "aeron:ipc", CTL)
    assert g.descriptor[1] == 31000 and g.control == ("", 0)
    assert g.control_outcome == "declined_invalid"


def test_standalone_ranges_must_not_overlap_nor_hold_shared_ids() -> None:
    ch = Endpoints()
    check_per_consumer_ids(IdRange(31000, 31001), ch, IdRange(32000, 32001))
    with pytest.raises(ValueError, match="overlap"):
        check_per_consumer_ids(IdRange(31000, 31001), ch, IdRange(31001, 31002))
    with pytest.raises(ValueError, match=r"control ids .* shared stream ids"):
        check_per_consumer_ids(None, ch, IdRange(ch.control_stream_id, ch.control_stream_id))


# --- the producer's table, through ProducerCore ------------------------------------------------


ONE_CTL = IdRange(32000, 32000)


def _core(ctl: IdRange | None = ONE_CTL, *, driver: bool = False) -> ProducerCore:
    streams = ConsumerStreams(
        ids=None if driver else StreamIdPool(IdRange(31000, 31001)),
        control_ids=None if driver else StreamIdPool(ctl),
        default_channel=DESC[0],
        control_channel=CTL,
        shared=DESC,
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
    core.tick(0)
    return core


def _hello(core: ProducerCore, cid: int, now: int, progress: bool = True) -> list[object]:
    core.on_consumer_hello(1, cid, LIMITED, now, max_rate_hz=10, supports_progress=progress)
    kinds = (SendConsumerConfig, OpenConsumerStream, CloseConsumerStream)
    return [a for a in core.tick(now) if isinstance(a, kinds)]


def test_s10_1_3_standalone_producer_opens_and_names_the_control_stream() -> None:
    core = _core()
    assert _hello(core, 7, 1) == [
        OpenConsumerStream(7, DESC[0], 31000, CTL, 32000),
        SendConsumerConfig(7, LIMITED, DESC[0], 31000, CTL, 32000),
    ]
    # a second consumer: the control range (one id) is exhausted; its descriptor stream stands
    assert _hello(core, 8, 1) == [
        OpenConsumerStream(8, DESC[0], 31001),
        SendConsumerConfig(8, LIMITED, DESC[0], 31001),
    ]
    streams = core.per_consumer
    assert streams is not None
    assert streams.counters["control_assigned"] == 1 and streams.counters["control_declined"] == 1


def test_s10_1_3_no_progress_asked_no_control_stream() -> None:
    assert _hello(_core(), 7, 1, progress=False) == [
        OpenConsumerStream(7, DESC[0], 31000),
        SendConsumerConfig(7, LIMITED, DESC[0], 31000),
    ]


def test_s10_1_3_stale_consumer_releases_both_streams_and_the_control_id_is_reused() -> None:
    core = _core()
    _hello(core, 7, 1)
    assert _hello(core, 8, 1)[-1] == SendConsumerConfig(8, LIMITED, DESC[0], 31001)
    core.on_consumer_qos(1, 8, STALE)  # 8 stays alive, 7 goes silent
    closed = [a for a in core.tick(STALE + 2) if isinstance(a, CloseConsumerStream)]
    assert closed == [CloseConsumerStream(7, "stale")]
    assert _hello(core, 8, STALE + 3)[-1] == SendConsumerConfig(
        8, LIMITED, DESC[0], 31001, CTL, 32000
    )


def test_driver_mode_producer_follows_the_drivers_control_assignment() -> None:
    core = _core(driver=True)
    assert _hello(core, 7, 1) == []  # the driver answers
    core.on_consumer_config(1, 7, DESC[0], 31000, 2, (CTL, 32000))
    assert [a for a in core.tick(2) if isinstance(a, OpenConsumerStream)] == [
        OpenConsumerStream(7, DESC[0], 31000, CTL, 32000)
    ]
    core.on_consumer_config(1, 7, "", 0, 3, (CTL, 32000))  # declined now: both go
    assert [a for a in core.tick(3) if isinstance(a, CloseConsumerStream)] == [
        CloseConsumerStream(7, "declined")
    ]


# --- where a frame's FrameProgress goes (§10.1.3) -----------------------------------------------


def test_s10_1_3_progress_goes_to_own_control_streams_of_consumers_that_see_the_frame() -> None:
    t = ProgressThrottle(ProgressSettings())
    t.on_hello(7, True, None, None)
    t.on_hello(8, True, None, None)
    assert t.start(0, 0, 100, 0, {7: True, 8: False}) == 0
    assert (t.shared, t.consumers) == (False, (7,))  # 8's rate slot is shut: not its frame
    assert t.start(1, 1, 100, 0, {7: False, 8: False}) is None  # nobody sees it: no progress
    t.on_hello(9, True, None, None)  # an opted-in consumer on the shared control stream
    assert t.start(2, 2, 100, 0, {7: True, 8: False}) == 0
    assert (t.shared, t.consumers) == (True, (7,))
    assert t.start(3, 3, 100, 0) == 0 and (t.shared, t.consumers) == (True, ())
