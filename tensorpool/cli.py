"""The `tensorpool` command: one entry point, one subcommand per tool.

Subcommand implementations live in `tensorpool.commands.<name>`; only the chosen
one is imported, and each imports numpy, Aeron or Spark inside `run`, so
`tensorpool --help` and light commands (`tap --hex`) start fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from tensorpool.transport.process import exit_with_parent

# 128 + SIGPIPE: what `yes | head -1` reports for `yes`, so `set -o pipefail` sees it.
EXIT_BROKEN_PIPE = 141


class UserError(Exception):
    """A mistake the user can fix (bad flag value, missing file, bad config).

    Printed as one line without a traceback; the command exits with status 2.
    """


# name -> (module, one-line help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("tensorpool.commands.demo", "run the end-to-end demo"),
    "produce": ("tensorpool.commands.produce", "publish synthetic frames"),
    "consume": ("tensorpool.commands.consume", "consume frames and print rates/drops"),
    "inspect": ("tensorpool.commands.inspect", "show a region's superblock and ring state"),
    "tap": ("tensorpool.commands.tap", "print every tensorpool message on a stream as JSON"),
    "ratelimiter": ("tensorpool.commands.ratelimiter", "run a rate limiter (one per consumer)"),
    "mediadriver": ("tensorpool.commands.mediadriver", "run a standalone Aeron media driver"),
    "driver": ("tensorpool.commands.driver", "run the SHM driver (also: driver status/shutdown)"),
    "bridge": ("tensorpool.commands.bridge", "carry streams between hosts over Aeron UDP"),
    "view": ("tensorpool.commands.view", "show a stream's newest frame live in a browser"),
    "top": ("tensorpool.commands.top", "live view of every stream on the host"),
    "serve": ("tensorpool.commands.serve", "serve this host's streams over Arrow Flight"),
    "soak": ("tensorpool.commands.soak", "chaos soak: load, seeded faults, exact frame accounting"),
}


def _build_parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorpool",
        description="Shared-memory tensor pools over Aeron.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
            p.set_defaults(_run=_runner(module))
    return parser


def _runner(module: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args) or 0)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status.

    A reader that goes away (`tensorpool driver status | head -1`) ends the command quietly
    with status 141, the shell's status for a process killed by SIGPIPE (#13.7): stdout is
    pointed at /dev/null (the recipe in Python's `signal` docs) so the interpreter's final
    flush cannot print a second error, and no traceback is shown.
    """
    exit_with_parent()  # a part of `tensorpool demo` does not outlive the demo
    try:
        try:
            return _main(argv)
        finally:  # buffered output (help, status) fails here, not at interpreter exit
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(chosen if chosen in _COMMANDS else None)
    args = parser.parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return args._run(args)
    except UserError as exc:
        print(f"tensorpool {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
