"""Region URI parsing and formatting (§4.1 grammar, validation per §15.22)."""

from __future__ import annotations

import pytest

from tensorpool.counters import Reason
from tensorpool.shm import ShmUri, UriError, format_shm_uri, parse_shm_uri


def test_s4_1_minimal_uri() -> None:
    assert parse_shm_uri("shm:file?path=/dev/shm/a") == ShmUri("/dev/shm/a", False)


@pytest.mark.parametrize(("flag", "expected"), [("true", True), ("false", False)])
def test_s4_1_require_hugepages_flag(flag: str, expected: bool) -> None:
    uri = f"shm:file?path=/dev/hugepages/x|require_hugepages={flag}"
    assert parse_shm_uri(uri) == ShmUri("/dev/hugepages/x", expected)


def test_s4_1_parameter_order_is_free() -> None:
    assert parse_shm_uri("shm:file?require_hugepages=true|path=/a/b") == ShmUri("/a/b", True)


@pytest.mark.parametrize(
    "uri",
    [
        "aeron:udp?endpoint=localhost:40123",
        "shm:memfd?path=/dev/shm/x",
        "file:///dev/shm/x",
        "bridge://1",
        "",
        "SHM:file?path=/a",
    ],
)
def test_s15_22_unknown_scheme_rejected(uri: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(uri)
    assert info.value.reason == Reason.URI_UNKNOWN_SCHEME


@pytest.mark.parametrize(
    "uri",
    [
        "shm:file?path=/a|mode=rw",
        "shm:file?path=/a|Require_hugepages=true",
        "shm:file?path=/a|prefault=true",
    ],
)
def test_s15_22_unknown_parameter_rejected(uri: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(uri)
    assert info.value.reason == Reason.URI_UNKNOWN_PARAMETER


@pytest.mark.parametrize(
    "uri",
    [
        "shm:file?path=/a|path=/b",
        "shm:file?path=/a|require_hugepages=true|require_hugepages=false",
    ],
)
def test_s4_1_duplicate_parameter_rejected(uri: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(uri)
    assert info.value.reason == Reason.URI_DUPLICATE_PARAMETER


@pytest.mark.parametrize("uri", ["shm:file?", "shm:file?require_hugepages=true", "shm:file?path="])
def test_s4_1_missing_path_rejected(uri: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(uri)
    assert info.value.reason == Reason.URI_MISSING_PATH


@pytest.mark.parametrize("path", ["dev/shm/x", "./x", "../etc/passwd", "~/x"])
def test_s4_1_relative_path_rejected(path: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(f"shm:file?path={path}")
    assert info.value.reason == Reason.PATH_NOT_ABSOLUTE


@pytest.mark.parametrize("value", ["TRUE", "1", "yes", "", "true "])
def test_s4_1_bad_bool_rejected(value: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(f"shm:file?path=/a|require_hugepages={value}")
    assert info.value.reason == Reason.URI_BAD_BOOL


@pytest.mark.parametrize(
    "uri",
    [
        "shm:file?path=/a b",  # space
        "shm:file?path=/a?b",  # '?'
        "shm:file?path=/a\x00b",  # NUL
        "shm:file?path=/caf\u00e9",  # non-ASCII
        "shm:file?path",  # not key=value
        "shm:file?path=/a||require_hugepages=true",  # empty entry
        "shm:file?path=/a&require_hugepages=true ",  # trailing space
    ],
)
def test_s4_1_malformed_rejected(uri: str) -> None:
    with pytest.raises(UriError) as info:
        parse_shm_uri(uri)
    assert info.value.reason == Reason.URI_MALFORMED


def test_uri_error_is_value_error_with_reason() -> None:
    with pytest.raises(ValueError, match="uri_unknown_scheme"):
        parse_shm_uri("aeron:ipc")


def test_format_round_trips() -> None:
    for path, huge in [("/dev/shm/a", False), ("/dev/hugepages/b.pool", True)]:
        uri = format_shm_uri(path, require_hugepages=huge)
        assert parse_shm_uri(uri) == ShmUri(path, huge)
        assert str(ShmUri(path, huge)) == uri
    assert format_shm_uri("/x") == "shm:file?path=/x"
    assert format_shm_uri("/x", require_hugepages=True) == "shm:file?path=/x|require_hugepages=true"


@pytest.mark.parametrize("path", ["rel/x", "/a|b", "/a b", ""])
def test_format_refuses_what_parse_would_reject(path: str) -> None:
    with pytest.raises(UriError):
        format_shm_uri(path)
