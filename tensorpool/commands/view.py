"""`tensorpool view`: watch a stream's newest frame live in a browser (#19.3).

    tensorpool view --stream-id 1                      # http://127.0.0.1:8470/
    tensorpool view --driver --stream-id 10000 --colormap viridis --bind 0.0.0.0:8470 \
        --allow-host camA.lab --token-file /etc/tensorpool/view.token

A rate-limited consumer (``--max-rate-hz``, default 30) and a small HTTP server with one page;
see :mod:`tensorpool.observe.view`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from tensorpool.cli import UserError
from tensorpool.commands._common import (
    add_channel_args,
    add_shm_args,
    add_transport_args,
    client_settings,
    run_agent,
    start_context,
)
from tensorpool.config_util import parse_bind
from tensorpool.observe.render import COLORMAPS, FORMATS
from tensorpool.transport.process import StopSignals

DEFAULT_BIND = "127.0.0.1:8470"
#: the viewer's token when ``--token-file`` is not given
ENV_TOKEN = "TENSORPOOL_VIEW_TOKEN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream-id", type=int, required=True, help="tensorpool stream id")
    p.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="HOST:PORT",
        help="where the page is served (default %(default)s; a bare PORT binds 127.0.0.1)",
    )
    p.add_argument(
        "--max-rate-hz", type=int, default=30, help="frames/s taken and shown (%(default)s)"
    )
    p.add_argument("--colormap", choices=COLORMAPS, default="gray", help="for 2-D frames")
    p.add_argument("--format", choices=FORMATS, default="jpeg", help="image encoding")
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this Host name (repeatable; localhost names and IP "
        "addresses always work; others get 421)",
    )
    p.add_argument(
        "--token-file",
        help=f"require the token in this file on every request (or env {ENV_TOKEN}); the "
        "printed URL carries it",
    )
    add_transport_args(p)
    add_shm_args(p)
    add_channel_args(p)


def run(args: argparse.Namespace) -> int:
    from tensorpool.client.consumer import MODE_RATE_LIMITED, Consumer, Frame
    from tensorpool.commands.serve import read_token
    from tensorpool.observe.view import FrameStore, Kept, ViewServer
    from tensorpool.transport.agent import WorkAgent
    from tensorpool.transport.idle import idle_strategy

    if args.max_rate_hz <= 0:
        raise UserError(f"--max-rate-hz must be > 0, got {args.max_rate_hz}")
    bind = parse_bind(args.bind)
    if isinstance(bind, str):
        raise UserError(f"--bind {bind}")
    token = read_token(args.token_file, ENV_TOKEN)
    store = FrameStore(args.stream_id, args.format, args.colormap)
    try:  # first: a taken port is the likeliest mistake, and it needs nothing else
        server = ViewServer(
            bind[0],
            bind[1],
            store,
            args.max_rate_hz,
            allow_hosts=tuple(args.allow_host),
            token=token,
        )
    except OSError as exc:
        raise UserError(f"--bind {args.bind}: cannot listen: {exc.strerror or exc}") from None
    try:
        settings = client_settings(args)
        ctx = start_context(settings)
    except BaseException:
        server.server_close()
        raise
    stop = StopSignals((signal.SIGTERM,)).install()
    try:
        consumer = Consumer(
            ctx,
            args.stream_id,
            settings,
            mode=MODE_RATE_LIMITED,
            max_rate_hz=args.max_rate_hz,
            driver=args.driver,
        )
    except ValueError as exc:
        ctx.close()
        server.server_close()
        raise UserError(str(exc)) from None

    def handler(frame: Frame) -> None:
        arr = frame.copy()  # at most --max-rate-hz copies a second
        if arr is not None:
            store.put(Kept(arr, frame.seq, frame.epoch, frame.timestamp_ns))

    server.start()
    print(f"view: stream {args.stream_id} at {server.url}", flush=True)
    # a person watches at <= 30 Hz: parks of up to 5 ms cost nothing visible and keep the
    # idle loop at a few hundred wakeups a second instead of a thousand
    idle = idle_strategy("backoff", max_park_ns=5_000_000)
    last_t, last_frames, last_seq = time.monotonic(), 0, 0

    def report(final: bool) -> None:  # the page's numbers, once a second
        nonlocal last_t, last_frames, last_seq
        if final:
            return
        now = time.monotonic()
        kept = store.newest()
        seq = kept.seq if kept is not None else 0
        frames = consumer.stats.frames
        dt = max(now - last_t, 1e-9)
        store.set_stats(
            {
                "fps": (frames - last_frames) / dt,
                # how fast the producer's seq moves (its frame rate, unless it
                # keeps another stream's seqs, as a rate limiter does)
                "source_seq_per_s": (seq - last_seq) / dt if last_seq and seq else 0.0,
                "frames": frames,
                "drops_gap": consumer.drops_gap,
                "drops_late": consumer.drops_late,
                "drops": consumer.stats.drops.snapshot(),
            }
        )
        last_t, last_frames, last_seq = now, frames, seq

    try:
        run_agent(
            WorkAgent("view", lambda: consumer.poll(handler, 16)),
            ctx=ctx,
            idle=idle,
            stop=stop,
            report=report,
            report_interval_s=1.0,
            duration_s=args.duration,
        )
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        consumer.close()
        ctx.close()
        print(
            f"view: stream {args.stream_id}: {consumer.stats.frames} frames; requests refused: "
            f"{server.hosts.refused} for their Host, {server.token_refused} for the token",
            file=sys.stderr,
        )
    return 0
