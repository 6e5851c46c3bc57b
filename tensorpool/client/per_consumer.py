"""A producer's per-consumer descriptor streams (sans-IO).

Wire Spec §10.1.2/§10.1.3, §11 and Driver Model §11. A consumer that wants fewer descriptors
than the shared stream carries asks in its ``ConsumerHello``; whoever answers (the producer
standalone, the driver in driver mode) assigns a descriptor stream id from a configured range
in a ``ConsumerConfig``, and the producer publishes to that stream only the frames the
consumer's ``max_rate_hz`` admits, on the rate limiter's grid (:class:`RateGate`). The other
implementations (Julia, C) work the same way. What a hello asks for and how ids are handed out
(:func:`~tensorpool.stream_ids.read_request`, :class:`~tensorpool.stream_ids.StreamIdPool`) are
shared with the driver in :mod:`tensorpool.stream_ids`.

:class:`ConsumerStreams` is the producer's table: which consumers have their own stream, at
which rate, and when a stream is released -- the consumer went stale (neither a hello nor a
``QosConsumer`` for ``stale_ns``; §10.1.3: "3-5x the configured hello/qos interval"; a consumer
says hello on start and changes and sends QoS every period, so its QoS keeps the stream), or it
stopped asking.

Per-consumer control streams (the ``control_*`` fields) are always declined: nothing of this
producer's is per-consumer control traffic yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tensorpool.client.rate_gate import MODE_RATE_LIMITED, NULL_RATE, RateGate
from tensorpool.endpoints import Endpoints
from tensorpool.stream_ids import IdRangeLike, StreamIdPool, StreamRequest, read_request

__all__ = [
    "STALE_PERIODS",
    "CloseConsumerStream",
    "ConsumerStreams",
    "OpenConsumerStream",
    "SendConsumerConfig",
    "check_per_consumer_ids",
]

#: A per-consumer stream is released after this many QoS periods without a hello or QoS (§10.1.3).
STALE_PERIODS: Final = 5


def check_per_consumer_ids(ids: IdRangeLike, channels: Endpoints) -> None:
    """A standalone producer's range must not hold the shared streams' ids (as Driver Model
    §11 says of the driver's): ValueError naming them."""
    shared = (
        channels.control_stream_id,
        channels.descriptor_stream_id,
        channels.qos_stream_id,
        channels.metadata_stream_id,
    )
    clash = sorted({i for i in shared if i in ids})
    if clash:
        raise ValueError(f"per-consumer stream ids {ids} contain the shared stream ids {clash}")


@dataclass(frozen=True, slots=True)
class SendConsumerConfig:
    """Answer a ``ConsumerHello`` (§10.1.3): ``stream_id`` 0 and ``channel`` "" decline (the
    consumer stays on the shared stream)."""

    consumer_id: int
    mode: int
    channel: str = ""
    stream_id: int = 0


@dataclass(frozen=True, slots=True)
class OpenConsumerStream:
    """Add the publication of a consumer's own descriptor stream; descriptors the consumer's
    :attr:`ConsumerStream.gate` admits go there. If it cannot be added the agent calls
    :meth:`ConsumerStreams.on_open_failed` and sends the ``SendConsumerConfig`` that follows
    as a decline."""

    consumer_id: int
    channel: str
    stream_id: int


@dataclass(frozen=True, slots=True)
class CloseConsumerStream:
    """Close a consumer's descriptor publication (§10.1.3: stale, left, or declined now)."""

    consumer_id: int
    reason: str


@dataclass(slots=True)
class ConsumerStream:
    """One consumer's own descriptor stream and its rate grid."""

    channel: str
    stream_id: int
    gate: RateGate[object]
    last_seen_ns: int


PerConsumerAction = SendConsumerConfig | OpenConsumerStream | CloseConsumerStream


class ConsumerStreams:
    """A producer's per-consumer streams (offered when the producer is configured to).

    Standalone (``ids`` given, maybe with no range): the producer answers every request itself,
    assigning from ``ids``. Driver mode (``ids`` None): the driver assigns (Driver Model §11)
    and answers; the producer follows the driver's ``ConsumerConfig`` (:meth:`on_config`) and
    learns the rate from the hellos. ``shared`` is the producer's own descriptor stream: an
    "assignment" naming it (Driver Model §11's wording of an unset-range decline, which other
    drivers may follow) is a decline, never a second publication on the shared stream.
    """

    def __init__(
        self,
        *,
        ids: StreamIdPool | None,
        default_channel: str,
        shared: tuple[str, int],
        stale_ns: int,
    ) -> None:
        self._ids = ids
        self._default_channel = default_channel
        self._shared = shared
        self._stale_ns = stale_ns
        self.streams: dict[int, ConsumerStream] = {}
        self._rates: dict[int, int] = {}  # driver mode: the rate a consumer's hello asked for
        self.counters: dict[str, int] = {"assigned": 0, "declined": 0, "released": 0}

    def on_hello(
        self,
        consumer_id: int,
        mode: int,
        max_rate_hz: int,
        channel: str,
        stream_id: int,
        now_ns: int,
    ) -> list[PerConsumerAction]:
        request = read_request(mode, max_rate_hz, channel, stream_id)
        rate = 0 if mode != MODE_RATE_LIMITED or max_rate_hz == NULL_RATE else max_rate_hz
        driver_mode = self._ids is None
        if not isinstance(request, StreamRequest):
            self._rates.pop(consumer_id, None)
            out: list[PerConsumerAction] = self._close(consumer_id, "not_requested")
            if driver_mode and request is not None:
                return out  # the driver declines a half request (Driver Model §11)
            self.counters["declined"] += 1
            return [*out, SendConsumerConfig(consumer_id, mode)]
        self._rates[consumer_id] = rate
        if driver_mode:  # the driver answers (Driver Model §11); keep the stream alive
            current = self.streams.get(consumer_id)
            if current is not None:
                current.last_seen_ns = now_ns
                current.gate.set_fallback_rate(rate)
            return []
        assert self._ids is not None
        sid = self._ids.assign(consumer_id, request.stream_id)
        if not sid:
            self.counters["declined"] += 1
            return [SendConsumerConfig(consumer_id, mode)]
        channel = request.channel or self._default_channel
        out = self._follow(consumer_id, channel, sid, now_ns)
        return [*out, SendConsumerConfig(consumer_id, mode, channel, sid)]

    def on_config(
        self, consumer_id: int, channel: str, stream_id: int, now_ns: int
    ) -> list[PerConsumerAction]:
        """Driver mode: the driver's ``ConsumerConfig`` for a consumer of our stream."""
        if self._ids is not None:
            return []  # standalone: we are the authority; a config on the stream is our own
        if not channel or not stream_id or (channel, stream_id) == self._shared:
            return self._close(consumer_id, "declined")
        return self._follow(consumer_id, channel, stream_id, now_ns)

    def _follow(
        self, consumer_id: int, channel: str, stream_id: int, now_ns: int
    ) -> list[PerConsumerAction]:
        out: list[PerConsumerAction] = []
        rate = self._rates.get(consumer_id, 0)
        current = self.streams.get(consumer_id)
        if current is not None and (current.channel, current.stream_id) == (channel, stream_id):
            current.last_seen_ns = now_ns
            current.gate.set_fallback_rate(rate)
            return out
        if current is not None:
            out.append(CloseConsumerStream(consumer_id, "reassigned"))
        self.streams[consumer_id] = ConsumerStream(
            channel, stream_id, RateGate(rate, name="producer.per_consumer"), now_ns
        )
        self.counters["assigned"] += 1
        out.append(OpenConsumerStream(consumer_id, channel, stream_id))
        return out

    def on_qos(self, consumer_id: int, now_ns: int) -> None:
        """A consumer's ``QosConsumer`` of our stream: it is alive, its stream stays (§10.1.3)."""
        current = self.streams.get(consumer_id)
        if current is not None:
            current.last_seen_ns = now_ns

    def on_open_failed(self, consumer_id: int) -> None:
        """The agent could not add the publication (Aeron refused the channel): forget the
        stream; the answer then goes out as a decline (the agent's execution contract)."""
        if self.streams.pop(consumer_id, None) is not None and self._ids is not None:
            self._ids.release(consumer_id)
        self.counters["open_failed"] = self.counters.get("open_failed", 0) + 1

    def _close(self, consumer_id: int, reason: str) -> list[PerConsumerAction]:
        if self.streams.pop(consumer_id, None) is None:
            return []
        if self._ids is not None:
            self._ids.release(consumer_id)
        self.counters["released"] += 1
        return [CloseConsumerStream(consumer_id, reason)]

    def tick(self, now_ns: int) -> list[PerConsumerAction]:
        """Release the streams of consumers gone stale: no hello or QoS for ``stale_ns``
        (§10.1.3; a consumer killed with SIGKILL sends neither)."""
        stale = [cid for cid, s in self.streams.items() if now_ns - s.last_seen_ns > self._stale_ns]
        out: list[PerConsumerAction] = []
        for cid in stale:
            self._rates.pop(cid, None)
            out += self._close(cid, "stale")
        return out
