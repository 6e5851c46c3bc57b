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
* :func:`allocate_stream_id` / :class:`StreamIdPool` -- a free id of one range; a holder keeps
  its id while it asks again, an exhausted or unset range yields 0 (a decline).
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from dataclasses import dataclass
from typing import Final, Protocol

from tensorpool.specs.generated.wire import Bool, Mode

__all__ = [
    "INVALID",
    "IdRangeLike",
    "StreamIdPool",
    "StreamRequest",
    "allocate_stream_id",
    "consumer_config_fields",
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
    sid = 0 if stream_id == _NULL_U32 else stream_id
    if channel and sid:
        # the consumer maps this host's SHM: its descriptors travel on this host (IPC)
        return StreamRequest(channel, sid) if channel.startswith(_IPC) else INVALID
    if channel or sid:
        return INVALID
    if mode == _MODE_RATE_LIMITED and max_rate_hz not in (0, _NULL_U32):
        return StreamRequest("", 0)
    return None


def consumer_config_fields(
    stream_id: int, consumer_id: int, mode: int, channel: str, descriptor_stream_id: int
) -> dict[str, object]:
    """The fields of a ``ConsumerConfig`` (§10.1.3) as the driver and a producer both send it:
    the assigned descriptor stream, or a decline (``channel`` "" and id 0). Per-consumer
    control streams are always declined: tensorpool has no per-consumer control traffic."""
    return {
        "stream_id": stream_id,
        "consumer_id": consumer_id,
        "use_shm": int(Bool.TRUE),
        "mode": mode,
        "descriptor_stream_id": descriptor_stream_id,
        "control_stream_id": 0,
        "payload_fallback_uri": "",
        "descriptor_channel": channel,
        "control_channel": "",
    }


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

    def release(self, key: Hashable) -> int:
        """Free ``key``'s id; returns it (0 when it held none)."""
        sid = self._by_key.pop(key, 0)
        self._taken.discard(sid)
        return sid

    def held(self) -> dict[Hashable, int]:
        return dict(self._by_key)
