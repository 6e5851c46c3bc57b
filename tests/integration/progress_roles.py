"""A producer process driven line by line from stdin, for the FrameProgress tests (#29.2).

Commands (one per line), each answered with one JSON line on stdout once done:

* ``claim`` -> ``{"event": "claimed", "seq", "header_index"}``: claims a ``ROWS x COLS`` uint8
  frame (progress STARTED goes out if a consumer opted in);
* ``step K`` -> ``{"event": "stepped", "k", "bytes", "sent"}``: fills row block ``K`` of
  ``STEPS`` (every byte of row ``r`` is ``(seq + r) % 251``) and calls ``progress()``;
* ``commit`` -> ``{"event": "committed", "seq"}``;
* ``bclaim N`` -> ``{"event": "bclaimed", "first", "n"}``: a batch claim of N such frames;
* ``bstep K`` -> ``{"event": "bstepped", "k", "bytes", "sent"}``: fills frame ``K`` of the
  batch and reports ``(K + 1) * frame_bytes`` over the batch;
* ``bcommit`` -> ``{"event": "bcommitted", "first"}``;
* ``offer N`` -> ``{"event": "offered", "last"}``: N whole frames through ``offer`` (to make the
  ring reuse slots);
* ``stats`` -> ``{"event": "stats", "interested", "interval_ns", "bytes_delta",
  "progress_not_sent", "consumer_progress", "streams"}``: the throttle's state (consumers that
  asked, the policy in force) and, with ``--per-consumer-ids``, the consumers' own streams
  (``{consumer_id: [descriptor id, control id]}``).

``--per-consumer-ids``/``--control-ids`` (``START-END``): offer per-consumer descriptor and
control streams from these ranges (#29.1, Wire §10.1.3). ``--driver``: attach through the SHM
driver (its ``--control-channel``/``--control-stream-id``) instead of creating the regions.

Between commands the producer runs its duty cycle (announces, hellos, held-back progress).
"""

from __future__ import annotations

import argparse
import json
import select
import sys

import numpy as np

from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.progress_core import ProgressSettings
from tensorpool.client.settings import ClientSettings, Endpoints
from tensorpool.config_util import IdRange
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def row_pattern(seq: int, rows: int, cols: int) -> np.ndarray:
    """The frame the tests expect: row ``r`` is all ``(seq + r) % 251``."""
    return (
        ((seq + np.arange(rows, dtype=np.int64)) % 251)
        .astype(np.uint8)[:, None]
        .repeat(cols, axis=1)
    )


def id_range(text: str) -> IdRange:
    start, end = text.split("-")
    return IdRange(int(start), int(end))


def own_streams(producer: Producer) -> dict[str, list[int]]:
    table = producer._core.per_consumer
    if table is None:
        return {}
    return {str(cid): [s.stream_id, s.control[1]] for cid, s in table.streams.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--aeron-dir", required=True)
    p.add_argument("--shm-base-dir", required=True)
    p.add_argument("--stream-id", type=int, required=True)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--nslots", type=int, default=8)
    p.add_argument("--progress", choices=("off", "requested", "always"), default="requested")
    p.add_argument("--control-channel", default=Endpoints().control_channel)
    p.add_argument("--control-stream-id", type=int, default=Endpoints().control_stream_id)
    p.add_argument("--driver", action="store_true")
    p.add_argument("--per-consumer-ids", type=id_range, default=None)
    p.add_argument("--control-ids", type=id_range, default=None)
    a = p.parse_args()
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=a.aeron_dir),
        shm_base_dir=a.shm_base_dir,
        announce_period_ns=100_000_000,
        channels=Endpoints(
            control_channel=a.control_channel, control_stream_id=a.control_stream_id
        ),
    )
    progress = None
    if a.progress != "off":  # every step reported: no interval, no delta
        progress = ProgressSettings(
            interval_us=0, bytes_delta=1, only_when_requested=a.progress == "requested"
        )
    frame_bytes = a.rows * a.cols
    stream = StreamConfig(
        a.stream_id, header_nslots=a.nslots, pools=(PoolConfig(1, max(frame_bytes, 4096)),)
    )
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(
            ctx,
            a.stream_id if a.driver else stream,
            settings,
            driver=a.driver,
            attach_timeout_s=60.0,
            progress=progress,
            per_consumer=a.per_consumer_ids is not None,
            per_consumer_ids=a.per_consumer_ids,
            per_consumer_control_ids=a.control_ids,
        )
        if a.driver:
            producer.wait_until_attached()
        emit(event="ready")
        claim = None
        batch = None
        rows_per_step = a.rows // a.steps
        try:
            while True:
                producer.do_work()
                ready, _, _ = select.select([sys.stdin], [], [], 0.002)
                if not ready:
                    continue
                line = sys.stdin.readline()
                if not line or line.strip() == "quit":
                    break
                cmd, *arg = line.split()
                if cmd == "claim":
                    claim = producer.claim((a.rows, a.cols), np.uint8)
                    assert claim is not None
                    emit(event="claimed", seq=claim.seq, header_index=claim.header_index)
                elif cmd == "step":
                    assert claim is not None
                    k = int(arg[0])
                    lo, hi = k * rows_per_step, (k + 1) * rows_per_step
                    claim.array[lo:hi] = row_pattern(claim.seq, a.rows, a.cols)[lo:hi]
                    sent = producer.progress(claim, hi * a.cols)
                    emit(event="stepped", k=k, bytes=hi * a.cols, sent=sent)
                elif cmd == "commit":
                    assert claim is not None
                    seq = producer.commit(claim)
                    claim = None
                    emit(event="committed", seq=seq)
                elif cmd == "bclaim":
                    batch = producer.claim_batch(int(arg[0]), (a.rows, a.cols), np.uint8)
                    assert batch is not None
                    emit(event="bclaimed", first=batch.first_seq, n=batch.n)
                elif cmd == "bstep":
                    assert batch is not None
                    k = int(arg[0])
                    batch.array[k] = row_pattern(batch.first_seq + k, a.rows, a.cols)
                    sent = producer.progress(batch, (k + 1) * frame_bytes)
                    emit(event="bstepped", k=k, bytes=(k + 1) * frame_bytes, sent=sent)
                elif cmd == "bcommit":
                    assert batch is not None
                    first = producer.commit_batch(batch)
                    batch = None
                    emit(event="bcommitted", first=first)
                elif cmd == "offer":
                    last = None
                    for _ in range(int(arg[0])):
                        seq = producer.next_seq
                        last = producer.offer(row_pattern(seq, a.rows, a.cols))
                    emit(event="offered", last=last)
                elif cmd == "stats":
                    throttle = producer.progress_throttle
                    emit(
                        event="stats",
                        interested=0 if throttle is None else throttle.interested,
                        interval_ns=None if throttle is None else throttle.interval_ns,
                        bytes_delta=None if throttle is None else throttle.bytes_delta,
                        progress_not_sent=producer.stats.progress_not_sent,
                        consumer_progress=producer.stats.consumer_progress,
                        streams=own_streams(producer),
                    )
        finally:
            producer.close()


if __name__ == "__main__":
    main()
