"""The rules of tensorpool's TOML configuration files: value checks, field types, errors.

The schemas themselves are declared in :mod:`tensorpool.config_schema` (pydantic tables); this
module holds what they are built from and what lighter modules (``endpoints``, ``observe``,
``transport``) share without importing pydantic:

* :class:`ConfigError` -- the one exception of a bad configuration, naming the file, the
  dotted key and the reason, printed by the commands as one line;
* :func:`load_toml` -- stdlib :mod:`tomllib`, with syntax errors as ConfigErrors naming the
  line and column;
* problem functions (``check_aeron_channel``, ``check_path_component``, ``check_path_length``,
  ``check_bind``, ``aeron_dir_problem``, ...): each returns the one-line reason a value is
  refused, or None; the same functions serve the config files, the CLI flags and Python
  callers;
* field types (``Channel``, ``AeronStreamId``, ``PathName``, ``AeronDir``, ...): ``Annotated``
  types whose :class:`Rule` marker gives pydantic a strict base type and the problem function.
  pydantic is imported only when a schema is built.

Nothing here touches the filesystem beyond reading the config file itself and resolving
symlinks of directories that must not be system roots (:mod:`tensorpool.fsafety`).
"""

from __future__ import annotations

import os
import posixpath
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from tensorpool.fsafety import unsafe_root_reason

__all__ = [
    "ENV_PREFIX",
    "INT32_MAX",
    "UINT16_MAX",
    "UINT32_MAX",
    "UINT64_MAX",
    "AbsDir",
    "AeronDir",
    "AeronStreamId",
    "Bind",
    "Bool",
    "Channel",
    "ConfigError",
    "DataStreamId",
    "FieldProblem",
    "IdRange",
    "NonEmpty",
    "NonNegative",
    "OctalMode",
    "PathName",
    "Positive",
    "Rule",
    "ShmDir",
    "Str",
    "aeron_dir_problem",
    "check_aeron_channel",
    "check_bind",
    "check_path_component",
    "check_path_length",
    "env_names",
    "id_range",
    "int_in",
    "is_power_of_two",
    "load_toml",
    "parse_bind",
    "parse_bool_text",
    "parse_id_range",
    "parse_octal_mode",
    "power_of_two",
    "ranges_overlap",
    "type_name",
]

UINT16_MAX = 0xFFFF
UINT32_MAX = 0xFFFF_FFFF
UINT64_MAX = 0xFFFF_FFFF_FFFF_FFFF
INT32_MAX = 0x7FFF_FFFF
#: Linux limits (#26.6): one path component holds at most NAME_MAX bytes, a whole path fewer
#: than PATH_MAX bytes (the terminating NUL counts). Checked when the configuration is read, so
#: a name the kernel refuses is one line naming the key, not ENAMETOOLONG after files exist.
NAME_MAX = 255
PATH_MAX = 4096

#: Prefix of the scoped spelling of an environment override.
ENV_PREFIX = "TENSORPOOL_"

_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")
_CHANNEL = re.compile(r"^aeron:(ipc|udp)(\?[^=|?\s]+=[^|?\s]*(\|[^=|?\s]+=[^|?\s]*)*)?$")
_PATH_COMPONENT = re.compile(r"^[A-Za-z0-9._-]+$")
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class ConfigError(ValueError):
    """An invalid configuration: which file, which key, and why.

    One exception type for every config problem so that a CLI can print it as a
    single line and exit, and so tests can assert on ``file``/``key``/``reason``.
    """

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file = file
        self.key = key
        self.reason = reason
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {reason}")


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML file; unreadable files and syntax errors become ConfigError.

    The syntax error names the line and column so an operator can jump to it.
    """
    file = os.fspath(path)
    try:
        raw = Path(file).read_bytes()
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read config file: {exc.strerror or exc}") from exc
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(file, "", f"config file is not valid UTF-8: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        match = _TOML_POS.search(text)
        msg = _TOML_POS.sub("", text).strip()
        if match:
            reason = f"TOML syntax error at line {match.group(1)}, column {match.group(2)}: {msg}"
        else:  # pragma: no cover - tomllib always reports a position today
            reason = f"TOML syntax error: {msg}"
        raise ConfigError(file, "", reason) from exc


# --------------------------------------------------------------------------- validators


def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, ...; ring sizes and strides must be powers of two."""
    return value > 0 and (value & (value - 1)) == 0


def check_aeron_channel(value: str) -> str | None:
    """Return a reason if ``value`` is not an ``aeron:ipc``/``aeron:udp`` channel URI.

    Only the shape is checked (media, ``?key=value`` parameters separated by ``|``);
    Aeron itself validates parameter semantics when the channel is opened.
    """
    if not _CHANNEL.fullmatch(value):
        return (
            f"{value!r} is not an Aeron channel "
            "(expected 'aeron:ipc' or 'aeron:udp', optionally '?key=value|key=value')"
        )
    if value.startswith("aeron:udp"):  # #26.6: what Aeron refuses only once a media driver runs
        _, _, query = value.partition("?")
        params = dict(item.partition("=")[::2] for item in query.split("|") if item)
        addresses = [k for k in ("endpoint", "control") if k in params]
        if not addresses and params.get("control-mode") != "manual":
            return f"{value!r}: a udp channel needs endpoint=HOST:PORT (or control=HOST:PORT)"
        for key in addresses:
            host, sep, port = params[key].rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                return f"{value!r}: {key}={params[key]!r} is not HOST:PORT"
    return None


def check_path_component(value: str) -> str | None:
    """Return a reason if ``value`` cannot be used as one directory name.

    Names that end up inside SHM paths (namespace, instance id) must not be able to
    escape the base directory or break the ``shm:file?path=`` URI grammar.
    """
    if len(value) > NAME_MAX:  # the pattern allows ASCII only: characters are bytes
        return f"{value[:20]!r}... is {len(value)} bytes long: a name holds at most {NAME_MAX}"
    if not _PATH_COMPONENT.fullmatch(value) or value in {".", ".."}:
        return f"{value!r} must be a single directory name of letters, digits, '.', '_' or '-'"
    return None


def check_path_length(path: str, longest_suffix: str = "") -> str | None:
    """Return a reason if ``path`` (plus the longest name created below it) is too long.

    ``longest_suffix`` is the deepest relative path a component creates under ``path``
    (e.g. the driver's ``stream-<id>/epoch-<E>/payload-<pool>.pool``), so that the check
    covers every file the configuration leads to, not just the directory itself.
    """
    for part in path.split("/"):
        if len(os.fsencode(part)) > NAME_MAX:
            return f"the name {part[:20]!r}... is longer than {NAME_MAX} bytes"
    total = len(os.fsencode(posixpath.join(path, longest_suffix)))
    if total >= PATH_MAX:
        return f"paths below it would be {total} bytes long; the limit is {PATH_MAX - 1}"
    return None


def parse_bind(text: str) -> tuple[str, int] | str:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` -> ``(host, port)``, else the problem as text.

    A bare port binds 127.0.0.1 (#19.1): metrics stay on the host unless a host is named.
    ``[::1]:9100`` names an IPv6 host. Port 0 asks the kernel for a free port (tests).
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        host = ""
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        return f"{text!r} is not HOST:PORT (a port 0-65535, e.g. 127.0.0.1:9100 or 9100)"
    if any(c.isspace() or c in "/?#@" for c in host):
        return f"{text!r}: bad host {host!r}"
    return host, int(port_text)


def check_bind(text: str) -> str | None:
    """The problem with a ``metrics_bind`` value, or None (the empty string means off)."""
    if not text:
        return None
    parsed = parse_bind(text)
    return parsed if isinstance(parsed, str) else None


def parse_bool_text(text: str) -> bool | None:
    """Parse an environment boolean (true/false/1/0/yes/no/on/off); None if invalid."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return None


def parse_octal_mode(text: str) -> int | None:
    """Parse a POSIX permission string such as ``"660"`` or ``"0660"``; None if invalid."""
    if not re.fullmatch(r"0?[0-7]{3,4}", text):
        return None
    mode = int(text, 8)
    return mode if mode <= 0o7777 else None


@dataclass(frozen=True, slots=True)
class IdRange:
    """An inclusive range of ids (``start <= id <= end``)."""

    start: int
    end: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.start <= value <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


def ranges_overlap(a: IdRange, b: IdRange) -> bool:
    """True when two inclusive ranges share at least one id."""
    return a.start <= b.end and b.start <= a.end


def parse_id_range(value: object, *, lo: int = 0, hi: int = UINT32_MAX) -> IdRange | str | None:
    """Parse ``"20000-29999"``, ``"20000,29999"`` or ``[20000, 29999]``.

    Returns ``None`` for an empty string or empty array (range disabled), an
    :class:`IdRange` on success, or a ``str`` reason on failure.
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        parts = re.split(r"\s*[-,]\s*", text)
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return f"{value!r} is not a range (expected 'START-END' or [START, END])"
        start, end = int(parts[0]), int(parts[1])
    elif isinstance(value, list):
        if not value:
            return None
        if len(value) != 2 or not all(type(v) is int for v in value):
            return "a range array must hold exactly two integers [START, END]"
        start, end = value
    else:
        return f"expected a string 'START-END' or an array [START, END], got {type_name(value)}"
    if start > end:
        return f"range start {start} is greater than end {end}"
    if start < lo or end > hi:
        return f"range {start}-{end} is outside {lo}..{hi}"
    return IdRange(start, end)


def type_name(value: object) -> str:
    """How a config message names the type of a TOML value ("an integer", "a table")."""
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        tuple: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- environment


def env_names(dotted_key: str, *, prefix: str = ENV_PREFIX) -> tuple[str, str]:
    """The two variables that override ``dotted_key``, the scoped one (which wins) first."""
    plain = dotted_key.upper().replace(".", "_").replace("-", "_")
    return (prefix + plain, plain)


# --------------------------------------------------------------------------- field rules


class FieldProblem(ValueError):
    """A rule broken by the value at ``key`` (relative to where it is raised; "" = right there).

    Raised by schema rules (:class:`Rule`, cross-field checks of a table); the loader turns it
    into the one :class:`ConfigError` naming the file and the full dotted key.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}" if key else reason)
        self.key = key
        self.reason = reason


class Rule:
    """Annotation marker: a strict base type plus the one-line problem a value may have.

    ``Annotated[int, Rule(check)]`` accepts only a real ``int`` (not ``true``, not ``"5"``) and
    refuses any value ``check`` returns a reason for. ``before`` converts first (text forms such
    as ``"640"`` or ``"1-5"``). Pydantic reads the marker through its schema hook; it is imported
    only there, so modules that merely declare fields (``endpoints``) stay light.
    """

    def __init__(
        self,
        check: Callable[[Any], str | None] | None = None,
        *,
        before: Callable[[Any], Any] | None = None,
    ) -> None:
        self.check = check
        self.before = before

    def _after(self, value: Any) -> Any:
        problem = self.check(value) if self.check is not None else None
        if problem:
            raise FieldProblem("", problem)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema as cs

        strict = {int: cs.int_schema, str: cs.str_schema, bool: cs.bool_schema}.get(source)
        schema = strict(strict=True) if strict is not None else handler(source)
        if self.before is not None:
            schema = cs.no_info_before_validator_function(self.before, schema)
        if self.check is not None:
            schema = cs.no_info_after_validator_function(self._after, schema)
        return schema


def int_in(lo: int, hi: int, *more: Callable[[int], str | None]) -> Rule:
    """An integer in ``lo..hi`` that passes every check of ``more``."""

    def check(value: int) -> str | None:
        if not lo <= value <= hi:
            return f"{value} is out of range {lo}..{hi}"
        return next((p for p in (c(value) for c in more) if p), None)

    return Rule(check)


def power_of_two(value: int) -> str | None:
    return None if is_power_of_two(value) else f"{value} is not a power of two"


def _octal_mode(value: Any) -> Any:
    if isinstance(value, str):
        mode = parse_octal_mode(value)
        if mode is None:
            raise FieldProblem("", f'{value!r} is not an octal POSIX mode such as "660" or "0600"')
        return mode
    return value


def id_range(lo: int, hi: int) -> Rule:
    """``"START-END"``, ``"START,END"`` or ``[START, END]`` (empty = unset) within ``lo..hi``."""

    def parse(value: Any) -> Any:
        if value is None or isinstance(value, IdRange):
            return value
        parsed = parse_id_range(value, lo=lo, hi=hi)
        if isinstance(parsed, str):
            raise FieldProblem("", parsed)
        return parsed

    return Rule(before=parse)


def aeron_dir_problem(value: str) -> str | None:
    """The one check of a media driver directory (#26.5): absolute, never a system root.

    "" is allowed (each config gives it its meaning). #13.1: a media driver empties its
    directory, so ``/``, ``/etc``, ``$HOME``, ``/tmp``, ``/dev/shm`` ... are refused.
    """
    if not value:
        return None
    if not os.path.isabs(value):
        return "must be an absolute path (or empty)"
    return unsafe_root_reason(value)


def abs_dir_problem(value: str) -> str | None:
    """A directory in ``shm:file`` URIs: absolute, no ``?``, ``|`` or whitespace, not too long."""
    if not value.startswith("/"):
        return f"{value!r} must be an absolute path"
    if any(c in value for c in "?|") or any(c.isspace() for c in value):
        return f"{value!r} must not contain '?', '|' or whitespace (shm:file URI rules)"
    return check_path_length(value)


def shm_dir_problem(value: str) -> str | None:
    """A directory regions are created in: :func:`abs_dir_problem`, and never a system or
    shared root (#13.1)."""
    return abs_dir_problem(value) or unsafe_root_reason(value)


def _normpath(value: Any) -> Any:
    return posixpath.normpath(value) if isinstance(value, str) and value.startswith("/") else value


Bool = Annotated[bool, Rule()]
Str = Annotated[str, Rule()]
#: A positive count or period (``lo=1``) and a non-negative one.
Positive = Annotated[int, int_in(1, UINT32_MAX)]
NonNegative = Annotated[int, int_in(0, UINT32_MAX)]
#: Aeron stream ids are int32 (tensorpool uses the positive ones); data stream ids are uint32
#: with 0xFFFFFFFF the SBE null value.
AeronStreamId = Annotated[int, int_in(1, INT32_MAX)]
DataStreamId = Annotated[int, int_in(1, UINT32_MAX - 1)]
Channel = Annotated[str, Rule(check_aeron_channel)]
#: One directory name inside SHM paths (namespace, instance id).
PathName = Annotated[str, Rule(check_path_component)]
NonEmpty = Annotated[str, Rule(lambda v: None if v.strip() else "must not be empty")]
AeronDir = Annotated[str, Rule(aeron_dir_problem)]
#: A directory named in region URIs (an allowed base), and one regions are created in.
AbsDir = Annotated[str, Rule(abs_dir_problem, before=_normpath)]
ShmDir = Annotated[str, Rule(shm_dir_problem, before=_normpath)]
Bind = Annotated[str, Rule(check_bind)]
OctalMode = Annotated[int, Rule(before=_octal_mode)]
