"""Which ``Host`` an HTTP endpoint of tensorpool answers (#30: DNS rebinding).

The viewer and the metrics endpoints bind 127.0.0.1 by default, but a web page on the same
machine can still reach them: its script asks ``evil.example``, whose DNS answer is then
switched to 127.0.0.1, and the browser sends the request -- with ``Host: evil.example`` -- to
our port and lets the page read the answer (frames, statistics). What the browser cannot
forge is the ``Host`` header, so a request is answered only when it names this endpoint:

* a localhost name (``localhost``, ``*.localhost``: browsers resolve those to loopback
  themselves, so no rebinding is involved);
* an IP literal (a page can only be *served from* an IP literal by that address itself, so
  the origin is ours), which covers the bound address and any address of a wildcard bind;
* the bound host name, and the names the operator allows (``--allow-host`` of ``view``, or
  :data:`ENV_ALLOW_HOSTS` for every endpoint, comma-separated; ``*`` allows any).

Anything else -- and a request with no ``Host`` at all -- gets ``421 Misdirected Request`` and
is counted (:attr:`HostCheck.refused`). The port in the header is not compared: proxies and
port forwards change it, and a rebinding page cannot change the name.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections.abc import Iterable
from typing import Final

#: extra ``Host`` names every tensorpool HTTP endpoint answers (comma-separated; ``*``: any)
ENV_ALLOW_HOSTS: Final = "TENSORPOOL_ALLOW_HOSTS"


def _name(host_header: str) -> str:
    """The host part of a ``Host`` header, lower case, without port or trailing dot."""
    h = host_header.strip().lower()
    if h.startswith("["):  # [v6]:port
        h = h[1 : h.find("]")] if "]" in h else h
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """The ``Host`` names one endpoint bound to ``bind_host`` answers (thread-safe)."""

    def __init__(self, bind_host: str, allow: Iterable[str] = ()) -> None:
        env = os.environ.get(ENV_ALLOW_HOSTS, "")
        names = {_name(n) for n in (*allow, *env.split(",")) if n.strip()}
        self.any = "*" in names
        self.names = frozenset(names | ({_name(bind_host)} if bind_host else set()))
        self._refused = itertools.count()
        self.refused = 0

    def allows(self, host_header: str | None) -> bool:
        """Whether a request carrying ``host_header`` is answered; counts a refusal."""
        if self.any or (host_header is not None and self._known(_name(host_header))):
            return True
        self.refused = next(self._refused) + 1  # count() is atomic under the GIL
        return False

    def _known(self, name: str) -> bool:
        return (
            name == "localhost" or name.endswith(".localhost") or _is_ip(name) or name in self.names
        )

    @staticmethod
    def refusal(host_header: str | None) -> bytes:
        """The one-line body of a 421 answer."""
        shown = "no Host header" if host_header is None else f"Host {host_header[:80]!r}"
        return (
            f"tensorpool: {shown} is not this endpoint's name; open it as localhost or by "
            f"address, or allow the name (view --allow-host NAME, or {ENV_ALLOW_HOSTS})\n"
        ).encode()


__all__ = ["ENV_ALLOW_HOSTS", "HostCheck"]
