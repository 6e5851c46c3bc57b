"""Where a producer or consumer talks and where its shared memory lives.

Defaults follow the stream-id guidance of Wire Spec §15.11 (control 1000,
descriptors 1100, QoS 1200, metadata 1300, all on Aeron IPC) and the 1 Hz
cadences it recommends; the freshness window is 3x the announce period
(§10.1.1, §15.1). Producers and consumers of one deployment must agree on these.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tensorpool.fsafety import unsafe_root_reason
from tensorpool.transport.config import TransportConfig

IPC = "aeron:ipc"
# Explicit term lengths: Aeron's IPC default is 64 MiB per publication, and every producer
# opens four. Control traffic is tiny; the descriptor log holds ~170k descriptors per 16 MiB,
# far more than any ring, so a lagging consumer resyncs long before it back-pressures.
IPC_CONTROL = "aeron:ipc?term-length=4m"
IPC_DESCRIPTORS = "aeron:ipc?term-length=16m"
DEFAULT_CONTROL_STREAM_ID = 1000
DEFAULT_DESCRIPTOR_STREAM_ID = 1100
DEFAULT_QOS_STREAM_ID = 1200
DEFAULT_METADATA_STREAM_ID = 1300
DEFAULT_NAMESPACE = "tensorpool"
SEC = 1_000_000_000


# One default for every component, so a client attached to a driver accepts the driver's
# paths without flags (the reference configuration's value). Override per deployment.
DEFAULT_SHM_BASE_DIR = "/dev/shm/tensorpool"


def default_shm_base_dir() -> str:
    """`/dev/shm/tensorpool` (tmpfs); `<tmp>/tensorpool` where there is no /dev/shm."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return DEFAULT_SHM_BASE_DIR
    import tempfile

    return os.path.join(tempfile.gettempdir(), "tensorpool")


def default_aeron_dir() -> str:
    """Where `tensorpool mediadriver` / the SHM driver serve by default, and clients look."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    return os.path.join(root, f"tensorpool-aeron-{os.getuid()}")


@dataclass(frozen=True, slots=True)
class Channels:
    control_channel: str = IPC_CONTROL
    control_stream_id: int = DEFAULT_CONTROL_STREAM_ID
    descriptor_channel: str = IPC_DESCRIPTORS
    descriptor_stream_id: int = DEFAULT_DESCRIPTOR_STREAM_ID
    qos_channel: str = IPC_CONTROL
    qos_stream_id: int = DEFAULT_QOS_STREAM_ID
    metadata_channel: str = IPC_CONTROL
    metadata_stream_id: int = DEFAULT_METADATA_STREAM_ID

    def __post_init__(self) -> None:
        for name in ("control", "descriptor", "qos", "metadata"):
            sid = getattr(self, f"{name}_stream_id")
            if not 0 < sid < 2**31:
                raise ValueError(f"{name}_stream_id: must be in 1..2^31-1, got {sid}")
            if not getattr(self, f"{name}_channel").startswith("aeron:"):
                raise ValueError(f"{name}_channel: not an Aeron channel URI")


@dataclass(frozen=True, slots=True)
class ClientSettings:
    transport: TransportConfig = field(default_factory=TransportConfig)
    channels: Channels = field(default_factory=Channels)
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
