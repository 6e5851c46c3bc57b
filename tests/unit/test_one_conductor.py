"""#28.1: one Aeron client and one conductor per process, checked in the source.

A component that builds an ``AeronContext`` of its own gives its process a second Aeron client,
and one that decodes the control plane itself decodes every message again. This test reads the
source (no process started) and fails when

* ``AeronContext(...)`` is constructed outside the places that make a process's one context:
  the context factory (``transport/context.py: shared_context``) and the entry points of
  processes (CLI commands, the SHM driver daemon); everything else is handed a context or asks
  ``shared_context`` for the process's one (the Spark source, the bridge app, the sink
  publisher did build their own: up to four more clients in a Spark process), or
* a module decodes control-plane messages (``decode_any``/``peek_header``) other than the
  client conductor, the SHM driver (the server side of the control stream) and the listed
  diagnostic tools and byte translators.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorpool

ROOT = Path(tensorpool.__file__).resolve().parent

#: module -> why it may construct an AeronContext
CONTEXT_MAKERS: dict[str, str] = {
    "transport/context.py": "the factory: shared_context makes the process's one context",
    "commands/_common.py": "start_context: the CLI commands' entry point",
    "commands/ratelimiter.py": "the rate limiter process's entry point",
    "commands/top.py": "the top process's entry point",
    "driver/daemon.py": "the SHM driver process's entry point",
}

#: module -> why it may decode control-plane messages itself
DECODERS: dict[str, str] = {
    "client/conductor.py": "the conductor: decodes each message once for the whole process",
    "driver/agent.py": "the SHM driver: the server side of the control stream",
    "commands/tap.py": "diagnostic: prints every message of a stream",
    "commands/top.py": "diagnostic: its own process and client",
    "commands/driver.py": "the driver command's shutdown request and its reply",
    "ratelimiter/forward.py": "sans-IO: re-encodes the bytes of messages the conductor decoded",
    "spark_source/rings/stream_meta.py": "MetaTracker.on_message: bytes in, for the unit tests",
}


def _modules() -> list[tuple[str, ast.AST]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("specs/"):  # the codecs themselves
            continue
        out.append((rel, ast.parse(path.read_text(), rel)))
    return out


def _called(tree: ast.AST, names: set[str]) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in names:
                return True
    return False


def test_28_1_aeron_contexts_are_made_only_by_the_factory_and_process_entry_points() -> None:
    makers = {rel for rel, tree in _modules() if _called(tree, {"AeronContext"})}
    assert makers - set(CONTEXT_MAKERS) == set(), (
        "these modules build an AeronContext of their own (a second Aeron client in the "
        "process): take the one handed in, or transport.context.shared_context"
    )
    assert set(CONTEXT_MAKERS) <= makers, "stale entries in CONTEXT_MAKERS"


def test_28_1_control_messages_are_decoded_by_the_conductor_only() -> None:
    decoders = {rel for rel, tree in _modules() if _called(tree, {"decode_any", "peek_header"})}
    assert decoders - set(DECODERS) == set(), (
        "these modules decode control-plane messages themselves: take them decoded from the "
        "context's ContextConductor (an Inbox or a Tap)"
    )
    assert set(DECODERS) <= decoders, "stale entries in DECODERS"
