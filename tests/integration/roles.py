"""Producer and consumer roles run as real subprocesses by the integration tests.

Protocol with the test: roles print JSON lines on stdout; a consumer prints
{"event": "mapped", ...} once mapped; a producer waits for a "go" line on stdin
(when started with --wait-go) before producing. Payloads carry a checksum pattern:
every byte is `seq % 251`, and the first and last 8 bytes hold `seq` — any mix of
two frames is detectable.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import numpy as np

from tensorpool.client.consumer import MODE_STREAM, Consumer, Frame
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


def check(u8: np.ndarray, seq: int) -> bool:
    head = int.from_bytes(u8[:8].tobytes(), "little")
    tail = int.from_bytes(u8[-8:].tobytes(), "little")
    if head != seq or tail != seq:
        return False
    mid = u8[8:-8]
    return bool(mid.size == 0 or (mid.min() == mid.max() == seq % 251))


def settings(a: argparse.Namespace) -> ClientSettings:
    channels = Endpoints(control_stream_id=a.control_stream_id) if a.control_stream_id else None
    return ClientSettings(
        transport=TransportConfig(aeron_dir=a.aeron_dir),
        shm_base_dir=a.shm_base_dir,
        announce_period_ns=int(a.announce_period * 1e9),
        **({"channels": channels} if channels else {}),
    )


def run_producer(a: argparse.Namespace) -> None:
    s = settings(a)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    frame_bytes = int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
    stride = StreamConfig.for_frame_bytes(a.stream_id, frame_bytes).pools[0].stride_bytes
    stream = StreamConfig(a.stream_id, header_nslots=a.nslots, pools=(PoolConfig(1, stride),))
    with AeronContext(s.transport) as ctx:
        ctx.start()
        if a.driver:
            p = Producer(ctx, a.stream_id, s, driver=True)
            p.wait_until_attached()  # #14.1: construction does not block
        else:
            p = Producer(ctx, stream, s, instance_id=a.instance_id)
        p.do_work()
        emit(event="ready", epoch=p.epoch)
        if a.wait_go:
            while not stop:
                p.do_work()
                import select

                r, _, _ = select.select([sys.stdin], [], [], 0.01)
                if r and sys.stdin.readline().strip() == "go":
                    break
        period = 1.0 / a.rate if a.rate else 0.0
        start = time.monotonic()
        sent = 0
        shape = tuple(a.shape)
        while not stop and (a.count == 0 or sent < a.count):
            if period:
                due = start + sent * period
                now = time.monotonic()
                if now < due:
                    p.do_work()
                    time.sleep(min(due - now, 0.001))
                    continue
            claim = p.claim(shape, a.dtype)
            if claim is None:  # driver mode without a lease: wait for the reattach
                p.do_work()
                time.sleep(0.005)
                continue
            fill_checked(claim.array, claim.seq)
            p.commit(claim)
            sent += 1
            if sent % 256 == 0:
                p.do_work()
            if a.duration and time.monotonic() - start > a.duration:
                break
        emit(
            event="done",
            epoch=p.epoch,
            sent=sent,
            stats={
                "frames": p.stats.frames,
                "descriptors_not_sent": p.stats.descriptors_not_sent,
                "drops": p.stats.drops.snapshot(),
            },
            elapsed=time.monotonic() - start,
        )
        end = time.monotonic() + a.linger
        while not stop and time.monotonic() < end:
            p.do_work()
            time.sleep(0.01)
        p.close()


def run_consumer(a: argparse.Namespace) -> None:
    s = settings(a)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    seen: list[tuple[int, int]] = []
    bad: list[int] = []
    timestamps: list[int] = []
    accepted = 0

    def handler(frame: Frame) -> None:
        nonlocal accepted
        arr = frame.array
        ok = check(arr.reshape(-1).view(np.uint8), frame.seq)
        shape_ok = tuple(frame.shape) == tuple(a.shape) and arr.dtype == np.dtype(a.dtype)
        if a.slow_ms:
            time.sleep(a.slow_ms / 1000)
        if frame.is_current():  # the zero-copy contract: confirm after using the view
            accepted += 1
            if not (ok and shape_ok):
                bad.append(frame.seq)
            if a.record:
                seen.append((frame.epoch, frame.seq))
                timestamps.append(frame.timestamp_ns)

    with AeronContext(s.transport) as ctx:
        ctx.start()
        c = Consumer(ctx, a.stream_id, s, mode=MODE_STREAM, max_outstanding_seq_gap=a.max_gap)
        mapped_epochs: list[int] = []
        start = time.monotonic()
        last_frame = time.monotonic()
        while not stop:
            got = c.poll(handler, 64)
            if c.epoch is not None and (not mapped_epochs or mapped_epochs[-1] != c.epoch):
                mapped_epochs.append(c.epoch)
                emit(event="mapped", epoch=c.epoch)
            now = time.monotonic()
            if got:
                last_frame = now
            elif a.idle_exit and accepted and now - last_frame > a.idle_exit:
                break
            if a.count and accepted >= a.count:
                break
            if a.duration and now - start > a.duration:
                break
            if not got:
                time.sleep(0.0002)
        emit(
            event="done",
            accepted=accepted,
            bad=bad[:20],
            n_bad=len(bad),
            seen=seen,
            timestamps=timestamps,
            mapped_epochs=mapped_epochs,
            drops_gap=c.drops_gap,
            drops_late=c.drops_late,
            drops=c.stats.drops.snapshot(),
            control=c.stats.control.snapshot(),
        )
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("producer", "consumer"))
    ap.add_argument("--aeron-dir", required=True)
    ap.add_argument("--shm-base-dir", required=True)
    ap.add_argument("--stream-id", type=int, default=1)
    ap.add_argument("--shape", type=int, nargs="+", default=[1024])
    ap.add_argument("--dtype", default="uint32")
    ap.add_argument("--nslots", type=int, default=64)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--duration", type=float, default=0.0)
    ap.add_argument("--linger", type=float, default=0.5)
    ap.add_argument("--wait-go", action="store_true")
    ap.add_argument("--instance-id", default=None)
    ap.add_argument("--announce-period", type=float, default=0.2)
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--idle-exit", type=float, default=0.0)
    ap.add_argument("--max-gap", type=int, default=256)
    ap.add_argument("--driver", action="store_true", help="attach through the SHM driver")
    ap.add_argument("--control-stream-id", type=int, default=0)
    a = ap.parse_args()
    (run_producer if a.role == "producer" else run_consumer)(a)


if __name__ == "__main__":
    main()
