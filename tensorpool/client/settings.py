"""Where a producer or consumer talks and where its shared memory lives.

The control-plane endpoints and the deployment defaults (namespace, base directory, media
driver directory) are :mod:`tensorpool.endpoints`' — one type and one set of defaults for every
tensorpool process (#14.1); they are re-exported here for the client's callers. Cadences follow
the 1 Hz the Wire Spec recommends; the freshness window is 3x the announce period (§10.1.1,
§15.1). Producers and consumers of one deployment must agree on these.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tensorpool.endpoints import (
    DEFAULT_CONTROL_STREAM_ID,
    DEFAULT_DESCRIPTOR_STREAM_ID,
    DEFAULT_METADATA_STREAM_ID,
    DEFAULT_NAMESPACE,
    DEFAULT_QOS_STREAM_ID,
    DEFAULT_SHM_BASE_DIR,
    IPC_CONTROL,
    IPC_DESCRIPTORS,
    Endpoints,
    default_aeron_dir,
    default_shm_base_dir,
)
from tensorpool.fsafety import unsafe_root_reason
from tensorpool.transport.config import TransportConfig

__all__ = [
    "DEFAULT_CONTROL_STREAM_ID",
    "DEFAULT_DESCRIPTOR_STREAM_ID",
    "DEFAULT_METADATA_STREAM_ID",
    "DEFAULT_NAMESPACE",
    "DEFAULT_QOS_STREAM_ID",
    "DEFAULT_SHM_BASE_DIR",
    "IPC",
    "IPC_CONTROL",
    "IPC_DESCRIPTORS",
    "SEC",
    "ClientSettings",
    "Endpoints",
    "default_aeron_dir",
    "default_shm_base_dir",
]

IPC = "aeron:ipc"
SEC = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ClientSettings:
    transport: TransportConfig = field(default_factory=TransportConfig)
    channels: Endpoints = field(default_factory=Endpoints)
    shm_base_dir: str = field(default_factory=default_shm_base_dir)
    namespace: str = DEFAULT_NAMESPACE
    allowed_base_dirs: tuple[str, ...] = ()
    """Consumers map only regions under these (§15.21a.5); empty = just `shm_base_dir`."""
    announce_period_ns: int = SEC
    qos_period_ns: int = SEC
    freshness_periods: int = 3

    def __post_init__(self) -> None:
        if not os.path.isabs(self.shm_base_dir):
            raise ValueError(f"shm_base_dir: must be an absolute path, got {self.shm_base_dir!r}")
        reason = unsafe_root_reason(self.shm_base_dir)  # #13.1: regions are created there
        if reason is not None:
            raise ValueError(f"shm_base_dir: refusing {reason}")
        if self.announce_period_ns <= 0 or self.qos_period_ns <= 0:
            raise ValueError("announce_period_ns and qos_period_ns must be > 0")
        if self.freshness_periods < 1:
            raise ValueError("freshness_periods must be >= 1")

    @property
    def freshness_ns(self) -> int:
        return self.freshness_periods * self.announce_period_ns

    @property
    def base_dirs(self) -> tuple[str, ...]:
        return self.allowed_base_dirs or (self.shm_base_dir,)
