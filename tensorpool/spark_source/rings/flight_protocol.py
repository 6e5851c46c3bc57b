"""The ``tensorpool serve`` protocol (#18), defined once: the Spark source's Flight client
(:mod:`.remote`) and the server (:mod:`tensorpool.serve`) both import it, so the two sides
cannot drift.

The ticket (stream, epoch, seq range or planned runs, loss key) and its bounded decoding; the
``scan`` and ``losses`` actions' requests and answers (the read-time loss ledger's codec); loss
ranges in a batch's ``app_metadata``; a stream's summary and ring scan as an Arrow table. No
I/O: pyarrow is imported lazily, by the functions that build or read tables.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from tensorpool.spark_source.plan.margin import now_for
from tensorpool.spark_source.plan.offsets import RingState
from tensorpool.spark_source.rings import mapped_rings
from tensorpool.spark_source.rings.hosts import HostView, PlanOrigin

if TYPE_CHECKING:
    import pyarrow as pa

#: Flight action names the server implements.
ACTION_SCAN: Final = "scan"
#: ``{"key": loss key}`` -> ``{"lost": [[stream, epoch, frames], ...]}``, taken (cleared)
ACTION_LOSSES: Final = "losses"
#: a query's loss key: 128 random bits in hex (:func:`new_loss_key`); anything else is refused
LOSS_KEY: Final = re.compile(r"[0-9a-f]{32}")
#: Schema-metadata key of a FlightInfo's stream summary (JSON).
SUMMARY_KEY: Final = b"tensorpool"
#: Longest seq range one ticket may name: a planned range lies within one ring (nslots <= 2^24
#: in practice) plus the frames lost before it; anything beyond is a malformed ticket.
MAX_TICKET_SPAN: Final = 1 << 40
MAX_TICKET_RUNS: Final = 1 << 20
#: the longest request body (ticket, scan or losses) the server parses: a ticket's runs for a
#: ring of 2^16 gapped slots are well under 1 MiB; more is refused before it is parsed
MAX_REQUEST_BYTES: Final = 4 << 20
#: the deepest JSON nesting of any request (a ticket's runs: object, list, pair)
MAX_REQUEST_DEPTH: Final = 4
#: the most stream ids one scan may name (duplicates are scanned once)
MAX_SCAN_STREAMS: Final = 1024
#: stream ids as announced: a uint32 without the two values Aeron reserves
MAX_STREAM_ID: Final = 2**32 - 2
DEFAULT_PORT: Final = 8815


class TicketError(ValueError):
    """A ``do_get`` ticket or an action body is malformed (the message names the field)."""


class RemoteUnavailableError(RuntimeError):
    """A ``tensorpool serve`` host did not answer (after retries)."""


# --- the ticket ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ticket:
    """What one ``do_get`` reads: frames ``[first, end)`` of one stream epoch.

    ``runs`` (``[a, b)`` pairs inside the range) are the seqs the plan found committed; None
    reads every committed seq of the range (a relay's gaps are skipped, not lost), exactly as
    :func:`~.mapped_rings.read_range` does locally.
    """

    stream_id: int
    epoch: int
    first: int
    end: int
    runs: tuple[tuple[int, int], ...] | None = None
    include_meta: bool = True
    #: the reading query's loss key: the server counts this read's loss for its driver
    loss_key: str | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "v": 1,
            "stream": self.stream_id,
            "epoch": self.epoch,
            "first": self.first,
            "end": self.end,
            "meta": self.include_meta,
        }
        if self.runs is not None:
            doc["runs"] = [list(r) for r in self.runs]
        if self.loss_key is not None:
            doc["loss"] = self.loss_key
        return json.dumps(doc, separators=(",", ":")).encode()

    @property
    def frames(self) -> int:
        """How many seqs the ticket names: what a read of it may deliver or report lost."""
        return self.end - self.first if self.runs is None else sum(b - a for a, b in self.runs)

    def runs_array(self) -> np.ndarray | None:
        if self.runs is None:
            return None
        return np.asarray(self.runs, np.int64).reshape(-1, 2)


def _is_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _shown(v: object) -> str:
    """``repr`` of a client's value, cut short: an error message never echoes a whole body."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _int_field(doc: dict, name: str, lo: int, hi: int) -> int:
    v = doc.get(name)
    if not _is_int(v, lo, hi):
        raise TicketError(
            f"ticket field {name!r} must be an integer in {lo}..{hi}, got {_shown(v)}"
        )
    return v  # type: ignore[return-value]


_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"')
_OPENS: Final = np.frombuffer(b"[{", np.uint8)
_CLOSES: Final = np.frombuffer(b"]}", np.uint8)


def load_request(raw: bytes, what: str) -> Any:
    """``raw`` parsed as JSON, within :data:`MAX_REQUEST_BYTES` and :data:`MAX_REQUEST_DEPTH`
    (checked before parsing: the parser recurses once per level, and a client must not choose
    the server's stack depth); :class:`TicketError` names ``what`` is wrong."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise TicketError(f"{what} is {len(raw)} bytes; at most {MAX_REQUEST_BYTES} are read")
    chars = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
    step = np.isin(chars, _OPENS).astype(np.int64) - np.isin(chars, _CLOSES)
    if step.size and int(np.cumsum(step).max()) > MAX_REQUEST_DEPTH:
        raise TicketError(f"{what} nests JSON deeper than {MAX_REQUEST_DEPTH} levels")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise TicketError(f"{what} is not JSON ({exc})") from None


def decode_ticket(raw: bytes) -> Ticket:
    """Parse and validate a ticket; :class:`TicketError` names the first problem."""
    doc = load_request(raw, "ticket")
    if not isinstance(doc, dict):
        raise TicketError("ticket must be a JSON object")
    if doc.get("v") != 1:
        raise TicketError(f"ticket version {doc.get('v')!r} is not supported (expected 1)")
    unknown = sorted(set(doc) - {"v", "stream", "epoch", "first", "end", "meta", "runs", "loss"})
    if unknown:
        raise TicketError(f"ticket has unknown field(s) {unknown}")
    sid = _int_field(doc, "stream", 1, MAX_STREAM_ID)
    epoch = _int_field(doc, "epoch", 0, 2**63 - 1)
    first = _int_field(doc, "first", 0, 2**63 - 1)
    end = _int_field(doc, "end", first, 2**63 - 1)
    if end - first > MAX_TICKET_SPAN:
        raise TicketError(f"ticket range {first}..{end} spans more than {MAX_TICKET_SPAN} seqs")
    meta = doc.get("meta", True)
    if not isinstance(meta, bool):
        raise TicketError("ticket field 'meta' must be true or false")
    runs: tuple[tuple[int, int], ...] | None = None
    if "runs" in doc:
        raw_runs = doc["runs"]
        if not isinstance(raw_runs, list) or len(raw_runs) > MAX_TICKET_RUNS:
            raise TicketError("ticket field 'runs' must be a list of [a, b) pairs")
        out: list[tuple[int, int]] = []
        prev = first
        for r in raw_runs:
            if (
                not isinstance(r, list)
                or len(r) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                or not prev <= r[0] < r[1] <= end
            ):
                raise TicketError(
                    f"ticket field 'runs': {_shown(r)} is not an ascending [a, b) pair inside "
                    f"{first}..{end}"
                )
            out.append((r[0], r[1]))
            prev = r[1]
        runs = tuple(out)
    key = doc.get("loss")
    if key is not None:
        key = check_loss_key(key)
    return Ticket(sid, epoch, first, end, runs, meta, key)


def new_loss_key() -> str:
    return secrets.token_hex(16)


def check_loss_key(key: object) -> str:
    """``key`` if it is a loss key (:data:`LOSS_KEY`), else :class:`TicketError`."""
    if not isinstance(key, str) or LOSS_KEY.fullmatch(key) is None:
        raise TicketError("a loss key must be 32 lowercase hex digits")
    return key


# --- read-time loss counted by the servers (the 'losses' action) ---------------------------------
def encode_losses_request(key: str) -> bytes:
    return json.dumps({"key": key}).encode()


def decode_losses_request(raw: bytes) -> str:
    """The key of a ``losses`` action body; :class:`TicketError` says what is wrong."""
    doc = load_request(raw, "the losses action's body")
    if not isinstance(doc, dict) or set(doc) != {"key"}:
        raise TicketError("the losses action needs a JSON body {'key': loss key}")
    return check_loss_key(doc["key"])


def encode_scan_request(streams: list[int]) -> bytes:
    return json.dumps({"streams": streams}).encode()


def decode_scan_request(raw: bytes) -> tuple[int, ...]:
    """The stream ids of a ``scan`` action body, each once, in the order first named;
    :class:`TicketError` names what is wrong (at most :data:`MAX_SCAN_STREAMS` ids)."""
    doc = load_request(raw, "the scan action's body")
    if not isinstance(doc, dict) or set(doc) != {"streams"}:
        raise TicketError("the scan action needs a JSON body {'streams': [stream ids]}")
    ids = doc["streams"]
    if not isinstance(ids, list):
        raise TicketError(f"scan field 'streams' must be a list of stream ids, got {_shown(ids)}")
    if len(ids) > MAX_SCAN_STREAMS:
        raise TicketError(
            f"scan field 'streams' names {len(ids)} ids; at most {MAX_SCAN_STREAMS} per scan"
        )
    for sid in ids:
        if not _is_int(sid, 1, MAX_STREAM_ID):
            raise TicketError(
                f"scan field 'streams' holds {_shown(sid)}, not a stream id "
                f"(an integer in 1..{MAX_STREAM_ID})"
            )
    return tuple(dict.fromkeys(ids))


def encode_losses(taken: list[tuple[int, int, int]]) -> bytes:
    return json.dumps({"lost": [list(t) for t in taken]}, separators=(",", ":")).encode()


def decode_losses(raw: bytes) -> list[tuple[int, int, int]]:
    """``(stream, epoch, frames)`` of a ``losses`` answer."""
    return [(int(s), int(e), int(n)) for s, e, n in json.loads(raw)["lost"]]


# --- loss ranges in app_metadata -----------------------------------------------------------------
def encode_loss(ranges: list[tuple[int, int, str]]) -> bytes:
    return json.dumps({"lost": [list(r) for r in ranges]}, separators=(",", ":")).encode()


def decode_loss(raw: bytes | None) -> list[tuple[int, int, str]]:
    if not raw:
        return []
    doc = json.loads(raw)
    return [(int(a), int(b), str(why)) for a, b, why in doc.get("lost", ())]


class LossRanges:
    """``on_loss(seq, reason)`` of a server-side read, folded into ``[first, end)`` ranges."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int, str]] = []
        self.frames = 0

    def __call__(self, seq: int, reason: str) -> None:
        self.frames += 1
        r = self.ranges
        if r and r[-1][1] == seq and r[-1][2] == reason:
            r[-1] = (r[-1][0], seq + 1, reason)
        else:
            r.append((seq, seq + 1, reason))

    def add(self, first: int, end: int, reason: str) -> None:
        if end > first:
            self.frames += end - first
            self.ranges.append((first, end, reason))

    def take(self) -> list[tuple[int, int, str]]:
        out, self.ranges = self.ranges, []
        return out


# --- the stream summary and the scan -------------------------------------------------------------
def spec_to_json(spec: mapped_rings.RegionSpec) -> dict[str, Any]:
    return {
        "stream_id": spec.stream_id,
        "epoch": spec.epoch,
        "layout_version": spec.layout_version,
        "nslots": spec.nslots,
        "header_uri": spec.header_uri,
        "pools": [list(p) for p in spec.pools],
        "clock_domain": spec.clock_domain,
    }


def spec_from_json(doc: dict[str, Any]) -> mapped_rings.RegionSpec:
    return mapped_rings.RegionSpec(
        stream_id=int(doc["stream_id"]),
        epoch=int(doc["epoch"]),
        layout_version=int(doc["layout_version"]),
        nslots=int(doc["nslots"]),
        header_uri=str(doc["header_uri"]),
        pools=tuple((int(a), int(b), str(c)) for a, b, c in doc["pools"]),
        clock_domain=int(doc["clock_domain"]),
    )


def origin_to_json(o: PlanOrigin) -> dict[str, Any]:
    return {
        "hostname": o.view.hostname,
        "boot_id": o.view.boot_id,
        "mnt_ns": o.view.mnt_ns,
        "shm_base_dir": o.shm_base_dir,
        "header_path": o.header_path,
        "header_dev": o.header_dev,
        "header_ino": o.header_ino,
        "planned_at_ns": o.planned_at_ns,
    }


def origin_from_json(doc: dict[str, Any], kind: str) -> PlanOrigin:
    return PlanOrigin(
        HostView(str(doc["hostname"]), str(doc["boot_id"]), str(doc["mnt_ns"])),
        str(doc["shm_base_dir"]),
        str(doc["header_path"]),
        int(doc["header_dev"]),
        int(doc["header_ino"]),
        int(doc["planned_at_ns"]),
        kind,
    )


@dataclass(frozen=True, slots=True)
class StreamSnapshot:
    """One stream as a server sees it now (a ``scan`` result, decoded)."""

    spec: mapped_rings.RegionSpec
    state: RingState
    live: bool
    announce_age_ms: int | None
    origin: PlanOrigin
    base_dirs: tuple[str, ...]


def scan_table(summary: dict[str, Any], st: RingState, fields: dict[str, np.ndarray]) -> pa.Table:
    """A scan as an Arrow table (one row per slot) with the summary in its schema metadata."""
    import pyarrow as pa

    assert st.slot_seq is not None
    tbl = pa.table(
        {
            "slot_seq": pa.array(np.asarray(st.slot_seq, np.int64)),
            "committed": pa.array(np.asarray(fields["committed"], bool)),
            "values_len": pa.array(np.asarray(fields["values_len"], np.int64)),
            "timestamp_ns": pa.array(np.asarray(fields["timestamp_ns"], np.int64)),
        }
    )
    return tbl.replace_schema_metadata({SUMMARY_KEY: json.dumps(summary).encode()})


def snapshot_from_table(tbl: pa.Table) -> StreamSnapshot:
    doc = json.loads((tbl.schema.metadata or {})[SUMMARY_KEY])
    spec = spec_from_json(doc["region"])
    # The stamps are on the serving host's clock; shift them onto this host's (the start
    # margin of 'earliest' compares them with now), up to the call's latency.
    shift = now_for(spec.clock_domain) - int(doc["now_ns"]) if "now_ns" in doc else 0
    st = RingState.from_slots(
        spec.epoch,
        tbl.column("slot_seq").to_numpy(),
        tbl.column("committed").to_numpy(),
        tbl.column("values_len").to_numpy(),
        tbl.column("timestamp_ns").to_numpy() + shift,
    )
    return StreamSnapshot(
        spec,
        st,
        bool(doc["live"]),
        doc.get("announce_age_ms"),
        origin_from_json(doc["origin"], "stream"),
        tuple(doc["base_dirs"]),
    )
