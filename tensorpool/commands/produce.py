"""`tensorpool produce`: publish synthetic frames (a stand-in camera or detector)."""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from typing import TYPE_CHECKING

from tensorpool.cli import UserError
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
from tensorpool.config_util import IdRange, parse_id_range, parse_octal_mode
from tensorpool.transport.agent import AgentTermination
from tensorpool.transport.idle import idle_strategy
from tensorpool.transport.process import StopSignals

if TYPE_CHECKING:
    from tensorpool.client.producer import Producer
    from tensorpool.transport.context import AeronContext

PATTERNS = ("moving", "ramp", "noise", "stamp")
_INT32_MAX = 2**31 - 1


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: use e.g. 480,640") from None
    if not 1 <= len(shape) <= 8 or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: 1..8 positive dimensions")
    if any(d > _INT32_MAX for d in shape):  # TensorHeader dims are int32 on the wire
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: dimensions are at most {_INT32_MAX}")
    return shape


def parse_file_mode(text: str) -> int:
    mode = parse_octal_mode(text)
    if mode is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode such as 600 or 640")
    return mode


def parse_stream_id_range(text: str) -> IdRange:
    rng = parse_id_range(text, lo=1, hi=_INT32_MAX)
    if not isinstance(rng, IdRange):
        raise argparse.ArgumentTypeError(rng or "an empty range: use e.g. 31000-31099")
    return rng


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream-id", type=int, default=1, help="tensorpool stream id (%(default)s)")
    p.add_argument("--shape", type=parse_shape, default=(480, 640), help="e.g. 480,640")
    p.add_argument("--dtype", default="uint16", help="numpy dtype name (%(default)s)")
    p.add_argument("--rate", type=float, default=100.0, help="frames/s, 0 = flat out")
    p.add_argument("--pattern", choices=PATTERNS, default="moving")
    p.add_argument("--count", type=int, default=0, help="stop after N frames (0 = no limit)")
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    p.add_argument("--nslots", type=int, default=64, help="ring depth, a power of two")
    p.add_argument("--name", default="synthetic", help="data source name")
    p.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metadata attribute (repeatable)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        metavar="N",
        help="publish N frames per claim_batch/commit_batch (the batch fast path; 1 = per "
        "frame); with --rate, N frames go out together when the first is due",
    )
    p.add_argument("--producer-id", type=int, default=1)
    p.add_argument("--json", action="store_true", help="progress as JSON lines")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--report-interval", type=float, default=1.0, help="seconds between progress lines"
    )
    p.add_argument(
        "--file-mode",
        type=parse_file_mode,
        default=0o600,
        help="standalone: mode of the region files (default 600; 640 lets the group map "
        "them read-only; group/world write lets others truncate them: SIGBUS for readers)",
    )
    p.add_argument(
        "--takeover",
        action="store_true",
        help="standalone: replace a live producer of the same stream (same SHM base dir "
        "and namespace) instead of refusing to start",
    )
    p.add_argument(
        "--attach-timeout",
        type=float,
        default=30.0,
        help="with --driver: seconds to wait for the lease, including waiting out a crashed "
        "predecessor's lease (default %(default)s)",
    )
    p.add_argument(
        "--per-consumer-streams",
        action="store_true",
        help="offer per-consumer descriptor streams (Wire Spec §10.1.3): a RATE_LIMITED "
        "consumer gets its own stream carrying only the frames its max_rate_hz admits; ids "
        "from --per-consumer-stream-ids, or from the driver's descriptor_stream_id_range "
        "with --driver (default: off, every consumer reads the shared stream)",
    )
    p.add_argument(
        "--per-consumer-stream-ids",
        type=parse_stream_id_range,
        default=None,
        metavar="START-END",
        help="standalone: the descriptor stream ids to hand out (with --per-consumer-streams; "
        "unset: every request is declined)",
    )
    p.add_argument(
        "--per-consumer-control-stream-ids",
        type=parse_stream_id_range,
        default=None,
        metavar="START-END",
        help="standalone: the control stream ids to hand out to consumers that get their own "
        "descriptor stream and ask for FrameProgress (unset: declined, their progress stays on "
        "the shared control stream; with --driver: the driver's control_stream_id_range)",
    )
    add_transport_args(p)
    add_shm_args(p)
    add_channel_args(p)
    add_metrics_argument(p)


class Pattern:
    """Fills a claimed slot in place; cheap enough for 100 Hz VGA on one core."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: object) -> None:
        import numpy as np

        self.name = name
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "uifb":
            raise UserError(f"--dtype {self.dtype}: not a numeric dtype")
        self.top = min(int(np.iinfo(self.dtype).max), 4095) if self.dtype.kind in "ui" else 1.0
        if name == "moving":
            width = shape[-1]
            ramp = (np.arange(width * 2) % width) * (self.top / max(width - 1, 1))
            self.ramp = ramp  # float64: scaled per frame, then cast (one row, not the frame)
            self.width = width
            self.disc: tuple[np.ndarray, int, int] | None = None
            if len(shape) == 2 and min(shape) >= 16:  # #19.4: a shape a person can follow
                r = max(min(shape) // 8, 4)
                yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
                self.disc = (xx * xx + yy * yy <= r * r, shape[0], shape[1])
        self.rng = np.random.default_rng(0)

    def fill(self, view: object, seq: int) -> None:
        import numpy as np

        a: np.ndarray = view  # type: ignore[assignment]
        if self.name == "moving":
            # a scrolling ramp whose brightness pulses (period 400 frames), and a bright disc
            # circling the frame: the viewer shows motion, the mean intensity changes (#19.4)
            shift = (seq * 4) % self.width
            scale = 0.55 + 0.45 * math.sin(seq * (2 * math.pi / 400))
            a[...] = (self.ramp[shift : shift + self.width] * scale).astype(self.dtype)
            if self.disc is not None:
                mask, h, w = self.disc
                d = mask.shape[0]
                angle = seq * (2 * math.pi / 200)
                y0 = int((h - d) / 2 * (1 + 0.8 * math.sin(angle)))
                x0 = int((w - d) / 2 * (1 + 0.8 * math.cos(angle)))
                a[y0 : y0 + d, x0 : x0 + d][mask] = self.top
        elif self.name == "ramp":
            a.fill(seq % (int(self.top) + 1) if self.dtype.kind in "ui" else (seq % 100) / 100)
        elif self.name == "noise":
            if self.dtype.kind == "f":
                a[...] = self.rng.random(a.shape, dtype=self.dtype)
            else:
                a[...] = self.rng.integers(0, int(self.top) + 1, a.shape, dtype=self.dtype)
        else:  # stamp: the seq in the first 8 bytes, nothing else touched
            a.reshape(-1).view(np.uint8)[:8] = np.frombuffer(seq.to_bytes(8, "little"), np.uint8)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from tensorpool.client.producer import (
        MAX_FRAME_BYTES,
        AttachError,
        PoolConfig,
        Producer,
        StreamBusy,
        StreamConfig,
    )
    from tensorpool.shm.errors import WireLimitError

    if args.batch < 1:
        raise UserError(f"--batch must be >= 1, got {args.batch}")
    settings = client_settings(args)
    try:
        dtype = np.dtype(args.dtype)
    except TypeError:
        raise UserError(f"--dtype {args.dtype!r}: not a numpy dtype") from None
    # #13.4: sizes the wire cannot express are refused before anything (a file, a pattern
    # buffer) is allocated; math.prod cannot overflow the way a numpy product would
    nbytes = math.prod(args.shape) * dtype.itemsize
    if nbytes > MAX_FRAME_BYTES:
        shape = ",".join(map(str, args.shape))
        raise UserError(
            f"--shape {shape} --dtype {dtype.name}: a frame of {nbytes} bytes exceeds the "
            f"wire limit of {MAX_FRAME_BYTES} bytes (stride_bytes is a u32 power of two)"
        )
    try:
        auto = StreamConfig.for_frame_bytes(args.stream_id, nbytes)
        stream = StreamConfig(
            args.stream_id,
            header_nslots=args.nslots,
            pools=(PoolConfig(1, auto.pools[0].stride_bytes),),
            name=args.name,
            summary=f"{dtype.name}{list(args.shape)}",
        )
    except WireLimitError as exc:
        raise UserError(f"--nslots {args.nslots}: {exc.detail}") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    pattern = Pattern(args.pattern, args.shape, dtype)
    meta: dict[str, str] = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--meta {item!r}: expected KEY=VALUE")
        meta[key] = value

    if not args.driver:
        from tensorpool.client.per_consumer import check_per_consumer_ids

        try:
            check_per_consumer_ids(
                args.per_consumer_stream_ids,
                settings.channels,
                args.per_consumer_control_stream_ids,
            )
        except ValueError as exc:
            raise UserError(f"--per-consumer-stream-ids: {exc}") from None
    metrics = bind_metrics(args.metrics_bind)  # #26.6: before any file is created
    stop = StopSignals((signal.SIGTERM,)).install()
    try:
        ctx = start_context(settings)
    except BaseException:
        if metrics is not None:
            metrics.close()
        raise
    attach_ns = 0
    try:
        if args.driver:
            t0 = time.monotonic_ns()
            producer = Producer(
                ctx,
                args.stream_id,
                settings,
                driver=True,
                attach_timeout_s=args.attach_timeout,
                per_consumer=args.per_consumer_streams,
            )
            try:
                producer.wait_until_attached()  # #14.1: the constructor does not block
            except AttachError:
                producer.close()
                raise
            attach_ns = time.monotonic_ns() - t0
        else:
            producer = Producer(
                ctx,
                stream,
                settings,
                producer_id=args.producer_id,
                file_mode=args.file_mode,
                takeover=args.takeover,
                per_consumer=args.per_consumer_streams,
                per_consumer_ids=args.per_consumer_stream_ids,
                per_consumer_control_ids=args.per_consumer_control_stream_ids,
            )
    except (AttachError, StreamBusy) as exc:
        ctx.close()
        if metrics is not None:
            metrics.close()
        raise UserError(str(exc)) from None
    except (OSError, ValueError) as exc:
        ctx.close()
        if metrics is not None:
            metrics.close()
        raise UserError(f"cannot create SHM regions: {exc}") from None
    hist = None
    if args.driver:
        from tensorpool.counters import LatencyHistogram

        hist = LatencyHistogram()
        hist.observe_ns(attach_ns)
    from tensorpool.observe.metrics import ProducerCollector

    agent = ProduceAgent(producer, pattern, args, ctx)
    try:
        if meta:
            producer.set_metadata(meta)
        run_agent(
            agent,
            ctx=ctx,
            # a paced producer waits for its next frame in parks of at most 1 ms
            idle=idle_strategy("backoff", max_park_ns=1_000_000),
            stop=stop,
            report=agent.report,
            report_interval_s=args.report_interval if args.report_interval > 0 else 1.0,
            duration_s=args.duration,
            metrics=metrics,  # #19.1: read at scrape time, nothing per frame
            collectors=[ProducerCollector(producer, hist)],
        )
    except KeyboardInterrupt:
        pass
    finally:
        producer.close()
        ctx.close()
    return 0


def _publish_one(p: Producer, pattern: Pattern, shape: tuple[int, ...]) -> int:
    claim = p.claim(shape, pattern.dtype)
    if claim is None:
        if not p.attached:  # lease lost: the driver client reattaches in do_work
            p.do_work()
            return 0
        raise UserError(f"frame of shape {shape} does not fit any pool")
    pattern.fill(claim.array, claim.seq)
    return 1 if p.commit(claim) is not None else 0


def _publish_batch(p: Producer, pattern: Pattern, shape: tuple[int, ...], n: int) -> int | None:
    """Up to ``n`` frames through claim_batch/commit_batch (fewer at the ring's wrap)."""
    claim = p.claim_batch(n, shape, pattern.dtype)
    if claim is None:
        return None
    for k in range(claim.n):
        pattern.fill(claim.array[k], claim.first_seq + k)
    return claim.n if p.commit_batch(claim) is not None else 0


def _ranges(published: dict[int, int]) -> dict[str, list[int]]:
    """epoch -> [first, last] committed seq (epochs start at seq 0, Wire §15.2)."""
    return {str(e): [0, n - 1] for e, n in sorted(published.items()) if n > 0}


class ProduceAgent:
    """Publishes synthetic frames at ``--rate`` (deadline-based: no drift) or flat out."""

    role_name = "produce"

    def __init__(
        self, p: Producer, pattern: Pattern, args: argparse.Namespace, ctx: AeronContext
    ) -> None:
        self.p, self.pattern, self.args, self.ctx = p, pattern, args, ctx
        self.period = 1.0 / args.rate if args.rate > 0 else 0.0
        self.start = time.monotonic()
        self.sent = 0
        self._last = (0, 0)
        # epoch -> next seq: what was committed per epoch (a reattach opens a new epoch at seq
        # 0), in the --json lines for the soak's ledger (#30.3)
        self.published: dict[int, int] = {}

    def on_start(self) -> None:
        self.start = time.monotonic()
        self.p.do_work()

    def on_close(self) -> None:
        pass

    def do_work(self) -> int:
        p, args = self.p, self.args
        if args.count and self.sent >= args.count:
            raise AgentTermination
        if self.period and time.monotonic() < self.start + self.sent * self.period:
            return p.do_work()  # not due yet: the runner idles
        if args.batch > 1:
            n = args.batch if not args.count else min(args.batch, args.count - self.sent)
            got = _publish_batch(p, self.pattern, args.shape, n)
            if got is None:
                if not p.attached:  # lease lost: the driver client reattaches in do_work
                    return p.do_work()
                raise UserError(f"frame of shape {args.shape} does not fit any pool")
            self.sent += got
            self.published[p.epoch] = p.next_seq
            p.do_work()
            return got
        got = _publish_one(p, self.pattern, args.shape)
        self.sent += got
        self.published[p.epoch] = p.next_seq
        if not self.period and self.sent % 64 == 0:
            p.do_work()
        return got

    def report(self, final: bool) -> None:
        p, args = self.p, self.args
        if final and args.json:  # the final account, also with --quiet
            line = {
                "stream_id": p.stream_id,
                "epoch": p.epoch,
                "frames": p.stats.frames,
                "published": _ranges(self.published),
                "final": True,
            }
            print(json.dumps(line), flush=True)
        if args.quiet:
            return
        if final:
            print(
                f"produced {p.stats.frames} frames on stream {p.stream_id} epoch {p.epoch}",
                file=sys.stderr,
                flush=True,
            )
            return
        interval = args.report_interval if args.report_interval > 0 else 1.0
        st = p.stats
        line = {
            "stream_id": p.stream_id,
            "epoch": p.epoch,
            "frames": st.frames,
            "fps": round((st.frames - self._last[0]) / interval, 1),
            "mb_s": round((st.bytes - self._last[1]) / 1e6 / interval, 2),
            "descriptors_not_sent": st.descriptors_not_sent,
            "drops": st.drops.snapshot(),
            "consumers": p.has_consumers,
            # #26.3: a lost media driver, or (driver mode) no lease from the SHM driver
            "media_driver_connected": not self.ctx.media_driver_lost,
            "attached": p.attached,
            "published": _ranges(self.published),
        }
        self._last = (st.frames, st.bytes)
        if args.json:
            print(json.dumps(line), flush=True)
        else:
            print(
                f"stream {line['stream_id']} epoch {line['epoch']}: "
                f"{line['fps']} frames/s {line['mb_s']} MB/s "
                f"total {line['frames']} not-sent {line['descriptors_not_sent']}",
                flush=True,
            )
