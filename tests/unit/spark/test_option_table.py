"""#27.2 the option table: docs/spark.md agrees with it, option names and the option error live
only in ``spark_source/options/``, and the generic parser enforces what each row states.

Each checker is also run on a broken input (a docs table with a row missing, a module that
looks an option up by name, ...) to show it sees the break.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tensorpool
from tensorpool.spark_source.options import TensorPoolOptionError, parse_source_options, rules
from tensorpool.spark_source.options.parse import value
from tensorpool.spark_source.options.table import (
    BATCH,
    BOOL,
    CHOICE,
    DURATION,
    FLOAT,
    INT,
    PULSE,
    READING,
    STREAM_SCOPED,
    STREAMING,
    TEXT,
    WRITING,
    Opt,
)

ROOT = Path(tensorpool.__file__).resolve().parent
SPARK = ROOT / "spark_source"
OPTIONS = SPARK / "options"
DOCS = ROOT.parent / "docs" / "spark.md"
#: option names that are also field names of the serve protocol's JSON, the spool's messages
#: and the publisher's config ("stream", "streams", "driver"): as literals they are those fields
WIRE_WORDS = frozenset({"stream", "streams", "driver"})


# --- docs/spark.md --------------------------------------------------------------------------
def _slug(heading: str, seen: dict[str, int]) -> str:
    """GitHub's anchor of a heading (repeats get -1, -2, ...)."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else f"{slug}-{n}"


def doc_tables(text: str) -> dict[str, list[tuple[list[str], str]]]:
    """Anchor -> rows ``(names in the first column, default cell)`` of its option tables."""
    out: dict[str, list[tuple[list[str], str]]] = {}
    seen: dict[str, int] = {}
    anchor = ""
    in_table = False
    for line in text.splitlines():
        if line.startswith("#"):
            anchor = _slug(line.lstrip("#"), seen)
            in_table = False
        elif line.startswith("| option | default |"):
            in_table = True
        elif in_table and line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0].startswith("---"):
                continue
            out.setdefault(anchor, []).append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
        else:
            in_table = False
    return out


def _doc_default_problem(opt: Opt, cell: str) -> str | None:
    row = opt.row
    if cell == "as above":
        return None
    if row.default_doc:
        ok = row.default_doc in cell
    elif cell == "required":
        ok = bool(row.required)
    elif cell.startswith("none"):
        ok = row.default is None and not row.required
    else:
        literal = re.match(r"`([^`]+)`", cell)
        if literal is None:
            return f"{opt.name}: docs default {cell!r} is not a literal; give the row a default_doc"
        text = literal.group(1)
        ok = (text if row.kind == STREAM_SCOPED else value(opt, text)) == row.default
    return None if ok else f"{opt.name}: docs say default {cell!r}, the table {row.default!r}"


def docs_problems(text: str) -> list[str]:
    """What differs between the docs' option tables and :class:`Opt`."""
    tables = doc_tables(text)
    problems: list[str] = []
    documented: dict[tuple[str, str], str] = {}  # (anchor, name) -> default cell
    for anchor, rows in tables.items():
        for names, cell in rows:
            split = cell.split(" / ") if len(names) > 1 and " / " in cell else [cell] * len(names)
            for name, default in zip(names, split, strict=False):
                base = name.split("=")[0]
                if base not in Opt.__members__:
                    problems.append(f"{anchor}: documents {base!r}, which is not in the table")
                    continue
                if "=" not in name:
                    documented[(anchor, base)] = default
    for opt in Opt:
        anchors = set()
        if "source" in opt.row.scope:
            anchors.add(opt.row.anchor if opt.row.anchor != WRITING else READING)
        if "sink" in opt.row.scope:
            anchors.add(WRITING)
        for anchor in anchors:
            if (anchor, opt.name) not in documented:
                problems.append(f"{opt.name}: not documented in the #{anchor} table")
            else:
                problem = _doc_default_problem(opt, documented[(anchor, opt.name)])
                if problem is not None:
                    problems.append(problem)
    for anchor, name in documented:
        opt = Opt[name]
        if anchor == WRITING and "sink" not in opt.row.scope:
            problems.append(f"{name}: documented for the sink, but it is a source option")
        if anchor in (READING, PULSE) and "source" not in opt.row.scope:
            problems.append(f"{name}: documented for the source, but it is a sink option")
    return problems


def test_27_2_docs_option_tables_match_the_code_table() -> None:
    """#27.2: every row of the table is documented in docs/spark.md under its anchor, nothing
    documented is missing from the table, and the defaults the docs state are the table's
    (read with the row's own parser, so a type mismatch shows too)."""
    assert docs_problems(DOCS.read_text()) == []


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("| `maxLagMs` | none |", "| `maxLagMsX` | none |", "'maxLagMsX', which is not"),
        ("| `maxLagMs` | none |", "| `x` | none |", "maxLagMs: not documented"),
        ("| `freshnessMs` | `3000` |", "| `freshnessMs` | `300` |", "freshnessMs: docs say"),
        ("| `batchLengthS` | `1.0` |", "| `batchLengthS` | `true` |", "batchLengthS: must be"),
        ("| `headerNslots` | `1024` |", "| `freshnessMs` | `3000` |", "documented for the sink"),
    ],
)
def test_27_2_the_docs_checker_sees_drift(old: str, new: str, fragment: str) -> None:
    text = DOCS.read_text()
    assert old in text
    try:
        problems = docs_problems(text.replace(old, new))
    except TensorPoolOptionError as exc:  # a documented default the row's parser refuses
        problems = [str(exc)]
    assert any(fragment in p for p in problems), problems


# --- option names and the option error outside options/ --------------------------------------
def _outside_options() -> list[Path]:
    return [p for p in sorted(SPARK.rglob("*.py")) if OPTIONS not in p.parents]


def name_literals(source: str) -> list[str]:
    """String constants of ``source`` that spell an option name (any case, as Spark passes
    them lower-cased), other than the wire words."""
    names = {o.name.lower() for o in Opt} - WIRE_WORDS
    return [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lower() in names
    ]


def test_27_2_option_names_are_string_literals_only_under_options() -> None:
    """#27.2: code outside ``spark_source/options/`` names an option as ``Opt.<name>`` and
    reads the parsed objects; no string constant there equals an option name."""
    found = {str(p.relative_to(SPARK)): name_literals(p.read_text()) for p in _outside_options()}
    assert {k: v for k, v in found.items() if v} == {}


def test_27_2_the_name_scan_sees_a_lookup_by_name() -> None:
    assert name_literals('x = opts.get("maxFramesPerTrigger")') == ["maxFramesPerTrigger"]
    assert name_literals('raw = options["maxframespertrigger"]') == ["maxframespertrigger"]
    assert name_literals('doc["stream"]') == []  # a wire field


def option_error_uses(source: str) -> list[int]:
    """Lines of ``source`` that construct :class:`TensorPoolOptionError` (raise or call)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "TensorPoolOptionError"
    ]


def test_27_2_the_option_error_is_raised_only_from_options() -> None:
    """#27.2: one error, raised from one package: code elsewhere calls ``reject(option, why)``,
    so every message has the shape ``"<option>: <rule>"``."""
    found = {
        str(p.relative_to(SPARK)): option_error_uses(p.read_text()) for p in _outside_options()
    }
    assert {k: v for k, v in found.items() if v} == {}
    assert option_error_uses("raise TensorPoolOptionError('x: y')") == [1]


def spark_imports(path: Path) -> set[str]:
    """Every ``tensorpool.spark_source`` module ``path`` imports: lazy and ``TYPE_CHECKING``
    imports included (a cycle through a type-only import is still a cycle for readers)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("tensorpool.spark_source")}


def test_27_2_options_import_nothing_of_the_package_above_them() -> None:
    """#27.2: ``options/`` imports only itself from ``spark_source``, so no module it serves
    (``remote`` was one: ``options`` <-> ``remote`` was the package's only cycle) can be on a
    cycle with it."""
    above = {
        str(p.relative_to(OPTIONS)): sorted(
            m
            for m in spark_imports(p)
            if m != "tensorpool.spark_source"
            and not m.startswith("tensorpool.spark_source.options")
        )
        for p in OPTIONS.glob("*.py")
    }
    assert {k: v for k, v in above.items() if v} == {}


# --- the generic parser enforces each row -----------------------------------------------------
def _valid(opt: Opt) -> str:
    """A value ``opt``'s row accepts on its own."""
    row = opt.row
    if row.kind == INT:
        return str(row.default if row.default is not None else int(row.lo))
    if row.kind == FLOAT:
        return str(row.default if row.default is not None else row.hi)
    if row.kind == CHOICE:
        return row.choices[-1]
    if row.kind in (BOOL, DURATION):
        return {BOOL: "true", DURATION: "10s"}[row.kind]
    return {
        Opt.gatedStreams: "1",
        Opt.flightToken: "t",
        Opt.flightTlsRootCerts: __file__,
        Opt.maxBytesPerTrigger: "1000",
        Opt.endingOffsets: "latest",
        Opt.startingOffsetsByTimestamp: '{"1": -1}',
        Opt.endingOffsetsByTimestamp: '{"1": -1}',
    }[opt]


def _with(condition: str) -> dict[str, str]:
    """Options that make ``condition`` (a row's ``requires``) hold."""
    name, _, want = condition.partition("=")
    if name == Opt.hosts.name:
        return {name: "h:1", Opt.streams.name: "h/1"}
    return {name: want or _valid(Opt[name])}


def _source(**opts: str) -> dict[str, str]:
    return {"streams": "1", **opts}


ROWS = [o for o in Opt if ("source" in o.row.scope and o.row.kind != TEXT) or o is Opt.gatedStreams]


@pytest.mark.parametrize("opt", [o for o in ROWS if o.row.kind == INT], ids=str)
def test_27_2_each_int_row_rejects_values_outside_its_bounds(opt: Opt) -> None:
    """#27.2: the bounds of the row are what the parser enforces, one message for all."""
    for bad in (int(opt.row.lo) - 1, int(opt.row.hi) + 1):
        with pytest.raises(TensorPoolOptionError, match=rf"^{opt.name}: must be in "):
            value(opt, str(bad))
    assert value(opt, _valid(opt)) == int(_valid(opt))


@pytest.mark.parametrize("opt", [o for o in Opt if o.row.requires], ids=str)
def test_27_2_each_row_that_requires_another_fails_without_it(opt: Opt) -> None:
    """#27.2 (requires): e.g. ``maxBurstFrames`` alone says it needs ``maxFramesPerSecond``;
    with the requirement given the same value is accepted."""
    alone = _source(**{opt.name: _valid(opt)})
    with pytest.raises(TensorPoolOptionError, match=rf"^{opt.name}: only applies with "):
        parse_source_options(alone, streaming=True)
    parse_source_options({**alone, **_with(opt.row.requires[0])}, streaming=True)


@pytest.mark.parametrize("opt", [o for o in ROWS if o.row.mode != "any"], ids=str)
def test_27_2_each_batch_or_streaming_row_is_refused_by_the_other_kind(opt: Opt) -> None:
    """#27.2 (scope batch/streaming): e.g. ``endingOffsets`` in a streaming read."""
    opts = _source(**{opt.name: _valid(opt)})
    for condition in opt.row.requires[:1]:
        opts.update(_with(condition))
    kind = "streaming" if opt.row.mode == STREAMING else "batch"
    with pytest.raises(TensorPoolOptionError, match=rf"^\w+: is for {kind} queries"):
        parse_source_options(opts, streaming=opt.row.mode == BATCH)


@pytest.mark.parametrize("opt", [o for o in ROWS if o.row.local_only], ids=str)
def test_27_2_each_local_only_row_is_refused_with_hosts(opt: Opt) -> None:
    """#27.2 (scope local/remote): options that need the Spark driver host's SHM or Aeron."""
    raw = "pulse" if opt is Opt.batching else _valid(opt)
    opts = {"streams": "h/1", "hosts": "h:1", opt.name: raw}
    with pytest.raises(TensorPoolOptionError, match=rf"^{opt.name}: is not available with 'hosts'"):
        parse_source_options(opts, streaming=opt.row.mode != BATCH)


@pytest.mark.parametrize("opt", [o for o in ROWS if o.row.excludes], ids=str)
def test_27_2_each_row_excluded_by_pulse_is_refused_with_it(opt: Opt) -> None:
    """#27.2 (excludes): e.g. ``maxFramesPerTrigger`` with ``batching=pulse``."""
    opts = _source(**{opt.name: _valid(opt)}, batching="pulse")
    named = [opt.name]
    for condition in opt.row.requires[:1]:  # a required row may be refused first
        opts.update(_with(condition))
        named.append(condition.partition("=")[0])
    with pytest.raises(TensorPoolOptionError, match=rf"^({'|'.join(named)}): cannot be combined "):
        parse_source_options(opts, streaming=True)


#: one query per cross-option rule that breaks it, and the start of the message it gets
RULE_CASES = {
    rules.pulse_lists_streams: (
        {"streams": "*", "batching": "pulse"},
        True,
        "streams: '*' and ranges cannot be combined with batching=pulse",
    ),
    rules.pulse_is_streaming: (
        {"batching": "pulse"},
        False,
        "batching: 'pulse' is for streaming queries",
    ),
    rules.gated_streams_are_read: (
        {"batching": "pulse", "gatedStreams": "2"},
        True,
        "gatedStreams: stream(s) [2] are not in streams [1]",
    ),
    rules.min_frames_fit: (
        {"minFramesPerTrigger": "10", "maxFramesPerTrigger": "5"},
        True,
        "minFramesPerTrigger: 10 exceeds maxFramesPerTrigger 5",
    ),
    rules.stream_metadata_not_pulse: (
        {"includeStreamMetadata": "true", "batching": "pulse"},
        True,
        "includeStreamMetadata: cannot be combined with batching=pulse",
    ),
    rules.auto_bytes_is_streaming: (
        {"maxBytesPerTrigger": "auto"},
        False,
        "maxBytesPerTrigger: is for streaming queries",
    ),
    rules.target_sizes_itself: (
        {"targetBatchLatencyMs": "500", "maxBytesPerTrigger": "1000"},
        True,
        "targetBatchLatencyMs: sizes batches itself",
    ),
    rules.emergency_above_high_water: (
        {"maxBytesPerTrigger": "auto", "memoryHighWater": "0.9", "memoryEmergency": "0.9"},
        True,
        "memoryEmergency: must be above memoryHighWater (0.9)",
    ),
    rules.descriptors_apart_from_control: (
        {"descriptorChannel": "aeron:ipc?term-length=4m", "descriptorStreamId": "1000"},
        True,
        "descriptorStreamId: must differ from controlStreamId",
    ),
}


def test_27_2_every_cross_option_rule_has_a_case() -> None:
    assert set(RULE_CASES) == set(rules.RULES)


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda r: r.__name__)
def test_27_2_each_cross_option_rule_refuses_its_case(rule) -> None:
    """#27.2: the list of rules between options; each names the option and the rule."""
    opts, streaming, message = RULE_CASES[rule]
    with pytest.raises(TensorPoolOptionError, match="^" + re.escape(message)):
        parse_source_options(_source(**opts), streaming=streaming)


def test_27_2_every_condition_in_the_table_names_a_row_and_a_value_it_takes() -> None:
    """#27.2: ``requires``/``excludes`` are written as ``name`` or ``name=value``; a typo
    there would only show when a query gives the option."""
    for opt in Opt:
        for condition in (*opt.row.requires, *opt.row.excludes):
            name, _, want = condition.partition("=")
            assert name in Opt.__members__, (opt.name, condition)
            if want:
                value(Opt[name], want)
