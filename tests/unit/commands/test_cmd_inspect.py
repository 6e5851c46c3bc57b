"""`tensorpool inspect`: real region files on tmpfs, real mmaps, the real CLI entry point.

Regions are made the way producers make them (``create_region`` + ``SlotWriter``, and once with
a real ``Producer`` on an embedded media driver), then inspected through
``tensorpool.cli.main`` with stdout/stderr captured. Exact values (ages, pid liveness) are
checked through :func:`build_report` with an injected clock reading.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from tensorpool.cli import main
from tensorpool.commands.inspect import build_report, magic_text
from tensorpool.endpoints import DEFAULT_NAMESPACE
from tensorpool.shm import (
    MAGIC,
    EpochLayout,
    ShmRegion,
    SlotWriter,
    SuperblockFields,
    create_region,
    write_superblock,
)

STREAM_ID = 77
EPOCH = 3
NOW_NS = 5_000_000_000_000
SMALL = 1000  # bytes: lands in pool 1 (stride 4096)
LARGE = 10_000  # bytes: lands in pool 2 (stride 16384)


@pytest.fixture
def shm_base() -> Iterator[str]:
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    base = os.path.realpath(tempfile.mkdtemp(prefix="tp-inspect-test-", dir=parent))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Epoch:
    layout: EpochLayout
    header: ShmRegion
    pools: list[ShmRegion]
    writer: SlotWriter

    @property
    def directory(self) -> str:
        return self.layout.directory

    def close(self) -> None:
        self.writer.close()
        for region in (self.header, *self.pools):
            region.close()


def make_epoch(
    base: str,
    *,
    epoch: int = EPOCH,
    stream_id: int = STREAM_ID,
    nslots: int = 8,
    strides: dict[int, int] | None = None,
    instance: str = "producer-a",
    now_ns: int = NOW_NS,
    pid: int | None = None,
    layout_version: int = 1,
) -> Epoch:
    strides = strides or {1: 4096, 2: 16384}
    layout = EpochLayout(base, DEFAULT_NAMESPACE, instance, epoch)
    header = create_region(
        layout.header_path,
        SuperblockFields.header_ring(
            epoch=epoch,
            stream_id=stream_id,
            nslots=nslots,
            now_ns=now_ns,
            pid=pid,
            layout_version=layout_version,
        ),
    )
    pools = [
        create_region(
            layout.pool_path(pool_id),
            SuperblockFields.payload_pool(
                epoch=epoch,
                stream_id=stream_id,
                pool_id=pool_id,
                nslots=nslots,
                stride_bytes=stride,
                now_ns=now_ns,
                pid=pid,
                layout_version=layout_version,
            ),
        )
        for pool_id, stride in strides.items()
    ]
    return Epoch(layout, header, pools, SlotWriter(header, pools))


def write_frames(ep: Epoch, seqs: range) -> None:
    """Even seqs go to pool 1 (SMALL bytes), odd seqs to pool 2 (LARGE bytes)."""
    for seq in seqs:
        nbytes = SMALL if seq % 2 == 0 else LARGE
        assert ep.writer.write(seq, np.zeros(nbytes, np.uint8), timestamp_ns=1000 + seq) is not None


@pytest.fixture
def epoch(shm_base: str) -> Iterator[Epoch]:
    ep = make_epoch(shm_base)
    try:
        yield ep
    finally:
        ep.close()


def inspect_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    rc = main(["inspect", "--json", *argv])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1, out  # one JSON object on one line
    return rc, json.loads(lines[0])


def inspect_fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run inspect expecting a user error: exit 2, nothing on stdout, one line on stderr."""
    rc = main(["inspect", *argv])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert lines[0].startswith("tensorpool inspect: error: ")
    return lines[0]


# --- header ring ---------------------------------------------------------------------------------
def test_header_ring_json_reports_newest_oldest_occupancy_and_pool_usage(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_frames(epoch, range(11))  # 11 frames into 8 slots: seqs 3..10 remain
    rc, report = inspect_json(capsys, epoch.layout.header_path)
    assert rc == 0 and report["ok"] is True and report["kind"] == "file"
    (region,) = report["regions"]
    sb = region["superblock"]
    assert sb["magic_valid"] is True and sb["magic"] == magic_text(MAGIC)
    assert (sb["epoch"], sb["stream_id"], sb["region_type"], sb["nslots"]) == (
        EPOCH,
        STREAM_ID,
        "HEADER_RING",
        8,
    )
    assert (sb["pool_id"], sb["slot_bytes"], sb["stride_bytes"], sb["layout_version"]) == (
        0,
        256,
        0,
        1,
    )
    ring = region["ring"]
    assert ring["occupancy"] == {"committed": 8, "in_progress": 0, "empty": 0, "misplaced": 0}
    assert (ring["newest_committed_seq"], ring["newest_committed_index"]) == (10, 2)
    assert (ring["oldest_committed_seq"], ring["oldest_committed_index"]) == (3, 3)
    assert ring["newest_timestamp_ns"] == 1010
    assert ring["newest_in_progress_seq"] is None
    # seqs 4, 6, 8, 10 -> pool 1; 3, 5, 7, 9 -> pool 2
    assert ring["pools"] == [
        {"pool_id": 1, "slots": 4, "values_bytes": 4 * SMALL},
        {"pool_id": 2, "slots": 4, "values_bytes": 4 * LARGE},
    ]
    assert region["problems"] == []


def test_empty_ring_has_no_newest_seq(epoch: Epoch, capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = inspect_json(capsys, epoch.layout.header_path)
    ring = report["regions"][0]["ring"]
    assert rc == 0
    assert ring["occupancy"] == {"committed": 0, "in_progress": 0, "empty": 8, "misplaced": 0}
    assert ring["newest_committed_seq"] is None and ring["oldest_committed_seq"] is None
    assert ring["pools"] == []


def test_s8_3_in_progress_slot_is_not_counted_as_committed(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    """§8.3: a slot whose seq_commit has LSB 0 is being written, not a frame."""
    write_frames(epoch, range(5))
    epoch.writer.begin(5)  # producer claimed slot 5 and has not committed yet
    _, report = inspect_json(capsys, epoch.layout.header_path)
    ring = report["regions"][0]["ring"]
    assert ring["occupancy"] == {"committed": 5, "in_progress": 1, "empty": 2, "misplaced": 0}
    assert ring["newest_committed_seq"] == 4
    assert ring["newest_in_progress_seq"] == 5


def test_s15_18_committed_seq_in_the_wrong_slot_is_misplaced(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    """§15.18: seq S lives in slot S & (nslots-1); a committed word elsewhere is not a frame."""
    write_frames(epoch, range(2))
    epoch.header.words[(64 + 4 * 256) >> 3] = (9 << 1) | 1  # seq 9 belongs in slot 1
    _, report = inspect_json(capsys, epoch.layout.header_path)
    ring = report["regions"][0]["ring"]
    assert ring["occupancy"] == {"committed": 2, "in_progress": 0, "empty": 5, "misplaced": 1}
    assert ring["newest_committed_seq"] == 1


def test_text_output_names_the_newest_seq(epoch: Epoch, capsys: pytest.CaptureFixture[str]) -> None:
    write_frames(epoch, range(11))
    rc = main(["inspect", epoch.layout.header_path])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [line.split() for line in out.splitlines()]
    assert ["newest", "seq", "10", "@", "index", "2"] in lines
    assert ["oldest", "seq", "3", "@", "index", "3"] in lines
    assert ["epoch", str(EPOCH)] in lines
    assert ["occupancy", "8", "committed", "/", "0", "in", "progress", "/", "0", "empty"] in [
        line[:10] for line in lines
    ]


def test_pool_reports_its_size(epoch: Epoch, capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = inspect_json(capsys, epoch.layout.pool_path(2))
    (region,) = report["regions"]
    assert rc == 0
    assert region["superblock"]["region_type"] == "PAYLOAD_POOL"
    assert region["superblock"]["pool_id"] == 2
    assert region["pool"] == {
        "size_bytes": 64 + 8 * 16384,
        "declared_bytes": 64 + 8 * 16384,
        "payload_bytes": 8 * 16384,
    }
    assert "ring" not in region


def fingerprint(path: str) -> tuple[str, int]:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns


IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_CLOSE_NOWRITE = 0x10
IN_OPEN = 0x20
_EVENT = struct.Struct("iIII")


class AccessWatch:
    """inotify on real files: the kernel tells whether each open was for writing.

    ``IN_CLOSE_WRITE`` is reported when a descriptor opened for writing is closed, which any
    writable mapping needs; ``IN_CLOSE_NOWRITE`` for read-only ones. Works as root, where
    permission bits would not stop a write.
    """

    def __init__(self, paths: list[str]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            pytest.skip("inotify unavailable")
        self._names: dict[int, str] = {}
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_OPEN
        for path in paths:
            wd = self._libc.inotify_add_watch(self._fd, path.encode(), mask)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self._names[wd] = path

    def events(self) -> dict[str, int]:
        """OR of the event masks seen per path since the watch started."""
        seen = dict.fromkeys(self._names.values(), 0)
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            data = b""
        off = 0
        while off < len(data):
            wd, mask, _cookie, name_len = _EVENT.unpack_from(data, off)
            seen[self._names[wd]] |= mask
            off += _EVENT.size + name_len
        os.close(self._fd)
        return seen


def test_inspect_opens_regions_read_only_and_changes_nothing(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_frames(epoch, range(3))
    paths = [epoch.layout.header_path, *(epoch.layout.pool_path(p) for p in (1, 2))]
    before = {p: fingerprint(p) for p in paths}
    watch = AccessWatch(paths)
    rc, report = inspect_json(capsys, epoch.directory)
    seen = watch.events()
    assert rc == 0 and report["ok"] is True
    for path in paths:
        assert seen[path] & IN_OPEN and seen[path] & IN_CLOSE_NOWRITE, (path, seen[path])
        assert not seen[path] & (IN_CLOSE_WRITE | IN_MODIFY), (path, seen[path])
    assert {p: fingerprint(p) for p in paths} == before


# --- directories and streams ---------------------------------------------------------------------
def test_epoch_directory_inspects_every_region(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_frames(epoch, range(4))
    rc, report = inspect_json(capsys, epoch.directory)
    assert rc == 0 and report["ok"] is True
    assert report["kind"] == "directory" and report["directory"] == epoch.directory
    assert [os.path.basename(r["path"]) for r in report["regions"]] == [
        "header.ring",
        "payload-1.pool",
        "payload-2.pool",
    ]
    assert report["regions"][0]["ring"]["newest_committed_seq"] == 3
    assert report["problems"] == []


def test_stream_id_picks_the_newest_epoch_directory(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    made = [
        make_epoch(shm_base, epoch=2),
        make_epoch(shm_base, epoch=5),
        make_epoch(shm_base, epoch=9, stream_id=STREAM_ID + 1, instance="producer-b"),
    ]
    try:
        write_frames(made[1], range(6))
        rc, report = inspect_json(capsys, "--shm-base-dir", shm_base, str(STREAM_ID))
        assert rc == 0
        assert report["kind"] == "stream" and report["stream_id"] == STREAM_ID
        assert report["directory"] == made[1].directory
        assert report["candidates"] == 2  # the other stream's epoch 9 is not a candidate
        ring = report["regions"][0]["ring"]
        assert report["regions"][0]["superblock"]["epoch"] == 5
        assert ring["newest_committed_seq"] == 5
    finally:
        for ep in made:
            ep.close()


def test_14_1_stream_id_uses_the_one_epoch_directory_rule(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """#14.1: ``inspect <stream id>`` finds epoch directories by the rule the producer and the
    driver create them by (``shm.epochs``): ``epoch-0009`` (leading zeros) is no epoch
    directory, even with a newer ring of the stream in it."""
    made = [make_epoch(shm_base, epoch=5), make_epoch(shm_base, epoch=9)]
    try:
        odd = os.path.join(os.path.dirname(made[1].directory), "epoch-0009")
        os.rename(made[1].directory, odd)
        rc, report = inspect_json(capsys, "--shm-base-dir", shm_base, str(STREAM_ID))
        assert rc == 0
        assert report["directory"] == made[0].directory and report["candidates"] == 1
    finally:
        for ep in made:
            ep.close()


def test_real_producer_regions(shm_base: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
    from tensorpool.client.settings import ClientSettings
    from tensorpool.transport.context import AeronContext

    settings = ClientSettings(shm_base_dir=shm_base)
    with AeronContext() as ctx:
        producer = Producer(
            ctx, StreamConfig(4711, header_nslots=16, pools=(PoolConfig(1, 8192),)), settings
        )
        try:
            for i in range(20):
                assert producer.offer(np.full((16, 16), i, np.uint32)) == i
            rc, by_stream = inspect_json(capsys, "--shm-base-dir", shm_base, "4711")
            _, by_file = inspect_json(capsys, producer.header_region_path)
        finally:
            producer.close()
    assert rc == 0 and by_stream["directory"] == producer.epoch_directory
    for report in (by_stream, by_file):
        ring_region = report["regions"][0]
        sb = ring_region["superblock"]
        assert (sb["epoch"], sb["stream_id"], sb["pid"]) == (producer.epoch, 4711, os.getpid())
        assert sb["pid_alive"] is True
        ring = ring_region["ring"]
        assert ring["occupancy"]["committed"] == 16
        assert (ring["newest_committed_seq"], ring["newest_committed_index"]) == (19, 3)
        assert (ring["oldest_committed_seq"], ring["oldest_committed_index"]) == (4, 4)
        assert ring["pools"] == [{"pool_id": 1, "slots": 16, "values_bytes": 16 * 1024}]
    assert by_stream["regions"][1]["pool"]["size_bytes"] == 64 + 16 * 8192


# --- exact derived values ------------------------------------------------------------------------
def test_s7_1_activity_age_uses_the_given_monotonic_reading(shm_base: str) -> None:
    """§7.1: activity_timestamp_ns is the liveness clock; age = now - activity."""
    ep = make_epoch(shm_base)
    try:
        report = build_report(
            ep.layout.header_path,
            shm_base_dir=shm_base,
            now_ns=NOW_NS + 2_500_000_000,
            probe=lambda pid: None,
        )
    finally:
        ep.close()
    sb = report["regions"][0]["superblock"]
    assert sb["activity_timestamp_ns"] == NOW_NS and sb["start_timestamp_ns"] == NOW_NS
    assert sb["activity_age_s"] == 2.5 and sb["start_age_s"] == 2.5
    assert sb["pid_alive"] is None  # whatever the probe says


def test_never_refreshed_activity_has_no_age(shm_base: str) -> None:
    ep = make_epoch(shm_base, now_ns=0)
    try:
        report = build_report(ep.layout.header_path, shm_base_dir=shm_base, now_ns=NOW_NS)
    finally:
        ep.close()
    assert report["regions"][0]["superblock"]["activity_age_s"] is None


def test_dead_producer_pid_is_reported_not_alive(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    ep = make_epoch(shm_base, pid=child.pid)
    try:
        _, report = inspect_json(capsys, ep.layout.header_path)
    finally:
        ep.close()
    assert report["regions"][0]["superblock"]["pid"] == child.pid
    assert report["regions"][0]["superblock"]["pid_alive"] is False


# --- problems inside readable regions (exit 1) ---------------------------------------------------
def test_s7_1_unknown_layout_version_is_a_problem_and_the_ring_is_not_guessed(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ep = make_epoch(shm_base, layout_version=2)
    try:
        rc, report = inspect_json(capsys, ep.layout.header_path)
    finally:
        ep.close()
    region = report["regions"][0]
    assert rc == 1 and report["ok"] is False
    assert [p["reason"] for p in region["problems"]] == ["superblock_layout_version_mismatch"]
    assert region["ring"] is None


def header_fields(**changes: int) -> SuperblockFields:
    fields = SuperblockFields.header_ring(epoch=EPOCH, stream_id=STREAM_ID, nslots=8, now_ns=NOW_NS)
    return dataclasses.replace(fields, **changes)


def pool_fields(**changes: int) -> SuperblockFields:
    fields = SuperblockFields.payload_pool(
        epoch=EPOCH, stream_id=STREAM_ID, pool_id=1, nslots=8, stride_bytes=4096, now_ns=NOW_NS
    )
    return dataclasses.replace(fields, **changes)


@pytest.mark.parametrize(
    ("fields", "reasons"),
    [
        (header_fields(), []),
        (header_fields(pool_id=3), ["superblock_pool_id_mismatch"]),
        (header_fields(slot_bytes=128), ["superblock_slot_bytes_mismatch"]),
        (header_fields(nslots=6), ["superblock_nslots_not_power_of_two"]),
        (pool_fields(), []),
        (pool_fields(slot_bytes=0xFFFFFFFF), []),  # the C reference's null slot_bytes
        (pool_fields(slot_bytes=8192), ["superblock_slot_bytes_mismatch"]),
        (pool_fields(stride_bytes=6000, slot_bytes=6000), ["stride_bytes_not_power_of_two"]),
        (pool_fields(region_type=7), ["superblock_region_type_mismatch"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_s7_1_superblock_rules_are_checked(
    shm_base: str, capsys: pytest.CaptureFixture[str], fields: SuperblockFields, reasons: list[str]
) -> None:
    """§7.1: header ring pool_id 0 and 256-byte slots; pools sized by their stride (§15.22)."""
    path = os.path.join(shm_base, "region")
    buf = bytearray(64 + fields.nslots * max(fields.stride_bytes, 256))
    write_superblock(buf, fields)
    with open(path, "wb") as f:
        f.write(buf)
    rc, report = inspect_json(capsys, path)
    (region,) = report["regions"]
    assert [p["reason"] for p in region["problems"]] == reasons
    assert rc == (1 if reasons else 0) and report["ok"] is (not reasons)
    if fields.region_type == 7:
        assert region["superblock"]["region_type"] == "UNKNOWN(7)"
        assert "ring" not in region and "pool" not in region


def test_truncated_ring_scans_only_complete_slots(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_frames(epoch, range(8))
    os.truncate(epoch.layout.header_path, 64 + 3 * 256 + 100)
    rc, report = inspect_json(capsys, epoch.layout.header_path)
    region = report["regions"][0]
    assert rc == 1
    assert [p["reason"] for p in region["problems"]] == ["region_too_small"]
    assert region["ring"]["slots_scanned"] == 3
    assert region["ring"]["newest_committed_seq"] == 2


def test_s15_5_pool_disagreeing_with_the_ring_is_reported(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """§15.5 / §7.1: pools of an epoch share the ring's epoch, stream and nslots."""
    ep = make_epoch(shm_base, strides={1: 4096})
    odd = create_region(
        ep.layout.pool_path(2),
        SuperblockFields.payload_pool(
            epoch=EPOCH + 1,
            stream_id=STREAM_ID,
            pool_id=2,
            nslots=16,
            stride_bytes=4096,
            now_ns=NOW_NS,
        ),
    )
    try:
        rc, report = inspect_json(capsys, ep.directory)
    finally:
        odd.close()
        ep.close()
    assert rc == 1 and report["ok"] is False
    assert sorted(p["reason"] for p in report["problems"]) == [
        "superblock_epoch_mismatch",
        "superblock_nslots_mismatch",
    ]


def test_bad_region_inside_a_directory_is_reported_beside_the_good_ones(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(os.path.join(epoch.directory, "payload-7.pool"), "wb") as f:
        f.write(b"NOTMAGIC" + bytes(120))
    os.mkfifo(os.path.join(epoch.directory, "payload-8.pool"))
    rc, report = inspect_json(capsys, epoch.directory)
    assert rc == 1
    by_name = {os.path.basename(r["path"]): r for r in report["regions"]}
    assert by_name["payload-7.pool"]["error"]["reason"] == "superblock_bad_magic"
    assert "NOTMAGIC" in by_name["payload-7.pool"]["error"]["detail"]
    assert by_name["payload-8.pool"]["error"]["reason"] == "path_not_regular_file"
    assert by_name["header.ring"]["superblock"]["magic_valid"] is True
    rc = main(["inspect", epoch.directory])
    text = capsys.readouterr().out
    assert rc == 1 and "superblock_bad_magic" in text and "path_not_regular_file" in text


# --- user errors (exit 2, one line) --------------------------------------------------------------
def test_missing_path(shm_base: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = inspect_fails(capsys, os.path.join(shm_base, "nope", "header.ring"))
    assert "path_not_found" in line


def test_directory_without_regions(shm_base: str, capsys: pytest.CaptureFixture[str]) -> None:
    empty = os.path.join(shm_base, "empty")
    os.mkdir(empty)
    assert "no_regions" in inspect_fails(capsys, empty)


def test_instance_directory_hints_at_epoch_directories(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    line = inspect_fails(capsys, os.path.dirname(epoch.directory))
    assert "no_regions" in line and "epoch-*" in line


@pytest.mark.timeout(20)
def test_s15_21a_5_fifo_is_refused_without_blocking(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """§15.21a.5: only regular files are opened; a FIFO would block an open for reading."""
    fifo = os.path.join(shm_base, "header.ring")
    os.mkfifo(fifo)
    assert "path_not_regular_file" in inspect_fails(capsys, fifo)


def test_s15_21a_5_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "path_not_regular_file" in inspect_fails(capsys, "/dev/null")


def test_s7_1_wrong_magic_is_not_a_region(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """§7.1: a magic other than TPOLSHM1 makes the file invalid; its bytes are shown."""
    path = os.path.join(shm_base, "header.ring")
    with open(path, "wb") as f:
        f.write(b"ELF\x7fXXXX" + bytes(56 + 256))
    line = inspect_fails(capsys, path)
    assert "superblock_bad_magic" in line and "ELF.XXXX" in line


def test_file_shorter_than_a_superblock(shm_base: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = os.path.join(shm_base, "header.ring")
    with open(path, "wb") as f:
        f.write(MAGIC.to_bytes(8, "little"))
    assert "region_too_small" in inspect_fails(capsys, path)


def test_s15_21a_5_symlink_out_of_the_named_directory_is_refused(
    epoch: Epoch, capsys: pytest.CaptureFixture[str]
) -> None:
    """§15.21a.5: the canonical path must stay inside an allowed base (a real region outside
    the named directory and the SHM base is still refused)."""
    elsewhere = os.path.realpath(tempfile.mkdtemp(prefix="tp-inspect-elsewhere-"))
    try:
        target = os.path.join(elsewhere, "header.ring")
        shutil.copyfile(epoch.layout.header_path, target)
        trap = os.path.join(epoch.directory, "payload-9.pool")
        os.symlink(target, trap)
        line = inspect_fails(capsys, "--shm-base-dir", epoch.directory, trap)
        assert "path_outside_allowed_base" in line
        rc, report = inspect_json(capsys, "--shm-base-dir", epoch.directory, epoch.directory)
        by_name = {os.path.basename(r["path"]): r for r in report["regions"]}
        assert rc == 1
        assert by_name["payload-9.pool"]["error"]["reason"] == "path_outside_allowed_base"
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_unknown_stream_id(epoch: Epoch, capsys: pytest.CaptureFixture[str]) -> None:
    base = epoch.layout.base_dir
    assert "stream_not_found" in inspect_fails(capsys, "--shm-base-dir", base, "12345")
    missing = os.path.join(base, "nothing-here")
    assert "stream_not_found" in inspect_fails(capsys, "--shm-base-dir", missing, "1")
    assert "stream_id_out_of_range" in inspect_fails(capsys, "--shm-base-dir", base, str(2**32))


def test_relative_path_and_number_named_file(
    epoch: Epoch, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare number is a stream id; ``./NUMBER`` is a file."""
    shutil.copyfile(epoch.layout.header_path, os.path.join(epoch.directory, "123"))
    monkeypatch.chdir(epoch.directory)
    rc, report = inspect_json(capsys, "./123")
    assert rc == 0 and report["kind"] == "file"
    assert report["regions"][0]["superblock"]["stream_id"] == STREAM_ID
    base = epoch.layout.base_dir
    assert "stream_not_found" in inspect_fails(capsys, "--shm-base-dir", base, "123")


def test_stream_id_finds_the_drivers_stream_directories(
    shm_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SHM driver lays epochs out as ``<instance>/stream-<id>/epoch-<E>`` (Driver Model
    §8): ``inspect <stream id>`` finds them as it finds a standalone producer's."""
    ep = make_epoch(shm_base, epoch=3)
    try:
        instance_dir = os.path.dirname(ep.directory)
        moved = os.path.join(instance_dir, f"stream-{STREAM_ID}", os.path.basename(ep.directory))
        os.renames(ep.directory, moved)
        rc, report = inspect_json(capsys, "--shm-base-dir", shm_base, str(STREAM_ID))
        assert rc == 0
        assert report["directory"] == moved and report["candidates"] == 1
    finally:
        ep.close()
