"""Shared test helpers: the schema model and Hypothesis strategies derived from it.

Strategies come from the parsed XML (not from the generated code), so a generator
bug cannot hide itself by producing matching strategies.
"""

from __future__ import annotations

import string
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from tensorpool.specs.codegen import SCHEMA_DIR, Field, Group, Message, Schema, parse_schema
from tensorpool.specs.generated import bridge, driver, wire

MODULES: dict[str, ModuleType] = {"wire": wire, "driver": driver, "bridge": bridge}
SCHEMAS: dict[str, Schema] = {k: parse_schema(SCHEMA_DIR / f"{k}.xml", k) for k in MODULES}
ALL_MESSAGES: list[tuple[str, Message]] = [(k, m) for k, s in SCHEMAS.items() for m in s.messages]
MESSAGE_IDS = [f"{k}.{m.name}" for k, m in ALL_MESSAGES]

ASCII = string.printable


def int_range(f: Field) -> tuple[int, int]:
    bits = f.primitive.size * 8
    if f.primitive.fmt.islower():  # signed struct codes are lower case
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def field_strategy(f: Field) -> st.SearchStrategy[Any]:
    if f.kind == "enum":
        assert f.enum is not None
        base: st.SearchStrategy[Any] = st.sampled_from([v for _, v in f.enum.values])
    elif f.kind == "array":
        if f.bytes_array:
            return st.binary(min_size=f.length, max_size=f.length)
        lo, hi = int_range(f)
        return st.lists(st.integers(lo, hi), min_size=f.length, max_size=f.length).map(tuple)
    else:
        lo, hi = int_range(f)
        base = st.integers(lo, hi)
    if f.optional:
        return st.none() | base.filter(lambda v: v != f.null_value)
    return base


def data_strategy(text: bool, max_length: int) -> st.SearchStrategy[Any]:
    cap = min(max_length, 300)
    if text:
        return st.text(alphabet=ASCII, max_size=min(cap, 40))
    return st.binary(max_size=cap)


def members_strategy(
    fields: list[Field], groups: list[Group], data: list[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields:
        if f.kind != "constant":
            parts[f.snake] = field_strategy(f)
    for g in groups:
        parts[g.snake] = st.lists(members_strategy(g.fields, g.groups, g.data), max_size=3)
    for d in data:
        parts[d.snake] = data_strategy(d.text, d.max_length)
    return st.fixed_dictionaries(parts)


def message_strategy(msg: Message) -> st.SearchStrategy[dict[str, Any]]:
    return members_strategy(msg.fields, msg.groups, msg.data)


def sample_values(msg: Message) -> dict[str, Any]:
    """A deterministic valid value set with every group and var-data field non-empty."""

    def members(fields: list[Field], groups: list[Group], data: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, f in enumerate(fields):
            if f.kind == "constant":
                continue
            if f.kind == "enum":
                assert f.enum is not None
                out[f.snake] = f.enum.values[-1][1]
            elif f.kind == "array":
                out[f.snake] = (
                    bytes(range(1, f.length + 1))
                    if f.bytes_array
                    else tuple(range(1, f.length + 1))
                )
            else:
                out[f.snake] = i + 1
        for g in groups:
            out[g.snake] = [members(g.fields, g.groups, g.data) for _ in range(2)]
        for j, d in enumerate(data):
            out[d.snake] = f"v{j}-abc" if d.text else bytes(range(j + 3))
        return out

    return members(msg.fields, msg.groups, msg.data)


def codec(key: str, msg: Message) -> tuple[Any, Any]:
    mod = MODULES[key]
    return getattr(mod, f"{msg.name}Encoder"), getattr(mod, f"{msg.name}Decoder")


def encode(key: str, msg: Message, values: dict[str, Any], body: bool = False) -> bytes:
    enc, _ = codec(key, msg)
    size = enc.encoded_length(**values) - (8 if body else 0)
    buf = bytearray(size)
    n = (enc.encode_body if body else enc.encode)(buf, 0, **values)
    assert n == size
    return bytes(buf)


def expected_dict(
    values: dict[str, Any], fields: list[Field], groups: list[Group], data: list[Any]
) -> dict[str, Any]:
    """What ``to_dict`` must return for encoder input ``values``."""
    out: dict[str, Any] = {}
    for f in fields:
        if f.kind == "constant":
            continue
        out[f.snake] = values[f.snake]
    for g in groups:
        out[g.snake] = [expected_dict(e, g.fields, g.groups, g.data) for e in values[g.snake]]
    for d in data:
        out[d.snake] = values[d.snake]
    return out
