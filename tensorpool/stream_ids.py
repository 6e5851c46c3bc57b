"""Stream ids handed out from configured ranges, and what a hello asks for (sans-IO).

Shared by the driver (Driver Model §11: dynamic streams and per-consumer descriptor streams)
and the standalone producer (client/per_consumer.py), which must not disagree on these rules,
so they live below both (the driver never imports the client). Wire Spec §10.1.2/§10.1.3, §11:

* :func:`read_request` -- what a ``ConsumerHello`` asks for. An explicit request names a
  channel *and* a non-zero stream id; a half request (one without the other) MUST be
  rejected, and so is a channel that is not IPC (the stream serves a consumer mapping this
  host's SHM; declining is always allowed, §11). ``mode=RATE_LIMITED`` with a rate and nothing
  named is an implicit request: §11 says such a consumer "expects reduced-rate delivery via
  per-consumer stream", and Driver Model §11 allocates "when a consumer requests per-consumer
  streams with ``descriptor_stream_id=0``".
* :func:`read_control_request` -- the per-consumer *control* stream request (§10.1.2): explicit
  (channel and id, same rules), or implicit: a consumer that asks for a descriptor stream of its
  own and ``supportsProgress`` wants its ``FrameProgress`` beside it (Driver Model §11 allocates
  "when a consumer requests per-consumer streams with ``control_stream_id=0``").
* :func:`allocate_stream_id` / :class:`StreamIdPool` -- a free id of one range; a holder keeps
  its id while it asks again, an exhausted or unset range yields 0 (a decline).
* :func:`grant` -- the answer to both requests, for the driver and the standalone producer
  alike. A control stream goes only with a descriptor stream of the consumer's own: it carries
  ``FrameProgress`` for the frames that consumer will see, and a consumer on the shared
  descriptor stream sees every frame, which the shared control stream's progress serves
  (declining is always allowed, Wire §10.1.3). So a declined descriptor request declines the
  control request too (``no_descriptor``), while a granted descriptor stream stands even when
  the control range is unset or exhausted.
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from dataclasses import dataclass
from typing import Final, Protocol

from tensorpool.specs.generated.wire import Bool, Mode

__all__ = [
    "INVALID",
    "Grant",
    "IdRangeLike",
    "StreamIdPool",
    "StreamRequest",
    "allocate_stream_id",
    "asks_for_streams",
    "consumer_config_fields",
    "grant",
    "read_control_request",
    "read_request",
]

_MODE_RATE_LIMITED: Final = int(Mode.RATE_LIMITED)
_IPC: Final = "aeron:ipc"
#: A uint32 of all ones is the SBE null value: no rate, no stream id given.
_NULL_U32: Final = 0xFFFF_FFFF


class IdRangeLike(Protocol):
    """An inclusive id range (``tensorpool.config_util.IdRange``)."""

    start: int
    end: int

    def __contains__(self, value: object) -> bool: ...


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """A hello's per-consumer descriptor stream request; ``channel`` "" and ``stream_id`` 0:
    the answerer chooses (the implicit request of a ``RATE_LIMITED`` consumer)."""

    channel: str
    stream_id: int


INVALID: Final = "invalid_per_consumer_request"
"""A half request (§10.1.2: producers MUST reject it): answered with a decline."""


def read_request(
    mode: int, max_rate_hz: int, channel: str, stream_id: int
) -> StreamRequest | str | None:
    """What a ``ConsumerHello`` asks for: a :class:`StreamRequest`, :data:`INVALID`, or None."""
    explicit = _read_explicit(channel, stream_id)
    if explicit is not None:
        return explicit
    if mode == _MODE_RATE_LIMITED and max_rate_hz not in (0, _NULL_U32):
        return StreamRequest("", 0)
    return None


def read_control_request(
    supports_progress: bool,
    descriptor: StreamRequest | str | None,
    channel: str,
    stream_id: int,
) -> StreamRequest | str | None:
    """What a ``ConsumerHello`` asks for as a per-consumer control stream (``descriptor``: its
    :func:`read_request`)."""
    explicit = _read_explicit(channel, stream_id)
    if explicit is not None:
        return explicit
    if supports_progress and isinstance(descriptor, StreamRequest):
        return StreamRequest("", 0)
    return None


def asks_for_streams(
    mode: int,
    max_rate_hz: int,
    descriptor_channel: str,
    descriptor_stream_id: int,
    supports_progress: bool,
    control_channel: str,
    control_stream_id: int,
) -> bool:
    """Whether a hello asks for any per-consumer stream (the driver answers such a hello)."""
    desc = read_request(mode, max_rate_hz, descriptor_channel, descriptor_stream_id)
    ctl = read_control_request(supports_progress, desc, control_channel, control_stream_id)
    return desc is not None or ctl is not None


def _read_explicit(channel: str, stream_id: int) -> StreamRequest | str | None:
    sid = 0 if stream_id == _NULL_U32 else stream_id
    if channel and sid:
        # the consumer maps this host's SHM: its streams travel on this host (IPC)
        return StreamRequest(channel, sid) if channel.startswith(_IPC) else INVALID
    if channel or sid:
        return INVALID
    return None


def consumer_config_fields(
    stream_id: int,
    consumer_id: int,
    mode: int,
    channel: str,
    descriptor_stream_id: int,
    control_channel: str = "",
    control_stream_id: int = 0,
) -> dict[str, object]:
    """The fields of a ``ConsumerConfig`` (§10.1.3) as the driver and a producer both send it:
    the assigned descriptor and control streams, each a decline when ``channel`` "" and id 0."""
    return {
        "stream_id": stream_id,
        "consumer_id": consumer_id,
        "use_shm": int(Bool.TRUE),
        "mode": mode,
        "descriptor_stream_id": descriptor_stream_id,
        "control_stream_id": control_stream_id,
        "payload_fallback_uri": "",
        "descriptor_channel": channel,
        "control_channel": control_channel,
    }


@dataclass(frozen=True, slots=True)
class Grant:
    """The answer to a hello's two requests: each stream ``(channel, id)``, ``("", 0)`` when
    declined or not asked for; each outcome ``assigned``, ``declined_<why>`` or "" (not asked)."""

    descriptor: tuple[str, int]
    control: tuple[str, int]
    descriptor_outcome: str
    control_outcome: str


_NONE: Final = ("", 0)


def grant(
    key: Hashable,
    descriptor: StreamRequest | str | None,
    control: StreamRequest | str | None,
    descriptor_ids: StreamIdPool,
    control_ids: StreamIdPool,
    descriptor_channel: str,
    control_channel: str,
) -> Grant:
    """Assign (or decline, or give back) ``key``'s per-consumer streams (see the module);
    ``*_channel``: where an implicit request's stream goes."""
    d_stream, d_outcome = _assign(key, descriptor, descriptor_ids, descriptor_channel)
    if d_stream == _NONE and isinstance(control, StreamRequest):
        control_ids.release(key)
        return Grant(d_stream, _NONE, d_outcome, "declined_no_descriptor")
    c_stream, c_outcome = _assign(key, control, control_ids, control_channel)
    return Grant(d_stream, c_stream, d_outcome, c_outcome)


def _assign(
    key: Hashable, request: StreamRequest | str | None, ids: StreamIdPool, channel: str
) -> tuple[tuple[str, int], str]:
    if not isinstance(request, StreamRequest):
        ids.release(key)
        return _NONE, ("" if request is None else "declined_invalid")
    if not ids.configured:
        return _NONE, "declined_no_range"
    sid = ids.assign(key, request.stream_id)
    if not sid:
        return _NONE, "declined_exhausted"
    return (request.channel or channel, sid), "assigned"


def allocate_stream_id(
    id_range: IdRangeLike, taken: Container[int], requested: int, cursor: int
) -> int | None:
    """Pick a free id of ``id_range`` (Driver Model §11): ``requested`` when it lies inside
    the range and is free, so a client can name its stream; otherwise the next free id at or
    after ``cursor`` (wrapping). None means the range is exhausted."""
    if requested in id_range and requested not in taken:
        return requested
    start = cursor if cursor in id_range else id_range.start
    candidate = start
    while True:
        if candidate not in taken:
            return candidate
        candidate = id_range.start if candidate == id_range.end else candidate + 1
        if candidate == start:
            return None


class StreamIdPool:
    """The ids of one range, each held by one key (a consumer) until released."""

    __slots__ = ("_by_key", "_cursor", "_range", "_taken")

    def __init__(self, id_range: IdRangeLike | None) -> None:
        self._range = id_range
        self._by_key: dict[Hashable, int] = {}
        self._taken: set[int] = set()
        self._cursor = id_range.start if id_range is not None else 0

    def assign(self, key: Hashable, requested: int = 0) -> int:
        """The id of ``key`` (kept while it asks again), or a new one; 0 = declined (no
        range configured, or every id is held)."""
        held = self._by_key.get(key)
        if held is not None:
            return held
        if self._range is None:
            return 0
        sid = allocate_stream_id(self._range, self._taken, requested, self._cursor)
        if sid is None:
            return 0
        self._by_key[key] = sid
        self._taken.add(sid)
        rng = self._range
        self._cursor = rng.start if sid == rng.end else sid + 1
        return sid

    @property
    def configured(self) -> bool:
        """Whether there is a range at all (an unset one declines every request)."""
        return self._range is not None

    def release(self, key: Hashable) -> int:
        """Free ``key``'s id; returns it (0 when it held none)."""
        sid = self._by_key.pop(key, 0)
        self._taken.discard(sid)
        return sid

    def held(self) -> dict[Hashable, int]:
        return dict(self._by_key)
