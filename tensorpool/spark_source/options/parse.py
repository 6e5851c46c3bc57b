"""The generic parser: walks :class:`~.table.Opt` for whatever options Spark hands over.

Steps, each failing with the first broken option in table order: names (unknown options are
errors: a typo such as ``maxFramePerTrigger`` would otherwise silently disable admission
control), required options, every given value by its row's kind and bounds, the rows' scope
(hosts, requires, batch/streaming, excludes). :mod:`.build` then runs the cross-option
:data:`.rules.RULES` and builds the frozen objects of :mod:`.values` from the typed values.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tensorpool.spark_source.options import fields
from tensorpool.spark_source.options.errors import reject
from tensorpool.spark_source.options.policy import (
    AUTO,
)
from tensorpool.spark_source.options.table import (
    BATCH,
    BOOL,
    BYTES,
    CHOICE,
    DURATION,
    FLOAT,
    INT,
    STREAMING,
    TEXT,
    Opt,
)

_ALL: dict[str, Opt] = {o.name.lower(): o for o in Opt}


@dataclass(frozen=True)
class Given:
    """The options a query gave: typed values (``raw`` as written, for messages)."""

    side: str  # "source" / "sink"
    raw: dict[Opt, str]
    values: dict[Opt, object]
    streaming: bool | None = None

    def __contains__(self, opt: Opt) -> bool:
        return opt in self.raw

    def get(self, opt: Opt) -> object:
        """The value, or the row's default when the option was not given."""
        return self.values.get(opt, opt.row.default)

    def holds(self, condition: str) -> bool:
        """``"name"``: given; ``"name=value"``: given with that value."""
        name, _, want = condition.partition("=")
        opt = Opt[name]
        if opt not in self.values:
            return False
        if not want:
            return True
        have = self.values[opt]
        if opt.row.kind == BOOL:
            return have == fields.parse_bool(want)
        return str(have).lower() == want


def normalise(options: Mapping[str, str], side: str) -> dict[Opt, str]:
    """Map user keys to table rows; reject unknown keys (naming the closest valid one)."""
    allowed = [o for o in Opt if side in o.row.scope]
    allowed_lower = {o.name.lower(): o for o in allowed}
    out: dict[Opt, str] = {}
    for key, value in options.items():
        opt = allowed_lower.get(str(key).lower())
        if opt is None:
            # Spark lower-cases option keys before we see them; name it as received.
            if str(key).lower() in _ALL:
                hint = f" (it is a {'sink' if side == 'source' else 'source'} option)"
            else:
                close = difflib.get_close_matches(str(key).lower(), list(allowed_lower), 1)
                hint = f" (did you mean {allowed_lower[close[0]].name}?)" if close else ""
            reject(
                str(key),
                f"unknown option for the tensorpool {side}{hint}; valid options: "
                + ", ".join(o.name for o in allowed),
            )
        out[opt] = "" if value is None else str(value)
    return out


def value(opt: Opt, raw: str) -> object:
    """``raw`` read as ``opt``'s row says: its kind, its bounds, its own check."""
    row, name = opt.row, opt.name
    out: object
    if row.kind in (INT, BYTES):
        if row.kind == BYTES and raw.strip().lower() == AUTO:
            return AUTO
        try:
            out = int(raw.strip())
        except ValueError:
            reject(name, f"must be an integer, got {raw!r}")
        if not row.lo <= out <= row.hi:
            reject(name, f"must be in {int(row.lo)}..{int(row.hi)}, got {out}")
    elif row.kind == FLOAT:
        unit = f" {row.unit}" if row.unit else ""
        try:
            out = float(raw.strip())
        except ValueError:
            reject(name, f"must be a number{' of' + unit if unit else ''}, got {raw!r}")
        if not (row.lo < out <= row.hi) or math.isnan(out):
            reject(name, f"must be in ({row.lo:g}, {row.hi:g}]{unit}, got {raw!r}")
    elif row.kind == BOOL:
        out = fields.parse_bool(raw)
        if out is None:
            reject(name, f"must be true or false, got {raw!r}")
    elif row.kind == CHOICE:
        out = raw.strip().lower()
        if out not in row.choices:
            reject(name, "must be " + " or ".join(repr(c) for c in row.choices) + f", got {raw!r}")
    elif row.kind == DURATION:
        out = fields.duration_ms(name, raw)
    elif row.kind == TEXT:
        assert row.parse is not None
        out = row.parse(name, raw)
    else:  # STREAM_SCOPED: read with the streams, when the query is built
        out = raw
    problem = row.check(out, raw) if row.check is not None else None
    if problem is not None:
        reject(name, problem)
    return out


def read(options: Mapping[str, str], side: str, streaming: bool | None = None) -> Given:
    """Every check the rows make: names, required, values, scope (the rules between
    options are :data:`.rules.RULES`, run on the result)."""
    raw = normalise(options, side)
    for opt in Opt:
        if opt.row.required and side in opt.row.scope and opt not in raw:
            reject(opt, f"required: {opt.row.required}")
    given = Given(side, raw, {o: value(o, raw[o]) for o in Opt if o in raw}, streaming)
    _scope(given)
    return given


def _scope(given: Given) -> None:
    """The rows' own scope: hosts (local-only rows), requires, batch/streaming, excludes."""
    present = [o for o in Opt if o in given]
    if Opt.hosts in given:
        for o in present:
            row = o.row
            # choosing a choice's default says nothing (batching=none works everywhere)
            if row.local_only and not (row.kind == CHOICE and given.get(o) == row.default):
                reject(o, "is not available with 'hosts' (remote streams) yet")
    for o in present:
        row = o.row
        if row.requires and not any(given.holds(c) for c in row.requires):
            reject(o, f"only applies with {row.requires_text or ' or '.join(row.requires)}")
    for o in present:
        if o.row.mode == STREAMING and given.streaming is False:
            reject(o, "is for streaming queries (spark.readStream) only")
        if o.row.mode == BATCH and given.streaming:
            reject(o, "is for batch queries (spark.read) only")
    for o in present:
        row = o.row
        for c in row.excludes:
            if given.holds(c):
                why = f": {row.excludes_why}" if row.excludes_why else ""
                reject(o, f"cannot be combined with {c}{why}")
