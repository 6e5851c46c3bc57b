"""#26.7: one command-line vocabulary. The same concept has the same flag in every command
(``VOCABULARY`` in tensorpool/commands/_common.py, declared once); an old spelling still works,
hidden from ``--help``, with a one-line deprecation notice on stderr."""

from __future__ import annotations

import argparse
import re

import pytest

from tensorpool.cli import _COMMANDS, _build_parser
from tensorpool.commands._common import VOCABULARY


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's (and sub-command's) parser, by name."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, sp in action.choices.items():
                    walk(sp, f"{name} {sub}")

    for command in _COMMANDS:
        root = _build_parser(command)
        sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
        walk(sub.choices[command], command)
    return out


PARSERS = _parsers()


def test_26_7_every_spelling_of_a_shared_concept_is_the_tables() -> None:
    """A flag that names a shared concept (report interval, idle park, metrics bind, Aeron
    directory, attach timeout) is that concept's one spelling, or one of its declared old
    spellings kept as a hidden alias."""
    wrong = []
    for name, parser in PARSERS.items():
        for action in parser._actions:
            for flag in action.option_strings:
                for concept, (new, old, pattern) in VOCABULARY.items():
                    if not re.search(pattern, flag):
                        continue
                    if flag == new:
                        assert action.dest == concept, (name, flag, action.dest)
                    elif flag in old:
                        assert action.help == argparse.SUPPRESS, (name, flag)
                        assert action.dest == concept, (name, flag)
                    else:
                        wrong.append(f"{name}: {flag} (use {new})")
    assert not wrong, wrong


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["bridge", "--config", "x.toml", "--status-interval", "0.5"], "report_interval", 0.5),
        (["bridge", "--config", "x.toml", "--max-park-us", "50"], "idle_max_park_us", 50),
        (["ratelimiter", "--stats-interval", "2"], "report_interval", 2.0),
        (["top", "--interval", "0.25"], "report_interval", 0.25),
        (["mediadriver", "--dir", "/dev/shm/x"], "aeron_dir", "/dev/shm/x"),
    ],
)
def test_26_7_old_spellings_still_work_with_one_deprecation_line(
    argv: list[str], dest: str, value: object, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _build_parser(argv[0]).parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err.strip().splitlines()
    new = VOCABULARY[dest][0]
    assert len(err) == 1 and "deprecated" in err[0] and new in err[0], err


@pytest.mark.parametrize("command", ["bridge", "ratelimiter", "top", "mediadriver"])
def test_26_7_new_spellings_parse_without_a_notice(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = PARSERS[command]
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    argv = [command]
    for concept, (new, _, _) in VOCABULARY.items():
        if flags.get(concept) == new and concept in ("report_interval", "idle_max_park_us"):
            argv += [new, "1"]
    if command == "mediadriver":
        argv += ["--aeron-dir", "/dev/shm/x"]
    _build_parser(command).parse_args(argv)
    assert capsys.readouterr().err == ""
