"""Options shared by the client commands, and turning them into settings."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tensorpool.cli import UserError
from tensorpool.client.settings import ClientSettings
from tensorpool.config_util import aeron_dir_problem
from tensorpool.endpoints import (
    ENDPOINT_NAMES,
    Endpoints,
    default_aeron_dir,
    default_shm_base_dir,
)
from tensorpool.fsafety import unsafe_root_reason

if TYPE_CHECKING:
    from threading import Lock, RLock

    from tensorpool.observe.metrics import MetricsServer
    from tensorpool.transport.agent import Agent, AgentRunner
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.idle import IdleStrategy
    from tensorpool.transport.process import StopSignals

ENV_AERON_DIR = "TENSORPOOL_AERON_DIR"
ENV_SHM_BASE_DIR = "TENSORPOOL_SHM_BASE_DIR"


def add_transport_args(p: argparse.ArgumentParser, *, driver: bool = True) -> None:
    """`--aeron-dir`/`--embedded`, and `--driver` for commands that attach to streams."""
    g = p.add_argument_group("Aeron")
    g.add_argument(
        "--aeron-dir",
        default=os.environ.get(ENV_AERON_DIR) or default_aeron_dir(),
        help=f"media driver directory to join (env {ENV_AERON_DIR}; default %(default)s); "
        "start one with `tensorpool mediadriver`",
    )
    if driver:
        g.add_argument(
            "--driver",
            action="store_true",
            help="attach through a running `tensorpool driver` (it owns the SHM) instead of "
            "standalone mode",
        )
    g.add_argument(
        "--embedded",
        action="store_true",
        help="start a private embedded media driver (IPC then reaches only this process)",
    )


def add_shm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shared memory")
    g.add_argument(
        "--shm-base-dir",
        default=os.environ.get(ENV_SHM_BASE_DIR) or default_shm_base_dir(),
        help=f"base directory of SHM regions (env {ENV_SHM_BASE_DIR}; default %(default)s)",
    )
    g.add_argument(
        "--allowed-base-dir",
        action="append",
        default=[],
        help="extra directory consumers may map from (repeatable)",
    )


def add_channel_args(p: argparse.ArgumentParser) -> None:
    """``--<name>-channel`` / ``--<name>-stream-id`` for the four endpoints (#14.1: the same
    defaults as every config; validated by :class:`~tensorpool.endpoints.Endpoints`)."""
    d = Endpoints()
    g = p.add_argument_group("channels")
    for name in ENDPOINT_NAMES:
        g.add_argument(f"--{name}-channel", default=getattr(d, f"{name}_channel"))
        g.add_argument(f"--{name}-stream-id", type=int, default=getattr(d, f"{name}_stream_id"))


def endpoints_from_args(args: argparse.Namespace) -> Endpoints:
    """The endpoints the channel options name; a bad value is a one-line UserError."""
    try:
        return Endpoints(
            **{
                f"{name}_{kind}": getattr(args, f"{name}_{kind}")
                for name in ENDPOINT_NAMES
                for kind in ("channel", "stream_id")
            }
        )
    except ValueError as exc:
        field_name, _, reason = str(exc).partition(": ")
        raise UserError(f"--{field_name.replace('_', '-')}: {reason}") from None


def transport_config(args: argparse.Namespace):  # -> TransportConfig
    from tensorpool.transport.config import TransportConfig
    from tensorpool.transport.mediadriver import serves

    if args.embedded:
        return TransportConfig()
    reason = aeron_dir_problem(os.path.abspath(args.aeron_dir))  # #13.1, #26.5: the one check
    if reason is not None:
        raise UserError(f"--aeron-dir: refusing {reason}")
    if not serves(args.aeron_dir):  # a loaded host's late heartbeat still counts
        raise UserError(
            f"no running media driver in {args.aeron_dir}: start one with "
            "`tensorpool mediadriver`, pass --aeron-dir DIR, or use --embedded"
        )
    return TransportConfig(aeron_dir=args.aeron_dir)


def client_settings(args: argparse.Namespace) -> ClientSettings:
    try:
        channels = endpoints_from_args(args)
        base = os.path.abspath(args.shm_base_dir)
        reason = unsafe_root_reason(base)  # #13.1: standalone producers create regions there
        if reason is not None:
            raise UserError(f"--shm-base-dir: refusing {reason}")
        allowed = tuple(os.path.abspath(d) for d in args.allowed_base_dir)
        return ClientSettings(
            transport=transport_config(args),
            channels=channels,
            shm_base_dir=base,
            allowed_base_dirs=(base, *allowed) if allowed else (),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None


def start_context(settings: ClientSettings):  # -> AeronContext
    from tensorpool.transport.context import AeronContext
    from tensorpool.transport.mediadriver import MediaDriverError

    try:
        return AeronContext(settings.transport).start()
    except MediaDriverError as exc:
        raise UserError(str(exc)) from None


def add_metrics_argument(p: argparse.ArgumentParser, *, config_key: str | None = None) -> None:
    """The one ``--metrics-bind`` option every command shares. With ``config_key`` the default is
    None, so the command can tell "not given" from "given" and fall back to the config."""
    where = f"; default: {config_key} of the config, else off" if config_key else "; default off"
    p.add_argument(
        "--metrics-bind",
        default=None if config_key else "",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT binds "
        f"127.0.0.1{where})",
    )


def bind_metrics(bind: str | None) -> MetricsServer | None:
    """Serve metrics on ``bind`` (None when empty), bound before the command creates anything
    (#26.6): a bad bind or a taken port is one line and exit 2, with nothing left behind. The
    command hands the server to :func:`run_agent`, which adds its collectors and closes it;
    a command that fails before that exits, and the server's daemon thread with it."""
    if not bind:
        return None
    from tensorpool.observe.metrics import start_metrics

    try:
        return start_metrics(bind)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def run_agent(
    agent: Agent,
    *,
    ctx: AeronContext | None,
    context_lock: Lock | RLock | None = None,
    idle: IdleStrategy | None = None,
    stop: StopSignals | None = None,
    report: Callable[[bool], object] | None = None,
    report_interval_s: float = 0.0,
    duration_s: float = 0.0,
    metrics: MetricsServer | None = None,
    collectors: Sequence[object] = (),
    fatal: tuple[type[Exception], ...] = (),
) -> AgentRunner:
    """Run a long-running command's agent under the one runner (#26.1) until a stop signal,
    ``duration_s``, or the agent ends; returns the finished runner.

    Every command goes through here, so none can forget a duty-cycle service: the runner keeps
    ``ctx``'s media driver (reconnecting after a restart), idles, stops on SIGTERM/SIGINT
    (``stop``: signals the command installed earlier, e.g. before a long attach), watches the
    parent, reports, and ``metrics`` (bound by :func:`bind_metrics` before the command created
    anything) serves ``collectors`` plus the runner's own health
    (``tensorpool_media_driver_connected``); it is closed when the runner ends.
    """
    from tensorpool.transport.agent import AgentRunner
    from tensorpool.transport.process import StopSignals

    runner = AgentRunner(
        agent,
        idle,
        context=ctx,
        context_lock=context_lock,
        stop_signals=stop if stop is not None else StopSignals(),
        watch_parent=True,
        report=report,
        report_interval_s=report_interval_s,
        duration_s=duration_s,
        fatal=(UserError, *fatal),  # a command's own one-line error ends it (exit 2)
    )
    if metrics is not None:
        from tensorpool.observe.metrics import RunnerCollector

        for collector in (*collectors, RunnerCollector(runner.health)):
            metrics.add(collector)  # type: ignore[arg-type]
    try:
        runner.run()
    finally:
        if metrics is not None:
            metrics.close()
    return runner


#: One command-line vocabulary (#26.7): for each concept several commands share, the one flag
#: every command spells it with, the old spellings that keep working for one release (with a
#: one-line deprecation notice on stderr), and a pattern that finds any spelling of the concept
#: (tests/unit/commands/test_cli_vocabulary.py checks every command's flags against this table).
VOCABULARY: dict[str, tuple[str, tuple[str, ...], str]] = {
    "report_interval": (
        "--report-interval",
        ("--status-interval", "--stats-interval", "--interval"),
        r"interval",
    ),
    "idle_max_park_us": ("--idle-max-park-us", ("--max-park-us",), r"max-park|park-us"),
    "metrics_bind": ("--metrics-bind", (), r"metrics"),
    "aeron_dir": ("--aeron-dir", ("--dir",), r"aeron|^--dir$"),
    "attach_timeout": ("--attach-timeout", (), r"attach"),
}


class _DeprecatedSpelling(argparse.Action):
    """An old spelling of a flag: stores into the new one's ``dest`` and says so once."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kw: object) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kw)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        import sys

        print(
            f"tensorpool: {option_string} is deprecated and will be removed; use {self.new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_flag(
    p: argparse.ArgumentParser, concept: str, *, old: tuple[str, ...] = (), **kwargs: object
) -> None:
    """Add ``concept``'s flag (:data:`VOCABULARY`), and ``old``: the spellings this command
    used before #26.7, kept as hidden aliases that print a deprecation notice."""
    new, known, _ = VOCABULARY[concept]
    p.add_argument(new, dest=concept, **kwargs)  # type: ignore[arg-type]
    for spelling in old:
        assert spelling in known, f"{spelling}: not an old spelling of {new} in VOCABULARY"
        p.add_argument(
            spelling,
            dest=concept,
            action=_DeprecatedSpelling,
            new=new,
            type=kwargs.get("type"),  # type: ignore[arg-type]
            help=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
        )
