"""#13.2 at the transport layer: an AeronContext follows its media driver through a restart.

A real standalone media driver process is killed (-9, then SIGTERM) and a new one started in
the same directory; the same Publisher and Subscriber objects must carry messages again after
``maintain()`` reconnects, with ``generation`` counting the reconnects. The directory itself is
never touched by the client.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator

import pytest

from tensorpool.transport.cnc import read_cnc_identity
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import MediaDriverProcess, is_active

pytestmark = pytest.mark.slow


@pytest.fixture
def aeron_dir() -> Iterator[str]:
    parent = tempfile.mkdtemp(
        prefix="tp-reconnect-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    yield os.path.join(parent, "aeron")
    shutil.rmtree(parent, ignore_errors=True)


def _start(aeron_dir: str) -> MediaDriverProcess:
    deadline = time.monotonic() + 20
    while os.path.exists(os.path.join(aeron_dir, "cnc.dat")) and is_active(aeron_dir):
        assert time.monotonic() < deadline, "the killed driver still looks alive"
        time.sleep(0.05)
    while True:  # the C driver's own staleness check may trail ours briefly after a kill -9
        try:
            return MediaDriverProcess(aeron_dir).start()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_13_2_context_reconnects_and_keeps_its_publishers_and_subscribers(aeron_dir: str) -> None:
    """#13.2: kill -9 and SIGTERM of the media driver, each followed by a new one in the same
    directory: maintain() notices within its check period, reconnects, and the existing
    Publisher/Subscriber objects work again."""
    md = _start(aeron_dir)
    got: list[bytes] = []
    try:
        with AeronContext(TransportConfig(aeron_dir=aeron_dir)) as ctx:
            pub = ctx.add_publication("aeron:ipc", 77)
            sub = ctx.add_subscription("aeron:ipc", 77, lambda b, h: got.append(bytes(b)))
            for n, sig in enumerate((signal.SIGKILL, signal.SIGTERM), start=1):
                before = read_cnc_identity(aeron_dir)
                assert before is not None and md.pid == before.pid
                assert md.pid is not None
                os.kill(md.pid, sig)
                md.stop()  # reaps it (after a kill -9 it also removes the dead one's files)
                md = _start(aeron_dir)
                deadline = time.monotonic() + 30
                while not ctx.maintain():
                    assert time.monotonic() < deadline, f"no reconnect: {ctx.lost_reason}"
                    time.sleep(0.01)
                assert ctx.generation == n and not ctx.media_driver_lost
                got.clear()
                msg = f"after {sig.name}".encode()
                while not got:
                    pub.offer(msg)
                    sub.poll()
                    assert time.monotonic() < deadline, pub.counters
                    time.sleep(0.01)
                assert got[0] == msg
    finally:
        md.stop()
