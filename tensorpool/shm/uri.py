"""Region URIs: ``shm:file?path=<absolute path>[|require_hugepages=true|false]``.

v1.1 knows exactly one scheme and two parameters (§4.1); everything else is rejected (§15.22),
because a consumer that guessed at an unknown scheme or ignored an unknown parameter could map
the wrong thing or silently drop a requirement. Parameters are separated Aeron-style by ``|``.
The path must be absolute and made of printable ASCII other than ``?``, ``|`` and space
(the informative ABNF of §4.1). Parsing is cold-path code: it runs once per announce.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorpool.counters import Reason
from tensorpool.shm.errors import UriError

SCHEME_PREFIX = "shm:file?"
PARAM_SEPARATOR = "|"
PARAM_PATH = "path"
PARAM_REQUIRE_HUGEPAGES = "require_hugepages"


@dataclass(frozen=True, slots=True)
class ShmUri:
    """A parsed, validated region URI."""

    path: str
    require_hugepages: bool = False

    def __str__(self) -> str:
        return format_shm_uri(self.path, require_hugepages=self.require_hugepages)


def _check_path_chars(path: str) -> None:
    for ch in path:
        code = ord(ch)
        # VCHAR is 0x21..0x7E; '?' and '|' would make the URI ambiguous.
        if code < 0x21 or code > 0x7E or ch in "?|":
            raise UriError(Reason.URI_MALFORMED, f"character {ch!r} not allowed in path")


def _check_absolute(path: str) -> None:
    if not path:
        raise UriError(Reason.URI_MISSING_PATH, "empty path")
    if not path.startswith("/"):
        raise UriError(Reason.PATH_NOT_ABSOLUTE, f"path must be absolute: {path!r}")


def parse_shm_uri(uri: str) -> ShmUri:
    """Parse and validate a region URI; raise :class:`UriError` with a specific reason."""
    if not isinstance(uri, str):
        raise UriError(Reason.URI_MALFORMED, "uri must be a str")
    if not uri.startswith(SCHEME_PREFIX):
        scheme = uri.split("?", 1)[0]
        raise UriError(Reason.URI_UNKNOWN_SCHEME, f"unsupported region uri scheme {scheme!r}")
    params = uri[len(SCHEME_PREFIX) :]
    if not params:
        raise UriError(Reason.URI_MISSING_PATH, "no parameters")
    path: str | None = None
    hugepages: bool | None = None
    for entry in params.split(PARAM_SEPARATOR):
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise UriError(Reason.URI_MALFORMED, f"parameter {entry!r} is not key=value")
        if key == PARAM_PATH:
            if path is not None:
                raise UriError(Reason.URI_DUPLICATE_PARAMETER, PARAM_PATH)
            path = value
        elif key == PARAM_REQUIRE_HUGEPAGES:
            if hugepages is not None:
                raise UriError(Reason.URI_DUPLICATE_PARAMETER, PARAM_REQUIRE_HUGEPAGES)
            if value == "true":
                hugepages = True
            elif value == "false":
                hugepages = False
            else:
                raise UriError(Reason.URI_BAD_BOOL, f"require_hugepages={value!r}")
        else:
            raise UriError(Reason.URI_UNKNOWN_PARAMETER, f"unknown parameter {key!r}")
    if path is None:
        raise UriError(Reason.URI_MISSING_PATH, "missing path parameter")
    _check_absolute(path)
    _check_path_chars(path)
    return ShmUri(path=path, require_hugepages=bool(hugepages))


def format_shm_uri(path: str, *, require_hugepages: bool = False) -> str:
    """Build a URI that :func:`parse_shm_uri` accepts; refuses paths it would reject."""
    _check_absolute(path)
    _check_path_chars(path)
    uri = f"{SCHEME_PREFIX}{PARAM_PATH}={path}"
    if require_hugepages:
        uri += f"{PARAM_SEPARATOR}{PARAM_REQUIRE_HUGEPAGES}=true"
    return uri
