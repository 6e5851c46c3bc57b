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
break the first one's clients, so we check ``is_driver_active`` first and refuse. A directory left
by a dead driver is wiped and reused.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import FrameType, TracebackType
from typing import Final, Self

import pyaeron

from tensorpool.transport.config import TransportConfig
from tensorpool.transport.process import stop_process

log = logging.getLogger(__name__)

ACTIVE_CHECK_TIMEOUT_MS: Final = 1_000
"""A driver counts as live if it heartbeated within this window (Aeron's liveness check)."""

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


def start_media_driver(
    aeron_dir: str, config: TransportConfig | None = None
) -> pyaeron.MediaDriver:
    """Start a C media driver in this process, serving ``aeron_dir``.

    The driver deletes its directory when closed (it owns it). Raises MediaDriverError if a
    live driver already serves the directory.
    """
    cfg = config or TransportConfig()
    if os.path.exists(os.path.join(aeron_dir, "cnc.dat")) and is_active(aeron_dir):
        raise MediaDriverError(f"a media driver is already active in {aeron_dir}")
    kwargs: dict[str, object] = {
        "dir": aeron_dir,
        "threading": cfg.threading_mode,
        "dir_delete_on_start": True,
        "dir_delete_on_shutdown": True,
        "dir_warn_if_exists": False,
    }
    if cfg.ipc_term_buffer_length is not None:
        kwargs["ipc_term_buffer_length"] = cfg.ipc_term_buffer_length
    if cfg.term_buffer_length is not None:
        kwargs["term_buffer_length"] = cfg.term_buffer_length
    if cfg.mtu_length is not None:
        kwargs["mtu_length"] = cfg.mtu_length
    try:
        return pyaeron.MediaDriver(**kwargs)
    except pyaeron.AeronError as exc:
        raise MediaDriverError(f"cannot start a media driver in {aeron_dir}: {exc}") from exc


def close_media_driver(driver: pyaeron.MediaDriver) -> None:
    """Close a driver; a failure to remove its directory is logged, not raised."""
    try:
        driver.close()
    except pyaeron.AeronError as exc:
        log.warning("media driver close reported an error: %s", exc)


def run_media_driver(
    aeron_dir: str,
    config: TransportConfig | None = None,
    *,
    stop: threading.Event | None = None,
    handle_signals: bool = True,
) -> None:
    """Serve ``aeron_dir`` until ``stop`` is set or SIGTERM/SIGINT arrives, then close.

    Signal handlers are only installed when called from the main thread.
    """
    stop_event = stop if stop is not None else threading.Event()
    previous: dict[int, object] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            stop_event.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _on_signal)
    driver = start_media_driver(aeron_dir, config)
    log.info("media driver serving %s", driver.dir)
    try:
        while not stop_event.wait(0.2):
            pass
    finally:
        close_media_driver(driver)
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        log.info("media driver for %s stopped", aeron_dir)


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
    Stopping sends SIGTERM (clean close, directory removed), then SIGKILL if it hangs.
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

    def command(self) -> list[str]:
        cfg = self._config
        cmd = [sys.executable, "-m", "tensorpool.transport.aeronmd", "--dir", self.dir]
        cmd += ["--threading", cfg.threading_mode]
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
        if os.path.exists(os.path.join(self.dir, "cnc.dat")) and is_active(self.dir):
            # Checked here too: waiting for "active" below would be fooled by the other driver.
            raise MediaDriverError(f"a media driver is already active in {self.dir}")
        self._process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL)
        try:
            wait_until_active(self.dir, self._start_timeout_s, process=self._process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Stop the child; returns its exit code (None if it was never started)."""
        proc = self._process
        if proc is None:
            return None
        stop_process(proc, timeout_s)
        if self._owns_dir and os.path.isdir(self.dir):
            # A killed driver cannot clean up after itself.
            shutil.rmtree(self.dir, ignore_errors=True)
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
