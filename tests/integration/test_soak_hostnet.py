"""#30.1: the soak's host B on its own network: a namespace when the host allows one.

`setup()` must give a namespace whose address a datagram from the soak's namespace reaches
(what the bridge's UDP does), and `close()` must remove it and its veth pair; without root
or `ip`, it must say loopback and why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from tensorpool.commands import soak_hostnet

pytestmark = pytest.mark.slow

RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
s.settimeout(60)
print(s.recv(100).decode(), flush=True)
"""


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, check=True).stdout.decode()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and `ip netns`"
)
def test_30_1_host_b_namespace_carries_udp_from_the_soak_and_is_removed() -> None:
    net = soak_hostnet.setup()
    try:
        assert net.namespace is not None, net.reason
        assert net.describe()["kind"] == "netns"
        rx = subprocess.Popen(
            net.wrap([sys.executable, "-c", RECEIVE, net.addr]),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert rx.stdout is not None
            port = int(rx.stdout.readline())
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"from host A", (net.addr, port))
            assert rx.stdout.readline().strip() == "from host A"
        finally:
            rx.kill()
            rx.wait()
        # the address is the namespace's alone: nothing in ours is bound to it
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(OSError):
            s.bind((net.addr, 0))
    finally:
        assert net.close() == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, check=True)
    assert net.namespace not in listed.stdout.decode()
    assert f"tpsa{os.getpid() % 100_000}" not in _links()


def test_30_1_without_a_namespace_the_soak_says_loopback_and_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(soak_hostnet, "_IP", "no-such-ip-command")
    net = soak_hostnet.setup()
    assert net.namespace is None and net.addr == "127.0.0.1"
    assert net.describe()["kind"] == "loopback" and net.reason
    assert net.wrap(["x"]) == ["x"] and net.close() == []
