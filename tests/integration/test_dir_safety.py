"""#13.1 "Nothing deletes what it did not create", entry point by entry point, with real media
drivers and real processes.

For each way of starting an Aeron media driver — `tensorpool mediadriver --aeron-dir D`,
`python -m tensorpool.transport.aeronmd --dir D`, the SHM driver daemon with its embedded media
driver in ``driver.aeron_dir`` (file and env override), ``MediaDriverProcess(aeron_dir=D)`` and
``start_media_driver`` / an embedded ``AeronContext`` — a directory holding a sentinel file is
refused (exit status 2, one line naming the path) and survives untouched; an empty directory
that existed before survives start and stop (same mode, our files gone); a directory the driver
created is removed at stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_fixtures import DriverProcess, cli, driver_toml

from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.mediadriver import (
    MediaDriverError,
    MediaDriverProcess,
    is_active,
    start_media_driver,
    wait_until_active,
)
from tensorpool.transport.process import stop_process

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
HOME = os.path.expanduser("~")


@pytest.fixture
def work() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="tp-dirsafety-", dir=SHM_ROOT)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def sentinel_dir(work: Path) -> Path:
    d = work / "precious"
    d.mkdir()
    (d / "sentinel").write_text("operator data")
    (d / "sub").mkdir()
    (d / "sub" / "more").write_text("more data")
    return d


def snapshot(d: Path) -> tuple[object, ...]:
    """Everything a delete-and-recreate or a partial delete would change."""
    st = d.stat()
    files = sorted(
        (str(p.relative_to(d)), p.stat().st_ino, p.read_bytes() if p.is_file() else b"")
        for p in d.rglob("*")
    )
    return (st.st_ino, stat.S_IMODE(st.st_mode), st.st_mtime_ns, tuple(files))


def one_line_refusal(stderr: str, path: Path) -> None:
    """One line: refusing ``path``, naming the first foreign entry found inside it."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert f"refusing {path}: it holds {path}/" in lines[0], stderr


def serve_then_interrupt(cmd: list[str], aeron_dir: Path) -> tuple[int, list[str]]:
    """Run a media driver command until it serves ``aeron_dir``, then SIGINT it; returns its
    exit status and what the directory held while it ran."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        wait_until_active(str(aeron_dir), 20.0, process=proc)  # type: ignore[arg-type]
        during = sorted(os.listdir(aeron_dir))
        proc.send_signal(signal.SIGINT)
        return proc.wait(20.0), during
    finally:
        stop_process(proc)


CLI_ENTRY_POINTS = {
    "tensorpool mediadriver": [sys.executable, "-m", "tensorpool", "mediadriver", "--aeron-dir"],
    "aeronmd": [sys.executable, "-m", "tensorpool.transport.aeronmd", "--dir"],
}


@pytest.mark.parametrize("entry", sorted(CLI_ENTRY_POINTS))
def test_cli_media_driver_refuses_a_directory_with_foreign_files(work: Path, entry: str) -> None:
    """#13.1: `--dir D` with a sentinel file exits 2 with one line and touches nothing (it used
    to remove D and everything in it)."""
    d = sentinel_dir(work)
    before = snapshot(d)
    done = subprocess.run(
        [*CLI_ENTRY_POINTS[entry], str(d)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    one_line_refusal(done.stderr, d)
    assert done.stdout == ""
    assert snapshot(d) == before


@pytest.mark.parametrize("entry", sorted(CLI_ENTRY_POINTS))
@pytest.mark.parametrize("name", ["cnc.dat", "publications/notes.logbuffer"])
def test_30_a_file_named_like_aerons_is_not_taken_for_aerons(
    work: Path, entry: str, name: str
) -> None:
    """#30: `mkdir d; echo precious > d/cnc.dat; tensorpool mediadriver --dir d` deleted the
    user's file (likewise `publications/notes.logbuffer`): an Aeron directory is recognised by
    its CnC file's content, not by names. Refused with one line, nothing touched."""
    d = work / "named-like-aeron"
    (d / name).parent.mkdir(parents=True)
    (d / name).write_text("precious\n")
    before = snapshot(d)
    done = subprocess.run(
        [*CLI_ENTRY_POINTS[entry], str(d)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    one_line_refusal(done.stderr, d)
    assert snapshot(d) == before and (d / name).read_text() == "precious\n"


@pytest.mark.parametrize("entry", sorted(CLI_ENTRY_POINTS))
def test_cli_media_driver_leaves_a_pre_existing_empty_directory(work: Path, entry: str) -> None:
    """#13.1: an empty directory that existed before start still exists after stop, with its
    mode; only the files the driver made are gone."""
    d = work / "empty"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o710)
    rc, during = serve_then_interrupt([*CLI_ENTRY_POINTS[entry], str(d)], d)
    assert rc == 0
    assert "cnc.dat" in during
    assert d.is_dir() and list(d.iterdir()) == []
    assert stat.S_IMODE(d.stat().st_mode) == 0o710


@pytest.mark.parametrize("entry", sorted(CLI_ENTRY_POINTS))
def test_cli_media_driver_removes_only_the_directories_it_created(work: Path, entry: str) -> None:
    """#13.1: `--dir work/a/b` creates a and b; stop removes b and a, not work."""
    d = work / "a" / "b"
    rc, _ = serve_then_interrupt([*CLI_ENTRY_POINTS[entry], str(d)], d)
    assert rc == 0
    assert not (work / "a").exists()
    assert work.is_dir()


@pytest.mark.parametrize("bad", ["/", "/etc", HOME])
def test_cli_media_driver_refuses_system_roots(bad: str) -> None:
    """#13.1: `--dir /`, `/etc`, `$HOME` are refused before anything is looked at."""
    for cmd in CLI_ENTRY_POINTS.values():
        done = subprocess.run([*cmd, bad], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "refusing" in done.stderr and bad in done.stderr


def test_client_commands_refuse_system_roots(work: Path) -> None:
    """#13.1: produce's --shm-base-dir and --aeron-dir refuse roots (exit 2, one line)."""
    for args in (("--embedded", "--shm-base-dir", "/etc"), ("--aeron-dir", HOME)):
        done = cli("produce", "--stream-id", "1", "--count", "1", *args)
        assert done.returncode == 2, done.stderr
        assert "refusing" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the SHM driver


def daemon(work: Path, aeron_dir: Path | str, **kw: object) -> DriverProcess:
    base = str(work / "shm")
    cfg = work / "driver.toml"
    cfg.write_text(driver_toml(base, str(aeron_dir), embedded=True, **kw))  # type: ignore[arg-type]
    return DriverProcess(str(cfg), base, str(work / "driver.log"))


def test_daemon_refuses_an_aeron_dir_with_foreign_files(work: Path) -> None:
    """#13.1: the default deployment (daemon hosting the embedded media driver) with
    driver.aeron_dir = D holding a sentinel: exit 2, one line naming the file, key and path;
    D untouched and not even the SHM base directory created."""
    d = sentinel_dir(work)
    before = snapshot(d)
    proc = daemon(work, d).start()
    try:
        assert proc.wait(30) == 2
    finally:
        proc.stop()
    one_line_refusal(proc.log_text(), d)
    assert "driver.aeron_dir" in proc.log_text() and "driver.toml" in proc.log_text()
    assert snapshot(d) == before
    assert not (work / "shm").exists()


def test_daemon_refuses_a_foreign_aeron_dir_from_the_environment(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#13.1: the same through the env override TENSORPOOL_DRIVER_AERON_DIR."""
    d = sentinel_dir(work)
    before = snapshot(d)
    monkeypatch.setenv("TENSORPOOL_DRIVER_AERON_DIR", str(d))
    proc = daemon(work, work / "unused-aeron").start()
    try:
        assert proc.wait(30) == 2
    finally:
        proc.stop()
    one_line_refusal(proc.log_text(), d)
    assert snapshot(d) == before
    assert not (work / "unused-aeron").exists() and not (work / "shm").exists()


@pytest.mark.parametrize("bad", ["/", "/etc", HOME])
def test_daemon_refuses_roots_as_aeron_dir_and_base_dir(work: Path, bad: str) -> None:
    """#13.1: `tensorpool driver` with aeron_dir or shm.base_dir a system root: exit 2."""
    cfg = work / "driver.toml"
    cfg.write_text(driver_toml(str(work / "shm"), bad, embedded=True))
    done = cli("driver", "--config", str(cfg))
    assert done.returncode == 2 and "driver.aeron_dir" in done.stderr and bad in done.stderr
    cfg.write_text(driver_toml(bad, str(work / "aeron"), embedded=True))
    done = cli("driver", "--config", str(cfg))
    assert done.returncode == 2 and "shm.base_dir" in done.stderr, done.stderr


def test_daemon_world_writable_mode_needs_allow_world_writable(work: Path) -> None:
    """#13.1: permissions_mode "666" is refused at load (exit 2) unless allowed."""
    cfg = work / "driver.toml"
    text = driver_toml(str(work / "shm"), str(work / "aeron"), embedded=True)
    cfg.write_text(text.replace('permissions_mode = "600"', 'permissions_mode = "666"'))
    done = cli("driver", "--config", str(cfg))
    assert done.returncode == 2 and "shm.allow_world_writable" in done.stderr, done.stderr
    assert not (work / "shm").exists() and not (work / "aeron").exists()


def test_daemon_leaves_a_pre_existing_empty_aeron_dir_and_removes_one_it_created(
    work: Path,
) -> None:
    """#13.1: start + SIGTERM with an empty pre-existing driver.aeron_dir: the directory is
    still there, empty, with its mode. Then with an absent one: it is gone after stop."""
    d = work / "aeron-empty"
    d.mkdir()
    os.chmod(d, 0o750)
    proc = daemon(work, d).start()
    try:
        proc.wait_ready()
        assert is_active(str(d))
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.log_text()
    finally:
        proc.stop()
    assert d.is_dir() and list(d.iterdir()) == []
    assert stat.S_IMODE(d.stat().st_mode) == 0o750

    created = work / "aeron-new"
    proc = daemon(work, created).start()
    try:
        proc.wait_ready()
        assert (created / "cnc.dat").exists()
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.log_text()
    finally:
        proc.stop()
    assert not created.exists()


# --------------------------------------------------------------------------- Python API


def test_media_driver_process_refuses_foreign_and_keeps_pre_existing(work: Path) -> None:
    """#13.1: MediaDriverProcess(aeron_dir=D): sentinel refused before the child is spawned
    (D untouched); an empty D survives start and stop; a D it created is removed, even after
    the child was SIGKILLed (what is left is only Aeron's files)."""
    d = sentinel_dir(work)
    before = snapshot(d)
    refused = MediaDriverProcess(str(d))
    try:
        with pytest.raises(MediaDriverError, match="refusing") as info:
            refused.start()
    finally:
        refused.stop()  # a no-op unless the rule is broken and a child was started
    assert f"it holds {d}/" in str(info.value)
    assert snapshot(d) == before

    empty = work / "empty"
    empty.mkdir()
    with MediaDriverProcess(str(empty)) as md:
        assert is_active(md.dir)
    assert empty.is_dir() and list(empty.iterdir()) == []

    fresh = work / "fresh"
    md = MediaDriverProcess(str(fresh)).start()
    try:
        assert md.pid is not None
        os.kill(md.pid, signal.SIGKILL)
    finally:
        md.stop()
    assert not fresh.exists()


def test_stale_layout_left_by_a_killed_driver_is_taken_over(work: Path) -> None:
    """#13.1 keeps the old behaviour: a directory left by a killed driver (only Aeron's files)
    is reused once stale; it existed before, so it stays after stop."""
    d = work / "stale"
    killer = subprocess.Popen(
        [sys.executable, "-m", "tensorpool.transport.aeronmd", "--dir", str(d)],
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until_active(str(d), 20.0, process=killer)  # type: ignore[arg-type]
        killer.kill()
        killer.wait(10)
    finally:
        stop_process(killer)
    assert (d / "cnc.dat").exists()
    deadline = time.monotonic() + 20.0  # the heartbeat goes stale within ACTIVE_CHECK_TIMEOUT_MS
    while is_active(str(d)):
        assert time.monotonic() < deadline, "a killed driver's heartbeat never went stale"
        time.sleep(0.05)
    driver = start_media_driver(str(d))
    try:
        assert is_active(str(d))
    finally:
        driver.close()
    assert d.is_dir() and list(d.iterdir()) == []


def test_start_media_driver_and_embedded_context(work: Path) -> None:
    """#13.1: start_media_driver on a sentinel dir raises and touches nothing; an embedded
    AeronContext makes a private directory under embedded_parent_dir and removes only that."""
    d = sentinel_dir(work)
    before = snapshot(d)
    with pytest.raises(MediaDriverError, match="refusing"):
        start_media_driver(str(d)).close()  # close: only reached if the rule is broken
    assert snapshot(d) == before
    with AeronContext(TransportConfig(embedded_parent_dir=str(d))) as ctx:
        private = Path(ctx.dir)
        assert private.parent == d and is_active(ctx.dir)
    assert not private.exists()
    assert snapshot(d)[3] == before[3]  # the parent's files are exactly as they were
