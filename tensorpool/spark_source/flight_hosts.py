"""The ``hosts`` option's value (#18): which ``tensorpool serve`` serves which stream, and how
to reach the servers (token, TLS roots, timeouts).

Option-layer data: :mod:`~tensorpool.spark_source.options` parses ``hosts`` into a
:class:`RemoteHosts` and :mod:`~tensorpool.spark_source.rings.remote` (the Flight client) reads it,
so it sits below both (#27.2: options < plan < rings < spark; the options <-> remote import cycle
ran through these three names). ``pyarrow.flight`` is imported only when a call is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pyarrow.flight as flight

#: seconds a planning call (scan) may take before the driver gives up on a host
CALL_TIMEOUT_S: Final = 10.0
#: seconds a call retries a server that does not answer (restarting) before it fails
RETRY_S: Final = 15.0


@dataclass(frozen=True, slots=True)
class FlightAccess:
    """How to reach the servers: token and TLS roots (picklable: it travels in partitions)."""

    token: str | None = None
    tls_root_certs: bytes | None = None  # PEM; None = plain gRPC
    timeout_s: float = CALL_TIMEOUT_S
    #: how long a call keeps retrying an unavailable server (a restart) before it fails
    retry_s: float = RETRY_S

    def location(self, address: str) -> str:
        return f"grpc+tls://{address}" if self.tls_root_certs is not None else f"grpc://{address}"

    def call_options(self, timeout_s: float | None = None) -> flight.FlightCallOptions:
        import pyarrow.flight as flight

        headers = []
        if self.token is not None:
            headers.append((b"authorization", b"Bearer " + self.token.encode()))
        return flight.FlightCallOptions(headers=headers, timeout=timeout_s)


@dataclass(frozen=True, slots=True)
class RemoteHosts:
    """``hosts`` + ``streams="host/id,..."``: which server serves which stream."""

    hosts: tuple[tuple[str, str], ...]  # (name as written in 'streams', "host:port")
    stream_host: tuple[tuple[int, str], ...]  # (stream id, host name), sorted by stream id
    access: FlightAccess
    prefer_local_reads: bool = True

    def address_of(self, sid: int) -> str:
        name = dict(self.stream_host)[sid]
        return dict(self.hosts)[name]

    def by_address(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for sid, name in self.stream_host:
            out.setdefault(dict(self.hosts)[name], []).append(sid)
        return out


def parse_hosts(
    raw_hosts: str, raw_streams: str
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[int, str], ...]]:
    """``hosts`` and ``streams`` -> ((name, address)...), ((sid, name)...); ValueError names
    the option ("hosts: ..." / "streams: ...")."""
    hosts: list[tuple[str, str]] = []
    for part in (p.strip() for p in raw_hosts.split(",")):
        host, sep, port = part.rpartition(":")
        if not part or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"hosts: expected 'host:port[,host:port...]', got {part!r}")
        if part in (a for _, a in hosts):
            raise ValueError(f"hosts: {part!r} is named twice")
        hosts.append((part, part))
    # a stream names its server as "host:port", or as "host" when one server runs there
    by_host: dict[str, list[str]] = {}
    for a, _ in hosts:
        by_host.setdefault(a.rpartition(":")[0], []).append(a)
    names = dict(hosts)
    names.update({h: a[0] for h, a in by_host.items() if len(a) == 1})
    streams: list[tuple[int, str]] = []
    for part in (p.strip() for p in raw_streams.split(",")):
        name, sep, sid_s = part.rpartition("/")
        if not sep:
            raise ValueError(
                f"streams: with 'hosts', name each stream as host/id (e.g. 'camA/1'), got {part!r}"
            )
        if name not in names:
            hint = " (it runs several servers: write host:port/id)" if name in by_host else ""
            raise ValueError(
                f"streams: {part!r} names host {name!r}, which is not in 'hosts'{hint}"
            )
        name = names[name]
        try:
            sid = int(sid_s)
        except ValueError:
            raise ValueError(f"streams: stream id {sid_s!r} is not an integer") from None
        if not 1 <= sid <= 2**31 - 1:
            raise ValueError(f"streams: stream id {sid} must be in 1..{2**31 - 1}")
        if sid in dict(streams):
            # offsets are keyed by stream id: one id, one stream, across all hosts
            raise ValueError(
                f"streams: stream id {sid} appears twice; stream ids must be unique across hosts"
            )
        streams.append((sid, name))
    return tuple(hosts), tuple(sorted(streams))
