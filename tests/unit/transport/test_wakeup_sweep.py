"""Leave nothing behind for the semaphore wakeup: a SIGKILLed consumer's
``/dev/shm/sem.tensorpool-wake-*`` file is removed by the producer's rescan or by the next
consumer of its namespace, and only on proof that a dead tensorpool consumer made it.

Real named semaphores and real processes; the proof checks run against real files in
``/dev/shm`` that each test makes (and removes if they are kept)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tensorpool.transport.process import creator_stamp as _creator_stamp
from tensorpool.transport.process import pid_namespace as _pid_namespace
from tensorpool.transport.process import proc_stat
from tensorpool.transport.wakeup import (
    SEM_DIR,
    SEM_FILE_SIZE,
    SemaphoreIdleStrategy,
    WakePoster,
    remove_if_abandoned,
    sweep_abandoned,
)

WAIT_S = 30.0
"""Hang guard only: each wait ends as soon as its condition holds."""
SHORT_NS = 1_000_000
TOKEN = "0123abcd"
_ids = itertools.count()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A namespace of this test only; none of its semaphores may be left behind."""
    ns = f"s{os.getpid()}_{next(_ids)}"
    yield ns
    left = [n for n in os.listdir(SEM_DIR) if n.startswith(f"sem.tensorpool-wake-{ns}-")]
    assert not left, f"semaphores left behind: {left}"


@pytest.fixture
def dead_pid() -> int:
    """A pid whose process has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def craft() -> Iterator[Callable[..., Path]]:
    """Make a file in /dev/shm shaped like a wake semaphore (32 bytes, 0600, stamped with
    this pid namespace); the test made it, so whatever the sweep keeps is removed here."""
    made: list[Path] = []

    def make(
        name: str, *, size: int = SEM_FILE_SIZE, mode: int = 0o600, stamp: int | None = None
    ) -> Path:
        path = SEM_DIR / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
        made.append(path)
        os.write(fd, bytes(size))
        os.close(fd)
        os.chmod(path, mode)
        ns = _creator_stamp(_pid_namespace(), 12345) if stamp is None else stamp
        os.utime(path, ns=(ns, ns))
        return path

    yield make
    for path in made:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)


def _spawn_consumer(namespace: str, stream_id: int) -> tuple[subprocess.Popen[str], Path]:
    """A consumer process idling on its own wake semaphore; returns it and the file."""
    code = (
        "import sys, time\n"
        "from tensorpool.transport.wakeup import SemaphoreIdleStrategy\n"
        f"s = SemaphoreIdleStrategy({namespace!r}, {stream_id})\n"
        "print(s.path, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def _kill(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
    child.wait(WAIT_S)


def test_producer_scan_removes_a_killed_consumers_semaphore(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The producer's rescan keeps a live consumer's semaphore and posts it; once the consumer
    is SIGKILLed (and reaped), the next rescan removes its file, counts and logs it."""
    child, path = _spawn_consumer(namespace, 9)
    poster = WakePoster(namespace, 9, rescan_ns=SHORT_NS)
    try:
        assert poster.rescan() == 0  # live pid: kept and posted
        assert (poster.consumers, path.exists()) == (1, True)
        _kill(child)
        deadline = time.monotonic() + WAIT_S
        with caplog.at_level(logging.INFO, logger="tensorpool.transport.wakeup"):
            while path.exists():
                assert time.monotonic() < deadline, f"{path} never removed"
                poster.maybe_rescan(time.monotonic_ns())
                time.sleep(0.001)
        assert (poster.removed, poster.consumers) == (1, 0)
        lines = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
        assert lines == [f"removed 1 wake semaphore(s) of dead consumers: {path.name}"]
    finally:
        poster.close()
        _kill(child)
        path.unlink(missing_ok=True)  # this test made it (through its child)


def test_new_consumer_removes_a_killed_consumers_semaphore(namespace: str) -> None:
    """With no producer running, the next consumer of the namespace (any stream) removes a
    SIGKILLed consumer's file when it creates its own, and keeps live consumers' files."""
    live, live_path = _spawn_consumer(namespace, 1)
    killed, killed_path = _spawn_consumer(namespace, 2)
    try:
        _kill(killed)
        with SemaphoreIdleStrategy(namespace, 3, SHORT_NS) as newcomer:
            assert newcomer.removed == 1
            assert (killed_path.exists(), live_path.exists()) == (False, True)
            assert sweep_abandoned(namespace) == []  # the newcomer's own is kept too
            assert newcomer.path.exists()
    finally:
        for child, path in ((live, live_path), (killed, killed_path)):
            _kill(child)
            path.unlink(missing_ok=True)  # this test made them (through its children)


def test_a_stamped_file_of_a_dead_pid_is_removed(
    namespace: str, dead_pid: int, craft: Callable[..., Path]
) -> None:
    """The control for the kept cases below: the crafted file they vary is removed."""
    path = craft(f"sem.tensorpool-wake-{namespace}-1-{dead_pid}-{TOKEN}")
    assert remove_if_abandoned(path.name)
    assert not path.exists()
    assert not remove_if_abandoned(path.name)  # already gone: not an error, not counted


@pytest.mark.parametrize(
    "tail",
    [
        "1-{pid}-0123abc",  # token: 7 hex digits
        "1-{pid}-0123abcde",  # 9
        "1-{pid}-0123ABCD",  # upper case: token_hex writes lower
        "1-0{pid}-0123abcd",  # leading zero: not str(pid)
        "01-{pid}-0123abcd",
        "4294967296-{pid}-0123abcd",  # stream id beyond uint32
        "1-{pid}-0123abcd-1",  # one field more
        "1-{pid}-0123abcd.bak",
        "1-{pid}\u0661-0123abcd",  # a non-ASCII digit
        "1--{pid}-0123abcd",
    ],
)
def test_a_malformed_name_is_kept(
    namespace: str, dead_pid: int, craft: Callable[..., Path], tail: str
) -> None:
    path = craft(f"sem.tensorpool-wake-{namespace}-" + tail.format(pid=dead_pid))
    assert not remove_if_abandoned(path.name)
    assert sweep_abandoned(namespace) == []
    assert path.exists()


def test_a_bad_namespace_is_kept(dead_pid: int, craft: Callable[..., Path]) -> None:
    path = craft(f"sem.tensorpool-wake-..-1-{dead_pid}-{TOKEN}")
    assert not remove_if_abandoned(path.name)
    assert path.exists()


@pytest.mark.parametrize(
    ("size", "mode", "stamp"),
    [
        (SEM_FILE_SIZE - 1, 0o600, None),
        (SEM_FILE_SIZE * 2, 0o600, None),
        (0, 0o600, None),
        (SEM_FILE_SIZE, 0o644, None),  # not what the creator's 0600 can produce
        (SEM_FILE_SIZE, 0o600, 1_700_000_000_000_000_000),  # unstamped: mtime is a date
        (SEM_FILE_SIZE, 0o600, "other-ns"),  # stamped in another pid namespace
    ],
    ids=["short", "long", "empty", "mode-0644", "no-stamp", "other-pid-namespace"],
)
def test_a_file_unlike_ours_is_kept(
    namespace: str,
    dead_pid: int,
    craft: Callable[..., Path],
    size: int,
    mode: int,
    stamp: int | str | None,
) -> None:
    if stamp == "other-ns":
        stamp = _creator_stamp(_pid_namespace() + 1, 12345)
    name = f"sem.tensorpool-wake-{namespace}-1-{dead_pid}-{TOKEN}"
    path = craft(name, size=size, mode=mode, stamp=stamp)
    assert not remove_if_abandoned(name)
    assert path.exists()


def test_a_symlink_or_directory_is_kept(
    namespace: str, dead_pid: int, craft: Callable[..., Path]
) -> None:
    """Only a regular file is a semaphore (``lstat``: a link is judged, never followed)."""
    target = craft(f"sem.tensorpool-wake-{namespace}-1-{dead_pid}-{TOKEN}")
    link = SEM_DIR / f"sem.tensorpool-wake-{namespace}-2-{dead_pid}-{TOKEN}"
    link.symlink_to(target)
    try:
        assert not remove_if_abandoned(link.name)
        assert link.is_symlink()
    finally:
        link.unlink()
    # a link's size is its target's length: a stamped one of 32 bytes differs from a
    # semaphore by its type (and its mode, 0777) only
    link.symlink_to("t" * SEM_FILE_SIZE)
    try:
        stamp = _creator_stamp(_pid_namespace(), 12345)
        os.utime(link, ns=(stamp, stamp), follow_symlinks=False)
        assert not remove_if_abandoned(link.name)
        assert link.is_symlink()
    finally:
        link.unlink()
    folder = SEM_DIR / f"sem.tensorpool-wake-{namespace}-3-{dead_pid}-{TOKEN}"
    folder.mkdir()
    try:
        assert not remove_if_abandoned(folder.name)
        assert folder.is_dir()
    finally:
        folder.rmdir()
    assert target.exists()


def test_another_users_file_is_kept(
    namespace: str, dead_pid: int, craft: Callable[..., Path]
) -> None:
    if os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    path = craft(f"sem.tensorpool-wake-{namespace}-1-{dead_pid}-{TOKEN}")
    os.chown(path, 12345, -1)
    assert not remove_if_abandoned(path.name)
    assert path.exists()


def test_a_live_other_users_pid_is_kept(namespace: str, craft: Callable[..., Path]) -> None:
    """EPERM from kill(pid, 0): alive, another user's; never judged."""
    try:
        os.kill(1, 0)
    except PermissionError:
        pass
    else:
        pytest.skip("pid 1 is signalable here (root or same user): no other-user pid")
    path = craft(f"sem.tensorpool-wake-{namespace}-1-1-{TOKEN}")
    assert not remove_if_abandoned(path.name)
    assert path.exists()


def test_a_live_creator_is_kept_and_a_reused_pid_is_not(
    namespace: str, craft: Callable[..., Path]
) -> None:
    """The pid is alive: its process made the file only if it started at the stamped tick.
    Same tick: the creator, kept. Another tick: the pid was reused, the creator is gone."""
    me = proc_stat(os.getpid())
    assert me is not None
    pidns = _pid_namespace()
    mine = craft(
        f"sem.tensorpool-wake-{namespace}-1-{os.getpid()}-{TOKEN}",
        stamp=_creator_stamp(pidns, me[1]),
    )
    reused = craft(
        f"sem.tensorpool-wake-{namespace}-2-{os.getpid()}-{TOKEN}",
        stamp=_creator_stamp(pidns, me[1] + 1),
    )
    assert sweep_abandoned(namespace) == [reused.name]
    assert mine.exists()


def test_a_zombie_creators_file_is_removed(namespace: str, craft: Callable[..., Path]) -> None:
    """A killed consumer its parent has not reaped yet is a zombie: its pid still answers
    kill(pid, 0), but it holds no mapping any more, so its file goes."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = proc_stat(child.pid)
        assert start is not None
        path = craft(
            f"sem.tensorpool-wake-{namespace}-1-{child.pid}-{TOKEN}",
            stamp=_creator_stamp(_pid_namespace(), start[1]),
        )
        assert not remove_if_abandoned(path.name)  # alive, same tick: its creator
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while (state := proc_stat(child.pid)) is not None and state[0] != b"Z":
            assert time.monotonic() < deadline, "never became a zombie"
            time.sleep(0.001)
        assert remove_if_abandoned(path.name)
        assert not path.exists()
    finally:
        child.kill()
        child.wait()


def test_a_leader_that_exited_before_its_threads_is_alive(
    namespace: str, craft: Callable[..., Path]
) -> None:
    """A process whose main thread ended (``pthread_exit``) while another runs shows state Z
    but lives on: its file is kept until the last thread is gone."""
    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "print('ready', flush=True)\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        start = proc_stat(child.pid)
        assert start is not None
        path = craft(
            f"sem.tensorpool-wake-{namespace}-1-{child.pid}-{TOKEN}",
            stamp=_creator_stamp(_pid_namespace(), start[1]),
        )
        deadline = time.monotonic() + WAIT_S
        while (state := proc_stat(child.pid)) is not None and state[0] != b"Z":
            assert time.monotonic() < deadline, "the main thread never ended"
            time.sleep(0.001)
        assert not remove_if_abandoned(path.name)
        assert path.exists()
    finally:
        child.kill()
        child.wait()
