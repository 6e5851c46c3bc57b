"""`tensorpool consume`: read a stream and report rates, drops and latency each second."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import TYPE_CHECKING

from tensorpool.commands._common import (
    add_channel_args,
    add_metrics_argument,
    add_shm_args,
    add_transport_args,
    bind_metrics,
    client_settings,
    run_agent,
    start_context,
)
from tensorpool.transport.process import StopSignals

if TYPE_CHECKING:
    import numpy as np

    from tensorpool.client.consumer import Consumer, FrameBatch
    from tensorpool.gpu.delivery import DeviceBatch
    from tensorpool.transport.idle import IdleStrategy
    from tensorpool.transport.wakeup import SemaphoreIdleStrategy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream-id", type=int, default=1, help="tensorpool stream id (%(default)s)")
    p.add_argument("--mode", choices=("stream", "rate-limited"), default="stream")
    p.add_argument("--max-rate-hz", type=int, default=0, help="with --mode rate-limited")
    p.add_argument(
        "--progress",
        action="store_true",
        help="opt in to FrameProgress (Wire §10.2.2): supportsProgress in the hello; with "
        "--mode rate-limited a producer offering per-consumer streams sends it on this "
        "consumer's own control stream (§10.1.3)",
    )
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    p.add_argument("--count", type=int, default=0, help="stop after N frames")
    p.add_argument("--max-outstanding-seq-gap", type=int, default=256)
    p.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="N",
        help="read up to N frames per poll_batch (the batch fast path; 0 = per-frame poll)",
    )
    p.add_argument(
        "--device",
        default=None,
        metavar="cuda:N",
        help="copy each batch into this GPU's memory (pinned pools, checked after the copy; "
        "needs tensorpool[gpu]); implies --batch 64 unless given",
    )
    p.add_argument(
        "--on-register-failure",
        choices=("error", "staging"),
        default="error",
        help="with --device: when a pool cannot be pinned, fail or copy through a pinned "
        "staging buffer (%(default)s)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--report-interval", type=float, default=1.0, help="seconds between report lines"
    )
    p.add_argument(
        "--idle",
        choices=("backoff", "busy-spin", "yield", "sleep", "semaphore"),
        default="backoff",
        help="idle strategy between empty polls; semaphore: block until the producer posts "
        "(needs a producer of this version; at most --idle-max-wait-ms otherwise)",
    )
    p.add_argument(
        "--idle-max-wait-ms",
        type=float,
        default=10.0,
        help="with --idle semaphore: longest block per empty poll (%(default)s ms); "
        "the consumer's duties run at least this often",
    )
    add_transport_args(p)
    add_shm_args(p)
    add_channel_args(p)
    add_metrics_argument(p)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from tensorpool.cli import UserError
    from tensorpool.client.consumer import MODE_RATE_LIMITED, MODE_STREAM, Consumer, Frame
    from tensorpool.client.progress_core import ProgressRequest
    from tensorpool.transport.clock import now_ns
    from tensorpool.transport.idle import idle_strategy

    max_wait_ns = int(args.idle_max_wait_ms * 1e6) if args.idle_max_wait_ms < 1e9 else 0
    if max_wait_ns <= 0:  # also NaN (False < 1e9) and inf
        raise UserError(f"--idle-max-wait-ms must be > 0 and finite, got {args.idle_max_wait_ms}")
    if args.batch < 0:
        raise UserError(f"--batch must be >= 0, got {args.batch}")
    if args.device is not None:  # before any transport starts: a bad option or no CuPy fails fast
        from tensorpool.gpu.cuda import Cuda, GpuUnavailable, parse_device
        from tensorpool.gpu.delivery import GpuRegistrationError

        try:
            Cuda(parse_device(args.device))  # CuPy importable, the device visible
        except (ValueError, GpuUnavailable) as exc:
            raise UserError(f"--device: {exc}") from None
    settings = client_settings(args)
    mode = MODE_RATE_LIMITED if args.mode == "rate-limited" else MODE_STREAM
    stop = StopSignals((signal.SIGTERM,)).install()
    metrics = bind_metrics(args.metrics_bind)  # #26.6: before anything is created
    ctx = start_context(settings)
    try:
        consumer = Consumer(
            ctx,
            args.stream_id,
            settings,
            mode=mode,
            max_rate_hz=args.max_rate_hz,
            max_outstanding_seq_gap=args.max_outstanding_seq_gap,
            driver=args.driver,
            progress=ProgressRequest() if args.progress else None,
        )
    except ValueError as exc:
        ctx.close()
        raise UserError(str(exc)) from None
    if args.device is not None:
        from tensorpool.gpu.cuda import GpuUnavailable

        try:
            consumer.to_device(args.device, on_register_failure=args.on_register_failure)
        except (ValueError, GpuUnavailable) as exc:
            consumer.close()
            ctx.close()
            raise UserError(f"--device: {exc}") from None
    if args.idle == "semaphore":  # owned by the consumer: consumer.close() unlinks it
        idle: IdleStrategy | SemaphoreIdleStrategy = consumer.wake_idle_strategy(max_wait_ns)
    else:
        idle = idle_strategy(args.idle.replace("-", "_"))
    lat = np.zeros(1 << 16, np.int64)
    n_lat = 0
    touched = 0

    def handler(frame: Frame) -> None:
        nonlocal n_lat, touched
        arr = frame.array
        if arr.size and arr.flags.c_contiguous:  # touch one byte per 4 KiB page, like a reader
            touched += int(arr.reshape(-1).view(np.uint8)[::4096].sum())
        if frame.is_current():
            lat[n_lat & 0xFFFF] = now_ns() - frame.timestamp_ns
            n_lat += 1

    def record_ages(batch: FrameBatch | DeviceBatch) -> None:
        """Latency samples of a batch's accepted rows, into the ring ``lat``."""
        nonlocal n_lat
        ages = now_ns() - batch.timestamps_ns[batch.valid].astype(np.int64)
        k = n_lat & 0xFFFF
        m = min(len(ages), lat.size - k)
        lat[k : k + m] = ages[:m]
        n_lat += m

    def poll_batch() -> int:
        nonlocal touched
        batch = consumer.poll_batch(args.batch)
        if not len(batch):
            return 0
        arrays = [batch.array] if batch.array is not None else batch.arrays
        for arr in arrays:  # touch one byte per 4 KiB page of every frame, like a reader
            if arr is not None and arr.size:
                rows = arr.reshape(len(arr), -1) if arr is batch.array else arr.reshape(1, -1)
                touched += int(rows.view(np.uint8)[:, ::4096].sum())
        got = batch.confirm()
        if got:
            record_ages(batch)
        return got

    def poll_frames() -> int:
        return consumer.poll(handler, 64)

    def poll_device() -> int:
        try:
            batch = consumer.poll_batch(args.batch or 64, device=args.device)
        except GpuRegistrationError as exc:
            raise UserError(str(exc)) from None
        got = batch.count if len(batch) else 0  # final: checked after the copy to the device
        if got:
            record_ages(batch)
        return got

    step = poll_batch if args.batch > 0 else poll_frames
    if args.device is not None:
        step = poll_device
    interval = args.report_interval if args.report_interval > 0 else 1.0
    last = (0, 0, 0, 0)

    def report(final: bool) -> None:
        nonlocal last, n_lat
        last = _report(
            consumer, lat, min(n_lat, lat.size), last, args.json, final=final,
            interval=1.0 if final else interval, idle=idle, device=args.device,
            connected=not ctx.media_driver_lost,
        )  # fmt: skip
        if not final:
            n_lat = 0

    def work() -> int:
        got = step()
        if args.count and consumer.stats.frames >= args.count:
            raise AgentTermination
        return got

    from tensorpool.observe.metrics import ConsumerCollector
    from tensorpool.transport.agent import AgentTermination, WorkAgent

    try:
        run_agent(
            WorkAgent("consume", work),
            ctx=ctx,
            idle=idle,
            stop=stop,
            report=report,
            report_interval_s=interval,
            duration_s=args.duration,
            metrics=metrics,  # #19.1: read at scrape time, nothing per frame
            collectors=[ConsumerCollector(consumer)],
        )
    except KeyboardInterrupt:
        pass
    finally:  # a closed stdout (`| head`) must not skip closing the consumer
        consumer.close()
        ctx.close()
    return 0


def _report(
    consumer: Consumer,
    lat: np.ndarray,
    n: int,
    last: tuple[int, int, int, int],
    as_json: bool,
    final: bool = False,
    interval: float = 1.0,
    idle: object = None,
    device: str | None = None,
    connected: bool = True,
) -> tuple[int, int, int, int]:
    import numpy as np

    st = consumer.stats
    cs = consumer.control_stream
    frames, nbytes, gap, late = st.frames, st.bytes, consumer.drops_gap, consumer.drops_late
    p50 = p99 = None
    if n:
        p50, p99 = (float(x) / 1e3 for x in np.percentile(lat[:n], [50, 99]))
    line = {
        "stream_id": consumer.stream_id,
        "epoch": consumer.epoch,
        "fps": round((frames - last[0]) / interval, 1),
        "mb_s": round((nbytes - last[1]) / 1e6 / interval, 2),
        "frames": frames,
        "drops_gap": gap,
        "drops_late": late,
        "drops": st.drops.snapshot(),
        "control_drops": st.control.snapshot(),
        "latency_us_p50": None if p50 is None else round(p50, 1),
        "latency_us_p99": None if p99 is None else round(p99, 1),
        # --idle semaphore: empty polls that ended by the producer's post, not the timeout
        "idle_wakeups": getattr(idle, "wakeups", None),
        # #26.3: a lost media driver, or (driver mode) no lease from the SHM driver
        "media_driver_connected": connected,
        "mapped": consumer.is_mapped,
        # the shared descriptor stream, or the consumer's own (Wire Spec §10.1.3)
        "descriptor_stream": "{}#{}".format(*consumer.descriptor_stream),
        "descriptors": st.descriptors,
        # --progress: the consumer's own control stream (None: the shared one), and the
        # FrameProgress messages that came on it
        "control_stream": None if cs is None else "{}#{}".format(*cs),
        "progress_own": st.progress_own,
        "final": final,
        # per mapping: seq range taken, delivered, drops (the soak's ledger, #30.3)
        "segments": consumer.core.segment_records() if as_json else None,
    }
    if device is not None:  # --device: the rates are into GPU memory, rows checked after the copy
        line["device"] = device
    if as_json:
        print(json.dumps(line), flush=True)
    else:
        lat_txt = "-" if p50 is None else f"p50 {p50:.0f} us p99 {p99:.0f} us"
        drops = ", ".join(f"{k}={v}" for k, v in line["drops"].items()) or "none"
        print(
            f"{'total' if final else 'stream'} {line['stream_id']} epoch {line['epoch']}: "
            f"{line['fps']} frames/s {line['mb_s']} MB/s"
            f"{' into ' + device if device else ''} latency {lat_txt} "
            f"gap {gap} late {late} drops {drops}",
            file=sys.stdout,
            flush=True,
        )
    return frames, nbytes, gap, late
