"""`tensorpool ratelimiter`: run one rate limiter instance (RateLimiter Spec v1.0).

    tensorpool ratelimiter --config rl.toml            # run until SIGINT/SIGTERM
    tensorpool ratelimiter --config rl.toml --check    # validate the config and exit
    tensorpool ratelimiter --config rl.toml --json     # JSON lines: started, stats, stopped

Run one instance per consumer: it attaches through the SHM driver as a consumer of each
mapping's source stream and as the exclusive producer of its destination stream, and
republishes at most `max_rate_hz` frames per second (the destination consumer's
`ConsumerHello.max_rate_hz` wins over the config). Exit status: 0 after a clean stop, 2 for
a bad config or command line (also a destination whose pools cannot hold the source's
frames, found once both layouts are known), 1 when the driver refuses an attach (e.g. the
destination already has a producer) or no driver answers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from tensorpool.cli import UserError
from tensorpool.commands._common import add_flag, add_metrics_argument, bind_metrics, run_agent
from tensorpool.transport.process import StopSignals

ENV_CONFIG = "TENSORPOOL_RATELIMITER_CONFIG"
log = logging.getLogger("tensorpool.ratelimiter")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", default=os.environ.get(ENV_CONFIG), help=f"rate limiter TOML (env {ENV_CONFIG})"
    )
    p.add_argument("--check", action="store_true", help="validate the config, print it, exit")
    p.add_argument("--json", action="store_true", help="print JSON lines (started/stats/stopped)")
    add_flag(
        p,
        "report_interval",
        old=("--stats-interval",),
        type=float,
        default=5.0,
        help="seconds between stats reports (0 = only at exit; default %(default)s)",
    )
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds (0 = run)")
    add_flag(
        p,
        "idle_max_park_us",
        type=int,
        default=1000,
        help="longest backoff park while a slot is open or a mapping is unlimited, "
        "microseconds (default %(default)s); between slots the agent sleeps until the next one",
    )
    add_metrics_argument(p, config_key="rate_limiter.metrics_bind")
    add_flag(
        p,
        "attach_timeout",
        type=float,
        default=30.0,
        help="seconds to wait for each destination lease, including waiting out a crashed "
        "predecessor's lease (default %(default)s)",
    )


def _load(path: str | None):  # -> RateLimiterConfig
    from tensorpool.driver.config import load_driver_config
    from tensorpool.ratelimiter.config import ConfigError, load_ratelimiter_config

    if not path:
        raise UserError(f"--config FILE is required (or set {ENV_CONFIG})")
    try:  # the command composes the two agents' configs: driver.config profile checks
        return load_ratelimiter_config(path, load_driver=load_driver_config)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def _emit(args: argparse.Namespace, event: str, **fields: Any) -> None:
    if args.json:
        print(json.dumps({"event": event, **fields}), flush=True)
    else:
        log.info("%s %s", event, json.dumps(fields))


def run(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if args.check:
        from dataclasses import asdict

        print(json.dumps(asdict(config), indent=2, default=str))
        return 0
    if args.idle_max_park_us <= 0:
        raise UserError("--idle-max-park-us must be > 0")
    if args.report_interval < 0:
        raise UserError("--report-interval must be >= 0")
    logging.getLogger("tensorpool").setLevel(
        min(logging.getLogger().getEffectiveLevel(), logging.INFO)
    )

    from tensorpool.client.producer import AttachError
    from tensorpool.observe.metrics import RateLimiterCollector
    from tensorpool.ratelimiter.agent import PoolFitError, RateLimiterAgent
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.mediadriver import MediaDriverError

    metrics = bind_metrics(  # #26.6: before anything is created
        config.metrics_bind if args.metrics_bind is None else args.metrics_bind
    )
    try:
        ctx = AeronContext(
            config.driver.transport_config(client_name=f"ratelimiter-{config.instance_id}")
        ).start()
    except MediaDriverError as exc:
        print(f"tensorpool ratelimiter: error: {exc}", file=sys.stderr)
        return 1
    stop = StopSignals().install()  # before the attach, which can take --attach-timeout
    try:
        try:
            agent = RateLimiterAgent(config, ctx, attach_timeout_s=args.attach_timeout)
        except AttachError as exc:
            print(f"tensorpool ratelimiter: error: {exc}", file=sys.stderr)
            return 1
        _emit(args, "started", **agent.snapshot())

        def report(final: bool) -> None:  # #26.3: with the media driver's health
            health = ctx.media_driver_health(ctx.clock())
            _emit(args, "stopped" if final else "stats", **agent.snapshot(), media_driver=health)

        try:
            run_agent(
                agent,
                ctx=ctx,
                idle=agent.idle_strategy(max_park_ns=args.idle_max_park_us * 1000),
                stop=stop,
                report=report,
                report_interval_s=args.report_interval,
                duration_s=args.duration,
                metrics=metrics,
                collectors=[RateLimiterCollector(agent)],
                fatal=(PoolFitError,),
            )
        except PoolFitError as exc:  # a config mistake seen only once the layouts are known
            print(f"tensorpool ratelimiter: error: {config.source}: {exc}", file=sys.stderr)
            return 2
    finally:
        ctx.close()
    return 0
