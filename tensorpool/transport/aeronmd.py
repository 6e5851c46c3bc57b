"""``python -m tensorpool.transport.aeronmd --dir DIR``: run an Aeron media driver until signalled.

The standalone driver several tensorpool processes on one host share (each with
``aeron_dir=DIR``). Named after Aeron's C driver binary, ``aeronmd``; kept apart from
:mod:`tensorpool.transport.mediadriver` so ``python -m`` does not execute a module the package
has already imported. Exit codes: 0 after a clean stop, 2 if the driver cannot start (bad
option, a live driver already serves DIR, or DIR holds anything but Aeron's files or is a
system/shared root: see :mod:`tensorpool.fsafety`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from tensorpool.fsafety import check_media_driver_dir
from tensorpool.transport.config import THREADING_MODES, TransportConfig
from tensorpool.transport.mediadriver import MediaDriverError, run_media_driver


def _positive_int(text: str) -> int:
    value = int(text, 0)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorpool.transport.aeronmd",
        description="Run an Aeron media driver until SIGTERM/SIGINT.",
    )
    parser.add_argument("--dir", required=True, help="Aeron directory to serve")
    parser.add_argument("--threading", default="shared", choices=sorted(THREADING_MODES))
    parser.add_argument("--ipc-term-length", type=_positive_int, default=None)
    parser.add_argument("--term-length", type=_positive_int, default=None)
    parser.add_argument("--mtu", type=_positive_int, default=None)
    parser.add_argument(
        "--parent-created", action="append", default=[], metavar="DIR",
        help="a directory the parent made for this driver: removed at the stop if empty",
    )  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        check_media_driver_dir(args.dir, "--dir")  # #13.1: before Aeron can empty it
        config = TransportConfig(
            aeron_dir=args.dir,
            threading_mode=args.threading,
            ipc_term_buffer_length=args.ipc_term_length,
            term_buffer_length=args.term_length,
            mtu_length=args.mtu,
        )
        run_media_driver(args.dir, config, parent_created=args.parent_created)
    except (MediaDriverError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
