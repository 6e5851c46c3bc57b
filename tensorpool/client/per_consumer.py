"""A producer's per-consumer descriptor and control streams (sans-IO).

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

A consumer that asks for its own descriptor stream and for progress (``supportsProgress``),
or names a control stream, also gets a control stream of its own (ids from the producer's
control range standalone, the driver's ``control_stream_id_range`` in driver mode; the rules
of :func:`~tensorpool.stream_ids.grant`): the producer publishes there, and not on the shared
control stream, the ``FrameProgress`` of the frames that consumer will see (§10.1.3: "the
consumer MUST subscribe to that control stream for FrameProgress"; nothing else goes there).
Both streams of a consumer are opened, released and declined together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tensorpool.client.rate_gate import MODE_RATE_LIMITED, NULL_RATE, RateGate
from tensorpool.endpoints import Endpoints
from tensorpool.stream_ids import (
    IdRangeLike,
    StreamIdPool,
    StreamRequest,
    grant,
    read_control_request,
    read_request,
)

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


def check_per_consumer_ids(
    ids: IdRangeLike | None, channels: Endpoints, control_ids: IdRangeLike | None = None
) -> None:
    """A standalone producer's ranges must not hold the shared streams' ids nor overlap (as
    Driver Model §11 says of the driver's): ValueError naming them."""
    shared = (
        channels.control_stream_id,
        channels.descriptor_stream_id,
        channels.qos_stream_id,
        channels.metadata_stream_id,
    )
    for what, rng in (("per-consumer stream ids", ids), ("per-consumer control ids", control_ids)):
        clash = sorted({i for i in shared if rng is not None and i in rng})
        if clash:
            raise ValueError(f"{what} {rng} contain the shared stream ids {clash}")
    both = ids is not None and control_ids is not None
    if both and ids.start <= control_ids.end and control_ids.start <= ids.end:  # type: ignore[union-attr]
        raise ValueError(f"per-consumer control ids {control_ids} overlap stream ids {ids}")


@dataclass(frozen=True, slots=True)
class SendConsumerConfig:
    """Answer a ``ConsumerHello`` (§10.1.3): ``stream_id`` 0 and ``channel`` "" decline (the
    consumer stays on the shared stream); likewise ``control_*`` for its control stream."""

    consumer_id: int
    mode: int
    channel: str = ""
    stream_id: int = 0
    control_channel: str = ""
    control_stream_id: int = 0


@dataclass(frozen=True, slots=True)
class OpenConsumerStream:
    """Add the publications of a consumer's own descriptor stream (descriptors the consumer's
    :attr:`ConsumerStream.gate` admits go there) and, with ``control_stream_id``, of its own
    control stream (its ``FrameProgress``). If one cannot be added the agent calls
    :meth:`ConsumerStreams.on_open_failed` and sends the ``SendConsumerConfig`` that follows
    as a decline."""

    consumer_id: int
    channel: str
    stream_id: int
    control_channel: str = ""
    control_stream_id: int = 0


@dataclass(frozen=True, slots=True)
class CloseConsumerStream:
    """Close a consumer's publications (§10.1.3: stale, left, or declined now)."""

    consumer_id: int
    reason: str


@dataclass(slots=True)
class ConsumerStream:
    """One consumer's own descriptor stream and its rate grid, and its own control stream
    (``("", 0)``: none, its progress goes on the shared control stream)."""

    channel: str
    stream_id: int
    gate: RateGate[object]
    last_seen_ns: int
    control: tuple[str, int] = ("", 0)


PerConsumerAction = SendConsumerConfig | OpenConsumerStream | CloseConsumerStream


class ConsumerStreams:
    """A producer's per-consumer streams (offered when the producer is configured to).

    Standalone (``ids`` given, maybe with no range): the producer answers every request itself,
    assigning from ``ids`` and ``control_ids``. Driver mode (``ids`` None): the driver assigns
    (Driver Model §11)
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
        control_ids: StreamIdPool | None = None,
        control_channel: str = "",
    ) -> None:
        self._ids = ids
        self._control_ids = control_ids or StreamIdPool(None)
        self._default_channel = default_channel
        self._control_channel = control_channel
        self._shared = shared
        self._stale_ns = stale_ns
        self.streams: dict[int, ConsumerStream] = {}
        self._rates: dict[int, int] = {}  # driver mode: the rate a consumer's hello asked for
        self.counters: dict[str, int] = {
            "assigned": 0,
            "declined": 0,
            "released": 0,
            "control_assigned": 0,
            "control_declined": 0,
        }

    def on_hello(
        self,
        consumer_id: int,
        mode: int,
        max_rate_hz: int,
        channel: str,
        stream_id: int,
        now_ns: int,
        *,
        supports_progress: bool = False,
        control_channel: str = "",
        control_stream_id: int = 0,
    ) -> list[PerConsumerAction]:
        request = read_request(mode, max_rate_hz, channel, stream_id)
        control = read_control_request(
            supports_progress, request, control_channel, control_stream_id
        )
        rate = 0 if mode != MODE_RATE_LIMITED or max_rate_hz == NULL_RATE else max_rate_hz
        driver_mode = self._ids is None
        if not isinstance(request, StreamRequest):
            self._rates.pop(consumer_id, None)
            out: list[PerConsumerAction] = self._close(consumer_id, "not_requested")
            if driver_mode and (request is not None or control is not None):
                return out  # the driver declines (Driver Model §11)
            self.counters["declined"] += 1
            if control is not None:
                self.counters["control_declined"] += 1
            return [*out, SendConsumerConfig(consumer_id, mode)]
        self._rates[consumer_id] = rate
        if driver_mode:  # the driver answers (Driver Model §11); keep the stream alive
            current = self.streams.get(consumer_id)
            if current is not None:
                current.last_seen_ns = now_ns
                current.gate.set_fallback_rate(rate)
            return []
        assert self._ids is not None
        g = grant(
            consumer_id,
            request,
            control,
            self._ids,
            self._control_ids,
            self._default_channel,
            self._control_channel,
        )
        if g.control_outcome.startswith("declined"):
            self.counters["control_declined"] += 1
        if not g.descriptor[1]:
            self.counters["declined"] += 1
            return [*self._close(consumer_id, "declined"), SendConsumerConfig(consumer_id, mode)]
        out = self._follow(consumer_id, *g.descriptor, now_ns, g.control)
        return [*out, SendConsumerConfig(consumer_id, mode, *g.descriptor, *g.control)]

    def on_config(
        self,
        consumer_id: int,
        channel: str,
        stream_id: int,
        now_ns: int,
        control: tuple[str, int] = ("", 0),
    ) -> list[PerConsumerAction]:
        """Driver mode: the driver's ``ConsumerConfig`` for a consumer of our stream (a control
        stream without a descriptor stream is not followed: see the module)."""
        if self._ids is not None:
            return []  # standalone: we are the authority; a config on the stream is our own
        if not channel or not stream_id or (channel, stream_id) == self._shared:
            return self._close(consumer_id, "declined")
        if not control[0] or not control[1]:
            control = ("", 0)
        return self._follow(consumer_id, channel, stream_id, now_ns, control)

    def _follow(
        self,
        consumer_id: int,
        channel: str,
        stream_id: int,
        now_ns: int,
        control: tuple[str, int],
    ) -> list[PerConsumerAction]:
        out: list[PerConsumerAction] = []
        rate = self._rates.get(consumer_id, 0)
        current = self.streams.get(consumer_id)
        if current is not None and (current.channel, current.stream_id, current.control) == (
            channel,
            stream_id,
            control,
        ):
            current.last_seen_ns = now_ns
            current.gate.set_fallback_rate(rate)
            return out
        if current is not None:
            out.append(CloseConsumerStream(consumer_id, "reassigned"))
        self.streams[consumer_id] = ConsumerStream(
            channel, stream_id, RateGate(rate, name="producer.per_consumer"), now_ns, control
        )
        self.counters["assigned"] += 1
        if control[1]:
            self.counters["control_assigned"] += 1
        out.append(OpenConsumerStream(consumer_id, channel, stream_id, *control))
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
            self._control_ids.release(consumer_id)
        self.counters["open_failed"] = self.counters.get("open_failed", 0) + 1

    def _close(self, consumer_id: int, reason: str) -> list[PerConsumerAction]:
        if self.streams.pop(consumer_id, None) is None:
            return []
        if self._ids is not None:
            self._ids.release(consumer_id)
            self._control_ids.release(consumer_id)
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
