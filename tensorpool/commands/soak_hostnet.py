"""The soak's second host on its own network (issue #30.1): a network namespace when allowed.

Host B (its media driver, SHM driver, the bridge receiver and its consumer) runs in a network
namespace joined to the soak's by a veth pair, so the bridge's UDP really leaves one network
stack for another. That needs root and ``ip netns``; where either is missing (or any step
fails) host B shares the soak's loopback, and the report says which one ran and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

_IP = "ip"


@dataclass
class HostNet:
    """Where host B's processes run and the address the bridge sends to."""

    addr: str
    """Host B's address: the receiver binds there, the sender sends there."""
    namespace: str | None = None
    """The network namespace host B runs in; None: the soak's own loopback."""
    reason: str = ""
    """Why loopback (empty when a namespace runs)."""
    _links: list[str] = field(default_factory=list)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside host B's namespace (``ip netns exec`` execs in place: the pid
        the soak signals is the part's own)."""
        if self.namespace is None:
            return argv
        return [_IP, "netns", "exec", self.namespace, *argv]

    def describe(self) -> dict[str, str | None]:
        if self.namespace is None:
            return {"kind": "loopback", "address": self.addr, "reason": self.reason}
        return {"kind": "netns", "namespace": self.namespace, "address": self.addr}

    def close(self) -> list[str]:
        """Remove what :func:`setup` created (only that: the names carry our pid); returns
        what could not be removed, for the leftovers."""
        left: list[str] = []
        for link in self._links:
            _ip("link", "del", link)
        if self.namespace is not None:
            _ip("netns", "del", self.namespace)
            if self.namespace in _namespaces():
                left.append(f"netns {self.namespace}")
        self._links = []
        return left


def _ip(*args: str) -> str | None:
    """Run ``ip ARGS``; the error text on failure, None on success."""
    res = subprocess.run([_IP, *args], capture_output=True, check=False, timeout=30)
    if res.returncode == 0:
        return None
    return (res.stderr.decode(errors="replace").strip() or f"exit {res.returncode}")[:200]


def _namespaces() -> set[str]:
    res = subprocess.run([_IP, "netns", "list"], capture_output=True, check=False, timeout=30)
    return {line.split()[0] for line in res.stdout.decode().splitlines() if line.strip()}


def setup() -> HostNet:
    """A namespace and veth pair for host B, or loopback with the reason."""
    if os.geteuid() != 0:
        return HostNet("127.0.0.1", reason="not root: no network namespace")
    if shutil.which(_IP) is None:
        return HostNet("127.0.0.1", reason="no `ip` command: no network namespace")
    tag = os.getpid() % 100_000
    ns, va, vb = f"tpsoak{tag}", f"tpsa{tag}", f"tpsb{tag}"
    net = f"10.213.{tag % 250}"
    host = HostNet(f"{net}.2", namespace=ns)
    steps = [
        ("netns", "add", ns),
        ("link", "add", va, "type", "veth", "peer", "name", vb),
        ("link", "set", vb, "netns", ns),
        ("addr", "add", f"{net}.1/30", "dev", va),
        ("link", "set", va, "up"),
        ("-n", ns, "addr", "add", f"{net}.2/30", "dev", vb),
        ("-n", ns, "link", "set", vb, "up"),
        ("-n", ns, "link", "set", "lo", "up"),
    ]
    for i, step in enumerate(steps):
        error = _ip(*step)
        if i == 1 and error is None:
            host._links.append(va)
        if error is not None:
            if i == 0:  # nothing created
                host.namespace = None
            host.close()
            return HostNet("127.0.0.1", reason=f"ip {' '.join(step)}: {error}")
    return host
