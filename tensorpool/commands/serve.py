"""`tensorpool serve`: this host's streams, read-only, over Arrow Flight (#18).

A Spark job on other hosts reads them with ``hosts="thishost:8815"`` and
``streams="thishost/1"`` (docs/spark.md). The server learns its streams from announces
(standalone) or from the SHM driver (``--driver``), maps what was announced with the usual
checks, and never opens a path a client names. It binds 127.0.0.1 unless ``--bind`` says
otherwise; ``--token-file`` (or ``TENSORPOOL_SERVE_TOKEN``) requires a bearer token on every
call, ``--tls-cert``/``--tls-key`` turn on TLS. SIGTERM or SIGINT stops it cleanly. The
read-time loss it counts for Spark queries is journalled in ``--state-dir`` (default
``<shm base dir>/.serve-<port>``; none with ``--port 0``) and survives a restart.
"""

from __future__ import annotations

import argparse
import os
import socket
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
)

if TYPE_CHECKING:
    from tensorpool.client.settings import ClientSettings
    from tensorpool.serve.journal import LedgerJournal

ENV_TOKEN = "TENSORPOOL_SERVE_TOKEN"
DEFAULT_PORT = 8815


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stream-id",
        type=int,
        action="append",
        required=True,
        help="a stream to serve (repeatable); other ids are refused",
    )
    p.add_argument(
        "--bind", default="127.0.0.1", help="address to listen on (%(default)s; 0.0.0.0: all)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (%(default)s)")
    p.add_argument(
        "--token-file",
        help=f"file holding the bearer token clients must send (or env {ENV_TOKEN})",
    )
    p.add_argument("--tls-cert", help="PEM certificate chain (with --tls-key: serve over TLS)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument(
        "--attach-timeout",
        type=float,
        default=0.0,
        help="wait up to S seconds for every stream's first announce before serving (0: no wait)",
    )
    p.add_argument(
        "--state-dir",
        help="directory of the loss ledger's journal, kept across restarts (created and locked"
        " by this serve; default <shm base dir>/.serve-<port>, none with --port 0; 'none': off)",
    )
    add_transport_args(p)
    add_shm_args(p)
    add_channel_args(p)
    add_metrics_argument(p)


def _read(path: str, what: str) -> bytes:
    from tensorpool.cli import UserError

    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UserError(f"{what}: cannot read {path}: {exc.strerror}") from None


def read_token(token_file: str | None, env: str) -> str | None:
    """The token of ``--token-file`` (stripped; an empty file is an error), else of the
    environment variable ``env``, else None (no token required)."""
    from tensorpool.cli import UserError

    if token_file:
        token = _read(token_file, "--token-file").decode(errors="replace").strip()
        if not token:
            raise UserError(f"--token-file: {token_file} is empty")
        return token
    return os.environ.get(env) or None


def _port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (None: it can, or the kernel picks, port 0).

    gRPC reports a taken port only through its C logger on stderr and a bare "Server did not
    start properly", so the port is tried here first, with the same address reuse gRPC uses.
    """
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except OSError as exc:
        return f"--bind {host} --port {port}: cannot listen: {exc.strerror or exc}"
    return None


def state_dir(arg: str | None, port: int, shm_base_dir: str) -> str | None:
    """Where the journal lives. By default next to the rings it counts the loss of, one per
    port (a restarted serve is found again by its port); a server on a port the kernel picks
    cannot be found again by its queries, so it keeps nothing."""
    if arg is not None:
        return None if arg == "none" else arg
    return None if port == 0 else os.path.join(shm_base_dir, f".serve-{port}")


def run(args: argparse.Namespace) -> int:
    from tensorpool.cli import UserError

    if bool(args.tls_cert) != bool(args.tls_key):
        raise UserError("--tls-cert and --tls-key go together")
    if not 0 <= args.port < 65536:
        raise UserError(f"--port: {args.port} is not a TCP port")
    streams = tuple(sorted(set(args.stream_id)))
    if any(not 1 <= s <= 2**31 - 1 for s in streams):
        raise UserError("--stream-id: ids must be in 1..2147483647")
    token = read_token(args.token_file, ENV_TOKEN)
    tls = (
        [(_read(args.tls_cert, "--tls-cert"), _read(args.tls_key, "--tls-key"))]
        if args.tls_cert
        else None
    )
    settings = client_settings(args)
    taken = _port_problem(args.bind, args.port)
    if taken:  # #26.6: one line and nothing attached, instead of gRPC's own log lines
        raise UserError(taken)
    from tensorpool.serve.journal import LedgerJournal, StateDirError

    sdir = state_dir(args.state_dir, args.port, settings.shm_base_dir)
    try:
        journal = None if sdir is None else LedgerJournal(sdir)
    except StateDirError as exc:
        raise UserError(str(exc)) from None
    try:
        return _serve(args, streams, token, tls, settings, journal)
    finally:
        if journal is not None:
            journal.close()


def _serve(
    args: argparse.Namespace,
    streams: tuple[int, ...],
    token: str | None,
    tls: list[tuple[bytes, bytes]] | None,
    settings: ClientSettings,
    journal: LedgerJournal | None,
) -> int:
    from tensorpool.cli import UserError

    metrics = bind_metrics(args.metrics_bind)  # #26.6: before anything is attached

    from tensorpool.observe.metrics import ServeCollector
    from tensorpool.serve.server import TensorPoolFlightServer
    from tensorpool.spark_source.rings.attach import StreamsNotAttached, open_attachment
    from tensorpool.transport.idle import SleepingIdleStrategy
    from tensorpool.transport.process import StopSignals

    stop = StopSignals().install()
    # on this thread, under the one runner (#26.1); the Flight threads read it under its lock
    att = open_attachment(
        streams, settings, driver=args.driver, intake_capacity=None, background=False
    )
    server = None
    try:
        if args.attach_timeout > 0:
            try:
                att.wait_for_layouts(args.attach_timeout)
            except StreamsNotAttached as exc:
                print(f"tensorpool serve: {exc}; serving them once they appear", file=sys.stderr)
        scheme = "grpc+tls" if tls else "grpc"
        host = f"[{args.bind}]" if ":" in args.bind else args.bind
        try:
            server = TensorPoolFlightServer(
                f"{scheme}://{host}:{args.port}",
                streams=streams,
                directory=att,
                base_dirs=settings.base_dirs,
                shm_base_dir=settings.shm_base_dir,
                token=token,
                tls_certificates=tls,
                journal=journal,
            )
        except Exception as exc:  # port in use, bad certificate, bad address
            raise UserError(f"cannot serve on {scheme}://{host}:{args.port}: {exc}") from None
        print(
            f"tensorpool serve: streams {list(streams)} on {scheme}://{host}:{server.port}"
            + (" (token required)" if token else "")
            + (
                f"; loss journal {journal.dir} ({len(server.ledger)} entries)"
                if journal
                else "; loss journal off"
            ),
            flush=True,
        )
        run_agent(
            att,
            ctx=att.context,
            context_lock=att.lock,
            idle=SleepingIdleStrategy(1_000_000),
            stop=stop,
            metrics=metrics,  # #19.1: the server's own counters, read when scraped
            collectors=[ServeCollector(server)],
        )
        return 0
    finally:
        if server is not None:
            server.shutdown()
            counts = dict(server.counters)
            print(f"tensorpool serve: stopped; {counts}", file=sys.stderr, flush=True)
        att.close()
        stop.restore()
