"""Aeron media driver lifecycle: embedded for one process, standalone for many.

Not to be confused with tensorpool's own SHM driver (``tensorpool.driver``): this is Aeron's
media driver, the thing that owns log buffers and sockets and through which publications and
subscriptions meet. Clients find it by its directory (``cnc.dat`` inside).

Three ways to have one:
- :func:`start_media_driver` runs a C driver inside this process (``pyaeron.MediaDriver``).
  :class:`~tensorpool.transport.context.AeronContext` does this for ``aeron_dir=None``.
- :func:`run_media_driver` (CLI: ``python -m tensorpool.transport.aeronmd --dir DIR``) runs one
  in the foreground until SIGTERM/SIGINT, for other processes to join with ``aeron_dir=DIR``.
- :class:`MediaDriverProcess` spawns that command as a child and waits until it is live; tests
  and the CLI use it to give several processes one shared driver.

A live directory is never taken over: the C driver would happily start a second driver on it and
break the first one's clients, so we check ``is_driver_active`` first and refuse.

Nothing is deleted that this process did not create (#13.1). The C driver empties any directory
it starts in that no live driver serves, whatever ``dir_delete_on_start`` says, so a directory is
only served when :func:`tensorpool.fsafety.check_media_driver_dir` finds it absent, empty, or
holding nothing but an Aeron layout (a dead driver's, which is then reused); anything else, and
system or shared roots (``/``, ``/tmp``, ``$HOME`` ...), is refused before Aeron sees it. Aeron's
own ``dir_delete_on_shutdown`` (which removes the whole tree) is never used: on close
:class:`EmbeddedMediaDriver` removes only Aeron's files, and the directory itself only if this
process created it; a pre-existing directory keeps its permissions.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final, Self

import pyaeron

from tensorpool.fsafety import (
    DirState,
    UnsafeDirectory,
    check_media_driver_dir,
    missing_dirs,
    remove_aeron_files,
)
from tensorpool.transport.agent import AgentRunner, AgentTermination, WorkAgent
from tensorpool.transport.cnc import read_cnc_identity
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.idle import SleepingIdleStrategy
from tensorpool.transport.process import (
    StopSignals,
    child_env,
    exit_with_parent,
    pid_running,
    stop_process,
)

log = logging.getLogger(__name__)

ACTIVE_CHECK_TIMEOUT_MS: Final = 1_000
"""Staleness window for taking a directory over from a killed driver: past it, a heartbeat
counts as stopped. The C driver refreshes its heartbeat once per timer interval (1 s), so this
window also misses live drivers whose refresh is late (any loaded host): never use it to decide
whether a driver is there to join -- :data:`JOIN_CHECK_TIMEOUT_MS` is for that."""

JOIN_CHECK_TIMEOUT_MS: Final = 10_000
"""A client joins a driver that heartbeated within this window: Aeron's own client driver
timeout (``aeron.driver.timeout``, ``TransportConfig.driver_timeout_ms``). A 1 s window refused
live drivers at load ~20, where the conductor's once-a-second refresh can come seconds late; a
driver that really died meanwhile fails the client's connect with Aeron's error instead."""

_SHM_DIR: Final = "/dev/shm"


class MediaDriverError(RuntimeError):
    """A media driver could not be started, reached, or stopped."""


def default_parent_dir() -> str:
    """/dev/shm when usable (tmpfs: log buffers never touch disk), else the temp directory."""
    if os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK | os.X_OK):
        return _SHM_DIR
    return tempfile.gettempdir()


def new_private_dir(parent: str | None = None, prefix: str = "tensorpool-aeron-") -> str:
    """A fresh, uniquely named directory for a driver this process owns."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent or default_parent_dir())


def is_active(aeron_dir: str, timeout_ms: int = ACTIVE_CHECK_TIMEOUT_MS) -> bool:
    """True if a media driver heartbeats in ``aeron_dir``."""
    return bool(pyaeron.is_driver_active(aeron_dir, timeout_ms))


def serves(aeron_dir: str) -> bool:
    """Whether a media driver serves ``aeron_dir`` for a client to join (``cnc.dat`` with a
    heartbeat within :data:`JOIN_CHECK_TIMEOUT_MS`)."""
    return os.path.exists(os.path.join(aeron_dir, "cnc.dat")) and is_active(
        aeron_dir, JOIN_CHECK_TIMEOUT_MS
    )


def _remove_created(aeron_dir: str, created: list[str]) -> None:
    """Remove Aeron's files, then the directories we created if nothing else is in them."""
    empty = remove_aeron_files(aeron_dir)
    if not empty:
        log.warning("left %s in place: it holds files the media driver did not create", aeron_dir)
        return
    for path in created:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError:
            return  # not empty: someone else's files now live there


class EmbeddedMediaDriver:
    """A C media driver running in this process, and what it created.

    ``close()`` stops the driver and removes Aeron's own files; the directory (and any parent)
    is removed only if this process created it. Everything else found there stays.
    """

    def __init__(self, driver: pyaeron.MediaDriver, aeron_dir: str, created: list[str]) -> None:
        self._driver = driver
        self.dir = aeron_dir
        self.created_dirs = tuple(created)
        """Directories this process created for the driver, deepest first."""
        self._closed = False

    def close(self) -> None:
        """Stop the driver and remove what it created (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._driver.close()
        finally:
            _remove_created(self.dir, list(self.created_dirs))

    def __repr__(self) -> str:
        return f"EmbeddedMediaDriver(dir={self.dir!r}, created={list(self.created_dirs)!r})"


def held(aeron_dir: str) -> bool:
    """Whether a media driver may still serve ``aeron_dir``, so that a new one must not start
    there (a start empties the directory: it would pull the files from under a live driver).

    A heartbeat within :data:`ACTIVE_CHECK_TIMEOUT_MS`: held. Silent longer, but within
    :data:`JOIN_CHECK_TIMEOUT_MS`: held while the pid in ``cnc.dat`` still runs -- a driver
    starved on a loaded host refreshes its once-a-second heartbeat seconds late, and the 1 s
    window alone took such live drivers for dead -- and free at once when that pid is gone
    (exited, killed, a zombie), which keeps a restart after ``kill -9`` fast. Silent past
    Aeron's own client timeout: free, whatever the pid (it may have been reused).
    """
    if not serves(aeron_dir):
        return False
    if is_active(aeron_dir):
        return True
    identity = read_cnc_identity(aeron_dir)
    return identity is not None and pid_running(identity.pid)


def start_media_driver(
    aeron_dir: str, config: TransportConfig | None = None, *, owns_dir: bool = False
) -> EmbeddedMediaDriver:
    """Start a C media driver in this process, serving ``aeron_dir``.

    ``aeron_dir`` must be absent, empty, or hold only an Aeron layout that no live driver
    serves; otherwise MediaDriverError is raised and nothing is touched. ``owns_dir``: the
    caller made this (empty) directory for the driver, so closing removes it too.
    """
    cfg = config or TransportConfig()
    try:
        state = check_media_driver_dir(aeron_dir)
    except UnsafeDirectory as exc:
        raise MediaDriverError(str(exc)) from None
    if state is DirState.AERON and held(aeron_dir):
        raise MediaDriverError(f"a media driver is already active in {aeron_dir}")
    created = missing_dirs(aeron_dir)
    if owns_dir and not created:
        created = [os.path.abspath(aeron_dir)]
    # A directory that exists keeps its mode (mkdtemp: 0700); Aeron would recreate it 0755.
    mode = os.stat(aeron_dir).st_mode & 0o7777 if os.path.isdir(aeron_dir) else None
    kwargs: dict[str, object] = {
        "dir": aeron_dir,
        "threading": cfg.threading_mode,
        # Whatever this says, the C driver empties a directory no live driver serves; the check
        # above makes sure only Aeron's own files can be in it. True only for a stale layout:
        # False adds Aeron's own liveness check, whose 10 s window would refuse a directory a
        # killed driver left a moment ago (ours, ACTIVE_CHECK_TIMEOUT_MS, already passed).
        # It never removes the directory on close: EmbeddedMediaDriver.close removes only
        # what this process created.
        "dir_delete_on_start": state is DirState.AERON,
        "dir_delete_on_shutdown": False,
        "dir_warn_if_exists": False,
    }
    if cfg.ipc_term_buffer_length is not None:
        kwargs["ipc_term_buffer_length"] = cfg.ipc_term_buffer_length
    if cfg.term_buffer_length is not None:
        kwargs["term_buffer_length"] = cfg.term_buffer_length
    if cfg.mtu_length is not None:
        kwargs["mtu_length"] = cfg.mtu_length
    try:
        driver = pyaeron.MediaDriver(**kwargs)
    except pyaeron.AeronError as exc:
        _remove_created(aeron_dir, created)
        raise MediaDriverError(f"cannot start a media driver in {aeron_dir}: {exc}") from exc
    if mode is not None and os.stat(aeron_dir).st_mode & 0o7777 != mode:
        os.chmod(aeron_dir, mode)  # Aeron recreated it with its own mode; keep the operator's
    return EmbeddedMediaDriver(driver, aeron_dir, created)


TAKEOVER_WAIT_S: Final = 3 * ACTIVE_CHECK_TIMEOUT_MS / 1000
"""How long a start waits for a killed predecessor's directory to go stale (#26.4)."""


def start_media_driver_after_crash(
    aeron_dir: str,
    config: TransportConfig | None = None,
    takeover_s: float = TAKEOVER_WAIT_S,
    *,
    on_wait: Callable[[str], object] | None = None,
) -> EmbeddedMediaDriver:
    """:func:`start_media_driver`, but right after a ``kill -9`` of the previous driver in
    ``aeron_dir`` it waits (at most ``takeover_s``) until the old heartbeat is stale or its
    pid is gone (:func:`held`), instead of refusing. The one rule for the SHM driver's
    embedded media driver and ``tensorpool mediadriver`` alike (#13.2, #26.4): a systemd
    restart loop must not hit its start-rate limit. ``on_wait`` gets one line saying why,
    once, when there is something to wait for. A live driver is still refused.
    """
    deadline = time.monotonic() + takeover_s
    told = False
    while True:
        if held(aeron_dir):
            if time.monotonic() >= deadline:
                raise MediaDriverError(f"a media driver is already active in {aeron_dir}")
        else:
            try:
                return start_media_driver(aeron_dir, config)
            except MediaDriverError as exc:
                # after a kill -9 the C driver's own liveness check of the old cnc.dat trails
                # ours by a few hundred ms ("Active media driver detected", EBUSY)
                if "Active media driver detected" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise
        if not told and on_wait is not None:
            identity = read_cnc_identity(aeron_dir)
            pid = "?" if identity is None else identity.pid
            on_wait(
                f"waiting up to {takeover_s:g} s for the previous media driver in {aeron_dir} "
                f"(pid {pid}) to go stale"
            )
            told = True
        time.sleep(0.1)


def close_media_driver(driver: EmbeddedMediaDriver) -> None:
    """Close a driver; a failure to remove its files is logged, not raised."""
    try:
        driver.close()
    except (pyaeron.AeronError, OSError) as exc:
        log.warning("media driver close reported an error: %s", exc)


def run_media_driver(
    aeron_dir: str,
    config: TransportConfig | None = None,
    *,
    stop: threading.Event | None = None,
    handle_signals: bool = True,
    parent_created: Sequence[str] = (),
    on_wait: Callable[[str], object] | None = None,
) -> None:
    """Serve ``aeron_dir`` until ``stop`` is set or SIGTERM/SIGINT arrives, then close.

    Signal handlers are only installed when called from the main thread. ``parent_created``:
    directories the process that started this driver for itself (:class:`MediaDriverProcess`)
    made for it; removed after the close if nothing but Aeron's files were in them, so a
    driver whose parent died without stopping it (it stops through
    :func:`~tensorpool.transport.process.exit_with_parent`, when signal handlers are installed)
    leaves nothing behind.
    """
    signals = StopSignals()
    if handle_signals:
        signals.install()
        exit_with_parent()  # a MediaDriverProcess child: stop (through `signals`) when it dies
    driver: EmbeddedMediaDriver | None = None
    try:
        driver = start_media_driver_after_crash(aeron_dir, config, on_wait=on_wait)
        log.info("media driver serving %s", driver.dir)
        # #26.1: the one runner; time.sleep, not Event.wait: a signal interrupts it, and the
        # handler takes no lock
        AgentRunner(
            WorkAgent("tensorpool-mediadriver", lambda: _until(stop)),
            SleepingIdleStrategy(50_000_000),
            stop_signals=signals if handle_signals else None,
        ).run()
    finally:
        if driver is not None:
            close_media_driver(driver)
        if parent_created:
            _remove_created(aeron_dir, list(parent_created))
        signals.restore()
        log.info("media driver for %s stopped", aeron_dir)


def _until(stop: threading.Event | None) -> int:
    """The media driver's process has nothing to do but be there until told to stop."""
    if stop is not None and stop.is_set():
        raise AgentTermination
    return 0


def wait_until_active(
    aeron_dir: str, timeout_s: float, *, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until a driver heartbeats in ``aeron_dir`` (or raise MediaDriverError)."""
    deadline = time.monotonic() + timeout_s
    cnc = os.path.join(aeron_dir, "cnc.dat")
    while True:
        if os.path.exists(cnc) and is_active(aeron_dir):
            return
        if process is not None and process.poll() is not None:
            raise MediaDriverError(
                f"media driver process exited with code {process.returncode} before becoming "
                f"active in {aeron_dir}"
            )
        if time.monotonic() >= deadline:
            raise MediaDriverError(f"no active media driver in {aeron_dir} after {timeout_s} s")
        time.sleep(0.01)


class MediaDriverProcess:
    """A standalone media driver in a child process, for other processes to share.

    ``with MediaDriverProcess() as md: ... TransportConfig(aeron_dir=md.dir) ...``
    Stopping sends SIGTERM (clean close: the child removes Aeron's files), then SIGKILL if it
    hangs. The directory itself is removed only if it did not exist before :meth:`start`
    (or was made here, for ``aeron_dir=None``); a given directory is checked like
    :func:`start_media_driver` checks it, in this process, before the child is spawned.
    """

    def __init__(
        self,
        aeron_dir: str | None = None,
        config: TransportConfig | None = None,
        *,
        start_timeout_s: float = 10.0,
    ) -> None:
        self._config = config or TransportConfig()
        self._owns_dir = aeron_dir is None
        self.dir = aeron_dir or new_private_dir(self._config.embedded_parent_dir)
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._created: list[str] = [self.dir] if self._owns_dir else []
        self._served = False

    def command(self) -> list[str]:
        cfg = self._config
        cmd = [sys.executable, "-m", "tensorpool.transport.aeronmd", "--dir", self.dir]
        cmd += ["--threading", cfg.threading_mode]
        for path in self._created:
            cmd += ["--parent-created", path]
        if cfg.ipc_term_buffer_length is not None:
            cmd += ["--ipc-term-length", str(cfg.ipc_term_buffer_length)]
        if cfg.term_buffer_length is not None:
            cmd += ["--term-length", str(cfg.term_buffer_length)]
        if cfg.mtu_length is not None:
            cmd += ["--mtu", str(cfg.mtu_length)]
        return cmd

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> Self:
        if self._process is not None:
            raise MediaDriverError("media driver process already started")
        try:
            state = check_media_driver_dir(self.dir)
        except UnsafeDirectory as exc:
            raise MediaDriverError(str(exc)) from None
        if state is DirState.AERON and held(self.dir):
            # Checked here too: waiting for "active" below would be fooled by the other driver.
            raise MediaDriverError(f"a media driver is already active in {self.dir}")
        if not self._owns_dir:
            self._created = missing_dirs(self.dir)
        # child_env: the driver stops (and removes what was made for it) if we die first
        self._process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, env=child_env())
        try:
            wait_until_active(self.dir, self._start_timeout_s, process=self._process)
        except BaseException:
            self.stop()
            raise
        self._served = True
        return self

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Stop the child; returns its exit code (None if it was never started)."""
        proc = self._process
        if proc is None:
            return None
        stop_process(proc, timeout_s)
        if os.path.isdir(self.dir) and (self._served or not held(self.dir)):
            # A killed driver cannot clean up after itself; its files are still only Aeron's
            # (the directory was checked at start). Never touch another live driver's files.
            _remove_created(self.dir, self._created)
        return proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
