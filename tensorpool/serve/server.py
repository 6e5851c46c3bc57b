"""The Arrow Flight server of ``tensorpool serve``: one host's streams, read-only (#18).

The server learns its streams the way any consumer does -- announces (standalone) or leases
from the SHM driver (``driver=True``) -- through the Spark source's control-plane attachment,
and maps exactly what was announced, through the path containment and superblock checks of
every consumer (:class:`~tensorpool.spark_source.rings.mapped_rings.MappedStream`). A client names a
stream id, an epoch and seqs; never a path.

Calls (the protocol is defined once, in :mod:`tensorpool.spark_source.rings.flight_protocol`):

* ``list_flights`` / ``get_flight_info(path=[stream id])``: each served stream, its schema and a
  JSON summary in the schema metadata (layout, epoch, head seq, oldest seq in the ring,
  producer liveness, the server's view of its files);
* ``do_action("scan", {"streams": [...]})``: per stream, the summary plus the whole ring scan
  (one Arrow IPC table each) -- what the Spark driver plans with;
* ``do_action("stats")``: the server's counters (JSON);
* ``do_action("losses", {"key": k})``: frames ``do_get`` could not deliver to tickets carrying
  loss key ``k`` since the last such call, per (stream, epoch), taken from the bounded
  :class:`~tensorpool.serve.core.LossLedger` (how a driver on another host learns its tasks'
  read-time loss), and journalled so that a restart keeps it (:mod:`tensorpool.serve.journal`);
* ``do_get(ticket)``: frames of one stream epoch as record batches in the Spark source's schema,
  read with the seqlock by :func:`~tensorpool.spark_source.rings.mapped_rings.read_range`;
  frames not delivered are reported as ``(first, end, reason)`` ranges in ``app_metadata``.

Failures are Flight errors with one clear message (bad ticket, stream not served, bad or
missing token); the server never dies on them. Every refusal and every lost frame is counted
(:attr:`TensorPoolFlightServer.counters`). A request is bounded before it is parsed (size,
JSON depth, stream ids per scan: :func:`~tensorpool.spark_source.rings.protocol.load_request`), and
anything that still goes wrong in a handler is logged here and answered with one line
(``internal_error``): a client never sees the server's traceback or its file paths.

Threads: Flight runs handlers on a gRPC thread pool, and the mapping cache and Arrow buffer
pool of ``mapped_rings`` are per process and not thread-safe: one lock covers every mapping,
scan and batch build; batches are sent outside it.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as flight

from tensorpool.client.announce import StreamLayout
from tensorpool.serve.core import (
    BadTicket,
    LossLedger,
    NotAnnounced,
    journal_record,
    journal_take,
    plan_get,
)
from tensorpool.serve.journal import LedgerJournal
from tensorpool.spark_source.plan.margin import now_for
from tensorpool.spark_source.plan.offsets import RingState
from tensorpool.spark_source.rings import flight_protocol as protocol
from tensorpool.spark_source.rings import mapped_rings
from tensorpool.spark_source.rings.hosts import STREAM, PlanOrigin

log = logging.getLogger("tensorpool.serve")

#: ``do_action("stats")``: the counters below as one JSON object
ACTION_STATS = "stats"


class StreamDirectory(Protocol):
    """Where the server learns its streams (the Spark source's ``Attachment``)."""

    def layouts(self) -> dict[int, StreamLayout]: ...

    def liveness(self, now_ns: int) -> dict[int, tuple[bool, int | None]]: ...


def arrow_schema(include_meta: bool) -> pa.Schema:
    """The Spark source's Arrow schema (what Spark compares batches with), built without
    pyspark; ``tests/unit/test_serve_core.py`` checks it equals the source's."""
    fields = [
        pa.field("stream_id", pa.int32()),
        pa.field("epoch", pa.int64()),
        pa.field("seq", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_ns", pa.int64()),
    ]
    if include_meta:
        fields += [
            pa.field("meta_version", pa.int32()),
            pa.field("dtype", pa.string()),
            pa.field("shape", pa.list_(pa.field("element", pa.int32()))),
            pa.field("strides", pa.list_(pa.field("element", pa.int32()))),
        ]
    fields.append(pa.field("payload", pa.binary()))
    return pa.schema(fields)


SCHEMAS = {True: arrow_schema(True), False: arrow_schema(False)}


class BearerToken(flight.ServerMiddlewareFactory):
    """``authorization: Bearer <token>`` on every call, compared in constant time."""

    def __init__(self, token: str, counters: Counter[str]) -> None:
        super().__init__()
        self._token = token.encode()
        self._counters = counters

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        values = headers.get("authorization") or []
        for v in values:
            raw = v.encode() if isinstance(v, str) else bytes(v)
            scheme, _, given = raw.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(given, self._token):
                return None
        reason = "auth_missing" if not values else "auth_bad_token"
        self._counters[reason] += 1
        raise flight.FlightUnauthenticatedError(
            "tensorpool serve: "
            + ("no bearer token" if not values else "wrong bearer token")
            + " (send 'authorization: Bearer <token>'; the Spark option is flightToken)"
        )


class TensorPoolFlightServer(flight.FlightServerBase):
    """Serves ``streams`` of one host over Flight (see the module docstring)."""

    def __init__(
        self,
        location: str,
        *,
        streams: tuple[int, ...],
        directory: StreamDirectory,
        base_dirs: tuple[str, ...],
        shm_base_dir: str,
        token: str | None = None,
        tls_certificates: list[tuple[bytes, bytes]] | None = None,
        journal: LedgerJournal | None = None,
    ) -> None:
        # Everything a handler uses is set before the base class's __init__, which starts
        # serving on gRPC threads: a client retrying across a restart reached do_get while the
        # journal replayed (no ``_slots`` yet) and its task failed on an internal error (#30).
        self.counters: Counter[str] = Counter()
        self.streams = tuple(sorted(streams))
        self.directory = directory
        self.base_dirs = base_dirs
        self.shm_base_dir = shm_base_dir
        self._lock = threading.Lock()
        self.ledger = LossLedger(self.counters)
        self._ledger_lock = threading.Lock()  # apart from _lock: a take never waits on a read
        self.journal = journal
        if journal is not None:
            journal.load(self.ledger, time.time_ns(), self.counters)
        #: the most slots each stream's ring has had here: what bounds a ticket (plan_get)
        self._slots: dict[int, int] = {}
        middleware = {"auth": BearerToken(token, self.counters)} if token else None
        super().__init__(
            location,
            tls_certificates=tls_certificates or None,
            middleware=middleware,
        )

    @contextlib.contextmanager
    def _answering(self, call: str) -> Iterator[None]:
        """Flight errors pass as raised; anything else is this server's own failure: logged
        with its traceback here, counted (``internal_error``), and answered with one line."""
        try:
            yield
        except flight.FlightError:
            raise
        except Exception:
            self.counters["internal_error"] += 1
            log.exception("tensorpool serve: %s failed", call)
            raise flight.FlightInternalError(
                f"tensorpool serve: {call} failed (the server's log says why)"
            ) from None

    def _refuse(self, counter: str, message: str) -> flight.FlightServerError:
        self.counters[counter] += 1
        return flight.FlightServerError(f"tensorpool serve: {message}")

    # --- what a stream is now -------------------------------------------------------------------
    def _served(self, sid: int) -> None:
        if sid not in self.streams:
            raise self._refuse(
                "stream_not_served",
                f"stream {sid} is not served here (serves {list(self.streams)})",
            )

    def _spec(self, sid: int) -> mapped_rings.RegionSpec | None:
        layout = self.directory.layouts().get(sid)
        if layout is None:
            return None
        spec = mapped_rings.RegionSpec.from_layout(layout)
        self._slots[sid] = max(self._slots.get(sid, 0), spec.nslots)
        return spec

    def _summary_and_scan(
        self, sid: int
    ) -> tuple[dict[str, Any], RingState, dict[str, Any]] | None:
        spec = self._spec(sid)
        if spec is None:
            return None
        with self._lock:
            m = mapped_rings.mapped(spec, self.base_dirs)
            scan = m.ring.scan()
            origin = PlanOrigin.of(m.regions[0].path, self.shm_base_dir, STREAM)
        st = mapped_rings.ring_state(spec.epoch, scan)
        fields = {
            "committed": scan.committed,
            "values_len": st.lens,
            "timestamp_ns": st.stamps,
        }
        live, age = self.directory.liveness(time.monotonic_ns()).get(sid, (False, None))
        summary = {
            "stream": sid,
            "region": protocol.spec_to_json(spec),
            "epoch": spec.epoch,
            "head": st.head,
            "oldest": st.oldest,
            "nslots": spec.nslots,
            "live": live,
            "announce_age_ms": age,
            "origin": protocol.origin_to_json(origin),
            "base_dirs": list(self.base_dirs),
            "now_ns": now_for(spec.clock_domain),  # the client shifts stamps by its now
        }
        return summary, st, fields

    # --- Flight calls ---------------------------------------------------------------------------
    def _info(self, sid: int) -> flight.FlightInfo:
        got = self._summary_and_scan(sid)
        summary: dict[str, Any] = (
            {"stream": sid, "missing": "no producer announced"} if got is None else got[0]
        )
        schema = SCHEMAS[True].with_metadata({protocol.SUMMARY_KEY: json.dumps(summary).encode()})
        descriptor = flight.FlightDescriptor.for_path(str(sid))
        endpoints = []
        if got is not None:
            st = got[1]
            t = protocol.Ticket(sid, st.epoch, st.oldest, st.head)
            endpoints.append(flight.FlightEndpoint(t.encode(), []))
            records = st.head - st.oldest
        else:
            records = 0
        return flight.FlightInfo(schema, descriptor, endpoints, records, -1)

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        for sid in self.streams:
            try:
                info = self._info(sid)
            except Exception:  # one stream's trouble must not hide the others
                self.counters["internal_error"] += 1
                log.exception("tensorpool serve: describing stream %d failed", sid)
                continue
            yield info

    def get_flight_info(
        self, context: Any, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        path = descriptor.path or []
        if len(path) != 1 or not path[0].isdigit() or len(path[0]) > 10:
            raise self._refuse(
                "bad_descriptor", "describe a stream by its id, as a one-element path ['1']"
            )
        sid = int(path[0])
        self._served(sid)
        with self._answering("get_flight_info"):
            return self._info(sid)

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            (protocol.ACTION_SCAN, "ring scans of {'streams': [ids]} (one Arrow IPC each)"),
            (ACTION_STATS, "the server's counters (JSON)"),
            (protocol.ACTION_LOSSES, "take the read-time loss counted for {'key': loss key}"),
        ]

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        with self._answering(f"action {action.type[:40]!r}"):
            return self._action(action)

    def _action(self, action: flight.Action) -> Iterator[bytes]:
        if action.type == ACTION_STATS:
            return iter([json.dumps(dict(self.counters), sort_keys=True).encode()])
        decode = {
            protocol.ACTION_LOSSES: protocol.decode_losses_request,
            protocol.ACTION_SCAN: protocol.decode_scan_request,
        }.get(action.type)
        if decode is None:
            raise self._refuse("bad_action", f"unknown action {action.type[:40]!r}")
        try:
            request = decode(action.body.to_pybytes())
        except protocol.TicketError as exc:
            raise self._refuse("bad_action", str(exc)) from None
        if isinstance(request, str):  # the losses key
            with self._ledger_lock:
                now = time.time_ns()
                taken = self.ledger.take(request, now)
                if taken:
                    self._journal(journal_take(request, now))
            return iter([protocol.encode_losses(taken)])
        sids = request
        for sid in sids:
            self._served(sid)
        out = []
        for sid in sids:
            got = self._summary_and_scan(sid)
            if got is None:
                out.append(json.dumps({"stream": sid, "missing": "no producer announced"}).encode())
                continue
            tbl = protocol.scan_table(*got)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, tbl.schema) as w:
                w.write_table(tbl)
            out.append(sink.getvalue().to_pybytes())
        self.counters["scans"] += 1
        return iter(out)

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        with self._answering("do_get"):
            return self._get(ticket)

    def _get(self, ticket: flight.Ticket) -> flight.FlightDataStream:
        try:
            t = protocol.decode_ticket(ticket.ticket)
        except protocol.TicketError as exc:
            raise self._refuse("bad_ticket", f"bad ticket: {exc}") from None
        self._served(t.stream_id)
        spec = self._spec(t.stream_id)
        st = None
        if spec is not None:
            try:
                with self._lock:
                    st = mapped_rings.mapped(spec, self.base_dirs).scan()
            except Exception as exc:  # regions gone since the announce: all lost
                log.warning("tensorpool serve: stream %d not mappable: %s", t.stream_id, exc)
                spec = None
        try:
            plan = plan_get(
                t, None if spec is None else spec.epoch, st, self._slots.get(t.stream_id)
            )
        except BadTicket as exc:
            raise self._refuse("bad_ticket", f"bad ticket: {exc}") from None
        except NotAnnounced as exc:
            self.counters["not_announced_yet"] += 1
            raise flight.FlightUnavailableError(f"tensorpool serve: {exc}") from None
        self.counters["gets"] += 1
        schema = SCHEMAS[t.include_meta]
        return flight.GeneratorStream(schema, self._stream(t, spec, plan, schema))

    def _stream(
        self,
        t: protocol.Ticket,
        spec: mapped_rings.RegionSpec | None,
        plan: Any,
        schema: pa.Schema,
    ) -> Iterator[Any]:
        """Batches with pending loss ranges in their app_metadata; a last empty batch carries
        what is left. Runs in the gRPC thread; a client that goes away closes it."""
        loss = protocol.LossRanges()
        for a, b, why in plan.lost:
            loss.add(a, b, why)
        empty = schema.empty_table().to_batches()
        empty_batch = empty[0] if empty else pa.RecordBatch.from_pylist([], schema=schema)
        frames = 0
        try:
            if spec is not None and plan.reads:
                batches = mapped_rings.read_range(
                    spec,
                    self.base_dirs,
                    plan.first,
                    plan.end,
                    include_meta=t.include_meta,
                    on_loss=loss,
                    schema=schema,
                    runs=plan.runs,
                )
                while True:
                    with self._lock:
                        batch = next(batches, None)
                    if batch is None:
                        break
                    frames += batch.num_rows
                    lost = loss.take()
                    yield (batch, self._loss_meta(t, lost)) if lost else batch
            lost = loss.take()
            if lost:
                yield (empty_batch, self._loss_meta(t, lost))
        except GeneratorExit:
            self.counters["client_gone"] += 1
            raise
        except Exception:
            self.counters["internal_error"] += 1
            log.exception("tensorpool serve: reading stream %d failed", t.stream_id)
            raise flight.FlightInternalError(
                f"tensorpool serve: reading stream {t.stream_id} failed (the server's log says why)"
            ) from None
        finally:
            self.counters["frames"] += frames
            self.counters["frames_lost"] += loss.frames

    def _loss_meta(self, t: protocol.Ticket, lost: list[tuple[int, int, str]]) -> bytes:
        """The ranges' ``app_metadata``; with a loss key, first counted in the ledger for the
        key's driver (before the client can see them, so a driver that collects after its
        tasks finished finds them)."""
        n = sum(b - a for a, b, _ in lost)
        if t.loss_key is not None and n > 0:
            with self._ledger_lock:
                now = time.time_ns()
                self.ledger.record(t.loss_key, t.stream_id, t.epoch, n, now)
                self._journal(journal_record(t.loss_key, t.stream_id, t.epoch, n, now))
        return protocol.encode_loss(lost)

    def _journal(self, line: bytes) -> None:
        """Append a ledger event (under the ledger's lock). The ledger's clock is the wall
        clock, the one a restarted process shares. A journal that cannot be written (disk
        full) keeps the loss in memory only: counted and logged, the read goes on."""
        if self.journal is None:
            return
        try:
            self.journal.append(line, self.ledger)
        except OSError as exc:
            self.counters["loss_journal_write_failed"] += 1
            log.warning("tensorpool serve: loss journal %s: %s", self.journal.dir, exc)


__all__ = ["SCHEMAS", "BearerToken", "StreamDirectory", "TensorPoolFlightServer", "arrow_schema"]
