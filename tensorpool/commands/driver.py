"""`tensorpool driver`: run the SHM driver, show its status, ask it to shut down.

    tensorpool driver --config driver.toml            # run the daemon (foreground)
    tensorpool driver status --config driver.toml     # streams, epochs, leases, counters
    tensorpool driver status --config driver.toml --json
    tensorpool driver shutdown --config driver.toml --token SECRET

`status` reads the status file the running driver rewrites every announce period
(`<shm.base_dir>/<shm.namespace>/driver-status.json`), so it needs neither Aeron nor a
responsive driver; it reports a document that stopped being rewritten as stale. Exit status
0 means "running", 1 "not running (stopped, stale or never started)".

`shutdown` sends `ShmDriverShutdownRequest` on the control stream (Driver Model §4.13) and
waits for the driver's `ShmDriverShutdown`. The endpoint comes from the flags, else from the
status file (which records the media driver directory the driver really uses), else from the
config. A wrong token gets no answer by design: the command then times out with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from typing import Any

from tensorpool.cli import UserError
from tensorpool.commands._common import add_metrics_argument, bind_metrics

ENV_CONFIG = "TENSORPOOL_DRIVER_CONFIG"
ENV_TOKEN = "TENSORPOOL_DRIVER_SHUTDOWN_TOKEN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=os.environ.get(ENV_CONFIG),
        help=f"driver TOML file (env {ENV_CONFIG})",
    )
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format")
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=None,
        help="driver log level (default info; -vv means debug)",
    )
    p.add_argument(
        "--idle-max-park-us",
        type=int,
        default=10000,
        help="longest idle sleep between duty cycles in microseconds: the most an idle "
        "driver adds to a request's latency, vs its idle CPU (default %(default)s)",
    )
    add_metrics_argument(p, config_key="driver.metrics_bind")
    sub = p.add_subparsers(
        dest="driver_action", metavar="[status | shutdown]", help="without one: run the driver"
    )
    st = sub.add_parser("status", help="show streams, epochs, leases and counters")
    st.add_argument("--config", default=argparse.SUPPRESS, help="driver TOML file")
    st.add_argument("--status-file", default=None, help="read this status file instead")
    st.add_argument("--json", action="store_true", help="print the status document as JSON")
    sd = sub.add_parser("shutdown", help="ask the running driver to shut down (§4.13)")
    sd.add_argument("--config", default=argparse.SUPPRESS, help="driver TOML file")
    sd.add_argument(
        "--token",
        default=os.environ.get(ENV_TOKEN),
        help=f"the driver's policies.shutdown_token (env {ENV_TOKEN})",
    )
    sd.add_argument("--aeron-dir", default=None, help="media driver directory of the driver")
    sd.add_argument("--control-channel", default=None)
    sd.add_argument("--control-stream-id", type=int, default=None)
    sd.add_argument("--reason", choices=("normal", "admin", "error"), default="admin")
    sd.add_argument("--message", default="", help="text carried in the request")
    sd.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for ShmDriverShutdown"
    )
    sd.add_argument("--no-wait", action="store_true", help="send the request and exit")


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "driver_action", None)
    if action == "status":
        return _status(args)
    if action == "shutdown":
        return _shutdown(args)
    return _run_daemon(args)


# --------------------------------------------------------------------------- helpers


def _load_config(path: str | None):  # -> DriverConfig
    from tensorpool.driver.config import ConfigError, load_driver_config

    if not path:
        raise UserError(f"--config FILE is required (or set {ENV_CONFIG})")
    try:
        return load_driver_config(path)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def _configure_logging(args: argparse.Namespace) -> None:
    from tensorpool.driver.daemon import JsonLogFormatter

    if args.log_level:
        level = getattr(logging, args.log_level.upper())
    else:
        level = logging.DEBUG if getattr(args, "verbose", 0) >= 2 else logging.INFO
    logging.getLogger("tensorpool.driver").setLevel(level)
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    if args.log_format == "json":
        for handler in root.handlers:
            handler.setFormatter(JsonLogFormatter())


# --------------------------------------------------------------------------- run


def _run_daemon(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    if args.idle_max_park_us <= 0:
        raise UserError("--idle-max-park-us must be > 0")
    _configure_logging(args)

    from tensorpool.config_util import ConfigError
    from tensorpool.driver.daemon import (
        DaemonOptions,
        DriverStartupError,
        default_idle_strategy,
        resolve_aeron_dir,
        run_driver,
    )
    from tensorpool.driver.lock import LockHeld

    options = DaemonOptions(
        aeron_dir=resolve_aeron_dir(config),
        idle=default_idle_strategy(args.idle_max_park_us * 1000),
    )
    bind = config.driver.metrics_bind if args.metrics_bind is None else args.metrics_bind
    metrics = bind_metrics(bind)  # #19.1: before anything is created: a taken port changes nothing
    try:
        return run_driver(
            config,
            options,
            on_agent=None if metrics is None else (lambda a: _add_collectors(metrics, a)),
        )
    except (ConfigError, DriverStartupError, LockHeld) as exc:
        raise UserError(str(exc)) from None
    finally:
        if metrics is not None:
            metrics.close()


def _add_collectors(metrics: Any, agent: Any) -> None:
    from tensorpool.observe.metrics import DriverCollector, RunnerCollector

    metrics.add(DriverCollector(agent))
    metrics.add(RunnerCollector(agent.runner_health))  # #26.3: media driver connected


# --------------------------------------------------------------------------- status


def _status_file(args: argparse.Namespace) -> str:
    from tensorpool.driver.status import status_path

    if args.status_file:
        return str(args.status_file)
    return status_path(_load_config(getattr(args, "config", None)))


def _status(args: argparse.Namespace) -> int:
    from tensorpool.driver.status import StatusUnavailable, assess, format_status, read_status

    path = _status_file(args)
    try:
        doc = read_status(path)
    except StatusUnavailable as exc:
        if args.json:
            print(json.dumps({"liveness": {"verdict": "missing", "reason": str(exc)}}))
        else:
            print(f"driver not running: {exc}")
        return 1
    liveness = assess(doc, time.time_ns())
    if args.json:
        doc["liveness"] = {
            "verdict": liveness.verdict,
            "age_ns": liveness.age_ns,
            "reason": liveness.reason,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(format_status(doc, liveness))
    return 0 if liveness.running else 1


# --------------------------------------------------------------------------- shutdown


def _shutdown_endpoint(args: argparse.Namespace) -> tuple[str, str, int, int]:
    """(aeron_dir, control channel, control stream id, drain timeout ms) for the request."""
    from tensorpool.commands._common import default_aeron_dir
    from tensorpool.driver.status import StatusUnavailable, read_status, status_path

    doc: dict[str, Any] = {}
    config = None
    config_path = getattr(args, "config", None)
    if config_path:
        config = _load_config(config_path)
        try:
            doc = read_status(status_path(config))
        except StatusUnavailable:
            doc = {}
    aeron_dir = args.aeron_dir or doc.get("aeron_dir")
    channel = args.control_channel or doc.get("control_channel")
    stream_id = args.control_stream_id or doc.get("control_stream_id")
    timeout_ms = 2000
    if config is not None:
        from tensorpool.driver.daemon import resolve_aeron_dir

        aeron_dir = aeron_dir or resolve_aeron_dir(config)
        channel = channel or config.driver.control_channel
        stream_id = stream_id or config.driver.control_stream_id
        timeout_ms = config.policies.shutdown_timeout_ms
    from tensorpool.driver.config import DEFAULT_CHANNEL, DEFAULT_CONTROL_STREAM_ID

    return (
        str(aeron_dir or default_aeron_dir()),
        str(channel or DEFAULT_CHANNEL),
        int(stream_id or DEFAULT_CONTROL_STREAM_ID),
        timeout_ms,
    )


def _shutdown(args: argparse.Namespace) -> int:
    import pyaeron

    from tensorpool.specs import DRIVER_SCHEMA_ID, CodecError, peek_header
    from tensorpool.specs.generated import driver as drv
    from tensorpool.transport.mediadriver import serves
    from tensorpool.transport.publication import Publisher
    from tensorpool.transport.subscription import Subscriber

    if not args.token:
        raise UserError(f"--token is required (or set {ENV_TOKEN})")
    if not args.token.isascii():
        raise UserError("--token must be ASCII")
    aeron_dir, channel, stream_id, drain_ms = _shutdown_endpoint(args)
    timeout_s = args.timeout if args.timeout is not None else drain_ms / 1000 + 5.0
    if not serves(aeron_dir):
        raise UserError(f"no running media driver in {aeron_dir}: is the SHM driver running?")
    notices: list[tuple[int, str]] = []
    # Aeron may hand a new subscription messages an earlier driver left in a lingering log;
    # only a notice stamped (driver monotonic clock, same host) after our request counts.
    sent_ns = [1 << 64]

    def on_control(buffer: Any, _header: Any) -> None:
        try:
            _, template_id, schema_id, _ = peek_header(buffer)
            if (
                schema_id == DRIVER_SCHEMA_ID
                and template_id == drv.ShmDriverShutdownDecoder.TEMPLATE_ID
            ):
                dec = drv.ShmDriverShutdownDecoder().wrap(buffer)
                if dec.timestamp_ns >= sent_ns[0]:
                    notices.append((dec.reason_raw, dec.error_message))
        except CodecError:
            pass

    reason = {
        "normal": drv.ShutdownReason.NORMAL,
        "admin": drv.ShutdownReason.ADMIN,
        "error": drv.ShutdownReason.ERROR,
    }[args.reason]
    buf = bytearray(4096 + len(args.token) + len(args.message))
    try:
        n = drv.ShmDriverShutdownRequestEncoder.encode(
            buf,
            0,
            correlation_id=random.getrandbits(62),
            reason=reason,
            token=args.token,
            error_message=args.message,
        )
    except CodecError as exc:
        raise UserError(f"cannot encode the request: {exc}") from None
    # A plain client with an error handler: a driver that hosts the media driver takes it down
    # right after its notice, and Aeron's default handler would exit() this process then.
    errors: list[str] = []
    try:
        aeron = pyaeron.Aeron(
            context=pyaeron.Context(
                dir=aeron_dir, error_handler=lambda code, text: errors.append(f"{code}: {text}")
            )
        )
    except pyaeron.AeronError as exc:
        raise UserError(f"cannot connect to the media driver in {aeron_dir}: {exc}") from None
    sub = Subscriber(aeron, channel, stream_id, on_control)
    pub = Publisher(aeron.add_exclusive_publication(channel, stream_id))
    try:
        if not pub.await_connected(min(timeout_s, 10.0)):
            raise UserError(f"nobody listens on {channel} stream {stream_id}: driver not running?")
        deadline = time.monotonic() + timeout_s
        sent_ns[0] = time.monotonic_ns()
        while not pub.offer(buf, 0, n):
            if time.monotonic() >= deadline:
                raise UserError("could not send the shutdown request (back-pressure)")
            time.sleep(0.01)
        if args.no_wait:
            print("shutdown request sent")
            return 0
        while time.monotonic() < deadline:
            sub.poll()
            if notices:
                code, message = notices[0]
                try:
                    name = drv.ShutdownReason(code).name
                except ValueError:
                    name = str(code)
                detail = f": {message}" if message else ""
                print(f"driver shut down (reason {name}{detail})")
                return 0
            time.sleep(0.01)
    finally:
        sub.close()
        pub.close()
        aeron.close()
    print(
        f"no ShmDriverShutdown within {timeout_s:.1f} s: wrong token, or shutdown requests are "
        "disabled (policies.shutdown_token is empty)",
        file=sys.stderr,
    )
    return 1
