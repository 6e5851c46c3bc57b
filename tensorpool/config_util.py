"""Shared building blocks for tensorpool's TOML configuration files.

Every service config (driver, rate limiter, bridge) follows the same model:

* the file is parsed with stdlib :mod:`tomllib` (:func:`load_toml`), so syntax errors
  surface with the file name, line and column;
* each TOML table is read through a :class:`Section`, which hands out typed values
  (``req_int``, ``opt_bool``, ...) and remembers which keys it handed out, so that
  :meth:`Section.finish` can reject every key nobody asked for — a typo such as
  ``anounce_period_ms`` must fail loudly instead of silently falling back to a default;
* scalar deployment keys may be overridden from the environment (:class:`EnvOverrides`),
  following the Aeron convention the Driver Model spec (§17) asks for: upper-case the
  dotted key and replace ``.`` with ``_`` (``driver.control_stream_id`` →
  ``DRIVER_CONTROL_STREAM_ID``). A ``TENSORPOOL_``-prefixed spelling of the same name is
  also accepted and wins when both are set, so that a deployment can scope its
  variables without clashing with other software;
* any problem raises exactly one :class:`ConfigError` naming the file, the dotted key
  and the reason.

Nothing here touches the filesystem beyond reading the config file itself.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "ENV_PREFIX",
    "INT32_MAX",
    "UINT16_MAX",
    "UINT32_MAX",
    "UINT64_MAX",
    "ConfigError",
    "EnvOverrides",
    "IdRange",
    "Section",
    "check_aeron_channel",
    "check_bind",
    "check_path_component",
    "check_path_length",
    "is_power_of_two",
    "load_toml",
    "parse_bind",
    "parse_bool_text",
    "parse_id_range",
    "parse_octal_mode",
    "ranges_overlap",
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
        return f"expected a string 'START-END' or an array [START, END], got {_type_name(value)}"
    if start > end:
        return f"range start {start} is greater than end {end}"
    if start < lo or end > hi:
        return f"range {start}-{end} is outside {lo}..{hi}"
    return IdRange(start, end)


def _type_name(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- environment


class EnvOverrides:
    """Environment overrides for dotted config keys.

    ``lookup("driver.instance_id")`` checks ``TENSORPOOL_DRIVER_INSTANCE_ID`` first, then
    ``DRIVER_INSTANCE_ID`` (the spec's Aeron-style name). An empty value counts as set,
    so an operator can blank out a string such as the shutdown token.
    """

    def __init__(self, environ: Mapping[str, str] | None, *, prefix: str = ENV_PREFIX) -> None:
        self._environ: Mapping[str, str] = {} if environ is None else environ
        self._prefix = prefix

    @staticmethod
    def names_for(dotted_key: str, *, prefix: str = ENV_PREFIX) -> tuple[str, str]:
        """The two variable names that override ``dotted_key`` (scoped one first)."""
        plain = dotted_key.upper().replace(".", "_").replace("-", "_")
        return (prefix + plain, plain)

    def lookup(self, dotted_key: str) -> tuple[str, str] | None:
        """Return ``(variable_name, value)`` of the winning override, or None."""
        for name in self.names_for(dotted_key, prefix=self._prefix):
            value = self._environ.get(name)
            if value is not None:
                return name, value
        return None


# --------------------------------------------------------------------------- sections

_MISSING: Any = object()


class Section:
    """Typed, strict access to one TOML table.

    Each getter records the key as known; :meth:`finish` then rejects anything left
    over. Getters with ``env=True`` consult :class:`EnvOverrides` first; the value from
    the environment is parsed from text and validated like the TOML value, and errors
    name both the variable and the dotted key it overrides.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        path: str,
        file: str,
        env: EnvOverrides | None = None,
    ) -> None:
        self.data = data
        self.path = path
        self.file = file
        self.env = env
        self._known: set[str] = set()

    # -- plumbing

    def key_path(self, key: str) -> str:
        """Dotted path of ``key`` inside this section (for messages)."""
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, reason: str) -> NoReturn:
        """Raise the one ConfigError for ``key`` of this section."""
        raise ConfigError(self.file, self.key_path(key), reason)

    def has(self, key: str) -> bool:
        """True if the key is present in the file or overridden from the environment."""
        if key in self.data:
            return True
        return self.env is not None and self.env.lookup(self.key_path(key)) is not None

    def _raw(self, key: str, env: bool) -> tuple[Any, str | None]:
        """Return ``(value, env_var_name)``; value is _MISSING if absent."""
        self._known.add(key)
        if env and self.env is not None:
            hit = self.env.lookup(self.key_path(key))
            if hit is not None:
                return hit[1], hit[0]
        return self.data.get(key, _MISSING), None

    def _env_fail(self, key: str, var: str, reason: str) -> NoReturn:
        raise ConfigError(self.file, self.key_path(key), f"(from environment {var}) {reason}")

    def finish(self) -> None:
        """Reject keys that no getter asked for (typos, unsupported options)."""
        unknown = [k for k in self.data if k not in self._known]
        if unknown:
            self.fail(unknown[0], "unknown key" + _did_you_mean(unknown[0], self._known))

    # -- scalars

    def opt_str(self, key: str, default: str, *, env: bool = False) -> str:
        value, _ = self._raw(key, env)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_type_name(value)}")
        return value

    def req_str(self, key: str, *, env: bool = False) -> str:
        value = self.opt_str(key, _MISSING, env=env)
        if value is _MISSING:
            self.fail(key, "required key is missing")
        return value

    def opt_bool(self, key: str, default: bool, *, env: bool = False) -> bool:
        value, var = self._raw(key, env)
        if value is _MISSING:
            return default
        if var is not None:
            parsed = parse_bool_text(value)
            if parsed is None:
                self._env_fail(key, var, f"expected true/false, got {value!r}")
            return parsed
        if not isinstance(value, bool):
            self.fail(key, f"expected a boolean (true/false), got {_type_name(value)}")
        return value

    def opt_int(
        self,
        key: str,
        default: int,
        *,
        lo: int = 0,
        hi: int = UINT32_MAX,
        env: bool = False,
        check: Callable[[int], str | None] | None = None,
    ) -> int:
        value, var = self._raw(key, env)
        if value is _MISSING:
            return default
        return self._int(key, value, var, lo, hi, check)

    def req_int(
        self,
        key: str,
        *,
        lo: int = 0,
        hi: int = UINT32_MAX,
        env: bool = False,
        check: Callable[[int], str | None] | None = None,
    ) -> int:
        value, var = self._raw(key, env)
        if value is _MISSING:
            self.fail(key, "required key is missing")
        return self._int(key, value, var, lo, hi, check)

    def _int(
        self,
        key: str,
        value: Any,
        var: str | None,
        lo: int,
        hi: int,
        check: Callable[[int], str | None] | None,
    ) -> int:
        if var is not None:
            text = value.strip().replace("_", "")
            if not re.fullmatch(r"[+-]?\d+", text):
                self._env_fail(key, var, f"expected an integer, got {value!r}")
            value = int(text)
        elif type(value) is not int:  # bool is an int subclass: reject it explicitly
            self.fail(key, f"expected an integer, got {_type_name(value)}")
        problem = f"{value} is out of range {lo}..{hi}" if not lo <= value <= hi else None
        if problem is None and check is not None:
            problem = check(value)
        if problem:
            if var is not None:
                self._env_fail(key, var, problem)
            self.fail(key, problem)
        return value

    def opt_str_list(
        self, key: str, default: Sequence[str], *, env: bool = False, env_sep: str = os.pathsep
    ) -> tuple[str, ...]:
        value, var = self._raw(key, env)
        if value is _MISSING:
            return tuple(default)
        if var is not None:
            return tuple(p for p in value.split(env_sep) if p)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, "expected an array of strings")
        return tuple(value)

    def opt_range(
        self, key: str, *, lo: int = 0, hi: int = UINT32_MAX, env: bool = False
    ) -> IdRange | None:
        value, var = self._raw(key, env)
        if value is _MISSING:
            return None
        parsed = parse_id_range(value, lo=lo, hi=hi)
        if isinstance(parsed, str):
            if var is not None:
                self._env_fail(key, var, parsed)
            self.fail(key, parsed)
        return parsed

    def checked(self, key: str, value: str, problem: str | None) -> str:
        """Raise for ``key`` if a validator returned a problem; else return ``value``."""
        if problem:
            var = None
            if self.env is not None:
                hit = self.env.lookup(self.key_path(key))
                var = hit[0] if hit else None
            if var is not None:
                self._env_fail(key, var, problem)
            self.fail(key, problem)
        return value

    # -- nesting

    def opt_table(self, key: str) -> Section:
        """A sub-section (empty when absent); environment overrides carry over."""
        value, _ = self._raw(key, False)
        if value is _MISSING:
            value = {}
        if not isinstance(value, dict):
            self.fail(key, f"expected a table, got {_type_name(value)}")
        return Section(value, self.key_path(key), self.file, self.env)

    def tables(self) -> Iterator[tuple[str, Section]]:
        """Iterate ``name -> sub-section`` for a table of tables (e.g. ``profiles.*``)."""
        for name, value in self.data.items():
            self._known.add(name)
            if not isinstance(value, dict):
                self.fail(name, f"expected a table, got {_type_name(value)}")
            yield name, Section(value, self.key_path(name), self.file, None)

    def array_of_tables(self, key: str, *, required: bool = False) -> list[Section]:
        """Sections for ``[[x.key]]`` or ``key = [{...}, ...]`` entries, with ``key[i]`` paths."""
        value, _ = self._raw(key, False)
        if value is _MISSING:
            if required:
                self.fail(key, "required key is missing")
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.fail(key, "expected an array of tables")
        return [
            Section(v, f"{self.key_path(key)}[{i}]", self.file, None) for i, v in enumerate(value)
        ]


def _did_you_mean(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""
