"""`tensorpool inspect PATH_OR_STREAM`: what a region file, an epoch, or a stream holds right now.

Model. An operator points the tool at one of three things:

* a region file (``header.ring`` or ``payload-N.pool``): its superblock, and for a header ring
  the state of every slot;
* an epoch directory (``<base>/<namespace>/<instance>/epoch-<E>/``): every region file in it,
  plus cross-checks between them (same epoch, stream and ring depth, §15.5);
* a stream id (a bare number; write ``./123`` for a file named ``123``): the newest epoch
  directory of that stream found under ``--shm-base-dir/<namespace>/*/epoch-*``, chosen by the
  superblocks it holds (highest epoch, then most recent activity). Scanning is fine for an
  operator tool; consumers never scan, they map exactly what is announced (§15.21a.4).

Safety. Every file goes through :class:`~tensorpool.shm.paths.PathPolicy` (§15.21a.5): canonical
path, containment, regular file, ``O_NOFOLLOW | O_NONBLOCK`` open and identity re-check, so a
FIFO, device or socket is refused before it could block or have side effects, and a symlink
cannot lead the tool out of the places it was pointed at. The allowed bases are the SHM base
directory, ``--allowed-base-dir`` entries, and the directory the operator named (the parent of
an explicit file, or the epoch directory itself). Regions are mapped read-only and only the
header ring is mapped at all; pools are judged by their 64-byte superblock (``pread``).

A live ring changes while it is read. Slot words are loaded as single aligned 8-byte loads and
each committed slot's header is read between two loads of its ``seq_commit`` (§8.3): a slot
that changed in between counts as in progress. The result is a consistent-per-slot snapshot,
not a global one. ``seq_commit == 0`` is counted as empty: it is also "seq 0 in progress", a
state that lasts microseconds and only ever in slot 0.

The report is plain data (dicts of JSON types) built by functions that take the clock reading
and the pid probe as arguments, so tests check it exactly; :func:`run` only does the I/O and
printing. Exit status: 0 when every region is valid, 1 when a region or a cross-check shows a
problem (reported in the output), 2 when there is nothing to inspect (missing path, refused
path, not a tensorpool region, unknown stream).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from tensorpool.commands._common import add_shm_args
from tensorpool.endpoints import DEFAULT_NAMESPACE
from tensorpool.transport.process import pid_running

if TYPE_CHECKING:
    from tensorpool.shm.paths import PathPolicy
    from tensorpool.shm.superblock import SuperblockFields

HEADER_RING_FILENAME: Final = "header.ring"
_POOL_FILE = re.compile(r"^payload-(\d+)\.pool$")
_STREAM_ID = re.compile(r"^[0-9]+$")
_U32_MAX: Final = 0xFFFFFFFF
_NS_PER_S: Final = 1_000_000_000


def _is_epoch_dirname(name: str) -> bool:
    """#14.1: the one epoch-directory rule, the one the producer and the driver create by
    (:func:`tensorpool.shm.epochs.parse_epoch_dirname`; imported here, not at the top, so the
    CLI starts without loading ``shm``)."""
    from tensorpool.shm.epochs import parse_epoch_dirname

    return parse_epoch_dirname(name) is not None


Report = dict[str, Any]
PidProbe = Callable[[int], bool | None]


class InspectError(Exception):
    """Nothing could be inspected; ``reason`` is a stable name, the message is for humans."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --- arguments ----------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="PATH_OR_STREAM",
        help="a region file (header.ring, payload-N.pool), an epoch directory, or a stream id "
        "(a bare number; write ./NAME for a file whose name is a number)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        help="namespace directory under --shm-base-dir searched for a stream id (%(default)s)",
    )
    add_shm_args(p)


# --- small pure helpers -------------------------------------------------------------------------
def magic_text(magic: int) -> str:
    """The 8 magic bytes in file order, non-printable bytes shown as ``.`` (hexdump style).

    File order is what ``head -c 8`` shows; a valid region reads ``1MHSLPOT`` because §7.1's
    magic is the u64 ``0x544F504C53484D31`` stored little-endian.
    """
    raw = magic.to_bytes(8, "little")
    return "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in raw)


def _problem(reason: str, detail: str) -> dict[str, str]:
    return {"reason": reason, "detail": detail}


def _age_s(now_ns: int, ts_ns: int) -> float | None:
    return None if ts_ns == 0 else round((now_ns - ts_ns) / _NS_PER_S, 6)


def _region_type_name(raw: int) -> str:
    from tensorpool.shm.layout import RegionType

    try:
        return RegionType(raw).name
    except ValueError:
        return f"UNKNOWN({raw})"


def describe_superblock(fields: SuperblockFields, *, now_ns: int, probe: PidProbe) -> Report:
    """Every superblock field, with the derived facts an operator asks about first."""
    from tensorpool.shm.layout import MAGIC

    return {
        "magic": magic_text(fields.magic),
        "magic_hex": f"{fields.magic:#018x}",
        "magic_valid": fields.magic == MAGIC,
        "layout_version": fields.layout_version,
        "epoch": fields.epoch,
        "stream_id": fields.stream_id,
        "region_type": _region_type_name(fields.region_type),
        "region_type_raw": fields.region_type,
        "pool_id": fields.pool_id,
        "nslots": fields.nslots,
        "slot_bytes": fields.slot_bytes,
        "stride_bytes": fields.stride_bytes,
        "pid": fields.pid,
        "pid_alive": probe(fields.pid),
        "start_timestamp_ns": fields.start_timestamp_ns,
        "activity_timestamp_ns": fields.activity_timestamp_ns,
        "start_age_s": _age_s(now_ns, fields.start_timestamp_ns),
        "activity_age_s": _age_s(now_ns, fields.activity_timestamp_ns),
    }


def check_superblock(fields: SuperblockFields, file_bytes: int) -> list[dict[str, str]]:
    """Structural problems of one region judged on its own (§7.1, §8.1, §15.22).

    Magic is checked by the caller (a bad magic means the rest is not a superblock at all).
    """
    from tensorpool.counters import Reason
    from tensorpool.shm.backend import is_power_of_two, validate_stride_bytes
    from tensorpool.shm.errors import BackendError
    from tensorpool.shm.layout import (
        HEADER_SLOT_BYTES,
        LAYOUT_VERSION,
        SUPERBLOCK_SIZE,
        RegionType,
    )

    problems: list[dict[str, str]] = []
    if fields.layout_version != LAYOUT_VERSION:
        problems.append(
            _problem(
                Reason.SUPERBLOCK_LAYOUT_VERSION_MISMATCH,
                f"layout_version {fields.layout_version}, this tool reads {LAYOUT_VERSION}",
            )
        )
    if not is_power_of_two(fields.nslots):
        problems.append(
            _problem(Reason.SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO, f"nslots {fields.nslots}")
        )
    if fields.region_type == RegionType.HEADER_RING:
        if fields.pool_id != 0:
            problems.append(
                _problem(
                    Reason.SUPERBLOCK_POOL_ID_MISMATCH,
                    f"header ring pool_id {fields.pool_id} (must be 0)",
                )
            )
        if fields.slot_bytes != HEADER_SLOT_BYTES:
            problems.append(
                _problem(
                    Reason.SUPERBLOCK_SLOT_BYTES_MISMATCH,
                    f"header ring slot_bytes {fields.slot_bytes} (must be {HEADER_SLOT_BYTES})",
                )
            )
        slot_size = HEADER_SLOT_BYTES
    elif fields.region_type == RegionType.PAYLOAD_POOL:
        try:
            validate_stride_bytes(fields.stride_bytes)
        except BackendError as exc:
            problems.append(_problem(exc.reason, exc.detail))
        if fields.slot_bytes not in (fields.stride_bytes, _U32_MAX):
            problems.append(
                _problem(
                    Reason.SUPERBLOCK_SLOT_BYTES_MISMATCH,
                    f"pool slot_bytes {fields.slot_bytes} != stride_bytes {fields.stride_bytes}",
                )
            )
        slot_size = fields.stride_bytes
    else:
        problems.append(
            _problem(
                Reason.SUPERBLOCK_REGION_TYPE_MISMATCH,
                f"region_type {fields.region_type} is neither HEADER_RING (1) nor PAYLOAD_POOL (2)",
            )
        )
        return problems
    declared = SUPERBLOCK_SIZE + fields.nslots * slot_size
    if file_bytes < declared:
        problems.append(
            _problem(
                Reason.REGION_TOO_SMALL,
                f"file has {file_bytes} bytes, superblock declares {declared}",
            )
        )
    return problems


def scan_header_ring(buf: Any, nslots: int) -> Report:
    """Classify every slot of a header ring mapping (§8.3) and summarise what it holds.

    ``buf`` is the read-only mapping of the ring (superblock included) holding at least
    ``nslots`` complete slots. The ring scan of ``shm/`` (``HeaderRingView.scan``): every
    ``seq_commit``, the header fields, every ``seq_commit`` again; a committed slot whose word
    changed in between, or whose sequence does not belong to this index (``seq & (nslots-1)``,
    §15.18) is not counted as committed.
    """
    import numpy as np

    from tensorpool.shm.ring import HeaderRingView

    committed = in_progress = empty = misplaced = 0
    newest: tuple[int, int, int, int] | None = None  # seq, index, timestamp_ns, meta_version
    oldest: tuple[int, int] | None = None
    newest_writing: int | None = None
    pools: dict[int, list[int]] = {}
    if nslots > 0:
        ring = HeaderRingView(buf, nslots)  # the one ring scan of shm/ (no raw seq_commit here)
        try:
            scan = ring.scan()
        finally:
            ring.close()
        seq = (scan.word1 >> np.uint64(1)).astype(np.int64)
        stable = scan.committed
        wrong = scan.misplaced(nslots)
        good = stable & ~wrong
        committed = int(good.sum())
        misplaced = int(wrong.sum())
        empty = int(scan.empty.sum())
        in_progress = nslots - committed - misplaced - empty  # writing, or rewritten meanwhile
        writing = (scan.word1 != 0) & ((scan.word1 & np.uint64(1)) == 0)
        if writing.any():
            newest_writing = int(seq[writing].max())
        if committed:
            at = np.flatnonzero(good)
            hi = int(at[np.argmax(seq[at])])
            lo = int(at[np.argmin(seq[at])])
            rec = scan.fields[hi]
            newest = (int(seq[hi]), hi, int(rec["timestamp_ns"]), int(rec["meta_version"]))
            oldest = (int(seq[lo]), lo)
            pool_ids = scan.fields["pool_id"][good]
            lens = scan.fields["values_len"][good].astype(np.int64)
            for pid in np.unique(pool_ids).tolist():
                mine = pool_ids == pid
                pools[int(pid)] = [int(mine.sum()), int(lens[mine].sum())]
    return {
        "slots_scanned": nslots,
        "occupancy": {
            "committed": committed,
            "in_progress": in_progress,
            "empty": empty,
            "misplaced": misplaced,
        },
        "newest_committed_seq": None if newest is None else newest[0],
        "newest_committed_index": None if newest is None else newest[1],
        "newest_timestamp_ns": None if newest is None else newest[2],
        "newest_meta_version": None if newest is None else newest[3],
        "oldest_committed_seq": None if oldest is None else oldest[0],
        "oldest_committed_index": None if oldest is None else oldest[1],
        "newest_in_progress_seq": newest_writing,
        "pools": [
            {"pool_id": pid, "slots": n, "values_bytes": nbytes}
            for pid, (n, nbytes) in sorted(pools.items())
        ],
    }


# --- one region -----------------------------------------------------------------------------------
def inspect_region(path: str, policy: PathPolicy, *, now_ns: int, probe: PidProbe) -> Report:
    """Open ``path`` through ``policy`` and report on it; raises :class:`InspectError` when
    the file cannot be judged at all (refused path, short file, bad magic)."""
    import mmap

    from tensorpool.counters import Reason
    from tensorpool.shm.errors import ShmError
    from tensorpool.shm.layout import (
        HEADER_SLOT_BYTES,
        LAYOUT_VERSION,
        MAGIC,
        SUPERBLOCK_SIZE,
        RegionType,
    )
    from tensorpool.shm.superblock import read_superblock

    try:
        fd, validated = policy.open(path)
    except ShmError as exc:
        raise InspectError(exc.reason, exc.detail) from None
    try:
        file_bytes = os.fstat(fd).st_size
        raw = os.pread(fd, SUPERBLOCK_SIZE, 0)
        if len(raw) < SUPERBLOCK_SIZE:
            raise InspectError(
                Reason.REGION_TOO_SMALL,
                f"{validated.canonical}: {file_bytes} bytes, a superblock needs {SUPERBLOCK_SIZE}",
            )
        fields = read_superblock(raw)
        if fields.magic != MAGIC:
            raise InspectError(
                Reason.SUPERBLOCK_BAD_MAGIC,
                f"{validated.canonical}: magic {magic_text(fields.magic)!r} "
                f"({fields.magic:#018x}) is not {magic_text(MAGIC)!r}: not a tensorpool region",
            )
        report: Report = {
            "path": validated.canonical,
            "file_bytes": file_bytes,
            "superblock": describe_superblock(fields, now_ns=now_ns, probe=probe),
            "problems": check_superblock(fields, file_bytes),
        }
        if fields.region_type == RegionType.PAYLOAD_POOL:
            payload = fields.nslots * fields.stride_bytes
            report["pool"] = {
                "size_bytes": file_bytes,
                "declared_bytes": SUPERBLOCK_SIZE + payload,
                "payload_bytes": payload,
            }
        elif fields.region_type == RegionType.HEADER_RING:
            complete = max(0, (file_bytes - SUPERBLOCK_SIZE) // HEADER_SLOT_BYTES)
            nslots = min(fields.nslots, complete)
            if fields.layout_version != LAYOUT_VERSION:
                report["ring"] = None  # another slot layout: do not guess
            elif nslots == 0:
                report["ring"] = scan_header_ring(b"", 0)
            else:
                # The whole file: on hugetlbfs it is a whole number of hugepages, as the
                # mapping and unmapping lengths must be.
                mm = mmap.mmap(fd, file_bytes, mmap.MAP_SHARED, mmap.PROT_READ)
                try:
                    report["ring"] = scan_header_ring(mm, nslots)
                finally:
                    mm.close()
        return report
    finally:
        os.close(fd)


# --- directories and streams ----------------------------------------------------------------
def region_files(directory: str) -> list[tuple[str, int | None]]:
    """``(path, pool id from the name or None for the ring)``: the ring first, pools by id."""
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise InspectError("path_open_failed", f"{directory}: {exc.strerror}") from None
    found: list[tuple[int, str, int | None]] = []
    for name in names:
        if name == HEADER_RING_FILENAME:
            found.append((-1, name, None))
        elif m := _POOL_FILE.fullmatch(name):
            found.append((int(m.group(1)), name, int(m.group(1))))
    found.sort()
    return [(os.path.join(directory, name), pid) for _, name, pid in found]


def cross_check(entries: Iterable[tuple[int | None, Report]]) -> list[dict[str, str]]:
    """Regions of one epoch directory must agree (§7.1, §15.5): same epoch and stream, pools
    with the ring's ``nslots``, names matching the superblock's type and pool id."""
    from tensorpool.counters import Reason

    problems: list[dict[str, str]] = []
    ring: Report | None = None
    readable: list[tuple[int | None, Report]] = []
    for name_pool_id, report in entries:
        sb = report.get("superblock")
        if sb is None:
            continue
        readable.append((name_pool_id, sb))
        if name_pool_id is None:
            if sb["region_type"] != "HEADER_RING":
                problems.append(
                    _problem(
                        Reason.SUPERBLOCK_REGION_TYPE_MISMATCH,
                        f"{HEADER_RING_FILENAME} holds a {sb['region_type']} superblock",
                    )
                )
            else:
                ring = sb
        else:
            if sb["region_type"] != "PAYLOAD_POOL":
                problems.append(
                    _problem(
                        Reason.SUPERBLOCK_REGION_TYPE_MISMATCH,
                        f"payload-{name_pool_id}.pool holds a {sb['region_type']} superblock",
                    )
                )
            elif sb["pool_id"] != name_pool_id:
                problems.append(
                    _problem(
                        Reason.SUPERBLOCK_POOL_ID_MISMATCH,
                        f"payload-{name_pool_id}.pool has pool_id {sb['pool_id']}",
                    )
                )
    if ring is None:
        problems.append(_problem("header_ring_missing", f"no readable {HEADER_RING_FILENAME}"))
        return problems
    for name_pool_id, sb in readable:
        if name_pool_id is None:
            continue
        where = f"payload-{name_pool_id}.pool"
        if sb["epoch"] != ring["epoch"]:
            problems.append(
                _problem(
                    Reason.SUPERBLOCK_EPOCH_MISMATCH,
                    f"{where} epoch {sb['epoch']}, header ring {ring['epoch']}",
                )
            )
        if sb["stream_id"] != ring["stream_id"]:
            problems.append(
                _problem(
                    Reason.SUPERBLOCK_STREAM_ID_MISMATCH,
                    f"{where} stream_id {sb['stream_id']}, header ring {ring['stream_id']}",
                )
            )
        if sb["nslots"] != ring["nslots"]:
            problems.append(
                _problem(
                    Reason.SUPERBLOCK_NSLOTS_MISMATCH,
                    f"{where} nslots {sb['nslots']}, header ring {ring['nslots']}",
                )
            )
    return problems


def inspect_directory(
    directory: str, policy: PathPolicy, *, now_ns: int, probe: PidProbe
) -> tuple[list[Report], list[dict[str, str]]]:
    """Every region in an epoch directory (per-region failures become ``error`` entries)."""
    files = region_files(directory)
    if not files:
        hint = ""
        try:
            if any(_is_epoch_dirname(n) for n in os.listdir(directory)):
                hint = " (it holds epoch-* directories: pass one of them, or a stream id)"
        except OSError:
            pass
        raise InspectError(
            "no_regions",
            f"{directory}: no region files ({HEADER_RING_FILENAME}, payload-N.pool){hint}",
        )
    entries: list[tuple[int | None, Report]] = []
    for path, name_pool_id in files:
        try:
            report = inspect_region(path, policy, now_ns=now_ns, probe=probe)
        except InspectError as exc:
            report = {"path": path, "error": _problem(exc.reason, exc.detail)}
        entries.append((name_pool_id, report))
    return [r for _, r in entries], cross_check(entries)


def _subdirs(directory: str) -> list[str]:
    """Real subdirectories (symlinks to directories are not followed)."""
    with os.scandir(directory) as it:
        return [e.path for e in it if e.is_dir(follow_symlinks=False)]


def epoch_dirs(root: str) -> list[str]:
    """``epoch-*`` directories under a namespace root, in both layouts that create them:
    ``<instance>/epoch-*`` (standalone producers) and ``<instance>/stream-<id>/epoch-*`` (the
    SHM driver). Symlinks are not followed."""
    found: list[str] = []
    level = [root]
    for _ in range(3):
        nxt: list[str] = []
        for d in level:
            try:
                entries = _subdirs(d)
            except OSError:
                continue
            for e in entries:
                (found if os.path.basename(e).startswith("epoch-") else nxt).append(e)
        level = nxt
    return found


def find_stream_directory(
    base_dir: str, namespace: str, stream_id: int, policy: PathPolicy
) -> tuple[str, int]:
    """Newest epoch directory of ``stream_id``: ``(directory, number of candidates)``.

    Candidates are ``<base>/<namespace>/*/epoch-*`` (standalone) and
    ``<base>/<namespace>/*/stream-*/epoch-*`` (the SHM driver) whose ``header.ring`` passes the path
    policy and has a valid superblock for the stream; the highest epoch wins, then the most
    recent activity. Symlinked directories are not followed while scanning.
    """
    from tensorpool.shm.errors import ShmError
    from tensorpool.shm.layout import MAGIC, SUPERBLOCK_SIZE, RegionType
    from tensorpool.shm.superblock import read_superblock

    root = os.path.join(base_dir, namespace)
    candidates: list[tuple[int, int, str]] = []
    try:
        _subdirs(root)  # a missing or unreadable root is its own error, not "no stream"
    except OSError as exc:
        raise InspectError(
            "stream_not_found", f"stream {stream_id}: {root}: {exc.strerror}"
        ) from None
    for epoch_dir in epoch_dirs(root):
        if not _is_epoch_dirname(os.path.basename(epoch_dir)):
            continue
        try:
            fd, _ = policy.open(os.path.join(epoch_dir, HEADER_RING_FILENAME))
        except ShmError:
            continue
        try:
            raw = os.pread(fd, SUPERBLOCK_SIZE, 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(raw) < SUPERBLOCK_SIZE:
            continue
        sb = read_superblock(raw)
        if (
            sb.magic == MAGIC
            and sb.region_type == RegionType.HEADER_RING
            and sb.stream_id == stream_id
        ):
            candidates.append((sb.epoch, sb.activity_timestamp_ns, epoch_dir))
    if not candidates:
        raise InspectError(
            "stream_not_found",
            f"no epoch directory with a header ring for stream {stream_id} under {root}"
            " (*/epoch-* or */stream-*/epoch-*)",
        )
    return max(candidates)[2], len(candidates)


# --- the whole report -----------------------------------------------------------------------
def build_report(
    target: str,
    *,
    shm_base_dir: str,
    namespace: str = DEFAULT_NAMESPACE,
    allowed_base_dirs: Iterable[str] = (),
    now_ns: int,
    probe: PidProbe = pid_running,
) -> Report:
    """Resolve ``target`` (file, directory or stream id) and inspect it.

    Raises :class:`InspectError` when there is nothing to show; otherwise returns the report
    whose ``ok`` says whether every region and cross-check passed.
    """
    from tensorpool.shm.paths import PathPolicy

    base = os.path.abspath(shm_base_dir)
    extra = [os.path.abspath(d) for d in allowed_base_dirs]
    report: Report = {"target": target, "now_ns": now_ns}
    problems: list[dict[str, str]] = []
    if _STREAM_ID.fullmatch(target):
        stream_id = int(target)
        if stream_id > _U32_MAX:
            raise InspectError("stream_id_out_of_range", f"{stream_id} does not fit in u32")
        policy = PathPolicy([base, *extra])
        directory, n = find_stream_directory(base, namespace, stream_id, policy)
        regions, problems = inspect_directory(directory, policy, now_ns=now_ns, probe=probe)
        report.update(kind="stream", stream_id=stream_id, directory=directory, candidates=n)
    else:
        path = os.path.abspath(target)
        if os.path.isdir(path):
            # The named directory is itself a base: files in it may not resolve elsewhere.
            policy = PathPolicy([base, *extra, path])
            regions, problems = inspect_directory(path, policy, now_ns=now_ns, probe=probe)
            report.update(kind="directory", directory=os.path.realpath(path))
        else:
            policy = PathPolicy([base, *extra, os.path.dirname(path)])
            regions = [inspect_region(path, policy, now_ns=now_ns, probe=probe)]
            report["kind"] = "file"
    report["regions"] = regions
    report["problems"] = problems
    report["ok"] = not problems and all("error" not in r and not r.get("problems") for r in regions)
    return report


# --- text output --------------------------------------------------------------------------------
def _fmt_age(age: float | None) -> str:
    return "never" if age is None else f"{age:.3f} s ago"


def _fmt_alive(alive: bool | None) -> str:
    return {True: "alive", False: "not running", None: "unknown"}[alive]


def format_text(report: Report) -> str:
    """A compact, aligned, human-readable rendering of :func:`build_report`'s result."""
    lines: list[str] = []
    kind = report["kind"]
    if kind == "stream":
        lines.append(
            f"stream {report['stream_id']}: {report['directory']} "
            f"(newest of {report['candidates']} epoch directories)"
        )
    elif kind == "directory":
        lines.append(f"directory {report['directory']}")
    for region in report["regions"]:
        lines.append(region["path"])
        if "error" in region:
            err = region["error"]
            lines.append(f"  error            {err['reason']}: {err['detail']}")
            continue
        sb = region["superblock"]
        valid = "valid" if sb["magic_valid"] else "INVALID"
        lines += [
            f"  magic            {sb['magic']} ({valid})",
            f"  layout_version   {sb['layout_version']}",
            f"  epoch            {sb['epoch']}",
            f"  stream_id        {sb['stream_id']}",
            f"  region_type      {sb['region_type']}",
            f"  pool_id          {sb['pool_id']}",
            f"  nslots           {sb['nslots']}",
            f"  slot_bytes       {sb['slot_bytes']}",
            f"  stride_bytes     {sb['stride_bytes']}",
            f"  pid              {sb['pid']} ({_fmt_alive(sb['pid_alive'])})",
            f"  started          {sb['start_timestamp_ns']} ns ({_fmt_age(sb['start_age_s'])})",
            f"  activity         {sb['activity_timestamp_ns']} ns "
            f"({_fmt_age(sb['activity_age_s'])})",
        ]
        if "pool" in region:
            pool = region["pool"]
            lines.append(
                f"  size             {pool['size_bytes']} bytes "
                f"(declared {pool['declared_bytes']}, payload {pool['payload_bytes']})"
            )
        if "ring" in region:
            ring = region["ring"]
            if ring is None:
                lines.append("  ring             not scanned (unknown layout_version)")
            else:
                occ = ring["occupancy"]
                text = (
                    f"  occupancy        {occ['committed']} committed / "
                    f"{occ['in_progress']} in progress / {occ['empty']} empty"
                )
                if occ["misplaced"]:
                    text += f" / {occ['misplaced']} misplaced"
                lines.append(text + f" (of {ring['slots_scanned']} scanned)")
                if ring["newest_committed_seq"] is None:
                    lines.append("  newest seq       none committed")
                else:
                    lines.append(
                        f"  newest seq       {ring['newest_committed_seq']} "
                        f"@ index {ring['newest_committed_index']}"
                    )
                    lines.append(
                        f"  oldest seq       {ring['oldest_committed_seq']} "
                        f"@ index {ring['oldest_committed_index']}"
                    )
                if ring["newest_in_progress_seq"] is not None:
                    lines.append(f"  writing seq      {ring['newest_in_progress_seq']}")
                for usage in ring["pools"]:
                    lines.append(
                        f"  pool {usage['pool_id']:<11} {usage['slots']} slots, "
                        f"{usage['values_bytes']} bytes"
                    )
        for prob in region["problems"]:
            lines.append(f"  PROBLEM          {prob['reason']}: {prob['detail']}")
    for prob in report["problems"]:
        lines.append(f"PROBLEM {prob['reason']}: {prob['detail']}")
    return "\n".join(lines)


# --- the command --------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    import time

    from tensorpool.cli import UserError

    try:
        report = build_report(
            args.target,
            shm_base_dir=args.shm_base_dir,
            namespace=args.namespace,
            allowed_base_dirs=args.allowed_base_dir,
            now_ns=time.monotonic_ns(),
        )
    except InspectError as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:  # e.g. a relative --allowed-base-dir refused by PathPolicy
        raise UserError(str(exc)) from None
    out = json.dumps(report) if args.json else format_text(report)
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
    return 0 if report["ok"] else 1
