"""Free 127.0.0.1 ports for tests that start servers or UDP endpoints.

The ports are bound together (so ``n`` of them are distinct), read and released; another
process could take one before the test binds it, which on a test host does not happen in
practice and shows as a clear bind error when it does.
"""

from __future__ import annotations

import socket


def free_ports(n: int = 1, kind: int = socket.SOCK_STREAM) -> list[int]:
    socks = [socket.socket(socket.AF_INET, kind) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_udp_ports(n: int) -> list[int]:
    return free_ports(n, socket.SOCK_DGRAM)


def free_port() -> int:
    return free_ports(1)[0]
