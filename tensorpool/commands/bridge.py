"""`tensorpool bridge`: run an Aeron-UDP bridge instance (Bridge Spec v1.0).

    tensorpool bridge --config bridge.toml               # status line per mapping every second
    tensorpool bridge --config bridge.toml --json        # one JSON object per mapping per tick

The process hosts the configuration's sender mappings (consume a local stream, send it as
`BridgeFrameChunk`s), receiver mappings (re-materialize remote frames into a local stream)
or both. It runs until SIGINT/SIGTERM (or `--duration`), then prints a final status and
closes its producers (the SHM driver then bumps the destination epochs) and consumers.

Status fields: frames/s and MB/s since the previous line, frame count, drops by reason
(sender: back_pressured, not_connected, source_overwritten, ...; receiver: chunk and frame
drop reasons such as no_announce, stale_epoch, superseded), assembly timeouts, source and
local epochs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys

from tensorpool.cli import UserError
from tensorpool.commands._common import add_flag, add_metrics_argument, bind_metrics, run_agent
from tensorpool.transport.process import StopSignals

ENV_CONFIG = "TENSORPOOL_BRIDGE_CONFIG"
log = logging.getLogger("tensorpool.bridge")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=os.environ.get(ENV_CONFIG),
        help=f"bridge TOML file (env {ENV_CONFIG})",
    )
    p.add_argument("--json", action="store_true", help="status as one JSON object per mapping")
    add_flag(
        p,
        "report_interval",
        old=("--status-interval",),
        type=float,
        default=1.0,
        help="seconds between status lines (0: only the final one)",
    )
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    p.add_argument(
        "--idle",
        choices=("backoff", "busy-spin", "yield", "sleep"),
        default="backoff",
        help="idle strategy between duty cycles that did no work",
    )
    p.add_argument(
        "--send-strategy",
        choices=("staging", "claim"),
        default="staging",
        help="how the sender writes chunks: one staged copy + offer per chunk (default, "
        "fastest in Python) or try_claim per chunk (no staging copy)",
    )
    add_metrics_argument(p, config_key="bridge.metrics_bind")
    add_flag(
        p,
        "idle_max_park_us",
        old=("--max-park-us",),
        type=int,
        default=200,
        help="longest backoff park, microseconds (latency vs idle CPU)",
    )


def run(args: argparse.Namespace) -> int:
    import pyaeron

    from tensorpool.bridge.app import BridgeApp, RateMeter
    from tensorpool.bridge.config import ConfigError, load_bridge_config
    from tensorpool.observe.metrics import BridgeCollector
    from tensorpool.transport.clock import now_ns
    from tensorpool.transport.idle import idle_strategy
    from tensorpool.transport.mediadriver import MediaDriverError

    if not args.config:
        raise UserError(f"--config is required (or set {ENV_CONFIG})")
    try:
        config = load_bridge_config(args.config)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    for warning in config.warnings:
        log.warning("%s: %s", args.config, warning)

    metrics = bind_metrics(  # #26.6: before anything is created
        config.bridge.metrics_bind if args.metrics_bind is None else args.metrics_bind
    )
    stop = StopSignals().install()
    try:
        app = BridgeApp(config, send_strategy=args.send_strategy)
    except MediaDriverError as exc:
        raise UserError(
            f"{exc} (is the host's media driver running? see [local] aeron_dir)"
        ) from None
    except pyaeron.AeronError as exc:  # e.g. a UDP endpoint another process has bound
        raise UserError(aeron_error_line(exc, config.bridge, args.config)) from None
    if args.idle == "backoff":
        idle = idle_strategy("backoff", max_park_ns=max(args.idle_max_park_us, 1) * 1000)
    else:
        idle = idle_strategy(args.idle.replace("-", "_"))
    meter = RateMeter()
    meter.update(app.status(), now_ns())

    def report(final: bool) -> None:
        _print(meter.update(app.status(), now_ns()), args.json, final=final)

    mode = ", ".join(f"{m.name} ({m.role.value})" for m in config.mappings)
    log.info("bridge %s running: %s", config.bridge.instance_id, mode)
    run_agent(
        app,
        ctx=app.ctx,
        idle=idle,
        stop=stop,
        report=report,
        report_interval_s=args.report_interval,
        duration_s=args.duration,
        metrics=metrics,
        collectors=[BridgeCollector(app)],
    )
    return 0


_CHANNEL_KEYS = (
    "receive_payload_channel",
    "receive_control_channel",
    "receive_metadata_channel",
    "payload_channel",
    "control_channel",
    "metadata_channel",
)


def aeron_error_line(exc: BaseException, bridge: object, path: str) -> str:
    """One line for an Aeron registration error, naming the endpoint and the config key.

    The media driver's message is a multi-line C stack (#13.7: a UDP port already in use gave
    a 35-line traceback); keep its errno text and the endpoint it failed to bind.
    """
    text = str(exc)
    reason = re.search(r"\((\d+)\) ([A-Za-z][^\n\[]*)", text)
    bind = re.search(r"failed to bind\(\d+, ([^)]+)\)", text)
    why = reason.group(2).strip() if reason else text.strip().splitlines()[0]
    if bind is None:
        return f"{path}: Aeron refused a channel: {why}"
    endpoint = bind.group(1).strip()
    keys = [k for k in _CHANNEL_KEYS if endpoint in str(getattr(bridge, k, ""))]
    where = f" ([bridge] {keys[0]})" if keys else ""
    return (
        f"{path}: cannot bind UDP endpoint {endpoint}{where}: {why} "
        "(another bridge or process is using it)"
    )


def _print(rows: list[dict[str, object]], as_json: bool, *, final: bool) -> None:
    from tensorpool.bridge.app import format_status_line

    for row in rows:
        if as_json:
            row["final"] = final
            print(json.dumps(row, sort_keys=True), flush=True)
        else:
            print(
                ("final " if final else "") + format_status_line(row), file=sys.stdout, flush=True
            )
