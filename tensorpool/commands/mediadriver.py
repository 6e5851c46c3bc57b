"""`tensorpool mediadriver`: the Aeron media driver that the processes of one host share."""

from __future__ import annotations

import argparse

from tensorpool.cli import UserError
from tensorpool.commands._common import add_flag, default_aeron_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(
        p, "aeron_dir", old=("--dir",), default=default_aeron_dir(),
        help="directory to serve (%(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--threading", default="shared", choices=("shared", "dedicated", "shared_network")
    )
    p.add_argument("--ipc-term-length", type=int, default=None, help="default IPC term bytes")
    p.add_argument("--term-length", type=int, default=None, help="default UDP term bytes")
    p.add_argument("--mtu", type=int, default=None, help="default UDP MTU bytes")


def run(args: argparse.Namespace) -> int:
    import sys

    from tensorpool.fsafety import UnsafeDirectory, check_media_driver_dir
    from tensorpool.transport.config import TransportConfig
    from tensorpool.transport.mediadriver import MediaDriverError, run_media_driver

    try:
        # #13.1: refused before anything is printed or touched (the driver would empty it)
        check_media_driver_dir(args.aeron_dir, "--aeron-dir")
    except UnsafeDirectory as exc:
        raise UserError(str(exc)) from None
    try:
        config = TransportConfig(
            aeron_dir=args.aeron_dir,
            threading_mode=args.threading,
            ipc_term_buffer_length=args.ipc_term_length,
            term_buffer_length=args.term_length,
            mtu_length=args.mtu,
        )
        print(f"media driver serving {args.aeron_dir} (Ctrl-C to stop)", flush=True)
        # #26.4: right after a kill -9 of the previous one, wait for it to go stale
        run_media_driver(
            args.aeron_dir,
            config,
            on_wait=lambda why: print(
                f"tensorpool mediadriver: {why}", file=sys.stderr, flush=True
            ),
        )
    except (MediaDriverError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0
