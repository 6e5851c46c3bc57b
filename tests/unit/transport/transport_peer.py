"""Child process for the multi-process tests: echo messages from one stream to another.

Usage: python transport_peer.py AERON_DIR CHANNEL IN_STREAM OUT_STREAM COUNT
Joins the media driver in AERON_DIR, echoes COUNT messages (prefixed with b"echo:"), exits 0.
Exits 3 if nothing arrives for 20 s, so a broken test cannot hang forever.
"""

from __future__ import annotations

import sys
import time

import pyaeron

from tensorpool.transport import AeronContext, TransportConfig


def main() -> int:
    aeron_dir, channel, in_stream, out_stream, count = sys.argv[1:6]
    todo = int(count)
    with AeronContext(TransportConfig(aeron_dir=aeron_dir, client_name="peer")) as ctx:
        out = ctx.add_publication(channel, int(out_stream))
        pending: list[bytes] = []

        def on_message(buffer: pyaeron.BufferView, header: pyaeron.Header) -> None:
            pending.append(b"echo:" + bytes(buffer))

        sub = ctx.add_subscription(channel, int(in_stream), on_message)
        deadline = time.monotonic() + 20.0
        while todo:
            if sub.poll():
                deadline = time.monotonic() + 20.0
            while pending and out.offer(pending[0]):
                pending.pop(0)
                todo -= 1
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.0002)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
