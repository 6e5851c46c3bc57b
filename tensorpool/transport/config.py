"""Settings for connecting to Aeron: which media driver, and how an embedded one is built.

Model: a process either *owns* a media driver (embedded, in-process, private directory, gone when
the process closes it) or *joins* one that another process runs (``aeron_dir`` names its
directory). Several processes exchange IPC messages only if they join the same directory, so
multi-process deployments run one standalone driver (``python -m tensorpool.transport.aeronmd``)
and point every process's ``aeron_dir`` at it.

``aeron_dir``:
- ``None`` (default): start an embedded driver in a fresh private directory.
- ``""``: Aeron's library default directory (``pyaeron.default_path()``, e.g.
  ``/dev/shm/aeron-<user>``), which is where a stock ``aeronmd`` listens. The TOML configs'
  ``aeron_dir = ""`` is *not* this: every config resolves it to the tensorpool default
  directory before building a ``TransportConfig``
  (:func:`tensorpool.endpoints.config_aeron_dir`, #14.1).
- any other string: that directory.

Driver-only options (threading mode, default term lengths, MTU) apply to drivers this process
starts; they are ignored when joining an external driver, whose own settings rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from tensorpool.config_util import aeron_dir_problem
from tensorpool.transport.channels import validate_mtu, validate_term_length

ThreadingMode = Literal["shared", "dedicated", "shared_network"]
THREADING_MODES: Final[frozenset[str]] = frozenset({"shared", "dedicated", "shared_network"})


class TransportConfigError(ValueError):
    """A transport setting is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """How to reach (or build) the Aeron media driver, and client timeouts."""

    aeron_dir: str | None = None
    """None = embedded driver; "" = Aeron's default directory; else an existing driver's dir."""

    embedded_parent_dir: str | None = None
    """Where an embedded driver makes its private directory; None = /dev/shm if usable."""

    threading_mode: ThreadingMode = "shared"
    """Driver threads: "shared" = 1 thread (right for 2-core hosts and tests)."""

    ipc_term_buffer_length: int | None = None
    """Default IPC term length for channels without ``term-length`` (driver default 64 MiB)."""

    term_buffer_length: int | None = None
    """Default UDP term length for channels without ``term-length`` (driver default 16 MiB)."""

    mtu_length: int | None = None
    """Default UDP MTU (driver default 1408)."""

    driver_timeout_ms: int = 10_000
    """How long the client waits for the driver to answer before failing."""

    keepalive_interval_ns: int | None = None
    resource_linger_duration_ns: int | None = None
    idle_sleep_duration_ns: int | None = None
    """Client conductor settings; None keeps Aeron's defaults."""

    pre_touch_mapped_memory: bool = False
    """Fault in log buffers on mapping (slower setup, no page faults on the first messages)."""

    client_name: str | None = None
    """Shown in the driver's counters; handy when several processes share a driver."""

    def __post_init__(self) -> None:
        if self.aeron_dir:  # #13.1: a media driver may serve (and empty) it; #26.5: one check
            reason = aeron_dir_problem(self.aeron_dir)
            if reason is not None:
                raise TransportConfigError(f"aeron_dir: refusing {reason}")
        if self.threading_mode not in THREADING_MODES:
            raise TransportConfigError(
                f"threading_mode: {self.threading_mode!r} is not one of {sorted(THREADING_MODES)}"
            )
        for name in ("ipc_term_buffer_length", "term_buffer_length"):
            value = getattr(self, name)
            if value is not None:
                try:
                    validate_term_length(value)
                except ValueError as exc:
                    raise TransportConfigError(f"{name}: {exc}") from None
        if self.mtu_length is not None:
            try:
                validate_mtu(self.mtu_length)
            except ValueError as exc:
                raise TransportConfigError(f"mtu_length: {exc}") from None
        if self.driver_timeout_ms <= 0:
            raise TransportConfigError(
                f"driver_timeout_ms: must be > 0, got {self.driver_timeout_ms}"
            )
        for name in (
            "keepalive_interval_ns",
            "resource_linger_duration_ns",
            "idle_sleep_duration_ns",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise TransportConfigError(f"{name}: must be > 0, got {value}")

    @property
    def embedded(self) -> bool:
        return self.aeron_dir is None
