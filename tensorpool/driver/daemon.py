"""Running the SHM driver as a process: start-up order, signals, clean shutdown, logs.

Start-up, in this order so that a failure leaves as little behind as possible:

1. the configuration is already validated (:func:`tensorpool.driver.config.load_driver_config`
   has no side effects); the backing filesystem is probed for hugepages and, when
   ``shm.require_hugepages`` is set, checked before anything is created;
2. the namespace lock is taken (:mod:`tensorpool.driver.lock`) — one driver per
   ``<base>/<namespace>``, released by the kernel if this process dies;
3. the epoch directories and ``last-epoch`` markers left by earlier drivers are scanned
   (:func:`tensorpool.driver.regions.scan_epochs`) and become the core's epoch floors, and the
   previous status file's ``next_lease_id`` joins the wall clock in seeding lease ids, so
   neither epochs nor lease ids repeat across restarts (§4.8, §10);
4. Aeron: with ``driver.embedded_media_driver`` the media driver runs inside this process,
   serving the configured directory so clients can join it (a directory left by a killed
   driver is taken over once its heartbeat has gone stale; one holding anything but Aeron's
   files is refused before step 2, see :mod:`tensorpool.fsafety`); otherwise the driver joins the
   external media driver at ``driver.aeron_dir``;
5. the agent runs on the main thread under the one runner (``AgentRunner``): a backoff idle
   strategy, and the media driver kept -- an external one restarted in the same directory is
   reconnected to (#26.1); the runner's health goes into the status file as ``runtime``.

Signals: the first SIGINT/SIGTERM starts the graceful drain (§4.13: final announces,
``ShmDriverShutdown`` after ``policies.shutdown_timeout_ms``, every lease invalidated); a second
one skips the drain. Afterwards the status file says ``STOPPED``, ``cleanup_shm_on_exit``
removes the epoch directories (the markers stay), the Aeron client and an embedded media
driver close, and the lock is released. Exit status: 0 after a clean stop, 1 after a fatal
error (e.g. ``mlock`` failure).

Logs are structured: every record is ``<event> key=value ...`` and, with
:class:`JsonLogFormatter`, one JSON object per line with the same keys.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from tensorpool.config_util import ConfigError
from tensorpool.driver.agent import DEFAULT_LINGER_NS, DriverAgent, log_event
from tensorpool.driver.config import DriverConfig
from tensorpool.driver.core import DriverCore
from tensorpool.driver.leases import lease_id_seed
from tensorpool.driver.lock import NamespaceLock
from tensorpool.driver.regions import RegionFiles, dir_mode_for, probe_hugepage_size, scan_epochs
from tensorpool.driver.status import StatusUnavailable, read_status, status_path
from tensorpool.endpoints import config_aeron_dir
from tensorpool.fsafety import UnsafeDirectory, check_media_driver_dir
from tensorpool.transport.agent import AgentRunner
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext
from tensorpool.transport.idle import BackoffIdleStrategy, IdleStrategy
from tensorpool.transport.mediadriver import (
    TAKEOVER_WAIT_S,
    EmbeddedMediaDriver,
    MediaDriverError,
    close_media_driver,
    serves,
    start_media_driver_after_crash,
)

__all__ = [
    "DEFAULT_MAX_PARK_NS",
    "DaemonOptions",
    "DriverStartupError",
    "JsonLogFormatter",
    "default_idle_strategy",
    "run_driver",
]

log = logging.getLogger("tensorpool.driver")


class DriverStartupError(RuntimeError):
    """The driver could not start (lock held, no media driver, ...); nothing was served."""


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, event and the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if event is not None:
            doc["event"] = event
            fields = getattr(record, "fields", {})
            for key, value in fields.items():
                plain = isinstance(value, (int, float, bool, type(None)))
                doc[key] = value if plain else str(value)
        else:
            doc["message"] = record.getMessage()
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"))


#: Longest idle sleep of the driver loop. Control traffic tolerates milliseconds (Aeron's own
#: client conductor idles 16 ms), and every wake-up of a Python loop costs ~20-25 us of CPU
#: on a loaded 2-core host, so 10 ms keeps an idle driver under 2 % of a core
#: (docs/benchmarks/driver.md). Bursts are unaffected: any work resets the backoff.
DEFAULT_MAX_PARK_NS = 10_000_000


def default_idle_strategy(max_park_ns: int = DEFAULT_MAX_PARK_NS) -> IdleStrategy:
    """Spin a little, yield a little, then park with doubling sleeps up to ``max_park_ns``.

    Any work resets it, so a burst of requests is served back to back without sleeping; only
    the first request after a quiet spell can wait up to ``max_park_ns``.
    """
    return BackoffIdleStrategy(
        max_spins=10, max_yields=20, min_park_ns=50_000, max_park_ns=max_park_ns
    )


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    """How to run one driver process (everything not in the TOML file)."""

    aeron_dir: str
    """Resolved media driver directory (served when embedded, joined otherwise)."""
    idle: IdleStrategy | None = None
    linger_ns: int = DEFAULT_LINGER_NS
    install_signal_handlers: bool = True
    media_driver_takeover_s: float = TAKEOVER_WAIT_S
    """How long to wait for a dead driver's media driver directory to go stale."""


def resolve_aeron_dir(config: DriverConfig) -> str:
    """``driver.aeron_dir``, or when empty the tensorpool default directory -- for an embedded
    media driver and for joining an external one alike (#14.1: ``aeron_dir = ""`` means the
    same in every config, :func:`~tensorpool.endpoints.config_aeron_dir`)."""
    return config_aeron_dir(config.driver.aeron_dir)


def _check_hugepages(config: DriverConfig) -> int:
    size = probe_hugepage_size(config.shm.base_dir)
    if config.shm.require_hugepages:
        if not size:
            raise ConfigError(
                config.source,
                "shm.require_hugepages",
                f"shm.base_dir {config.shm.base_dir!r} is not on a hugetlbfs mount, so no "
                "hugepage-backed region could ever be created",
            )
        config.check_hugepage_strides(size)
    return size


def _persisted_next_lease_id(config: DriverConfig) -> int:
    try:
        doc = read_status(status_path(config))
    except StatusUnavailable:
        return 0
    value = doc.get("next_lease_id")
    return value if isinstance(value, int) and value > 0 else 0


def _check_media_driver_dir(config: DriverConfig, aeron_dir: str) -> None:
    """Refuse a directory the embedded media driver must not serve, before anything is made.

    #13.1: Aeron empties the directory it starts in, so ``driver.aeron_dir`` (or the default)
    must be absent, empty or an Aeron layout; the error names the file, key and path.
    """
    key = "driver.aeron_dir" if config.driver.aeron_dir else "default media driver directory"
    try:
        check_media_driver_dir(aeron_dir, f"{config.source}: {key}")
    except UnsafeDirectory as exc:
        raise DriverStartupError(str(exc)) from None


def _start_embedded_media_driver(aeron_dir: str, takeover_s: float) -> EmbeddedMediaDriver:
    """Serve ``aeron_dir`` from this process; wait out a killed predecessor's heartbeat."""
    try:
        return start_media_driver_after_crash(
            aeron_dir, TransportConfig(aeron_dir=aeron_dir), takeover_s
        )
    except MediaDriverError as exc:
        raise DriverStartupError(
            f"{exc}; set driver.aeron_dir to another directory, or "
            "driver.embedded_media_driver = false to join it"
            if "already active" in str(exc)
            else str(exc)
        ) from exc


def run_driver(
    config: DriverConfig,
    options: DaemonOptions,
    *,
    clock: NanoClock = now_ns,
    on_agent: Callable[[DriverAgent], object] | None = None,
) -> int:
    """Run the driver until it is shut down; returns the process exit status.

    Raises ConfigError (hugepage checks) or DriverStartupError before anything is served.
    ``on_agent`` receives the agent once it exists (tests and embedding use it to stop it).
    """
    hugepage_size = _check_hugepages(config)
    if config.driver.embedded_media_driver:
        _check_media_driver_dir(config, options.aeron_dir)
    shm = config.shm
    namespace_dir = os.path.join(shm.base_dir, shm.namespace)
    pid = os.getpid()
    try:
        lock = NamespaceLock.acquire(
            namespace_dir,
            owner=f"pid={pid} instance={config.driver.instance_id}",
            dir_mode=dir_mode_for(shm.permissions_mode),
            file_mode=shm.permissions_mode,
        )
    except OSError as exc:  # LockHeld (another driver) propagates as is
        raise DriverStartupError(f"cannot lock {namespace_dir}: {exc}") from exc
    media_driver: EmbeddedMediaDriver | None = None
    ctx: AeronContext | None = None
    files: RegionFiles | None = None
    previous_handlers: dict[int, Any] = {}
    try:
        disk = scan_epochs(config)
        seed = lease_id_seed(time.time_ns(), _persisted_next_lease_id(config))
        aeron_dir = options.aeron_dir
        if config.driver.embedded_media_driver:
            media_driver = _start_embedded_media_driver(aeron_dir, options.media_driver_takeover_s)
        elif not serves(aeron_dir):  # joining: Aeron's driver timeout, not the takeover one
            raise DriverStartupError(
                f"no running media driver in {aeron_dir}: start one (tensorpool mediadriver "
                f"--dir {aeron_dir}) or set driver.embedded_media_driver = true"
            )
        ctx = AeronContext(
            TransportConfig(
                aeron_dir=aeron_dir, client_name=f"tensorpool-driver-{config.driver.instance_id}"
            ),
            clock=clock,
        )
        try:
            ctx.start()
        except MediaDriverError as exc:
            raise DriverStartupError(str(exc)) from exc
        core = DriverCore(
            config,
            now_ns=clock(),
            lease_id_start=seed,
            epoch_floors=disk.floors,
            known_epochs=disk.known,
            hugepages_backed=hugepage_size > 0,
        )
        files = RegionFiles(config, hugepage_size=hugepage_size)
        agent = DriverAgent(
            config,
            ctx,
            core,
            files,
            clock=clock,
            status_file=status_path(config),
            aeron_dir=aeron_dir,
            linger_ns=options.linger_ns,
        )
        log_event(
            logging.INFO,
            "driver_starting",
            pid=pid,
            config=config.source,
            lock=lock.path,
            epoch_floors=dict(sorted(disk.floors.items())),
            first_lease_id=seed,
            embedded_media_driver=config.driver.embedded_media_driver,
        )
        # #26.1: the runner keeps the media driver (an external one can be restarted under us)
        runner = AgentRunner(agent, options.idle or default_idle_strategy(), context=ctx)
        agent.runner_health = runner.health
        if on_agent is not None:
            on_agent(agent)
        on_main_thread = threading.current_thread() is threading.main_thread()
        if options.install_signal_handlers and on_main_thread:
            signals_seen = 0

            def on_signal(signum: int, _frame: FrameType | None) -> None:
                nonlocal signals_seen
                signals_seen += 1
                if signals_seen == 1:
                    agent.request_shutdown()
                else:
                    agent.force_stop()

            for sig in (signal.SIGINT, signal.SIGTERM):
                previous_handlers[sig] = signal.signal(sig, on_signal)
        runner.run()
        log_event(
            logging.INFO,
            "driver_stopped",
            exit_code=agent.exit_code,
            errors=runner.errors,
            duty_cycles=runner.duty_cycles,
        )
        return agent.exit_code
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if files is not None:
            files.close()
            if config.policies.cleanup_shm_on_exit:
                removed = files.remove_all_epochs()
                log_event(logging.INFO, "shm_cleanup", epochs_removed=removed)
        if ctx is not None:
            ctx.close()
        if media_driver is not None:
            close_media_driver(media_driver)
        lock.release()
