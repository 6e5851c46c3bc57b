"""Aeron channel URIs: build the few shapes tensorpool uses and read back sizes from them.

Model: an Aeron channel is ``aeron:<media>[?key=value|key=value...]`` where media is ``ipc``
(shared memory on one host) or ``udp`` (needs ``endpoint=host:port`` or ``control=``). Only the
parameters tensorpool sets are offered as arguments; anything else goes through ``extra`` so this
module never has to chase Aeron's full parameter list. Sizes are validated here, where a typo is
cheap to explain, instead of surfacing as an opaque "Invalid argument" from the media driver.

Limits (from Aeron): a term buffer is a power of two in [64 KiB, 1 GiB]; an MTU is a multiple of
32 bytes (the frame alignment) in [32, 65504]. The largest message a publication accepts is
``min(term_length // 8, 16 MiB)``; larger messages must be split by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

IPC: Final = "aeron:ipc"
UDP: Final = "aeron:udp"

TERM_LENGTH_MIN: Final = 64 * 1024
TERM_LENGTH_MAX: Final = 1024 * 1024 * 1024
MTU_MIN: Final = 32
MTU_MAX: Final = 65504
FRAME_ALIGNMENT: Final = 32
DATA_HEADER_LENGTH: Final = 32
MAX_MESSAGE_LENGTH_CAP: Final = 16 * 1024 * 1024

_SUFFIX: Final = {"k": 1024, "m": 1024 * 1024, "g": 1024 * 1024 * 1024}


class ChannelError(ValueError):
    """A channel URI or one of its parameters is malformed or out of Aeron's range."""


def parse_size(text: str) -> int:
    """Parse an Aeron size parameter (``65536``, ``64k``, ``4m``, ``1g``)."""
    s = text.strip().lower()
    if not s:
        raise ChannelError("empty size")
    mult = _SUFFIX.get(s[-1], 1)
    digits = s[:-1] if mult != 1 else s
    if not digits.isdigit():
        raise ChannelError(f"bad size {text!r}: expected digits with an optional k/m/g suffix")
    return int(digits) * mult


def validate_term_length(term_length: int) -> int:
    if not (TERM_LENGTH_MIN <= term_length <= TERM_LENGTH_MAX) or (term_length & (term_length - 1)):
        raise ChannelError(
            f"term length {term_length} must be a power of two in "
            f"[{TERM_LENGTH_MIN}, {TERM_LENGTH_MAX}]"
        )
    return term_length


def validate_mtu(mtu: int) -> int:
    if not (MTU_MIN <= mtu <= MTU_MAX) or mtu % FRAME_ALIGNMENT:
        raise ChannelError(
            f"mtu {mtu} must be a multiple of {FRAME_ALIGNMENT} in [{MTU_MIN}, {MTU_MAX}]"
        )
    return mtu


def max_message_length(term_length: int) -> int:
    """Largest message a publication with this term length accepts (Aeron's rule)."""
    return min(term_length // 8, MAX_MESSAGE_LENGTH_CAP)


def _build(
    media: str,
    params: list[tuple[str, str]],
    term_length: int | None,
    mtu: int | None,
    sparse: bool | None,
    alias: str | None,
    extra: Mapping[str, str | int] | None,
) -> str:
    if term_length is not None:
        params.append(("term-length", str(validate_term_length(term_length))))
    if mtu is not None:
        params.append(("mtu", str(validate_mtu(mtu))))
    if sparse is not None:
        params.append(("sparse", "true" if sparse else "false"))
    if alias is not None:
        params.append(("alias", alias))
    if extra:
        params.extend((k, str(v)) for k, v in extra.items())
    seen: set[str] = set()
    for key, value in params:
        if not key or any(c in key for c in "=|?") or any(c in value for c in "|"):
            raise ChannelError(f"bad channel parameter {key!r}={value!r}")
        if key in seen:
            raise ChannelError(f"channel parameter {key!r} given twice")
        seen.add(key)
    if not params:
        return media
    return media + "?" + "|".join(f"{k}={v}" for k, v in params)


def ipc_channel(
    *,
    term_length: int | None = None,
    mtu: int | None = None,
    sparse: bool | None = None,
    alias: str | None = None,
    extra: Mapping[str, str | int] | None = None,
) -> str:
    """``aeron:ipc`` with optional term length / MTU (None keeps the media driver default)."""
    return _build(IPC, [], term_length, mtu, sparse, alias, extra)


def udp_channel(
    endpoint: str,
    *,
    interface: str | None = None,
    term_length: int | None = None,
    mtu: int | None = None,
    ttl: int | None = None,
    sparse: bool | None = None,
    alias: str | None = None,
    extra: Mapping[str, str | int] | None = None,
) -> str:
    """``aeron:udp?endpoint=host:port`` (unicast, or multicast with a group address)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ChannelError(f"bad UDP endpoint {endpoint!r}: expected host:port")
    params = [("endpoint", endpoint)]
    if interface is not None:
        params.append(("interface", interface))
    if ttl is not None:
        if not 0 <= ttl <= 255:
            raise ChannelError(f"ttl {ttl} must be in [0, 255]")
        params.append(("ttl", str(ttl)))
    return _build(UDP, params, term_length, mtu, sparse, alias, extra)


def channel_params(channel: str) -> dict[str, str]:
    """The ``key=value`` parameters of a channel URI (tags like ``aeron-spy:`` not handled)."""
    if not channel.startswith("aeron:"):
        raise ChannelError(f"not an Aeron channel URI: {channel!r}")
    _, _, query = channel.partition("?")
    result: dict[str, str] = {}
    if not query:
        return result
    for item in query.split("|"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ChannelError(f"bad parameter {item!r} in channel {channel!r}")
        result[key] = value
    return result


def channel_term_length(channel: str) -> int | None:
    """The ``term-length`` a channel asks for, or None if the driver default applies."""
    value = channel_params(channel).get("term-length")
    return None if value is None else parse_size(value)


def channel_mtu(channel: str) -> int | None:
    value = channel_params(channel).get("mtu")
    return None if value is None else parse_size(value)


#: IPC channel parameters that only shape a publication's log: a subscription on the same stream
#: receives from every IPC publication whatever they say.
_IPC_PUBLICATION_ONLY: Final = frozenset(
    {"term-length", "mtu", "sparse", "alias", "linger", "init-term-id", "term-id", "term-offset"}
)


def subscription_channel(channel: str) -> str:
    """The channel as a subscription sees it: ``aeron:ipc?term-length=16m`` and ``aeron:ipc``
    receive the same messages, so a process needs one subscription for both (#28.1). Other
    media, and parameters that select what is received, are kept as given."""
    if not channel.startswith(IPC):
        return channel
    params = {k: v for k, v in channel_params(channel).items() if k not in _IPC_PUBLICATION_ONLY}
    return IPC + ("?" + "|".join(f"{k}={v}" for k, v in sorted(params.items())) if params else "")
