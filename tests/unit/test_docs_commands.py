"""#13.7: every command in README.md and docs/ runs as written.

The README's `consume --driver --stream-id 20000 --mode rate-limited` example got 0 frames
(it lacked the rate limiter's descriptor stream id), and `tap --hex 2400...` could not run
at all. This check reads every fenced shell block of README.md and docs/**/*.md:

* each `tensorpool ...` command must parse with the real `tensorpool` argument parser
  (subcommand, options and values), and the `config/...` files it names must exist;
* each `./dev X` must name a subcommand of the `dev` script (and `./dev demo ARGS` must
  parse as `tensorpool demo ARGS`);
* inline `tensorpool ...` spans in the prose must name a real subcommand and real options;
* the cheap ones run for real: `tap --hex`, `ratelimiter --check`, `--help`.

The end-to-end flows (driver + producer + rate limiter + consumer) need a whole deployment;
the README's rate limiter flow is exercised by tests/integration/test_ratelimiter_e2e.py
with the same options.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tensorpool.cli import _COMMANDS, _build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
_SIDE_BY_SIDE = re.compile(r"\s{2,}(?=tensorpool |\./dev )")


def _fenced_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line in a fenced shell block."""
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        text = doc.read_text()
        for block in _FENCE.finditer(text):
            if block.group(1).strip() not in SHELL_LANGS:
                continue
            first_line = text.count("\n", 0, block.start()) + 2
            body = re.sub(r"\\\n\s*", " ", block.group(2))  # join continued lines
            for i, line in enumerate(body.splitlines()):
                for part in _SIDE_BY_SIDE.split(line):  # two hosts side by side
                    part = part.strip().removeprefix("$ ")
                    if part.startswith(("tensorpool ", "./dev ")):
                        found.append((f"{doc.relative_to(REPO)}:{first_line + i}", part))
    return found


def _inline_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        prose = _FENCE.sub("", doc.read_text())
        for span in re.findall(r"`([^`\n]+)`", prose):
            if span.startswith("tensorpool "):
                found.append((str(doc.relative_to(REPO)), span))
    return found


FENCED = _fenced_commands()
INLINE = _inline_commands()


def _argv(command: str) -> list[str]:
    argv = shlex.split(command, comments=True)
    while argv and argv[-1] in ("&", "|"):
        argv.pop()
    return argv


def _parse(args: list[str]) -> argparse.Namespace:
    """Parse with the real parser; a parse error becomes an AssertionError with its text."""
    chosen = next((a for a in args if not a.startswith("-")), None)
    parser = _build_parser(chosen if chosen in _COMMANDS else None)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit as exc:
        raise AssertionError(err.getvalue().strip() or f"exit {exc.code}") from None


def _options(parser: argparse.ArgumentParser) -> set[str]:
    names: set[str] = set()
    for action in parser._actions:
        names.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= _options(sub)
    return names


def _dev_commands() -> set[str]:
    text = (REPO / "dev").read_text()
    case = text[text.index('case "$cmd" in') :]
    return set(re.findall(r"^\s+([a-z]+)\)", case, re.M))


def test_docs_have_commands() -> None:
    """The extraction finds the README's tour (a broken extractor must not pass silently)."""
    assert len(FENCED) > 20
    assert any("ratelimiter" in c for _, c in FENCED)


@pytest.mark.parametrize(("where", "command"), FENCED, ids=[w for w, _ in FENCED])
def test_fenced_command_parses(where: str, command: str) -> None:
    """#13.7: every documented command parses with the real parser, as written."""
    argv = _argv(command)
    if argv[0] == "./dev":
        assert argv[1] in _dev_commands(), f"{where}: ./dev has no {argv[1]!r}"
        if argv[1] == "demo":
            _parse(["demo", *argv[2:]])
        return
    assert argv[0] == "tensorpool"
    try:
        _parse(argv[1:])
    except AssertionError as exc:
        raise AssertionError(f"{where}: `{command}`: {exc}") from None
    for arg in argv[1:]:
        if arg.startswith("config/"):
            assert (REPO / arg).is_file(), f"{where}: {arg} does not exist"


@pytest.mark.parametrize(("where", "span"), INLINE, ids=[f"{w}:{s}" for w, s in INLINE])
def test_inline_command_names_real_options(where: str, span: str) -> None:
    """#13.7: inline `tensorpool X --opt` spans name a real subcommand and real options."""
    argv = _argv(span)
    assert argv[1] in _COMMANDS, f"{where}: no subcommand {argv[1]!r} in `{span}`"
    parser = _build_parser(argv[1])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        argv[1]
    ]
    known = _options(sub) | {"-h", "--help"}
    for opt in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
        assert opt in known, f"{where}: `{span}`: tensorpool {argv[1]} has no {opt}"


def _runnable(command: str) -> bool:
    argv = _argv(command)
    return argv[0] == "tensorpool" and ("--hex" in argv or "--check" in argv or "--help" in argv)


RUNNABLE = [(w, c) for w, c in FENCED if _runnable(c)]


@pytest.mark.parametrize(("where", "command"), RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_cheap_commands_run(where: str, command: str) -> None:
    """#13.7: the documented commands that need no running deployment succeed for real."""
    argv = _argv(command)
    done = subprocess.run(
        [sys.executable, "-m", "tensorpool", *argv[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{where}: `{command}`: {done.stderr}"
    assert "Traceback" not in done.stderr


def test_rate_limited_consume_example_uses_the_rate_limiters_descriptor_stream() -> None:
    """#13.7: the README's consume of the rate limiter's destination names the descriptor
    stream id the example rate limiter publishes on (without it: 0 frames)."""
    import tomllib

    rl = tomllib.loads((REPO / "config" / "ratelimiter.example.toml").read_text())
    dest_ids = {m["dest_stream_id"] for m in rl["mappings"]}
    descriptor_id = rl["rate_limiter"]["descriptor_stream_id"]
    checked = 0
    for where, command in FENCED:
        argv = _argv(command)
        if argv[:2] != ["tensorpool", "consume"] or "rate-limited" not in argv:
            continue
        args = _parse(argv[1:])
        if args.stream_id in dest_ids:
            assert args.descriptor_stream_id == descriptor_id, where
            checked += 1
    assert checked
