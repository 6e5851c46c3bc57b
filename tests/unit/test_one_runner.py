"""#26.1: every long-running process runs its agents under the one runner.

The runner (``tensorpool.transport.agent.AgentRunner``, for commands through
``commands/_common.run_agent``) owns the duty-cycle services: media-driver liveness and
reconnection, idling, stop signals, the parent watch, reports, health and metrics. A daemon with
a loop of its own silently goes without them -- which is how the SHM driver came to never
reconnect to a restarted media driver. This test reads the source (no process started) and fails
when

* a CLI command is neither classified as long-running nor as short-lived (a new command must
  say which it is), or
* a module that runs a long-running process has a duty-cycle loop of its own: a ``while`` loop
  that sleeps, idles, or waits on a stop flag (``.requested``, ``.is_set()``), outside the short
  bounded waits listed in ``BOUNDED_WAITS``, or
* anything but the runner calls ``AeronContext.maintain()``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorpool
from tensorpool.cli import _COMMANDS as COMMANDS

ROOT = Path(tensorpool.__file__).resolve().parent

#: CLI commands that run until stopped, and the modules their duty cycles live in.
LONG_RUNNING: dict[str, tuple[str, ...]] = {
    "driver": ("commands/driver.py", "driver/daemon.py"),
    "ratelimiter": ("commands/ratelimiter.py",),
    "bridge": ("commands/bridge.py", "bridge/app.py"),
    "serve": ("commands/serve.py", "spark_source/rings/attach.py"),
    "produce": ("commands/produce.py",),
    "consume": ("commands/consume.py",),
    "view": ("commands/view.py",),
    "top": ("commands/top.py",),
    "tap": ("commands/tap.py",),
    "mediadriver": ("commands/mediadriver.py", "transport/mediadriver.py"),
}
#: Commands that do one thing and exit (or supervise other commands' processes).
SHORT_LIVED: dict[str, str] = {
    "inspect": "reads a region once and exits",
    "demo": "starts the other commands as processes and waits on Spark's awaitTermination",
    "soak": "supervises the other commands as processes for --duration (no Aeron context)",
}
#: Background processes that are not CLI commands: the Spark source's keepers and publisher.
OTHER_PROCESSES = (
    "spark_source/rings/attach.py",
    "spark_source/rings/probe.py",
    "spark_source/rings/lifecycle.py",
    "spark_source/spark/publisher.py",
)
#: (module, function): bounded waits with a deadline, not duty cycles.
BOUNDED_WAITS = {
    ("commands/driver.py", "_shutdown"): "waits (deadline) for the driver's shutdown reply",
    ("spark_source/rings/attach.py", "wait_for_layouts"): "a plan waits (deadline) for layouts",
    ("spark_source/rings/probe.py", "wait_for_layouts"): "a plan waits (deadline) for layouts",
    ("spark_source/rings/probe.py", "announced"): "a plan listens for the rest of a window",
    ("transport/mediadriver.py", "start_media_driver_after_crash"): "bounded takeover wait",
    ("transport/mediadriver.py", "wait_until_active"): "bounded start-up wait",
}


def _functions(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """Every (innermost function name, while-node) pair of a module."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = func
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if isinstance(child, ast.While):
                out.append((name, child))
            visit(child, name)

    visit(tree, "<module>")
    return out


def _is_duty_cycle(loop: ast.While) -> bool:
    for node in ast.walk(loop):
        if isinstance(node, ast.Attribute) and node.attr in ("requested", "is_set", "idle"):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("sleep", "wait"):
                return True
    return False


def _loops_outside_runner(rel: str) -> list[str]:
    tree = ast.parse((ROOT / rel).read_text())
    return [
        f"{rel}:{loop.lineno} in {func}()"
        for func, loop in _functions(tree)
        if isinstance(loop, ast.While) and _is_duty_cycle(loop) and (rel, func) not in BOUNDED_WAITS
    ]


def test_26_1_every_cli_command_is_classified() -> None:
    assert set(COMMANDS) == set(LONG_RUNNING) | set(SHORT_LIVED), (
        "classify each command as LONG_RUNNING (and name its modules) or SHORT_LIVED"
    )
    assert not set(LONG_RUNNING) & set(SHORT_LIVED)


def test_26_1_no_long_running_process_runs_a_loop_of_its_own() -> None:
    modules = sorted({m for ms in LONG_RUNNING.values() for m in ms} | set(OTHER_PROCESSES))
    found = [hit for rel in modules for hit in _loops_outside_runner(rel)]
    assert not found, "duty-cycle loops outside the runner (use AgentRunner / run_agent):\n" + (
        "\n".join(found)
    )


def test_26_1_only_the_runner_calls_maintain() -> None:
    callers = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "maintain"
            ):
                callers.append(f"{rel}:{node.lineno}")
    allowed = {
        "transport/agent.py",
        # the client library's own keepalive path, for a Producer/Consumer used in a script
        # without a runner (under a runner the second call in a cycle returns at once)
        "client/conductor.py",
    }
    assert all(c.split(":")[0] in allowed for c in callers), callers
