"""Driver Model §11 / Wire Spec §10.1.3: the driver core's per-consumer descriptor stream
allocation, one rule per test (issue #29.1). Inputs are what the agent decodes from a wire
``ConsumerHello``; the answer is a ``SendConsumerConfig`` action."""

from __future__ import annotations

from driver_helpers import BASE_TOML, CAM, TTL_NS, Harness, make_config, only

from tensorpool.driver.actions import SendConsumerConfig
from tensorpool.driver.core import DriverCore
from tensorpool.specs.generated.driver import Role

C = Role.CONSUMER
STREAM, LIMITED = 1, 2
IPC = "aeron:ipc"
RANGE_TOML = BASE_TOML.replace(
    'stream_id_range = "20000-20009"',
    'stream_id_range = "20000-20009"\ndescriptor_stream_id_range = "31000-31001"',
)


def _harness(toml: str = RANGE_TOML) -> Harness:
    return Harness(DriverCore(make_config(toml), now_ns=0, lease_id_start=1))


def _hello(
    h: Harness,
    consumer_id: int,
    *,
    mode: int = LIMITED,
    rate: int = 10,
    channel: str = "",
    sid: int = 0,
    stream_id: int = CAM,
) -> SendConsumerConfig | None:
    actions = h.run(h.core.on_consumer_hello(stream_id, consumer_id, mode, rate, channel, sid))
    configs = only(actions, SendConsumerConfig)
    assert len(configs) == len(actions) <= 1, actions
    return configs[0] if configs else None


def test_driver_s11_rate_limited_lease_holder_gets_an_id_from_the_range() -> None:
    """§11: a RATE_LIMITED hello (descriptor_stream_id=0) from a consumer lease holder gets an
    id of descriptor_stream_id_range, on the driver's descriptor channel."""
    h = _harness()
    h.attach_ok(1, CAM, 5, C)
    cfg = _hello(h, 5)
    assert cfg is not None and cfg.descriptor_stream_id == 31000
    assert cfg.descriptor_channel == h.core.config.driver.descriptor_channel
    assert (cfg.stream_id, cfg.consumer_id, cfg.mode) == (CAM, 5, LIMITED)


def test_driver_s11_named_request_keeps_its_channel_and_a_free_id_in_range() -> None:
    """§10.1.2: an explicit request (channel + preferred id) is answered on that channel, with
    the preferred id when it lies in the range and is free."""
    h = _harness()
    h.attach_ok(1, CAM, 5, C)
    cfg = _hello(h, 5, mode=STREAM, rate=0, channel="aeron:ipc?alias=mine", sid=31001)
    assert cfg is not None
    assert (cfg.descriptor_channel, cfg.descriptor_stream_id) == ("aeron:ipc?alias=mine", 31001)


def test_driver_s11_repeated_hello_keeps_the_same_id() -> None:
    """A consumer renews its request with every hello: it keeps its id, no second one."""
    h = _harness()
    h.attach_ok(1, CAM, 5, C)
    h.attach_ok(2, CAM, 6, C)
    assert _hello(h, 5).descriptor_stream_id == 31000  # type: ignore[union-attr]
    assert _hello(h, 5).descriptor_stream_id == 31000  # type: ignore[union-attr]
    assert _hello(h, 6).descriptor_stream_id == 31001  # type: ignore[union-attr]


def test_driver_s11_exhausted_range_declines_with_empty_channel_and_zero() -> None:
    """§11: an exhausted range declines (empty channel, id 0, Wire §10.1.3)."""
    h = _harness()
    for corr, cid in ((1, 5), (2, 6), (3, 7)):
        h.attach_ok(corr, CAM, cid, C)
    _hello(h, 5)
    _hello(h, 6)
    cfg = _hello(h, 7)
    assert cfg is not None and (cfg.descriptor_channel, cfg.descriptor_stream_id) == ("", 0)
    assert h.core.counters["per_consumer_declined_exhausted"] == 1


def test_driver_s11_unset_range_declines() -> None:
    """§11: no range configured -- the request is declined, with the Wire §10.1.3 encoding
    (empty channel, id 0: the consumer stays on whatever shared stream it reads)."""
    h = _harness(BASE_TOML)
    h.attach_ok(1, CAM, 5, C)
    cfg = _hello(h, 5)
    assert cfg is not None and (cfg.descriptor_channel, cfg.descriptor_stream_id) == ("", 0)
    assert h.core.counters["per_consumer_declined_no_range"] == 1


def test_driver_s10_1_2_half_request_is_rejected() -> None:
    """Wire §10.1.2/§10.1.3: a channel without a stream id, or an id without a channel, MUST
    be rejected: declined, nothing allocated."""
    h = _harness()
    h.attach_ok(1, CAM, 5, C)
    for channel, sid in ((IPC, 0), ("", 31000)):
        cfg = _hello(h, 5, mode=STREAM, rate=0, channel=channel, sid=sid)
        assert cfg is not None and (cfg.descriptor_channel, cfg.descriptor_stream_id) == ("", 0)
    assert h.core.counters["per_consumer_declined_invalid"] == 2
    assert _hello(h, 5).descriptor_stream_id == 31000  # type: ignore[union-attr]  # still free


def test_driver_s11_no_consumer_lease_declines() -> None:
    """Only a consumer holding a lease on the stream gets an id (else anyone could drain the
    range): declined otherwise."""
    h = _harness()
    h.attach_ok(1, CAM, 5, C)
    cfg = _hello(h, 9)  # no lease
    assert cfg is not None and cfg.descriptor_stream_id == 0
    assert _hello(h, 5, stream_id=CAM + 1).descriptor_stream_id == 0  # type: ignore[union-attr]


def test_driver_s11_stream_hello_asks_for_nothing_and_releases() -> None:
    """A STREAM hello without a channel asks for nothing: no answer from the driver (the
    producer answers it) and the consumer's id goes back to the range."""
    h = _harness(RANGE_TOML.replace('"31000-31001"', '"31000-31000"'))
    h.attach_ok(1, CAM, 5, C)
    h.attach_ok(2, CAM, 6, C)
    assert _hello(h, 5).descriptor_stream_id == 31000  # type: ignore[union-attr]
    assert _hello(h, 5, mode=STREAM, rate=0) is None
    assert _hello(h, 6).descriptor_stream_id == 31000  # type: ignore[union-attr]


def test_driver_s11_detach_releases_the_id() -> None:
    """§10.1.3: the consumer left (detach): its id is handed out again."""
    h = _harness(RANGE_TOML.replace('"31000-31001"', '"31000-31000"'))
    resp = h.attach_ok(1, CAM, 5, C)
    h.attach_ok(2, CAM, 6, C)
    assert _hello(h, 5).descriptor_stream_id == 31000  # type: ignore[union-attr]
    assert _hello(h, 6).descriptor_stream_id == 0  # type: ignore[union-attr]
    h.detach(resp, 5, C)
    assert _hello(h, 6).descriptor_stream_id == 31000  # type: ignore[union-attr]


def test_driver_s11_lease_expiry_releases_the_id() -> None:
    """§10.1.3: a stale consumer (its lease expired) gives its id back."""
    h = _harness(RANGE_TOML.replace('"31000-31001"', '"31000-31000"'))
    h.attach_ok(1, CAM, 5, C)
    assert _hello(h, 5).descriptor_stream_id == 31000  # type: ignore[union-attr]
    h.advance(TTL_NS)  # expired
    h.attach_ok(2, CAM, 6, C)
    assert _hello(h, 6).descriptor_stream_id == 31000  # type: ignore[union-attr]
    assert h.core.counters["per_consumer_released"] == 1


# --- per-consumer control streams (issue #29.1) -------------------------------------------------

CTL_TOML = RANGE_TOML.replace(
    'descriptor_stream_id_range = "31000-31001"',
    'descriptor_stream_id_range = "31000-31001"\ncontrol_stream_id_range = "32000-32000"',
)


def _hello_progress(h: Harness, consumer_id: int) -> SendConsumerConfig:
    actions = h.run(
        h.core.on_consumer_hello(CAM, consumer_id, LIMITED, 10, "", 0, supports_progress=True)
    )
    (cfg,) = only(actions, SendConsumerConfig)
    return cfg


def test_driver_s11_control_stream_from_control_stream_id_range() -> None:
    """Driver Model §11: a lease holder asking for its own streams and progress gets a control
    stream id of control_stream_id_range on the driver's control channel, with its descriptor
    stream; one that does not ask for progress gets none."""
    h = _harness(CTL_TOML)
    h.attach_ok(1, CAM, 5, C)
    cfg = _hello_progress(h, 5)
    assert (cfg.descriptor_stream_id, cfg.control_stream_id) == (31000, 32000)
    assert cfg.control_channel == h.core.config.driver.control_channel
    h.attach_ok(2, CAM, 6, C)
    plain = _hello(h, 6)
    assert plain is not None and (plain.descriptor_stream_id, plain.control_stream_id) == (31001, 0)


def test_driver_s11_unset_or_exhausted_control_range_declines_control_only() -> None:
    """Driver Model §11: an unset or exhausted control range declines the control stream
    (empty channel, 0); the descriptor stream is still granted."""
    h = _harness(RANGE_TOML)  # no control range
    h.attach_ok(1, CAM, 5, C)
    cfg = _hello_progress(h, 5)
    assert (cfg.descriptor_stream_id, cfg.control_channel, cfg.control_stream_id) == (31000, "", 0)
    assert h.core.counters["per_consumer_control_declined_no_range"] == 1
    h = _harness(CTL_TOML)
    h.attach_ok(1, CAM, 5, C)
    h.attach_ok(2, CAM, 6, C)
    assert _hello_progress(h, 5).control_stream_id == 32000
    cfg = _hello_progress(h, 6)
    assert (cfg.descriptor_stream_id, cfg.control_stream_id) == (31001, 0)
    assert h.core.counters["per_consumer_control_declined_exhausted"] == 1


def test_driver_s11_lease_expiry_releases_the_control_id() -> None:
    """§10.1.3: a consumer whose lease expired (killed) gives its control id back too."""
    h = _harness(CTL_TOML)
    h.attach_ok(1, CAM, 5, C)
    assert _hello_progress(h, 5).control_stream_id == 32000
    h.advance(TTL_NS)  # expired
    h.attach_ok(2, CAM, 6, C)
    assert _hello_progress(h, 6).control_stream_id == 32000
    assert h.core.counters["per_consumer_control_released"] == 1
