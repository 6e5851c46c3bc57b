"""The one configuration mechanism: declarative tables validated by pydantic (issue #26.5).

A config file kind (driver, rate limiter, bridge) is a tree of :func:`table` dataclasses whose
fields carry their type, default and rule (``Annotated[int, int_in(1, 100)]``, ``Channel``,
``AeronDir``, ... from :mod:`tensorpool.config_util`); cross-field rules live in the table's
``__post_init__`` and raise :class:`~tensorpool.config_util.FieldProblem` naming the key. The
same classes are the runtime configuration, so every construction path (a file, Python code, a
test) goes through the same rules.

:func:`parse_file` is the whole loader: it lays environment overrides over the TOML document,
validates it in one pass, and turns the first problem into one
:class:`~tensorpool.config_util.ConfigError` — ``file: dotted.key: reason`` — saying which
variable it came from when the value was an override. Overrides follow the Aeron convention the
Driver Model spec (§17) asks for: every scalar key of a top-level table, upper-cased with ``.``
as ``_`` (``driver.control_stream_id`` → ``DRIVER_CONTROL_STREAM_ID``); a ``TENSORPOOL_``
prefixed spelling wins when both are set; an empty value counts as set.

Why pydantic (v2) and not msgspec: its errors carry the full location including the names of
``[profiles.<name>]`` tables (msgspec reports ``$.profiles[...]``) and a machine-readable type,
so the one-line messages are built without parsing text, and its dataclasses validate on every
construction path. It is imported only by the config loaders, not by clients.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from tensorpool import config_util as _util
from tensorpool.config_util import (
    ConfigError,
    FieldProblem,
    env_names,
    load_toml,
    parse_bool_text,
    type_name,
)
from tensorpool.endpoints import Endpoints

# The field types and rules, re-exported: a config module imports this one module and writes
# ``cs.Channel``, ``cs.int_in(1, 10)``, ``@cs.table``.
AbsDir = _util.AbsDir
AeronDir = _util.AeronDir
AeronStreamId = _util.AeronStreamId
Bind = _util.Bind
Bool = _util.Bool
Channel = _util.Channel
DataStreamId = _util.DataStreamId
IdRange = _util.IdRange
NonEmpty = _util.NonEmpty
NonNegative = _util.NonNegative
OctalMode = _util.OctalMode
PathName = _util.PathName
Positive = _util.Positive
Rule = _util.Rule
ShmDir = _util.ShmDir
Str = _util.Str
id_range = _util.id_range
int_in = _util.int_in
power_of_two = _util.power_of_two

__all__ = [
    "ConfigError",
    "EndpointKeys",
    "FieldProblem",
    "Table",
    "build",
    "fields_of",
    "load_file",
    "parse_file",
    "resolve",
    "table",
]

_CONFIG = ConfigDict(extra="forbid", revalidate_instances="never")


def table[T](cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen, validating config table (a pydantic dataclass)."""
    return pydantic_dataclass(frozen=True, slots=True, config=_CONFIG)(cls)


@table
class Table:
    """Base of every table: a key no field declares is refused, with a did-you-mean."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            names = [f.name for f in dataclasses.fields(cls) if f.init]
            for key in data:
                if key not in names:
                    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.75)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise FieldProblem(str(key), "unknown key" + hint)
        return data


def load_file[T](
    path: str | os.PathLike[str],
    parse: Callable[..., T],
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> T:
    """Read a TOML file and hand it to a file kind's ``parse(data, source=, env=)``; the
    environment is ``os.environ`` unless ``env`` is given (``{}``: ignore it)."""
    file = os.fspath(path)
    return parse(load_toml(file), source=file, env=os.environ if env is None else env, **options)


def build[T](cls: Callable[..., T], file: str, /, **values: Any) -> T:
    """Construct a table from already-validated parts; a rule spanning them is one
    ConfigError naming ``file`` and the key."""
    try:
        return cls(**values)
    except ValidationError as exc:
        raise _config_error(exc, file, {}) from None


def parse_file[T](
    schema: type[T], data: Mapping[str, Any], source: str, env: Mapping[str, str] | None
) -> T:
    """Validate a parsed TOML document against ``schema``, overrides from ``env`` included."""
    merged, from_env = _with_env(schema, data, {} if env is None else env)
    try:
        return _adapter(schema).validate_python(merged)
    except ValidationError as exc:
        raise _config_error(exc, source, from_env) from None


@functools.cache
def _adapter(schema: type) -> TypeAdapter[Any]:
    return TypeAdapter(schema)


@functools.cache
def _hints(cls: type, *, extras: bool) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=extras)


# --------------------------------------------------------------------------- environment


def _with_env(
    schema: type, data: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with the overrides of every scalar key of every top-level table."""
    merged = dict(data)
    from_env: dict[str, str] = {}
    for name, kind in _hints(schema, extras=False).items():
        if not (isinstance(kind, type) and issubclass(kind, Table)):
            continue
        section = merged.get(name)
        section = dict(section) if isinstance(section, Mapping) else section
        for key, ftype in _hints(kind, extras=True).items():
            hit = next(((var, env[var]) for var in env_names(f"{name}.{key}") if var in env), None)
            if hit is None or not isinstance(section, dict | None):
                continue
            section = {} if section is None else section
            section[key] = _from_text(hit[1], ftype)
            from_env[f"{name}.{key}"] = hit[0]
        if section is not None:
            merged[name] = section
    return merged, from_env


def _from_text(text: str, ftype: Any) -> Any:
    """An environment value as the field's type; left as text when it is not one (the
    validator then names the variable and the expected type), or when the field's own rule
    reads a text form (``"640"``, ``"1-5"``)."""
    union = typing.get_origin(ftype) in (typing.Union, types.UnionType)
    args = set(typing.get_args(ftype)) if union else {ftype}
    if any(
        isinstance(meta, Rule) and meta.before is not None
        for arg in args
        for meta in getattr(arg, "__metadata__", ())
    ):
        return text
    args = {typing.get_args(a)[0] if hasattr(a, "__metadata__") else a for a in args}
    if bool in args:
        parsed = parse_bool_text(text)
        return text if parsed is None else parsed
    if int in args:
        digits = text.strip().replace("_", "")
        return int(digits) if re.fullmatch(r"[+-]?\d+", digits) else text
    if typing.get_origin(ftype) is tuple:
        return tuple(p for p in text.split(os.pathsep) if p)
    return text


# --------------------------------------------------------------------------- errors

_EXPECTED = {
    "int": "an integer",
    "bool": "a boolean (true/false)",
    "string": "a string",
    "tuple": "an array",
    "list": "an array",
    "dict": "a table",
    "dataclass": "a table",
    "model": "a table",
}


def _config_error(exc: ValidationError, source: str, from_env: Mapping[str, str]) -> ConfigError:
    """The first problem as one ConfigError: the dotted key and a one-line reason."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(str(p) if isinstance(p, str) else p for p in err["loc"])
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    problem = err.get("ctx", {}).get("error")
    if isinstance(problem, FieldProblem):
        reason = problem.reason
        if problem.key:
            key = f"{key}.{problem.key}" if key else problem.key
    elif err["type"] == "missing":
        reason = "required key is missing"
    elif err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        reason = "unknown key"
    else:
        kind = err["type"].removesuffix("_type").removesuffix("_parsing")
        got = type_name(err["input"])
        if kind in _EXPECTED:
            reason = f"expected {_EXPECTED[kind]}, got {got}"
        else:
            reason = err["msg"].removeprefix("Value error, ")
    var = from_env.get(key)
    if var is not None:
        reason = f"(from environment {var}) {reason}"
    return ConfigError(source, key, reason)


# --------------------------------------------------------------------------- shared keys


@table
class EndpointKeys(Table, Endpoints):
    """The keys every config's local-driver table shares (#14.1, #26.5): the deployment's
    control-plane endpoints, declared once in :class:`~tensorpool.endpoints.Endpoints`, and
    the media driver directory, declared here once for every config file.

    ``aeron_dir = ""`` means the tensorpool default directory in every file
    (:func:`~tensorpool.endpoints.config_aeron_dir`); anything else must be absolute and is
    never a system or shared root (:func:`~tensorpool.config_util.aeron_dir_problem`).
    """

    aeron_dir: AeronDir = ""


def resolve(obj: object, **values: Any) -> None:
    """Fill a default that depends on other keys into a frozen table (from its
    ``__post_init__``, which runs once the table's own keys are valid)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


def fields_of(obj: Any) -> dict[str, Any]:
    """A table's values by key, one level deep (``dataclasses.asdict`` would recurse)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
