"""A scriptable producer for the Spark tests (a real process, real Aeron, real SHM).

Commands on stdin, one per line; events on stdout as JSON lines:

* ``produce N`` -- publish N frames now (``{"event": "produced", "next_seq": S}`` when done);
* ``rate N HZ [SHIFT_MS]`` -- publish N frames at HZ per second, then report ``produced``
  (with SHIFT_MS: stamped now + SHIFT_MS, a clock that stepped);
* ``stamp N HZ T0`` -- publish N frames now, frame ``seq`` stamped ``T0 + seq/HZ`` (simulated
  time: a pulse train at HZ without waiting for it), then report ``produced``;
* ``sparse N STEP [HZ]`` -- publish N frames whose seqs advance by STEP (a relay's output),
  at once or at HZ per second, then report ``produced``;
* ``exit``      -- close (regions removed) and exit.

Frames carry the checksum pattern of ``tests/integration/roles.py``: every byte is
``seq % 251`` and the first and last 8 bytes hold ``seq``. Between commands the producer keeps
announcing, so readers stay mapped.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import sys
import time

import numpy as np

from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def fill_checked(view: np.ndarray, seq: int) -> None:
    u8 = view.reshape(-1).view(np.uint8)
    u8.fill(seq % 251)
    u8[:8] = np.frombuffer(seq.to_bytes(8, "little"), np.uint8)
    u8[-8:] = u8[:8]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aeron-dir", required=True)
    ap.add_argument("--shm-base-dir", required=True)
    ap.add_argument("--stream-id", type=int, default=1)
    ap.add_argument("--shape", type=int, nargs="+", default=[256])
    ap.add_argument("--dtype", default="uint32")
    ap.add_argument("--nslots", type=int, default=64)
    ap.add_argument("--instance-id", default=None)
    ap.add_argument("--announce-period", type=float, default=0.2)
    ap.add_argument("--timestamp-base", type=int, default=-1)
    ap.add_argument("--driver", action="store_true", help="attach through the SHM driver")
    ap.add_argument("--control-stream-id", type=int, default=1000)
    ap.add_argument("--name", default="", help="DataSourceAnnounce name")
    ap.add_argument("--meta", action="append", default=[], help="KEY=VALUE attribute (#16.4)")
    a = ap.parse_args()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    s = ClientSettings(
        transport=TransportConfig(aeron_dir=a.aeron_dir),
        shm_base_dir=a.shm_base_dir,
        announce_period_ns=int(a.announce_period * 1e9),
        channels=Endpoints(control_stream_id=a.control_stream_id),
    )
    shape = tuple(a.shape)
    frame_bytes = int(np.prod(shape)) * np.dtype(a.dtype).itemsize
    stride = StreamConfig.for_frame_bytes(a.stream_id, frame_bytes).pools[0].stride_bytes
    stream = StreamConfig(
        a.stream_id, header_nslots=a.nslots, pools=(PoolConfig(1, stride),), name=a.name
    )
    with AeronContext(s.transport) as ctx:
        ctx.start()
        if a.driver:  # the driver's profile decides the ring; we only name the stream
            p = Producer(ctx, a.stream_id, s, driver=True)
            p.wait_until_attached()  # #14.1: construction does not block
        else:
            p = Producer(ctx, stream, s, instance_id=a.instance_id)
        if a.meta:
            p.set_metadata(dict(kv.split("=", 1) for kv in a.meta))
        p.do_work()
        emit(event="ready", epoch=p.epoch, header=p.header_region_path)

        def one(hz: float = 0.0, t0: int = 0, shift: int | None = None) -> None:
            claim = p.claim(shape, a.dtype)
            assert claim is not None
            fill_checked(claim.array, claim.seq)
            ts = None if a.timestamp_base < 0 else a.timestamp_base + claim.seq
            if hz:
                ts = t0 + round(claim.seq * 1e9 / hz)
            if shift is not None:  # a clock that steps by ``shift`` ns (#31.2)
                ts = time.monotonic_ns() + shift
            p.commit(claim, timestamp_ns=ts)

        while not stop:
            p.do_work()
            r, _, _ = select.select([sys.stdin], [], [], 0.005)
            if not r:
                continue
            line = sys.stdin.readline()
            if not line:
                break
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "exit":
                break
            if cmd[0] == "produce":
                for i in range(int(cmd[1])):
                    one()
                    if i % 256 == 255:
                        p.do_work()
            elif cmd[0] == "stamp":
                for i in range(int(cmd[1])):
                    one(float(cmd[2]), int(cmd[3]))
                    if i % 256 == 255:
                        p.do_work()
            elif cmd[0] == "sparse":
                # a relay keeping its source's numbering: seqs advance by STEP
                # (Producer.claim(seq=...)); the first one is the next seq
                n, step = int(cmd[1]), int(cmd[2])
                hz = float(cmd[3]) if len(cmd) > 3 else 0.0
                t0 = time.monotonic()
                seq = p.next_seq
                for i in range(n):
                    while hz and not stop and time.monotonic() < t0 + i / hz:
                        p.do_work()
                        time.sleep(0.0005)
                    claim = p.claim(shape, a.dtype, seq=seq)
                    assert claim is not None
                    fill_checked(claim.array, seq)
                    p.commit(claim)
                    seq += step
                    if i % 256 == 255:
                        p.do_work()
            elif cmd[0] == "rate":
                n, hz = int(cmd[1]), float(cmd[2])
                shift = int(float(cmd[3]) * 1e6) if len(cmd) > 3 else None
                t0 = time.monotonic()
                for i in range(n):
                    due = t0 + i / hz
                    while not stop and time.monotonic() < due:
                        p.do_work()
                        time.sleep(min(0.001, max(0.0, due - time.monotonic())))
                    one(shift=shift)
            emit(event="produced", next_seq=p.next_seq, epoch=p.epoch)
        p.close()
        emit(event="closed", epoch=p.epoch)


if __name__ == "__main__":
    main()
