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
  Here a ticket carries the query's random *loss key* (:attr:`FlightRings.loss_key`); the
  server counts the frames it could not deliver under (key, stream, epoch) in a bounded ledger
  (:class:`tensorpool.serve.core.LossLedger`), and the driver takes them with the ``losses``
  action at its next ``latestOffset`` (:meth:`FlightRings.take_losses`). So a Flight
  read's loss goes to the server only, never also to the spool; a task reads locally only when
  its loss can reach the driver (no key, or the spool is reachable from here), else over Flight.

The protocol itself (ticket, stream summary, scan and loss encodings) is
:mod:`.flight_protocol`, which the server imports too. This module imports pyarrow lazily and
never pyspark.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tensorpool.spark_source.plan.offsets import RingState
from tensorpool.spark_source.rings import mapped_rings, spool
from tensorpool.spark_source.rings.flight_protocol import (
    ACTION_LOSSES,
    ACTION_SCAN,
    RemoteUnavailableError,
    StreamSnapshot,
    Ticket,
    decode_loss,
    decode_losses,
    encode_losses_request,
    encode_scan_request,
    new_loss_key,
    snapshot_from_table,
)
from tensorpool.spark_source.rings.hosts import HostView, PlanOrigin
from tensorpool.spark_source.rings.local import LocalRead

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.flight as flight

    from tensorpool.spark_source.options import FlightAccess, RemoteHosts, SourceOptions

log = logging.getLogger("tensorpool.spark_source.rings.remote")


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


# --- the driver side -----------------------------------------------------------------------------
class FlightRings:
    """The :class:`~.port.RingSource` of streams served by ``tensorpool serve`` on their hosts
    (no Aeron on the Spark driver).

    Holds the newest snapshot per stream; :meth:`refresh` updates them, one call per host.
    """

    def __init__(self, remote: RemoteHosts, streams: tuple[int, ...]) -> None:
        self.remote = remote
        self.streams = streams
        self.snapshots: dict[int, StreamSnapshot | None] = dict.fromkeys(streams)
        self._closed = False
        #: what this query's tickets carry: the servers count their read-time loss under it
        self.loss_key = new_loss_key()
        self._late: dict[int, int] = {}  # taken from the servers, not yet in an offset

    def take_losses(self, streams: tuple[int, ...]) -> dict[int, int]:
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
        """An offset recorded what :meth:`take_losses` returned."""
        self._late.clear()

    def refresh(self) -> dict[int, StreamSnapshot | None]:
        for address, sids in self.remote.by_address().items():
            self.snapshots.update(scan_host(address, sids, self.remote.access))
        return self.snapshots

    def scan(
        self, streams: tuple[int, ...], specs: dict[tuple[int, int], mapped_rings.RegionSpec]
    ) -> dict[int, RingState | None]:
        """The hosts' scans (each stream epoch's spec recorded in ``specs``)."""
        out: dict[int, RingState | None] = {}
        for sid, snap in self.refresh().items():
            if snap is None:
                out[sid] = None
                continue
            specs[(sid, snap.spec.epoch)] = snap.spec
            out[sid] = snap.state
        return out

    def scan_one(self, sid: int, spec: mapped_rings.RegionSpec) -> RingState:
        """A fresh scan of one stream epoch (a replayed batch); raises if gone."""
        snap = scan_host(self.remote.address_of(sid), [sid], self.remote.access).get(sid)
        if snap is None or snap.spec.epoch != spec.epoch:
            raise LookupError(f"stream {sid} epoch {spec.epoch} is not served any more")
        return snap.state

    def feed(self) -> None:
        return None  # no descriptor intake: planning uses the ring scans

    def origin(self, spec: mapped_rings.RegionSpec) -> None:
        return None  # a task checks the server's origin itself (:meth:`RemoteRead.local_ok`)

    def reader_for(self, sid: int) -> RemoteRead:
        snap = self.snapshots.get(sid)
        r = self.remote
        if snap is None:  # not announced now (a replay): no local read, the server says
            nowhere = PlanOrigin(HostView("", "", ""), "", "", 0, 0, 0, "stream")
            return RemoteRead(r.address_of(sid), r.access, nowhere, (), False, self.loss_key)
        return RemoteRead(
            r.address_of(sid),
            r.access,
            snap.origin,
            snap.base_dirs,
            r.prefer_local_reads,
            self.loss_key,
        )

    def liveness(self, now_ns: int) -> dict[int, tuple[bool, int | None]]:
        return {
            sid: (False, None) if s is None else (s.live, s.announce_age_ms)
            for sid, s in self.snapshots.items()
        }

    # options refuse discovery, stream metadata and the SHM driver with 'hosts'
    @property
    def context(self) -> Any:
        raise NotImplementedError("no Aeron control plane with 'hosts'")

    def add_poller(self, poller: Callable[[], int]) -> None:
        raise NotImplementedError("stream discovery is not available with 'hosts'")

    def add_streams(self, streams: tuple[int, ...]) -> None:
        raise NotImplementedError("stream discovery is not available with 'hosts'")

    def wait_for_layouts(self, timeout_s: float) -> Any:
        raise NotImplementedError("no announces with 'hosts': the servers are scanned")

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


@dataclass
class FlightSnapshot:
    """A batch read's snapshot of served streams (:class:`~.port.RingSnapshot`)."""

    opts: SourceOptions
    served: dict[int, StreamSnapshot]
    meta: None = None  # includeStreamMetadata is refused with 'hosts'

    @property
    def specs(self) -> dict[int, mapped_rings.RegionSpec]:
        return {sid: s.spec for sid, s in self.served.items()}

    @property
    def states(self) -> dict[int, RingState]:
        return {sid: s.state for sid, s in self.served.items()}

    def origin(self, spec: mapped_rings.RegionSpec) -> None:
        return None  # a task checks the server's origin itself (:meth:`RemoteRead.local_ok`)

    def reader_for(self, sid: int) -> RemoteRead:
        r, s = self.opts.remote, self.served[sid]
        assert r is not None
        return RemoteRead(r.address_of(sid), r.access, s.origin, s.base_dirs, r.prefer_local_reads)


def flight_snapshot(opts: SourceOptions) -> FlightSnapshot:
    """The batch reader's snapshot of every remote stream; a missing one is an error."""
    remote = opts.remote
    assert remote is not None
    got = FlightRings(remote, opts.streams).refresh()
    missing = [sid for sid, s in got.items() if s is None]
    if missing:
        raise LookupError(
            "streams "
            + ", ".join(f"{remote.address_of(s)}/{s}" for s in missing)
            + ": not announced on their host (is the producer running? is the stream in the "
            "server's --stream-id list?)"
        )
    return FlightSnapshot(opts, {sid: s for sid, s in got.items() if s is not None})


# --- the executor side ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RemoteRead:
    """Where a partition's frames are served from (pickled into the partition)."""

    address: str
    access: FlightAccess
    origin: PlanOrigin  # the server's view of the header ring
    base_dirs: tuple[str, ...]  # the server's SHM base directories
    prefer_local: bool = True
    loss_key: str | None = None  # the streaming query's (:attr:`FlightRings.loss_key`)

    def read(
        self, part: Any, on_loss: Callable[[int, str], None], schema: pa.Schema
    ) -> Iterator[pa.RecordBatch]:
        return read_partition(part, self, on_loss, schema)

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


#: counters of this process's remote reads (tests and the benchmark look at them)
READS: dict[str, int] = {"local": 0, "flight": 0}


def read_partition(
    part: Any,
    rr: RemoteRead,
    on_loss: Callable[[int, str], None],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """A planned range of a remote stream: mapped here when possible, else ``do_get``.

    Read-time loss that counts (``failOnDataLoss=false``, not the first batch from
    'earliest', where overwritten frames are no loss) must reach the driver: over Flight the
    server counts it under the ticket's loss key, and ``on_loss`` is told not to spool it too
    (``counted_by_server``); a local read spools it, so it is done only where the driver's
    spool is reachable (its host), else the frames are fetched over Flight."""
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
            yield from LocalRead(rr.base_dirs).read(part, on_loss, schema)
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
    range with ``on_loss.add_range`` when the recorder has it).

    A server that goes away mid-stream (a ``serve`` restart) is asked again for the rest:
    the seqs after the last row or loss range received, within the same retry window,
    which starts afresh after each chunk that moved the read on. The restarted server
    reports what it can no longer read as loss (counted in its ledger for the query's
    driver), so each seq is delivered or counted once, and a restart costs the task
    nothing else."""
    import pyarrow.flight as flight

    retry = _Retry(address, access)
    rest: Ticket | None = ticket
    while rest is not None:
        try:
            reader = client_for(address, access).do_get(
                flight.Ticket(rest.encode()), access.call_options()
            )
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                batch, upto = _received(chunk, rest.first, on_loss)
                if batch is not None:
                    if schema is not None and batch.schema != schema:
                        batch = batch.select(schema.names)  # includeTensorMetadata=false
                    yield batch
                if upto > rest.first:
                    rest = _rest(rest, upto)
                    retry = _Retry(address, access)
                    if rest is None:
                        return
        except Exception as exc:
            retry.failed(exc)


def _received(
    chunk: Any, upto: int, on_loss: Callable[[int, str], None]
) -> tuple[pa.RecordBatch | None, int]:
    """One chunk's rows (None if none) and the seq its rows and loss ranges reach."""
    batch, meta = chunk.data, chunk.app_metadata
    if meta is not None:
        for a, b, why in decode_loss(meta.to_pybytes()):
            add = getattr(on_loss, "add_range", None)
            if add is not None:
                add(a, b, why)
            else:
                for s in range(a, b):
                    on_loss(s, why)
            upto = max(upto, b)
    if batch is None or not batch.num_rows:
        return None, upto
    import pyarrow.compute as pc

    return batch, max(upto, int(pc.max(batch.column("seq")).as_py()) + 1)


def _rest(ticket: Ticket, upto: int) -> Ticket | None:
    """What of ``ticket`` lies at or after ``upto`` (None when nothing)."""
    if upto >= ticket.end:
        return None
    runs = ticket.runs
    if runs is not None:
        runs = tuple((max(a, upto), b) for a, b in runs if b > upto)
        if not runs:
            return None
    return replace(ticket, first=upto, runs=runs)


__all__ = [
    "FlightRings",
    "FlightSnapshot",
    "RemoteRead",
    "fetch",
    "flight_snapshot",
    "read_partition",
    "take_losses",
]
