"""Benchmarks: ``python -m bench [NAME ...]`` (see ``bench/__main__.py``)."""

#: Exit status of a benchmark that cannot run on this host (``bench_gpu`` without a GPU or the
#: ``tensorpool[gpu]`` extra): ``python -m bench`` lists it as skipped, not failed.
SKIPPED = 77


def free_ports(n: int = 1, udp: bool = False) -> list[int]:
    """``n`` distinct free 127.0.0.1 ports (bound together, then released)."""
    import socket

    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    socks = [socket.socket(socket.AF_INET, kind) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
