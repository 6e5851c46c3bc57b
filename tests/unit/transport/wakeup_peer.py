"""Child process for the wakeup tests: a consumer that idles on its own wake semaphore.

Usage: python wakeup_peer.py AERON_DIR CHANNEL STREAM NAMESPACE MAX_WAIT_NS
Subscribes, creates its ``SemaphoreIdleStrategy``, prints ``ready <semaphore name>``, then
polls and idles until one message arrives and prints ``got <message> <wakeups>``
(``wakeups``: idle cycles ended by a post, not by the timeout), closes (unlinking the
semaphore) and exits 0; exits 3 when the publication never connects or nothing arrives.
"""

from __future__ import annotations

import sys
import time

import pyaeron

from tensorpool.transport import AeronContext, TransportConfig
from tensorpool.transport.wakeup import SemaphoreIdleStrategy


def main() -> int:
    aeron_dir, channel, stream, namespace, max_wait_ns = sys.argv[1:6]
    got: list[bytes] = []

    def on_message(buffer: pyaeron.BufferView, header: pyaeron.Header) -> None:
        got.append(bytes(buffer))

    with (
        AeronContext(TransportConfig(aeron_dir=aeron_dir, client_name="wakeup-peer")) as ctx,
        SemaphoreIdleStrategy(namespace, int(stream), int(max_wait_ns)) as idle,
    ):
        sub = ctx.add_subscription(channel, int(stream), on_message)
        deadline = time.monotonic() + 20.0
        while not sub.is_connected:  # the test's publication exists before we start
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.001)
        work = sub.poll()  # empty: the test offers only after reading "ready"
        print("ready", idle.sem_name, flush=True)
        # every idle cycle blocks until a post or max_wait_ns: no spinning here
        for _ in range(100):  # 100 x max_wait_ns bounds the run if nothing ever arrives
            idle.idle(work)
            work = sub.poll()
            if got:
                print("got", got[0].decode(), idle.wakeups, flush=True)
                return 0
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
