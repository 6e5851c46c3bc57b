"""The model behind ``tensorpool top`` (#19.2): snapshots in, rows out, no I/O.

A snapshot is what the command read at one instant: for each stream the newest header ring's
superblock, ring scan and committed seqs, the driver's status document when a driver runs,
and what QoS and announce traffic said. Rates need two snapshots: frames/s counts the frames
committed since the last refresh (:func:`_frame_rate`), MB/s that times the mean payload of
the ring's committed slots (the ring holds the recent frames, so the mean is recent). Columns
a source cannot fill (no driver: no leases) stay empty, never guessed.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

_NS = 1e-9


#: A consumer not heard from for this long has gone (consumers send QoS every second).
QOS_FRESH_NS = 3_000_000_000
MODES = {1: "stream", 2: "rate-limited"}


@dataclass(frozen=True, slots=True)
class ConsumerQos:
    """The newest ``QosConsumer`` of one consumer (Wire §10.4)."""

    consumer_id: int
    epoch: int
    last_seq_seen: int
    drops_gap: int
    drops_late: int
    mode: str
    heard_ns: int


class QosBook:
    """Who consumes what, from QoS traffic: fed decoded fields and ``now_ns``, no I/O.

    QoS is advisory and unauthenticated (any process can send it): it is shown as reported,
    never used to decide anything.
    """

    def __init__(self) -> None:
        self._consumers: dict[tuple[int, int], ConsumerQos] = {}
        self.messages = 0
        #: QoS-stream messages that did not decode (skipped and counted)
        self.malformed = 0
        self._announces: dict[int, tuple[int, int]] = {}  # stream -> (epoch, heard_ns)

    def on_consumer(
        self,
        stream_id: int,
        consumer_id: int,
        epoch: int,
        last_seq_seen: int,
        drops_gap: int,
        drops_late: int,
        mode: int,
        now_ns: int,
    ) -> None:
        self.messages += 1
        self._consumers[(stream_id, consumer_id)] = ConsumerQos(
            consumer_id, epoch, last_seq_seen, drops_gap, drops_late,
            MODES.get(mode, str(mode)), now_ns,
        )  # fmt: skip

    def consumers(self, stream_id: int, now_ns: int) -> list[ConsumerQos]:
        """Consumers of ``stream_id`` heard within :data:`QOS_FRESH_NS`; forgets older ones."""
        stale = [k for k, c in self._consumers.items() if now_ns - c.heard_ns > QOS_FRESH_NS]
        for k in stale:
            del self._consumers[k]
        return sorted(
            (c for (sid, _), c in self._consumers.items() if sid == stream_id),
            key=lambda c: c.consumer_id,
        )

    def on_announce(self, stream_id: int, epoch: int, now_ns: int) -> None:
        """A ``ShmPoolAnnounce`` heard on the control stream (driver or standalone producer)."""
        self.messages += 1
        self._announces[stream_id] = (epoch, now_ns)

    def announce_age_s(self, stream_id: int, now_ns: int) -> float | None:
        heard = self._announces.get(stream_id)
        return None if heard is None else max(now_ns - heard[1], 0) * _NS

    def stream_ids(self) -> set[int]:
        return {sid for sid, _ in self._consumers}


@dataclass(frozen=True, slots=True)
class StreamRow:
    stream_id: int
    epoch: int
    producer_pid: int
    producer_alive: bool | None
    newest_seq: int | None
    frames_per_s: float | None
    mb_per_s: float | None
    nslots: int
    committed: int
    in_progress: int
    occupancy: float
    last_frame_age_s: float | None
    activity_age_s: float | None
    consumers: int | None
    leases: int | None
    producer_lease: bool | None
    driver_status_age_s: float | None
    directory: str
    #: since the newest ShmPoolAnnounce heard on the control stream (None: none heard)
    announce_age_s: float | None = None
    producer_command: str = ""
    #: processes on this host mapping the ring read-only (consumers), None: not looked
    local_readers: int | None = None
    qos_consumers: tuple[ConsumerQos, ...] = ()

    @property
    def qos_drops(self) -> tuple[int, int]:
        """Sum of the reported (gap, late) drops of this stream's consumers."""
        return (
            sum(c.drops_gap for c in self.qos_consumers),
            sum(c.drops_late for c in self.qos_consumers),
        )

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for c in doc["qos_consumers"]:
            c.pop("heard_ns")
        return doc


def rows(
    regions: Mapping[int, Mapping[str, Any]],
    previous: Mapping[int, tuple[int, int]] | None,
    driver: Mapping[str, Any] | None,
    *,
    now_ns: int,
    now_unix_ns: int,
    qos: QosBook | None = None,
    commands: Mapping[int, str] | None = None,
    mapped: Mapping[int, tuple[list[int], list[int]]] | None = None,
) -> tuple[list[StreamRow], dict[int, tuple[int, int]]]:
    """Rows for one refresh, and the ``(newest_seq, now_ns)`` memo for the next one.

    ``regions``: stream id -> inspect report of its newest ``header.ring`` (with ``directory``);
    ``driver``: the driver's status document or None; ``qos``: consumers heard on the QoS
    channel; ``commands``: producer pid -> what it runs (``produce``, ``ratelimiter``, ...);
    ``mapped``: stream id -> (pids mapping its ring writable, pids mapping it read-only). The
    producer is the writer that is not the driver (a driver creates the files of its streams
    and its pid is in their superblocks), else the superblock's pid.
    """
    commands = commands or {}
    memo: dict[int, tuple[int, int]] = {}
    by_stream: dict[int, Mapping[str, Any]] = {}
    leases: dict[int, int] = {}
    status_age: float | None = None
    if driver:
        by_stream = {int(s["stream_id"]): s for s in driver.get("streams", [])}
        for lease in driver.get("leases", []):
            sid = int(lease["stream_id"])
            leases[sid] = leases.get(sid, 0) + 1
        written = driver.get("written_unix_ns")
        if written:
            status_age = max(now_unix_ns - int(written), 0) * _NS
    out: list[StreamRow] = []
    for sid in sorted(set(regions) | set(by_stream) | (qos.stream_ids() if qos else set())):
        region = regions.get(sid, {})
        sb = region.get("superblock", {})
        ring = region.get("ring") or {}
        occ = ring.get("occupancy", {})
        newest = ring.get("newest_committed_seq")
        fps = mbps = None
        if newest is not None:
            memo[sid] = (newest, now_ns)
            prev = (previous or {}).get(sid)
            if prev is not None and now_ns > prev[1] and newest >= prev[0]:
                fps = _frame_rate(region.get("seqs"), prev[0], newest, (now_ns - prev[1]) * _NS)
                pools = ring.get("pools", [])
                slots = sum(p["slots"] for p in pools)
                mean = sum(p["values_bytes"] for p in pools) / slots if slots else 0.0
                mbps = fps * mean / 1e6
        nslots = int(sb.get("nslots", 0) or 0)
        committed = int(occ.get("committed", 0))
        ts = ring.get("newest_timestamp_ns")
        drv = by_stream.get(sid)
        writers, readers = (mapped or {}).get(sid, ([], []))
        pid = int(sb.get("pid", 0) or 0)
        alive = sb.get("pid_alive")
        others = [w for w in writers if commands.get(w) != "driver"]
        if others and others[0] != pid:
            pid, alive = others[0], True
        out.append(
            StreamRow(
                stream_id=sid,
                epoch=int(sb.get("epoch", drv["epoch"] if drv else 0)),
                producer_pid=pid,
                producer_alive=alive,
                newest_seq=newest,
                frames_per_s=fps,
                mb_per_s=mbps,
                nslots=nslots,
                committed=committed,
                in_progress=int(occ.get("in_progress", 0)),
                occupancy=committed / nslots if nslots else 0.0,
                last_frame_age_s=max(now_ns - ts, 0) * _NS if ts else None,
                activity_age_s=sb.get("activity_age_s"),
                consumers=int(drv["consumer_count"]) if drv else None,
                leases=leases.get(sid, 0) if driver else None,
                producer_lease=(drv.get("producer_lease_id") is not None) if drv else None,
                driver_status_age_s=status_age if drv else None,
                directory=str(region.get("directory", "")),
                producer_command=commands.get(pid, ""),
                local_readers=len(readers) if mapped is not None else None,
                qos_consumers=tuple(qos.consumers(sid, now_ns)) if qos else (),
                announce_age_s=qos.announce_age_s(sid, now_ns) if qos else None,
            )
        )
    return out, memo


def _frame_rate(seqs: list[int] | None, prev_newest: int, newest: int, dt_s: float) -> float:
    """Frames/s since the last refresh.

    When the ring still holds a frame from before, no new frame can have been overwritten yet:
    the frames newer than the last refresh's newest are all there, and counted. When every
    slot is newer, the ring turned over in between: the seq distance is then scaled by how
    densely the ring's frames sit in seq space (1 for a producer's own consecutive seqs, 0.1
    for a rate limiter passing every 10th of its source's seqs). Both stay right for streams
    whose seqs skip, and neither is fooled by a burst of frames just before the refresh.
    """
    if seqs:
        new = len(seqs) - bisect.bisect_right(seqs, prev_newest)
        if new < len(seqs):
            return new / dt_s
        if len(seqs) > 1 and seqs[-1] > seqs[0]:
            density = (len(seqs) - 1) / (seqs[-1] - seqs[0])
            return (newest - prev_newest) * density / dt_s
    return (newest - prev_newest) / dt_s


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(rows_: list[StreamRow], driver: Mapping[str, Any] | None, title: str, note: str) -> Any:
    """A rich renderable: a summary line, the stream table, the consumers heard on QoS."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, expand=False, header_style="bold")
    for col in (
        "stream", "epoch", "producer", "frames/s", "MB/s", "seq", "ring", "occupancy",
        "last frame", "consumers", "drops gap/late", "leases", "announce age",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col == "producer" else "right")
    consumers = Table(title="consumers (QoS)", expand=False, header_style="bold")
    for col in ("stream", "consumer", "mode", "epoch", "seq seen", "behind", "gap", "late"):
        consumers.add_column(col, justify="left" if col == "mode" else "right")
    for r in rows_:
        alive = {True: "", False: " dead", None: ""}[r.producer_alive]
        who = f" {r.producer_command}" if r.producer_command else ""
        n_qos = len(r.qos_consumers)
        seen = [f"{n_qos} qos"]
        if r.local_readers is not None:
            seen.append(f"{r.local_readers} mapped")
        if r.consumers is not None:
            seen.append(f"{r.consumers} leased")
        n_cons = ", ".join(seen)
        gap, late = r.qos_drops
        table.add_row(
            str(r.stream_id),
            str(r.epoch),
            f"{r.producer_pid}{who}{alive}" if r.producer_pid else "-",
            _num(r.frames_per_s, ".1f"),
            _num(r.mb_per_s, ".2f"),
            _num(r.newest_seq, "d"),
            f"{r.nslots}",
            f"{r.occupancy:.0%}",
            "-" if r.last_frame_age_s is None else f"{r.last_frame_age_s:.2f} s",
            n_cons,
            f"{gap}/{late}" if n_qos else "-",
            _num(r.leases, "d"),
            "-" if r.announce_age_s is None else f"{r.announce_age_s:.1f} s",
        )
        for c in r.qos_consumers:
            behind = r.newest_seq - c.last_seq_seen if r.newest_seq is not None else None
            consumers.add_row(
                str(r.stream_id), str(c.consumer_id), c.mode, str(c.epoch),
                str(c.last_seq_seen), _num(behind, "d"), str(c.drops_gap), str(c.drops_late),
            )  # fmt: skip
    if driver:
        age = next(
            (r.driver_status_age_s for r in rows_ if r.driver_status_age_s is not None), None
        )
        line = (
            f"driver {driver.get('instance_id')} pid {driver.get('pid')} "
            f"{driver.get('state')}: {len(driver.get('streams', []))} streams, "
            f"{len(driver.get('leases', []))} leases"
            + ("" if age is None else f", status written {age:.1f} s ago")
        )
    else:
        line = "no driver status found (standalone producers only)"
    limiters = [r for r in rows_ if r.producer_command == "ratelimiter"]
    if limiters:
        line += "; rate limiters: " + ", ".join(
            f"-> {r.stream_id} at {_num(r.frames_per_s, '.1f')} frames/s" for r in limiters
        )
    parts: list[Any] = [Text(f"{line}{note}"), table]
    if consumers.row_count:
        parts.append(consumers)
    return Group(*parts)
