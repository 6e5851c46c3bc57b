"""#14.1 import layering: imports point downward only (docs/architecture.md, "Layers").

``specs`` <- ``shm`` <- ``client`` <- agents (``driver``, ``ratelimiter``, ``bridge``) and
``spark_source``; ``ingest`` and ``batching`` import nothing of tensorpool's I/O; agents do not
import each other; no module imports itself back through a chain (no cycles). Read statically from
the source (every ``import``, function-level ones included: a lazy import is a dependency too; only
``if TYPE_CHECKING:`` blocks are left out, they never run), so a new module is covered the day it
is added.

Issue #28 point 2: the sans-IO cores (``CORES``) and everything they import, transitively, with
``TYPE_CHECKING`` edges included and a package's ``__init__`` counted for each of its modules
(importing ``shm.uri`` runs ``shm/__init__.py``), reach no Aeron, no socket, no transport layer
(``transport.context``, ``transport.clock``) and no clock module: time is passed in.

Issue #27 point 2: inside ``spark_source`` four layers, options < plan < rings < spark, with
``TYPE_CHECKING`` edges counted; ``plan/`` reaches no pyspark, pyarrow, pyaeron or transport.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorpool

ROOT = Path(tensorpool.__file__).resolve().parent

#: Rank of each top-level part of the package: a module may import only parts of a lower rank,
#: its own part, or a host-agnostic leaf (``LEAVES``). Same-rank parts are peers and must not
#: import each other (two agents, or shm and transport).
RANK: dict[str, int] = {
    "specs": 0,
    # foundation: small pure helpers every layer may use
    "config_util": 1,
    # stream ids from configured ranges and what a hello asks for: driver and producer both
    "stream_ids": 1,
    # the declarative config tables (#26.5): pydantic, imported by the config loaders only
    "config_schema": 1,
    "fsafety": 1,
    "counters": 1,
    # PEP 562 lazy package exports (transport, spark_source): stdlib only
    "lazy": 1,
    "endpoints": 1,
    # SHM and Aeron, side by side
    "shm": 2,
    "transport": 2,
    # CUDA (#20): pinned pools and device copies; imports only the foundation (shm types only
    # under TYPE_CHECKING), so the client may hand a batch to it
    "gpu": 2,
    # the client library: Producer/Consumer/DriverClient and their sans-IO cores
    "client": 3,
    # agents and the Spark source, built on the client
    "driver": 4,
    "ratelimiter": 4,
    "bridge": 4,
    "spark_source": 4,
    # metrics, top and the viewer (#19): readers of everything below, used by the commands
    "observe": 5,
    # `tensorpool serve` (#18): the Spark source's reads served over Arrow Flight; it builds on
    # spark_source (mapped rings, read into Arrow, the protocol in spark_source/rings/remote.py)
    "serve": 5,
    # the command line composes everything
    "commands": 5,
    "cli": 5,
    "__main__": 5,
}
#: Host-agnostic primitives (seed 003 and seed 000; the soak's schedule and ledger, #30): usable
#: from the client up, importing nothing of tensorpool but themselves.
LEAVES = frozenset({"ingest", "batching", "soak"})
#: Ranks whose parts may import each other: the foundation helpers, and the command line.
PEERS_ALLOWED = frozenset({1, 5})
#: Pairs ruled out although the ranks would allow them: the driver is the server its clients
#: talk to, so code both sides need lives below both (``shm``, ``endpoints``), not in ``client``.
FORBIDDEN = {
    ("driver", "client"): "the driver serves the client layer; share code via shm/",
    ("observe", "commands"): "observe is a library the commands use, never the other way",
    ("observe", "cli"): "observe is a library the commands use, never the other way",
    ("serve", "commands"): "serve is a library the serve command uses, never the other way",
    ("serve", "cli"): "serve is a library the serve command uses, never the other way",
}
#: ``pyaeron`` is the transport layer's business (plus the agents and commands that run a media
#: driver or decode raw Aeron fragments); never below it.
NO_AERON = frozenset(
    {
        "specs",
        "shm",
        "client",
        "ingest",
        "batching",
        "soak",
        "config_util",
        "config_schema",
        "endpoints",
    }
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_all(node: ast.AST) -> Iterator[ast.AST]:
    """Every node, ``if TYPE_CHECKING:`` blocks included."""
    return ast.walk(node)


def _walk_runtime(node: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for orelse in child.orelse:
                yield orelse
                yield from _walk_runtime(orelse)
            continue
        yield child
        yield from _walk_runtime(child)


def imports_of(module: str, *, type_checking: bool = False) -> dict[str, int]:
    """The tensorpool modules ``module`` imports, with the line of the first import of each.

    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module, else ``pkg``.
    External packages are reported under their top-level name (``pyaeron``). ``type_checking``:
    count the imports under ``if TYPE_CHECKING:`` too.
    """
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name != module:
            found.setdefault(name, line)

    for node in (_walk_all if type_checking else _walk_runtime)(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tensorpool."):
                    add(alias.name, node.lineno)
                else:
                    add(alias.name.split(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("tensorpool"):
                add(target.split(".")[0], node.lineno)
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(sub if sub in MODULES else target, node.lineno)
    return found


GRAPH: dict[str, dict[str, int]] = {m: imports_of(m) for m in sorted(MODULES)}
#: The same with the ``TYPE_CHECKING`` edges: what a core's source names, run or not.
FULL_GRAPH: dict[str, dict[str, int]] = {
    m: imports_of(m, type_checking=True) for m in sorted(MODULES)
}

#: The sans-IO cores (docs/architecture.md, "How code is shaped"; issue #28 point 2).
CORES = (
    "tensorpool.client.lease",
    "tensorpool.client.producer_core",
    "tensorpool.client.consumer_core",
    "tensorpool.client.progress_core",
    "tensorpool.driver.core",
)
#: What no core may reach, even transitively: Aeron and the transport layer over it (its
#: context, its clock), sockets, and clock modules (a core is handed ``now_ns``). A module
#: name ending in ``.`` stands for every module under it.
CORE_FORBIDDEN = ("pyaeron", "socket", "time", "datetime", "tensorpool.transport.")


def _packages_of(module: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``module``: ``tensorpool.shm`` for
    ``tensorpool.shm.uri``."""
    pieces = module.split(".")
    return [p for p in (".".join(pieces[:i]) for i in range(1, len(pieces))) if p in MODULES]


def reach(root: str, graph: dict[str, dict[str, int]]) -> dict[str, str]:
    """Every module ``root`` imports transitively, each with the module that first imports it
    (breadth first, so the chain back to ``root`` is a shortest one)."""
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        module = todo.pop(0)
        for target in [*graph.get(module, {}), *_packages_of(module)]:
            if target != root and target not in found:
                found[target] = module
                if target in graph:
                    todo.append(target)
    return found


def core_io_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each forbidden module a core reaches, with the chain of imports that reaches it."""
    out: list[str] = []
    for core in CORES:
        found = reach(core, graph)
        for target in sorted(found):
            if not any(
                target == bad or (bad.endswith(".") and target.startswith(bad))
                for bad in CORE_FORBIDDEN
            ):
                continue
            chain = [target]
            while chain[-1] != core:
                chain.append(found[chain[-1]])
            out.append(" <- ".join(chain))
    return out


def part(module: str) -> str:
    """``tensorpool.client.consumer`` -> ``client``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else ""


def layering_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    out: list[str] = []
    for module, targets in graph.items():
        src = part(module)
        if not src:
            continue
        for target, line in targets.items():
            where = f"{module}:{line} imports {target}"
            if target == "pyaeron":
                if src in NO_AERON:
                    out.append(f"{where}: {src} must not touch Aeron")
                continue
            if not target.startswith("tensorpool.") or target not in MODULES:
                continue
            dst = part(target)
            if dst == src:
                continue
            if src in LEAVES:
                out.append(f"{where}: {src} is host-agnostic and imports nothing of tensorpool")
                continue
            if dst in LEAVES:
                if RANK.get(src, 0) < RANK["client"]:
                    out.append(f"{where}: {dst} is for the client layer and above")
                continue
            if (src, dst) in FORBIDDEN:
                out.append(f"{where}: {src} may not import {dst}: {FORBIDDEN[src, dst]}")
                continue
            if src not in RANK or dst not in RANK:
                out.append(f"{where}: {src or dst!r} has no layer: add it to docs/architecture.md")
                continue
            if RANK[dst] > RANK[src] or (RANK[dst] == RANK[src] and RANK[src] not in PEERS_ALLOWED):
                out.append(
                    f"{where}: {src} (layer {RANK[src]}) may not import {dst} (layer {RANK[dst]})"
                )
    return out


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_14_1_every_part_has_a_layer() -> None:
    """#14.1: a new top-level package or module gets a place in the layering (and the docs)."""
    parts = {part(m) for m in MODULES} - {""}
    assert parts <= set(RANK) | LEAVES, sorted(parts - set(RANK) - LEAVES)


def test_14_1_imports_point_downward_only() -> None:
    """#14.1: specs <- shm <- client <- agents and spark_source; agents never import each other
    (the rate limiter does not import ``driver.config``; driver and rate limiter configs take
    their defaults from ``tensorpool.endpoints``, not ``client.settings``); ingest and batching
    import nothing of tensorpool; pyaeron stays out of specs, shm, client and the leaves."""
    assert layering_violations(GRAPH) == []


def test_14_1_no_import_cycles() -> None:
    """#14.1: no chain of imports leads back to its start (spark_source pulse <-> source was
    one: the data source now lives in ``spark_source.datasource``)."""
    assert cycles(GRAPH) == []


@pytest.mark.parametrize(
    ("module", "target", "fragment"),
    [
        ("tensorpool.ratelimiter.config", "tensorpool.driver.config", "may not import driver"),
        ("tensorpool.driver.config", "tensorpool.client.settings", "may not import client"),
        ("tensorpool.shm.ring", "tensorpool.client.settings", "may not import client"),
        ("tensorpool.ingest.buffer", "tensorpool.shm.ring", "host-agnostic"),
        ("tensorpool.batching.batcher", "tensorpool.client.settings", "host-agnostic"),
        ("tensorpool.client.settings", "pyaeron", "must not touch Aeron"),
        ("tensorpool.shm.ring", "tensorpool.transport.channels", "may not import transport"),
    ],
)
def test_14_1_the_checker_sees_a_forbidden_import(module: str, target: str, fragment: str) -> None:
    """#14.1: the rules bite — an import the issue forbids, added to the real graph, is reported
    (so an empty violation list is not the checker seeing nothing)."""
    graph = {m: dict(t) for m, t in GRAPH.items()}
    graph[module][target] = 1
    problems = layering_violations(graph)
    assert any(module in p and fragment in p for p in problems), problems


def test_14_1_the_checker_sees_a_cycle() -> None:
    """#14.1: a lazy import back from ``source`` to ``pulse`` (the cycle that existed) is found."""
    graph = {m: dict(t) for m, t in GRAPH.items()}
    graph["tensorpool.spark_source.spark.source"]["tensorpool.spark_source.spark.pulse"] = 1
    assert any("tensorpool.spark_source.spark.pulse" in c for c in cycles(graph))


def test_28_2_cores_reach_no_io_transitively() -> None:
    """#28 point 2: LeaseMachine (client/lease.py), ProducerCore, ConsumerCore and the
    DriverCore, with every module they import (``TYPE_CHECKING`` edges and package
    ``__init__`` files included), reach no pyaeron, socket, transport layer or clock module.
    On the code before #28 the cores reached pyaeron through client/driver_client.py ->
    transport/context.py, and a clock through announce.py's ``time.time_ns`` default."""
    assert core_io_violations(FULL_GRAPH) == []


@pytest.mark.parametrize(
    ("module", "target"),
    [
        # a type-only import of the Aeron context two hops below a core
        ("tensorpool.client.announce", "tensorpool.transport.context"),
        ("tensorpool.shm.uri", "pyaeron"),  # through the shm package a core imports
        ("tensorpool.client.rate_gate", "time"),
        ("tensorpool.driver.leases", "socket"),
    ],
)
def test_28_2_the_core_checker_sees_an_indirect_import(module: str, target: str) -> None:
    """#28 point 2: the transitive check bites: an import of I/O added anywhere below a core
    is reported with the chain that reaches it."""
    graph = {m: dict(t) for m, t in FULL_GRAPH.items()}
    graph[module][target] = 1
    problems = core_io_violations(graph)
    assert any(p.startswith(f"{target} <- {module} <- ") for p in problems), problems


def test_28_2_the_full_graph_keeps_type_checking_edges() -> None:
    """#28 point 2: the core check reads ``if TYPE_CHECKING:`` imports, which the layering
    rules above leave out (gpu names shm types only for the type checker)."""
    assert "tensorpool.shm.batch" not in GRAPH["tensorpool.gpu.delivery"]
    assert "tensorpool.shm.batch" in FULL_GRAPH["tensorpool.gpu.delivery"]


# --- #27 point 2: the Spark source's four layers ------------------------------------------------
SPARK = "tensorpool.spark_source"
#: Rank of each part of ``spark_source`` (the name after ``spark_source.``): options < plan <
#: rings < spark. A module imports its own part or a lower one; options-layer modules are peers.
#: ``options`` is the ``options/`` package (its modules are peers).
SPARK_RANK: dict[str, int] = {
    "options": 0,
    "convert": 0,
    "plan": 1,
    "rings": 2,
    "spark": 3,
}
#: What planning never reaches, even transitively (package ``__init__`` files and
#: ``TYPE_CHECKING`` edges included): it decides from ring states, it does no I/O.
PLAN_FORBIDDEN = ("pyspark", "pyarrow", "pyaeron", "tensorpool.transport.")


def spark_part(module: str) -> str:
    """``tensorpool.spark_source.plan.offsets`` -> ``plan``; the package itself -> ``""``."""
    pieces = module.split(".")
    return pieces[2] if len(pieces) > 2 and pieces[1] == "spark_source" else ""


def spark_layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import inside ``spark_source`` that points up (or into the package facade)."""
    out: list[str] = []
    for module, targets in graph.items():
        if not module.startswith(SPARK + "."):
            continue
        src = spark_part(module)
        for target, line in targets.items():
            if target != SPARK and not target.startswith(SPARK + "."):
                continue
            where = f"{module}:{line} imports {target}"
            dst = spark_part(target)
            if not dst:
                out.append(f"{where}: import from the defining module, not the package facade")
            elif src not in SPARK_RANK or dst not in SPARK_RANK:
                out.append(f"{where}: {src if src not in SPARK_RANK else dst!r} has no layer")
            elif SPARK_RANK[dst] > SPARK_RANK[src]:
                out.append(f"{where}: {src} (layer {SPARK_RANK[src]}) may not import {dst}")
    return out


def plan_io_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    out: list[str] = []
    for root in sorted(m for m in MODULES if spark_part(m) == "plan"):
        found = reach(root, graph)
        for target in sorted(found):
            if not any(
                target == bad or (bad.endswith(".") and target.startswith(bad))
                for bad in PLAN_FORBIDDEN
            ):
                continue
            chain = [target]
            while chain[-1] != root:
                chain.append(found[chain[-1]])
            out.append(" <- ".join(chain))
    return out


def test_27_2_spark_source_modules_have_a_layer() -> None:
    """#27.2: every module of ``spark_source`` is in one of the four layers."""
    parts = {spark_part(m) for m in MODULES if m.startswith(SPARK + ".")}
    assert parts <= set(SPARK_RANK), sorted(parts - set(SPARK_RANK))


def test_27_2_spark_source_layers_point_downward() -> None:
    """#27.2: options < plan < rings < spark, ``TYPE_CHECKING`` imports counted (a type named
    from a higher layer ties the lower one to it as much as a runtime import). On the flat
    package ``options.py`` imported ``remote.py`` (a rings module) for the ``hosts`` types."""
    assert spark_layer_violations(FULL_GRAPH) == []


def test_27_2_spark_source_has_no_cycle_even_for_the_type_checker() -> None:
    """#27.2: the options <-> remote cycle (one side under ``TYPE_CHECKING``) is gone."""
    inner = {m: t for m, t in FULL_GRAPH.items() if m.startswith(SPARK + ".")}
    assert cycles(inner) == []


def test_27_2_plan_reaches_no_spark_arrow_aeron_or_transport() -> None:
    """#27.2: ``plan/`` and everything it imports (``TYPE_CHECKING`` edges and package
    ``__init__`` files included) reach no pyspark, pyarrow, pyaeron or transport module. The
    package ``__init__`` imports nothing eagerly so that importing ``plan.offsets`` does not
    load ``convert`` (pyarrow) or ``options`` (transport config)."""
    assert plan_io_violations(FULL_GRAPH) == []


@pytest.mark.parametrize(
    ("module", "target", "fragment"),
    [
        (
            "tensorpool.spark_source.plan.policy",
            "tensorpool.spark_source.rings.mapped_rings",
            "layer 1",
        ),
        ("tensorpool.spark_source.rings.remote", "tensorpool.spark_source.spark.source", "layer 2"),
        ("tensorpool.spark_source.options", "tensorpool.spark_source.rings.remote", "layer 0"),
        ("tensorpool.spark_source.spark.source", "tensorpool.spark_source", "package facade"),
    ],
)
def test_27_2_the_spark_layer_checker_sees_an_upward_import(
    module: str, target: str, fragment: str
) -> None:
    """#27.2: the sub-layer rule bites (an empty list is not the checker seeing nothing)."""
    graph = {m: dict(t) for m, t in FULL_GRAPH.items()}
    graph[module][target] = 1
    problems = spark_layer_violations(graph)
    assert any(module in p and fragment in p for p in problems), problems


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("tensorpool.spark_source.plan.offsets", "pyarrow"),
        ("tensorpool.spark_source.options.policy", "tensorpool.transport.config"),  # via policy
        ("tensorpool.spark_source", "pyspark"),  # the package __init__ runs first
    ],
)
def test_27_2_the_plan_checker_sees_an_indirect_import(module: str, target: str) -> None:
    """#27.2: an I/O import anywhere below ``plan/`` is reported with its chain."""
    graph = {m: dict(t) for m, t in FULL_GRAPH.items()}
    graph[module][target] = 1
    problems = plan_io_violations(graph)
    assert any(p.startswith(f"{target} <- {module} <- ") for p in problems), problems


def test_27_2_type_checking_edges_are_counted() -> None:
    """#27.2: the sub-layer checks read ``if TYPE_CHECKING:`` imports: ``rings.remote`` names
    ``SourceOptions`` and ``hosts``' ``RemoteHosts`` only for the type checker, and that edge
    is in the graph they walk."""
    remote, options = "tensorpool.spark_source.rings.remote", "tensorpool.spark_source.options"
    assert options not in GRAPH[remote]
    assert options in FULL_GRAPH[remote]
    graph = {m: dict(t) for m, t in FULL_GRAPH.items()}
    graph[options][remote] = graph[remote][options]  # the cycle the flat package had
    assert any(remote in c and options in c for c in cycles(graph))


def test_27_2_package_map_names_every_module() -> None:
    """#27.2: ``spark_source/__init__.py``'s module map names every module of the package (it
    named 11 of 27 when the package was flat)."""
    doc = (ROOT / "spark_source" / "__init__.py").read_text()
    missing = [
        m
        for m in sorted(MODULES)
        if m.startswith(SPARK + ".") and f":mod:`.{m[len(SPARK) + 1 :]}`" not in doc
    ]
    assert missing == []


#: The rings' implementations behind the port: the adapters never pick one (#27.2).
RING_IMPLEMENTATIONS = (f"{SPARK}.rings.local", f"{SPARK}.rings.remote")


def adapter_branch_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a ring implementation from ``spark/`` (``TYPE_CHECKING`` edges counted)."""
    return [
        f"{module}:{line} imports {target}: talk to rings.port's RingSource instead"
        for module, targets in graph.items()
        if spark_part(module) == "spark"
        for target, line in targets.items()
        if target in RING_IMPLEMENTATIONS
    ]


def test_27_2_spark_adapters_reach_the_rings_only_through_the_port() -> None:
    """#27.2: the pyspark adapters (the readers, pulse included, the sink and the publisher)
    import neither the local nor the Flight ring implementation: ``rings.port`` picks one per
    query, so ``spark/`` holds no local/remote branch. Before #27.2's last step the pulse
    reader imported ``rings.local`` to scan the attachment itself."""
    assert adapter_branch_violations(FULL_GRAPH) == []


@pytest.mark.parametrize("target", RING_IMPLEMENTATIONS)
def test_27_2_the_adapter_checker_sees_an_implementation_import(target: str) -> None:
    graph = {m: dict(t) for m, t in FULL_GRAPH.items()}
    graph[f"{SPARK}.spark.pulse"][target] = 1
    problems = adapter_branch_violations(graph)
    assert any(f"{SPARK}.spark.pulse:1 imports {target}" in p for p in problems), problems
