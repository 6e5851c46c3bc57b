"""Parsers of the option values that are more than a number: stream lists, offsets, hosts,
durations, directories. Each names its option in the error (:func:`.errors.reject`).

Offsets in ``startingOffsets`` / ``endingOffsets`` JSON follow the source's offset model (see
:mod:`tensorpool.spark_source.plan.offsets`): ``{"<stream>": {"epoch": E, "seq": S}}`` where
``S`` is the next sequence number to read; a stream may also be given as ``"earliest"`` /
``"latest"``.
"""

from __future__ import annotations

import json
import os
from typing import Final

from tensorpool.config_util import aeron_dir_problem
from tensorpool.endpoints import channel_problem, config_aeron_dir
from tensorpool.fsafety import unsafe_root_reason
from tensorpool.spark_source.options.errors import reject
from tensorpool.spark_source.options.values import (
    ALL_STREAMS,
    EARLIEST,
    EMBEDDED,
    LATEST,
    MAX_SEQ,
    MAX_STREAM_ID,
    TIMESTAMP_EARLIEST,
    TIMESTAMP_LATEST,
    OffsetSpec,
)

_DURATION_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def parse_bool(raw: str) -> bool | None:
    """The one spelling of a boolean Spark option (``true/1/yes``, ``false/0/no``); None when
    it is neither, for the caller to name the option in its error."""
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    return None


def duration_ms(name: str, raw: str) -> int:
    """Kafka's duration syntax: ``"500"`` (ms), ``"500ms"``, ``"10s"``, ``"15m"``, ``"1h"``."""
    text = raw.strip().lower()
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num) :].strip() or "ms"
    try:
        value = int(num.strip())
    except ValueError:
        value = -1
    if unit not in _DURATION_UNITS or value < 0:
        reject(name, f"must be a duration such as '500ms', '10s' or '15m', got {raw!r}")
    ms = value * _DURATION_UNITS[unit]
    if ms > 2**31:
        reject(name, f"must be at most {2**31} ms, got {raw!r}")
    return ms


def channel(name: str, raw: str) -> str:
    text = raw.strip()
    problem = channel_problem(text)  # the one channel validator (tensorpool.endpoints, #14.1)
    if problem is not None:
        reject(name, problem)
    return text


def aeron_dir(name: str, raw: str) -> str | None:
    """None = the embedded media driver; blank = where the tensorpool commands look."""
    text = raw.strip()
    if not text:
        return config_aeron_dir("")
    if text.lower() == EMBEDDED:
        return None
    reason = aeron_dir_problem(text)  # #26.5: the one aeron_dir check
    if reason is not None:
        reject(name, f"refusing {reason}")
    return os.path.normpath(text)


def abs_dir(name: str, raw: str, *, creates: bool = False) -> str:
    """An absolute, normalised directory; ``creates``: files are made there, so refuse
    system and shared roots (#13.1)."""
    path = raw.strip()
    if not os.path.isabs(path):
        reject(name, f"must be an absolute path, got {raw!r}")
    if creates:
        reason = unsafe_root_reason(path)
        if reason is not None:
            reject(name, f"refusing {reason}")
    return os.path.normpath(path)


def shm_dir(name: str, raw: str) -> str:
    return abs_dir(name, raw, creates=True)


def abs_dirs(name: str, raw: str) -> tuple[str, ...]:
    return tuple(abs_dir(name, p) for p in raw.split(",") if p.strip())


def file_bytes(name: str, raw: str) -> bytes:
    try:
        with open(raw, "rb") as f:
            return f.read()
    except OSError as exc:
        reject(name, f"cannot read {raw}: {exc.strerror}")


def path_component(name: str, raw: str) -> str:
    text = raw.strip()
    if not text or "/" in text or text in (".", ".."):
        reject(name, f"must be a single path component, got {text!r}")
    return text


def text(_name: str, raw: str) -> str:
    return raw


def parse_stream_ids(name: str, raw: str) -> tuple[int, ...]:
    """``"1"`` or ``"1, 2,3"`` -> sorted unique ids (sorted: offsets need a stable key order)."""
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p for p in parts):
        reject(name, f"expected stream ids such as '1' or '1,2', got {raw!r}")
    ids: list[int] = []
    for p in parts:
        try:
            sid = int(p)
        except ValueError:
            reject(name, f"stream id {p!r} is not an integer")
        if not 1 <= sid <= MAX_STREAM_ID:
            reject(name, f"stream id {sid} must be in 1..{MAX_STREAM_ID}")
        ids.append(sid)
    if len(set(ids)) != len(ids):
        reject(name, f"duplicate stream id in {raw!r}")
    return tuple(sorted(ids))


def parse_stream_pattern(name: str, raw: str) -> tuple[int, int] | None:
    """``"*"`` or ``"lo-hi"`` -> the inclusive id range to discover; None for an id list.

    Like Kafka's ``subscribePattern``: the query reads every stream announced on the control
    channel whose id is in the range, including streams that appear while it runs.
    """
    text = raw.strip()
    if text == ALL_STREAMS:
        return (1, MAX_STREAM_ID)
    lo_s, dash, hi_s = text.partition("-")
    if not dash or "," in text or not lo_s.strip():  # ids ("-1" is a bad id, not a range)
        return None
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        reject(name, f"expected '*', a range such as '1000-1999' or ids, got {raw!r}")
    for sid in (lo, hi):
        if not 1 <= sid <= MAX_STREAM_ID:
            reject(name, f"stream id {sid} must be in 1..{MAX_STREAM_ID}")
    if lo > hi:
        reject(name, f"range {raw!r} is empty (the first id must not exceed the last)")
    return (lo, hi)


def parse_hosts(
    raw_hosts: str, raw_streams: str
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[int, str], ...]]:
    """``hosts`` and ``streams`` -> ((name, address)...), ((sid, name)...) (#18)."""
    hosts: list[tuple[str, str]] = []
    for part in (p.strip() for p in raw_hosts.split(",")):
        host, sep, port = part.rpartition(":")
        if not part or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            reject("hosts", f"expected 'host:port[,host:port...]', got {part!r}")
        if part in (a for _, a in hosts):
            reject("hosts", f"{part!r} is named twice")
        hosts.append((part, part))
    # a stream names its server as "host:port", or as "host" when one server runs there
    by_host: dict[str, list[str]] = {}
    for a, _ in hosts:
        by_host.setdefault(a.rpartition(":")[0], []).append(a)
    names = dict(hosts)
    names.update({h: a[0] for h, a in by_host.items() if len(a) == 1})
    streams: list[tuple[int, str]] = []
    for part in (p.strip() for p in raw_streams.split(",")):
        name, sep, sid_s = part.rpartition("/")
        if not sep:
            reject(
                "streams",
                f"with 'hosts', name each stream as host/id (e.g. 'camA/1'), got {part!r}",
            )
        if name not in names:
            hint = " (it runs several servers: write host:port/id)" if name in by_host else ""
            reject("streams", f"{part!r} names host {name!r}, which is not in 'hosts'{hint}")
        name = names[name]
        try:
            sid = int(sid_s)
        except ValueError:
            reject("streams", f"stream id {sid_s!r} is not an integer")
        if not 1 <= sid <= MAX_STREAM_ID:
            reject("streams", f"stream id {sid} must be in 1..{MAX_STREAM_ID}")
        if sid in dict(streams):
            # offsets are keyed by stream id: one id, one stream, across all hosts
            reject(
                "streams", f"stream id {sid} appears twice; stream ids must be unique across hosts"
            )
        streams.append((sid, name))
    return tuple(hosts), tuple(sorted(streams))


def _json_stream_key(
    name: str, key: str, streams: tuple[int, ...], pattern: tuple[int, int] | None
) -> int:
    """A per-stream JSON option's key: a stream id the query reads (or may discover)."""
    try:
        sid = int(key)
    except ValueError:
        reject(name, f"key {key!r} is not a stream id")
    if pattern is not None:
        if not pattern[0] <= sid <= pattern[1]:
            reject(name, f"stream {sid} is not in streams {pattern[0]}-{pattern[1]}")
    elif sid not in streams:
        reject(name, f"stream {sid} is not in streams {list(streams)}")
    return sid


def parse_offset_spec(
    name: str,
    raw: str | None,
    default: str,
    streams: tuple[int, ...],
    pattern: tuple[int, int] | None = None,
) -> OffsetSpec:
    """``pattern`` (discovered streams): JSON may name any id in it; the rest use ``default``."""
    if raw is None:
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in (EARLIEST, LATEST):
        return OffsetSpec(text.lower())
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        reject(
            name,
            "must be 'earliest', 'latest' or JSON like "
            '{"1": {"epoch": 3, "seq": 100}}' + f", got {raw!r}",
        )
    if not isinstance(doc, dict):
        reject(name, "JSON must be an object keyed by stream id")
    entries: list[tuple[int, str | tuple[int, int]]] = []
    for key, value in doc.items():
        sid = _json_stream_key(name, key, streams, pattern)
        if isinstance(value, str) and value.lower() in (EARLIEST, LATEST):
            entries.append((sid, value.lower()))
            continue
        if not isinstance(value, dict):
            reject(name, f"stream {sid}: expected {{'epoch': E, 'seq': S}}, got {value!r}")
        extra = set(value) - {"epoch", "seq", "lost"}
        if extra:
            reject(name, f"stream {sid}: unknown field(s) {sorted(extra)}")
        epoch, seq = value.get("epoch"), value.get("seq")
        for what, v in (("epoch", epoch), ("seq", seq)):
            if type(v) is not int or not 0 <= v <= MAX_SEQ:
                reject(name, f"stream {sid}: {what} must be an integer >= 0, got {v!r}")
        entries.append((sid, (epoch, seq)))  # type: ignore[arg-type]
    if pattern is not None:
        return OffsetSpec(default, tuple(sorted(entries)))
    missing = sorted(set(streams) - {sid for sid, _ in entries})
    if missing:
        reject(name, f"no offset for stream(s) {missing}; give every stream in 'streams'")
    return OffsetSpec(None, tuple(sorted(entries)))


def parse_timestamps(
    name: str,
    raw: str | None,
    streams: tuple[int, ...],
    pattern: tuple[int, int] | None = None,
    *,
    end: bool = False,
) -> tuple[tuple[int, int], ...]:
    """``{"1": 1700000000000, "2": -1}`` -> sorted ``(stream, ms)`` (#16.4).

    Milliseconds since the Unix epoch, or Kafka's sentinels ``-1`` (latest) and ``-2``
    (earliest; not an end). Streams left out start/end as ``startingOffsets`` /
    ``endingOffsets`` say (Kafka: the timestamp option takes precedence where it is given).
    """
    if raw is None:
        return ()
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not doc:
        reject(
            name,
            'must be JSON like {"1": 1700000000000, "2": -1} (stream id -> ms since the epoch, '
            f"-1 latest, -2 earliest), got {raw!r}",
        )
    out: list[tuple[int, int]] = []
    for key, value in doc.items():
        sid = _json_stream_key(name, key, streams, pattern)
        lowest = TIMESTAMP_LATEST if end else TIMESTAMP_EARLIEST
        if type(value) is not int or not lowest <= value <= MAX_SEQ // 1_000_000:
            what = "-1 (latest)" if end else "-1 (latest), -2 (earliest)"
            reject(name, f"stream {sid}: expected ms since the epoch >= 0 or {what}, got {value!r}")
        out.append((sid, value))
    return tuple(sorted(out))
