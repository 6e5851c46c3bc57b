"""Time to the first row of a large frame, with and without FrameProgress (issue #29 point 2).

Run: ``.venv/bin/python -m bench.bench_frame_progress`` (about 1 min on 2 cores; ``--frames``,
``--mib``, ``--steps``, ``--step-ms`` to change the scenario). Prints one markdown table.
Results and analysis: docs/benchmarks/frame_progress.md.

Setup: one standalone Aeron media driver process shared by a producer process (``multiprocessing``
spawn) and the consumer in this process, real SHM files. Per frame the producer claims a
``--mib`` MiB uint8 frame (rows of 16 KiB), writes it in ``--steps`` equal row blocks
(``numpy`` copy of a prepared block; ``--step-ms`` > 0 paces the steps as a detector's readout
would: each step starts no earlier than ``step-ms`` after the previous one) and calls
``progress(claim, bytes_written)`` after each block, then commits. Frames are 200 ms apart so
one never overlaps the next.

Measured per frame: **first row** = the consumer's ``time.monotonic_ns()`` when it holds a
validated copy of row 0, minus the producer's ``time.monotonic_ns()`` just before the claim
(one CLOCK_MONOTONIC on one host, so the two processes' stamps compare). Without progress the
consumer can only take row 0 from the frame, after the ``FrameDescriptor`` (``frame.array[0]``
copied, then ``is_current``); with progress (default throttle: 250 µs, 64 KiB) it reads row 0
with ``read_prefix(event, max_bytes=row)`` at the first ``PROGRESS``. **Whole frame** = the same
clock at the descriptor (the frame is available only then, in both modes). **Producer write**:
claim to commit in the producer process (wall), and **producer CPU**: the writing thread's CPU
time over the same span without the pacing spin, and the part of it spent inside the 16
``progress()`` calls (the direct cost of publishing progress; the rest of the CPU difference
between the modes is the copy running beside a consumer that reads the same memory).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

ROW_BYTES = 16 * 1024
STREAM_ID = 2950


def _settings(aeron_dir: str, shm_base: str) -> Any:
    from tensorpool.client.settings import ClientSettings
    from tensorpool.transport.config import TransportConfig

    return ClientSettings(
        transport=TransportConfig(aeron_dir=aeron_dir),
        shm_base_dir=shm_base,
        announce_period_ns=100_000_000,
    )


def producer_main(aeron_dir: str, shm_base: str, cfg: dict[str, Any], ready: Any, out: Any) -> None:
    """The producer process: waits for ``ready`` (the consumer is mapped and has said hello),
    then writes ``frames`` frames and sends ``(seq, claim_ns, commit_ns)`` for each."""
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.client.progress_core import ProgressSettings
    from tensorpool.transport.context import AeronContext

    rows = cfg["frame_bytes"] // ROW_BYTES
    steps = cfg["steps"]
    block = rows // steps
    source = np.random.default_rng(1).integers(0, 255, (block, ROW_BYTES), dtype=np.uint8)
    settings = _settings(aeron_dir, shm_base)
    stream = StreamConfig(STREAM_ID, header_nslots=2, pools=(PoolConfig(1, cfg["frame_bytes"]),))
    progress = ProgressSettings() if cfg["progress"] else None
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(ctx, stream, settings, progress=progress, prefault=True)
        try:
            while not ready.is_set():
                producer.do_work()
                time.sleep(0.001)
            step_ns = int(cfg["step_ms"] * 1e6)
            for _ in range(cfg["frames"]):
                for _ in range(20):  # 200 ms between frames, duty cycle running
                    producer.do_work()
                    time.sleep(0.01)
                c0 = time.thread_time_ns()
                t0 = time.monotonic_ns()
                claim = producer.claim((rows, ROW_BYTES), np.uint8)
                assert claim is not None
                spin, in_progress, c_prev = 0, 0, time.thread_time_ns()
                for k in range(steps):
                    if step_ns:
                        while time.monotonic_ns() < t0 + k * step_ns:
                            pass
                    c1 = time.thread_time_ns()  # the pacing spin is not the writer's cost
                    claim.array[k * block : (k + 1) * block] = source
                    p0 = time.thread_time_ns()
                    producer.progress(claim, (k + 1) * block * ROW_BYTES)
                    in_progress += time.thread_time_ns() - p0
                    spin += c1 - c_prev
                    c_prev = time.thread_time_ns()
                seq = producer.commit(claim)
                cpu = time.thread_time_ns() - c0 - spin
                out.put((seq, t0, time.monotonic_ns(), cpu, in_progress))
            for _ in range(50):
                producer.do_work()
                time.sleep(0.01)
        finally:
            producer.close()
    out.put(None)


def run_mode(aeron_dir: str, cfg: dict[str, Any]) -> dict[str, Any]:
    from tensorpool.client.consumer import Consumer, Frame
    from tensorpool.client.progress_core import FrameProgress, ProgressRequest
    from tensorpool.specs.generated.wire import FrameProgressState
    from tensorpool.transport.context import AeronContext

    shm_base = tempfile.mkdtemp(prefix="tp-bench-progress-", dir="/dev/shm")
    spawn = mp.get_context("spawn")
    ready = spawn.Event()
    out = spawn.Queue()
    proc = spawn.Process(target=producer_main, args=(aeron_dir, shm_base, cfg, ready, out))
    proc.start()
    first_row: dict[int, int] = {}
    whole: dict[int, int] = {}
    refused = 0
    settings = _settings(aeron_dir, shm_base)
    try:
        with AeronContext(settings.transport) as ctx:
            ctx.start()
            consumer = Consumer(
                ctx, STREAM_ID, settings, progress=ProgressRequest() if cfg["progress"] else None
            )

            def on_progress(ev: FrameProgress) -> None:
                nonlocal refused
                if ev.frame_id in first_row or ev.bytes_filled < ROW_BYTES:
                    return
                if ev.state is not FrameProgressState.PROGRESS:
                    return
                got = consumer.read_prefix(ev, max_bytes=ROW_BYTES)
                if got is None:
                    refused += 1
                    return
                first_row[ev.frame_id] = time.monotonic_ns()

            def on_frame(frame: Frame) -> None:
                now = time.monotonic_ns()
                whole[frame.seq] = now
                if frame.seq not in first_row:
                    row = frame.array[0].copy()
                    if frame.is_current() and row.size:
                        first_row[frame.seq] = time.monotonic_ns()

            if cfg["progress"]:
                consumer.set_progress_handler(on_progress)
            deadline = time.monotonic() + 60
            while not consumer.is_mapped:
                consumer.poll(on_frame)
                time.sleep(0.001)
                if time.monotonic() > deadline:
                    raise RuntimeError("consumer never mapped")
            settle = time.monotonic() + 0.5  # the hello goes out, the producer takes it
            while time.monotonic() < settle:
                consumer.poll(on_frame)
                time.sleep(0.001)
            ready.set()
            produced: list[tuple[int, int, int, int, int]] = []
            done = False
            deadline = time.monotonic() + 30 + cfg["frames"] * 2
            while time.monotonic() < deadline:
                consumer.poll(on_frame)  # busy poll: the latency, not the idle strategy
                while not out.empty():
                    item = out.get()
                    if item is None:
                        done = True
                    else:
                        produced.append(item)
                if done and len(whole) >= len(produced):
                    break
            consumer.close()
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        shutil.rmtree(shm_base, ignore_errors=True)
    rows_ms, whole_ms, write_ms, cpu_ms, calls_us = [], [], [], [], []
    for seq, t0, t1, cpu, in_progress in produced:
        cpu_ms.append(cpu / 1e6)
        calls_us.append(in_progress / 1e3)
        if seq in first_row:
            rows_ms.append((first_row[seq] - t0) / 1e6)
        if seq in whole:
            whole_ms.append((whole[seq] - t0) / 1e6)
        write_ms.append((t1 - t0) / 1e6)
    return {
        "frames": len(produced),
        "first_row": rows_ms,
        "whole": whole_ms,
        "write": write_ms,
        "cpu": cpu_ms,
        "progress_calls": calls_us,
        "refused": refused,
    }


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument(
        "--step-ms",
        type=float,
        nargs="+",
        default=[0.0, 4.0],
        help="step pacing(s) to run: 0 = as fast as numpy copies",
    )
    p.add_argument("--json", action="store_true", help="also print the raw numbers")
    a = p.parse_args()
    from tensorpool.transport.mediadriver import MediaDriverProcess

    rows = []
    with MediaDriverProcess() as md:
        for step_ms in a.step_ms:
            for progress in (False, True):
                cfg = {
                    "frames": a.frames,
                    "frame_bytes": a.mib << 20,
                    "steps": a.steps,
                    "step_ms": step_ms,
                    "progress": progress,
                }
                r = run_mode(md.dir, cfg)
                rows.append((cfg, r))
                if a.json:
                    print(json.dumps({"cfg": cfg, **r}))
    print(
        f"\n{a.mib} MiB frame (rows of {ROW_BYTES // 1024} KiB) written in {a.steps} steps, "
        f"{a.frames} frames per row; ms from claim; cpus={os.cpu_count()}\n"
    )
    print(
        "| step pacing | progress | frames | first row p50 | first row p90 | whole frame p50 "
        "| producer write p50 | producer CPU p50 | in `progress()` p50 (µs) "
        "| prefix reads refused |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cfg, r in rows:
        pace = "as fast as numpy" if not cfg["step_ms"] else f"{cfg['step_ms']:g} ms/step"
        print(
            f"| {pace} | {'on' if cfg['progress'] else 'off'} | {r['frames']} "
            f"| {_p(r['first_row'], 50):.2f} | {_p(r['first_row'], 90):.2f} "
            f"| {_p(r['whole'], 50):.2f} | {_p(r['write'], 50):.2f} | {_p(r['cpu'], 50):.2f} "
            f"| {_p(r['progress_calls'], 50):.0f} "
            f"| {r['refused']} |"
        )


if __name__ == "__main__":
    main()
