"""Streams on other hosts: the Spark source's half of ``tensorpool serve`` (Arrow Flight, #18).

Shared memory is visible only on its own host, and Python data sources cannot pin a task to a
host. With ``hosts="camA:8815,camB:8815"`` and ``streams="camA/1,camB/2"`` each host runs
``tensorpool serve`` (:mod:`tensorpool.serve`) and the source talks to those servers instead of
mapping rings:

* **Planning** (the Spark driver, no Aeron there): one ``do_action("scan")`` per host returns,
  per stream, the announced layout (:class:`~.mapped_rings.RegionSpec`), the producer's
  liveness, the server's view of the files (a :class:`~.hosts.PlanOrigin`) and the ring scan
  (seq, committed, length, timestamp per slot). The scan becomes the same
  :class:`~.offsets.RingState` a local scan gives, so offsets, admission limits, loss at
  planning, replay from a checkpoint and ``Trigger.AvailableNow`` are the local code unchanged.
* **Reading** (any executor): a partition carries a :class:`RemoteRead` (server address, the
  server's origin, its base directories). The task reads locally when it can see the very
  header ring file the server maps -- same kernel (boot id) and the same ``st_dev``/``st_ino``
  at the path (:meth:`RemoteRead.local_ok`); then it maps the regions under the server's base
  directories with the usual containment and superblock checks (``preferLocalReads``, default
  true). Otherwise it sends a :class:`Ticket` (stream, epoch, seq range or planned runs) with
  ``do_get`` and gets record batches in the source's schema, read by the server with the same
  seqlock code (:func:`~.mapped_rings.read_range`). Frames the server could not deliver come
  back as ``(first, end, reason)`` ranges in the batches' ``app_metadata`` and go to the same
  loss recorder a local read uses (``failOnDataLoss``).
* **Read-time loss** (``failOnDataLoss=false``; the offsets' ``lostLate``): a local stream's
  tasks send it to the driver through :mod:`.spool`, a socket only the driver's host reaches.
  Here a ticket carries the query's random *loss key* (:attr:`RemoteAttachment.loss_key`); the
  server counts the frames it could not deliver under (key, stream, epoch) in a bounded ledger
  (:class:`tensorpool.serve.core.LossLedger`), and the driver takes them with the ``losses``
  action at its next ``latestOffset`` (:meth:`RemoteAttachment.collect_losses`). So a Flight
  read's loss goes to the server only, never also to the spool; a task reads locally only when
  its loss can reach the driver (no key, or the spool is reachable from here), else over Flight.

This module is also the protocol's one definition (ticket, stream summary, scan and loss
encodings): the server imports it, so the two sides cannot drift. It imports pyarrow lazily
and never pyspark.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from tensorpool.spark_source import mapped_rings, spool
from tensorpool.spark_source.hosts import HostView, PlanOrigin
from tensorpool.spark_source.margin import now_for
from tensorpool.spark_source.offsets import RingState
from tensorpool.spark_source.options import FlightAccess, RemoteHosts

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.flight as flight

    from tensorpool.spark_source.options import SourceOptions

log = logging.getLogger("tensorpool.spark_source.remote")

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


def take_losses(address: str, key: str, access: FlightAccess) -> list[tuple[int, int, int]]:
    """The frames ``address`` found lost for tickets carrying ``key`` since the last call
    (the server forgets them as it answers). One try: the caller keeps what it has on failure."""
    import pyarrow.flight as flight

    results = client_for(address, access).do_action(
        flight.Action(ACTION_LOSSES, encode_losses_request(key)),
        access.call_options(access.timeout_s),
    )
    out: list[tuple[int, int, int]] = []
    for r in results:
        out += decode_losses(r.body.to_pybytes())
    return out


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


#: now on the clock of a stream's stamps (the server stamps its scans with it)
clock_now: Final = now_for


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
    shift = clock_now(spec.clock_domain) - int(doc["now_ns"]) if "now_ns" in doc else 0
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


# --- clients (one per process and address) -------------------------------------------------------
_CLIENTS: dict[tuple[str, bytes | None], flight.FlightClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(address: str, access: FlightAccess) -> flight.FlightClient:
    import pyarrow.flight as flight

    key = (address, access.tls_root_certs)
    with _CLIENTS_LOCK:
        c = _CLIENTS.get(key)
        if c is None:
            kw: dict[str, Any] = {}
            if access.tls_root_certs is not None:
                kw["tls_root_certs"] = access.tls_root_certs
            c = _CLIENTS[key] = flight.FlightClient(access.location(address), **kw)
        return c


def _drop_client(address: str, access: FlightAccess) -> None:
    with _CLIENTS_LOCK:
        c = _CLIENTS.pop((address, access.tls_root_certs), None)
    if c is not None:
        with contextlib.suppress(Exception):  # closing a broken channel
            c.close()


def _retryable(exc: BaseException) -> bool:
    import pyarrow.flight as flight

    return isinstance(exc, (flight.FlightUnavailableError, flight.FlightTimedOutError))


class _Retry:
    """Back off 0.1 s doubling to 1 s, for ``access.retry_s`` in all; then
    :class:`RemoteUnavailableError` naming the host and the last error."""

    def __init__(self, address: str, access: FlightAccess) -> None:
        import time

        self.address = address
        self.access = access
        self.deadline = time.monotonic() + access.retry_s
        self.tries = 0
        self.pause = 0.1

    def failed(self, exc: BaseException) -> None:
        import time

        if not _retryable(exc):
            raise exc
        self.tries += 1
        _drop_client(self.address, self.access)
        if time.monotonic() + self.pause > self.deadline:
            raise RemoteUnavailableError(
                f"tensorpool serve at {self.address} did not answer for "
                f"{self.access.retry_s:g} s ({self.tries} tries): {exc}"
            ) from exc
        log.warning("tensorpool serve at %s unavailable (%s); retrying", self.address, exc)
        time.sleep(self.pause)
        self.pause = min(1.0, self.pause * 2)


def scan_host(
    address: str, streams: list[int], access: FlightAccess
) -> dict[int, StreamSnapshot | None]:
    """One ``scan`` action: every listed stream's snapshot (None: not announced there now).

    Retries ``access.retries`` times on an unavailable server (a restart), then raises
    :class:`RemoteUnavailableError` naming the host.
    """
    import pyarrow as pa
    import pyarrow.flight as flight

    body = encode_scan_request(streams)
    retry = _Retry(address, access)
    while True:
        try:
            client = client_for(address, access)
            out: dict[int, StreamSnapshot | None] = dict.fromkeys(streams)
            results = client.do_action(
                flight.Action(ACTION_SCAN, body), access.call_options(access.timeout_s)
            )
            for r in results:
                raw = r.body.to_pybytes()
                if raw.startswith(b"{"):  # {"stream": N, "missing": why}
                    doc = json.loads(raw)
                    log.info(
                        "tensorpool serve %s: stream %s: %s", address, doc["stream"], doc["missing"]
                    )
                    continue
                tbl = pa.ipc.open_stream(raw).read_all()
                snap = snapshot_from_table(tbl)
                out[snap.spec.stream_id] = snap
            return out
        except Exception as exc:
            retry.failed(exc)


# --- the driver-side attachment ------------------------------------------------------------------
class RemoteAttachment:
    """The streaming reader's view of remote streams (takes the place of an Aeron attachment).

    Holds the newest snapshot per stream; :meth:`scan` refreshes them, one call per host.
    """

    def __init__(self, remote: RemoteHosts, streams: tuple[int, ...]) -> None:
        self.intakes: dict[int, Any] = {}  # no descriptor intake: planning uses the ring scans
        self.remote = remote
        self.streams = streams
        self.snapshots: dict[int, StreamSnapshot | None] = dict.fromkeys(streams)
        self._closed = False
        #: what this query's tickets carry: the servers count their read-time loss under it
        self.loss_key = new_loss_key()
        self._late: dict[int, int] = {}  # taken from the servers, not yet in an offset

    def collect_losses(self, streams: tuple[int, ...]) -> dict[int, int]:
        """Read-time loss per stream the servers counted for this query, plus what earlier
        calls took and no offset recorded yet (as :func:`.spool.collect`; see
        :meth:`forget_losses`). A host that does not answer keeps its counts for the next call."""
        for address in self.remote.by_address():
            try:
                taken = take_losses(address, self.loss_key, self.remote.access)
            except Exception as exc:
                log.warning(
                    "tensorpool serve at %s: could not collect read-time loss: %s", address, exc
                )
                continue
            for sid, _epoch, n in taken:
                if sid in streams and n > 0:
                    self._late[sid] = self._late.get(sid, 0) + n
        return dict(self._late)

    def forget_losses(self) -> None:
        """An offset recorded what :meth:`collect_losses` returned."""
        self._late.clear()

    def scan(self) -> dict[int, StreamSnapshot | None]:
        for address, sids in self.remote.by_address().items():
            self.snapshots.update(scan_host(address, sids, self.remote.access))
        return self.snapshots

    def liveness(self, now_ns: int) -> dict[int, tuple[bool, int | None]]:
        return {
            sid: (False, None) if s is None else (s.live, s.announce_age_ms)
            for sid, s in self.snapshots.items()
        }

    def add_poller(self, poller: Callable[[], int]) -> None:  # pragma: no cover - not used
        raise NotImplementedError("stream discovery is not available with 'hosts'")

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


def scan_streams(
    att: RemoteAttachment,
    specs: dict[tuple[int, int], mapped_rings.RegionSpec],
) -> dict[int, RingState | None]:
    """:func:`~.source.scan_streams` for remote streams (records each epoch's spec)."""
    out: dict[int, RingState | None] = {}
    for sid, snap in att.scan().items():
        if snap is None:
            out[sid] = None
            continue
        specs[(sid, snap.spec.epoch)] = snap.spec
        out[sid] = snap.state
    return out


def scan_one(att: RemoteAttachment, sid: int, epoch: int) -> RingState:
    """A fresh scan of one stream at ``epoch`` (a replayed batch); raises if gone."""
    snap = scan_host(att.remote.address_of(sid), [sid], att.remote.access).get(sid)
    if snap is None or snap.spec.epoch != epoch:
        raise LookupError(f"stream {sid} epoch {epoch} is not served any more")
    return snap.state


def snapshot(opts: SourceOptions) -> dict[int, StreamSnapshot]:
    """The batch reader's snapshot of every remote stream; a missing one is an error."""
    remote = opts.remote
    assert remote is not None
    att = RemoteAttachment(remote, opts.streams)
    got = att.scan()
    missing = [sid for sid, s in got.items() if s is None]
    if missing:
        raise LookupError(
            "streams "
            + ", ".join(f"{remote.address_of(s)}/{s}" for s in missing)
            + ": not announced on their host (is the producer running? is the stream in the "
            "server's --stream-id list?)"
        )
    return {sid: s for sid, s in got.items() if s is not None}


def batch_reads(opts: SourceOptions, served: dict[int, StreamSnapshot]) -> dict[int, RemoteRead]:
    """Each stream's :class:`RemoteRead` for a batch read's partitions."""
    r = opts.remote
    assert r is not None
    return {
        sid: RemoteRead(r.address_of(sid), r.access, s.origin, s.base_dirs, r.prefer_local_reads)
        for sid, s in served.items()
    }


# --- the executor side ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RemoteRead:
    """Where a partition's frames are served from (pickled into the partition)."""

    address: str
    access: FlightAccess
    origin: PlanOrigin  # the server's view of the header ring
    base_dirs: tuple[str, ...]  # the server's SHM base directories
    prefer_local: bool = True
    loss_key: str | None = None  # the streaming query's (:attr:`RemoteAttachment.loss_key`)

    def local_ok(self) -> bool:
        """This process sees the very header ring file the server maps: same kernel (boot id)
        and the same file identity at the path. Then reading locally is reading the same
        memory (the regions are still validated by superblock when mapped)."""
        if not self.prefer_local:
            return False
        o = self.origin
        if o.header_ino == 0 or not HostView.here().same_kernel(o.view):
            return False
        import os

        try:
            st = os.stat(o.header_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (o.header_dev, o.header_ino)


def remote_read_for(att: RemoteAttachment, sid: int) -> RemoteRead:
    snap = att.snapshots.get(sid)
    r = att.remote
    if snap is None:  # not announced now (a replay): no local read, the server says what is lost
        nowhere = PlanOrigin(HostView("", "", ""), "", "", 0, 0, 0, "stream")
        return RemoteRead(r.address_of(sid), r.access, nowhere, (), False, att.loss_key)
    return RemoteRead(
        r.address_of(sid),
        r.access,
        snap.origin,
        snap.base_dirs,
        r.prefer_local_reads,
        att.loss_key,
    )


#: counters of this process's remote reads (tests and the benchmark look at them)
READS: dict[str, int] = {"local": 0, "flight": 0}


def read_partition(
    part: Any,
    on_loss: Callable[[int, str], None],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """A planned range of a remote stream: mapped here when possible, else ``do_get``.

    Read-time loss that counts (``failOnDataLoss=false``, not the first batch from
    'earliest', where overwritten frames are no loss) must reach the driver: over Flight the
    server counts it under the ticket's loss key, and ``on_loss`` is told not to spool it too
    (``counted_by_server``); a local read spools it, so it is done only where the driver's
    spool is reachable (its host), else the frames are fetched over Flight."""
    rr: RemoteRead = part.remote
    counts = not part.fail_on_data_loss and not getattr(part, "from_earliest", False)
    key = rr.loss_key if counts else None
    spool_dir = getattr(part, "spool_dir", None)
    if rr.local_ok() and (key is None or (spool_dir is not None and spool.reachable(spool_dir))):
        try:
            mapped_rings.mapped(part.region, rr.base_dirs)
        except Exception as exc:  # not ours after all (validation refused it): go remote
            log.info(
                "tensorpool: stream %d: local map refused (%s); reading over Flight",
                part.stream_id,
                exc,
            )
        else:
            READS["local"] += 1
            yield from mapped_rings.read_range(
                part.region,
                rr.base_dirs,
                part.first,
                part.end,
                include_meta=part.include_meta,
                on_loss=on_loss,
                schema=schema,
                runs=part.runs,
            )
            return
    READS["flight"] += 1
    runs = part.runs
    ticket = Ticket(
        part.stream_id,
        part.epoch,
        part.first,
        part.end,
        None if runs is None else tuple((int(a), int(b)) for a, b in runs.tolist()),
        part.include_meta,
        key,
    )
    if key is not None and (mark := getattr(on_loss, "counted_by_server", None)) is not None:
        mark()
    yield from fetch(rr.address, rr.access, ticket, on_loss, schema)


def fetch(
    address: str,
    access: FlightAccess,
    ticket: Ticket,
    on_loss: Callable[[int, str], None],
    schema: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """``do_get`` of one ticket; loss ranges go to ``on_loss`` (once per frame, or once per
    range with ``on_loss.add_range`` when the recorder has it)."""
    import pyarrow.flight as flight

    retry = _Retry(address, access)
    while True:
        try:
            reader = client_for(address, access).do_get(
                flight.Ticket(ticket.encode()), access.call_options()
            )
            first_chunk = reader.read_chunk()
            break
        except StopIteration:
            return
        except Exception as exc:
            retry.failed(exc)
    chunk = first_chunk
    while True:
        batch, meta = chunk.data, chunk.app_metadata
        if meta is not None:
            for a, b, why in decode_loss(meta.to_pybytes()):
                add = getattr(on_loss, "add_range", None)
                if add is not None:
                    add(a, b, why)
                else:
                    for s in range(a, b):
                        on_loss(s, why)
        if batch is not None and batch.num_rows:
            if schema is not None and batch.schema != schema:
                batch = batch.select(schema.names)  # includeTensorMetadata=false
            yield batch
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return


__all__ = [
    "ACTION_LOSSES",
    "ACTION_SCAN",
    "FlightAccess",
    "LossRanges",
    "RemoteAttachment",
    "RemoteHosts",
    "RemoteRead",
    "RemoteUnavailableError",
    "StreamSnapshot",
    "Ticket",
    "TicketError",
    "decode_loss",
    "decode_losses",
    "decode_scan_request",
    "decode_ticket",
    "encode_loss",
    "encode_scan_request",
    "fetch",
    "load_request",
    "read_partition",
    "scan_streams",
    "snapshot",
    "take_losses",
]
