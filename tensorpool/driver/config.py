"""SHM driver configuration (Driver Model v1.0 §17 and its configuration reference).

A TOML file with five key families is turned into frozen, validated dataclasses:

``[driver]``
    identity and Aeron endpoints: ``instance_id``, ``aeron_dir``,
    ``embedded_media_driver``, ``control_channel``/``control_stream_id`` (1000),
    ``announce_channel``/``announce_stream_id`` (default: the control endpoint),
    ``qos_channel``/``qos_stream_id`` (1200), ``descriptor_channel``/
    ``descriptor_stream_id`` (1100) and ``metadata_channel``/``metadata_stream_id``
    (1300) — the shared streams handed to clients — and the id ranges
    ``stream_id_range``, ``descriptor_stream_id_range``, ``control_stream_id_range``.
``[shm]``
    ``base_dir``, ``namespace``, ``require_hugepages``, ``page_size_bytes``,
    ``permissions_mode``, ``allowed_base_dirs`` and ``allow_world_writable`` (tensorpool:
    a mode with ``o+w`` is refused unless it is true, #13.1).
``[policies]``
    dynamic streams (and their limits), announce/keepalive timing, prefault/mlock,
    epoch GC, shutdown.
``[profiles.<name>]``
    ``header_nslots`` and ``payload_pools = [{pool_id, stride_bytes}, ...]``.
``[streams.<name>]``
    ``stream_id`` and ``profile``.

Keys not in the reference surface are tensorpool extensions, all optional:
``driver.embedded_media_driver``, ``driver.descriptor_*``, ``driver.metadata_*``,
``shm.namespace``, ``profiles.<name>.header_slot_bytes`` (must be 256),
``payload_pools[].nslots`` (must equal ``header_nslots``) and the dynamic-stream limits
``policies.max_dynamic_streams``, ``max_dynamic_streams_per_client``,
``dynamic_stream_idle_reclaim_ms`` and ``reserve_shm_for_configured_streams``.

Every scalar key of ``driver``, ``shm`` and ``policies`` can be overridden from the
environment (see :mod:`tensorpool.config_schema`): ``DRIVER_INSTANCE_ID``,
``SHM_BASE_DIR``, ``DRIVER_AERON_DIR``, ``POLICIES_SHUTDOWN_TOKEN``, ... or the same
names prefixed with ``TENSORPOOL_`` (which win). ``SHM_ALLOWED_BASE_DIRS`` is a
``os.pathsep``-separated list; ranges use the ``"START-END"`` text form.

Loading has no side effects: nothing is created or probed on disk (the agent
canonicalises directories and checks hugepage support when it starts). The one look at
the filesystem is resolving symlinks in ``driver.aeron_dir`` and ``shm.base_dir`` to refuse
system and shared roots (``/``, ``/etc``, ``$HOME``, ``/tmp``, ``/dev/shm`` ...; see
:mod:`tensorpool.fsafety`).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any

from tensorpool import config_schema as cs
from tensorpool.config_schema import ConfigError
from tensorpool.config_util import (
    UINT32_MAX,
    UINT64_MAX,
    IdRange,
    check_path_length,
    ranges_overlap,
)
from tensorpool.endpoints import (
    DEFAULT_CONTROL_STREAM_ID,
    DEFAULT_NAMESPACE,
    DEFAULT_SHM_BASE_DIR,
    IPC_CONTROL,
    MAX_AERON_STREAM_ID,
    MAX_DATA_STREAM_ID,
)
from tensorpool.fsafety import world_writable_reason
from tensorpool.shm.profiles import HEADER_SLOT_BYTES, HeaderSlots, ProfileConfig, ProfileTable

__all__ = [
    "DEFAULT_ANNOUNCE_PERIOD_MS",
    "DEFAULT_CHANNEL",
    "DEFAULT_CONTROL_STREAM_ID",
    "HEADER_SLOT_BYTES",
    "ConfigError",
    "DriverConfig",
    "DriverSettings",
    "IdRange",
    "PoliciesConfig",
    "ProfileConfig",
    "ProvisionedStream",
    "ShmConfig",
    "load_driver_config",
    "parse_driver_config",
]

#: The control channel every tensorpool process uses by default (tensorpool.endpoints).
DEFAULT_CHANNEL = IPC_CONTROL
DEFAULT_INSTANCE_ID = "driver-01"
DEFAULT_BASE_DIR = DEFAULT_SHM_BASE_DIR
DEFAULT_PAGE_SIZE = 4096
#: #13.4: group may read (map read-only), nobody else may write: a writer can truncate a
#: mapped file and SIGBUS every process mapping it. Cross-user producers need "660".
DEFAULT_PERMISSIONS = 0o640
DEFAULT_HEADER_NSLOTS = 1024
DEFAULT_ANNOUNCE_PERIOD_MS = 1000
DEFAULT_KEEPALIVE_INTERVAL_MS = 1000
DEFAULT_EXPIRY_GRACE_INTERVALS = 3
DEFAULT_SHUTDOWN_TIMEOUT_MS = 2000
DEFAULT_EPOCH_GC_KEEP = 2
#: Dynamic-stream limits (tensorpool extensions, issue #13.5): an attach flood with fresh
#: stream ids must not use up the space configured streams need.
DEFAULT_MAX_DYNAMIC_STREAMS = 64
DEFAULT_MAX_DYNAMIC_STREAMS_PER_CLIENT = 4
DEFAULT_DYNAMIC_STREAM_IDLE_RECLAIM_MS = 60_000

_MS = 1_000_000
#: The deepest file the driver creates below ``<base_dir>/<namespace>/<instance_id>``
#: (driver/streams.py), at the largest ids: the path-length check covers every region file.
_LONGEST_REGION_PATH = "stream-4294967294/epoch-18446744073709551615/payload-65535.pool"


@dataclass(frozen=True, slots=True)
class ProvisionedStream:
    """A statically provisioned stream."""

    name: str
    stream_id: int
    profile: str


#: An id range (Driver Model §11) of Aeron stream ids; unset = no range.
_AeronIdRange = Annotated[cs.IdRange | None, cs.id_range(1, MAX_AERON_STREAM_ID)]


@cs.table
class DriverSettings(cs.EndpointKeys):
    """``[driver]``: identity, media driver and the control-plane endpoints.

    The control/descriptor/QoS/metadata endpoints and ``aeron_dir`` are the shared
    :class:`~tensorpool.config_schema.EndpointKeys` (#14.1, #26.5); the announce endpoint is
    the driver's own (default: the control endpoint, where clients listen).
    """

    instance_id: cs.PathName = DEFAULT_INSTANCE_ID
    embedded_media_driver: cs.Bool = True
    announce_channel: cs.Channel | None = None
    announce_stream_id: cs.AeronStreamId | None = None
    stream_id_range: Annotated[cs.IdRange | None, cs.id_range(1, MAX_DATA_STREAM_ID)] = None
    descriptor_stream_id_range: _AeronIdRange = None
    control_stream_id_range: _AeronIdRange = None
    #: ``HOST:PORT`` of the Prometheus endpoint, "" = off (#19.1; ``--metrics-bind`` overrides)
    metrics_bind: cs.Bind = ""

    def __post_init__(self) -> None:
        if self.announce_channel is None:
            cs.resolve(self, announce_channel=self.control_channel)
        if self.announce_stream_id is None:
            cs.resolve(self, announce_stream_id=self.control_stream_id)
        ranges = [(k, r) for k, r in self.ranges() if r is not None]
        for i, (key_a, a) in enumerate(ranges):  # Driver Model §11
            for key_b, b in ranges[i + 1 :]:
                if ranges_overlap(a, b):
                    raise cs.FieldProblem(key_b, f"range {b} overlaps driver.{key_a} ({a})")
        for key, rng in ranges:
            for id_key in ("control", "announce", "qos", "descriptor", "metadata"):
                value = getattr(self, f"{id_key}_stream_id")
                if value in rng:
                    raise cs.FieldProblem(
                        key, f"range {rng} contains driver.{id_key}_stream_id ({value})"
                    )

    def ranges(self) -> tuple[tuple[str, cs.IdRange | None], ...]:
        return (
            ("stream_id_range", self.stream_id_range),
            ("descriptor_stream_id_range", self.descriptor_stream_id_range),
            ("control_stream_id_range", self.control_stream_id_range),
        )


@cs.table
class ShmConfig(cs.Table):
    """``[shm]``: where backing files live and how they are checked."""

    base_dir: cs.ShmDir = DEFAULT_BASE_DIR
    namespace: cs.PathName = DEFAULT_NAMESPACE
    require_hugepages: cs.Bool = False
    page_size_bytes: Annotated[int, cs.int_in(1, UINT32_MAX, cs.power_of_two)] = DEFAULT_PAGE_SIZE
    permissions_mode: cs.OctalMode = DEFAULT_PERMISSIONS
    allowed_base_dirs: tuple[cs.AbsDir, ...] = ()
    """Default: ``(base_dir,)``."""
    allow_world_writable: cs.Bool = False
    """``permissions_mode`` may include ``o+w`` only when this is set (#13.1)."""

    def __post_init__(self) -> None:
        problem = world_writable_reason(
            self.permissions_mode, self.allow_world_writable, "shm.allow_world_writable"
        )
        if problem:
            raise cs.FieldProblem("permissions_mode", problem)
        if not self.allowed_base_dirs:
            cs.resolve(self, allowed_base_dirs=(self.base_dir,))
        base = self.base_dir
        if not any(
            base == d or base.startswith(d.rstrip("/") + "/") for d in self.allowed_base_dirs
        ):
            raise cs.FieldProblem(
                "allowed_base_dirs",
                f"shm.base_dir {base!r} is not inside any allowed base dir; clients would "
                "reject every region the driver announces",
            )


def _ascii(value: str) -> str | None:
    return None if value.isascii() else "must be ASCII (it is sent as varAscii)"


@cs.table
class PoliciesConfig(cs.Table):
    """``[policies]``: lifecycle timing and behaviour switches."""

    allow_dynamic_streams: cs.Bool = False
    default_profile: cs.Str = ""
    """Profile of streams created on demand; "" = the first profile of the file."""
    announce_period_ms: cs.Positive = DEFAULT_ANNOUNCE_PERIOD_MS
    lease_keepalive_interval_ms: cs.Positive = DEFAULT_KEEPALIVE_INTERVAL_MS
    lease_expiry_grace_intervals: cs.Positive = DEFAULT_EXPIRY_GRACE_INTERVALS
    prefault_shm: cs.Bool = True
    reuse_existing_shm: cs.Bool = False
    mlock_shm: cs.Bool = False
    cleanup_shm_on_exit: cs.Bool = False
    epoch_gc_enabled: cs.Bool = True
    epoch_gc_keep: cs.Positive = DEFAULT_EPOCH_GC_KEEP
    epoch_gc_min_age_ns: Annotated[int, cs.int_in(0, UINT64_MAX)] | None = None
    """Default: three announce periods."""
    epoch_gc_on_startup: cs.Bool = False
    shutdown_timeout_ms: cs.NonNegative = DEFAULT_SHUTDOWN_TIMEOUT_MS
    shutdown_token: Annotated[str, cs.Rule(_ascii)] = ""
    max_dynamic_streams: cs.NonNegative = DEFAULT_MAX_DYNAMIC_STREAMS
    max_dynamic_streams_per_client: cs.NonNegative = DEFAULT_MAX_DYNAMIC_STREAMS_PER_CLIENT
    dynamic_stream_idle_reclaim_ms: cs.NonNegative = DEFAULT_DYNAMIC_STREAM_IDLE_RECLAIM_MS
    reserve_shm_for_configured_streams: cs.Bool = True

    def __post_init__(self) -> None:
        if self.epoch_gc_min_age_ns is None:
            cs.resolve(self, epoch_gc_min_age_ns=3 * self.announce_period_ms * _MS)

    @property
    def dynamic_stream_idle_reclaim_ns(self) -> int:
        """0: dynamic streams are never reclaimed."""
        return self.dynamic_stream_idle_reclaim_ms * _MS

    @property
    def announce_period_ns(self) -> int:
        return self.announce_period_ms * _MS

    @property
    def keepalive_interval_ns(self) -> int:
        return self.lease_keepalive_interval_ms * _MS

    @property
    def lease_ttl_ns(self) -> int:
        """How long a lease lives after a keepalive: interval x grace intervals."""
        return self.lease_keepalive_interval_ms * self.lease_expiry_grace_intervals * _MS

    @property
    def shutdown_timeout_ns(self) -> int:
        return self.shutdown_timeout_ms * _MS


@cs.table
class _Profile(ProfileTable):
    """``[profiles.<name>]`` of the driver (1024 header slots unless set)."""

    header_nslots: HeaderSlots = DEFAULT_HEADER_NSLOTS


@cs.table
class StreamTable(cs.Table):
    """``[streams.<name>]`` as written."""

    stream_id: cs.DataStreamId
    profile: cs.Str


@cs.table
class DriverFile(cs.Table):
    """The driver's TOML file: the tables and the rules that span them."""

    driver: DriverSettings = field(default_factory=DriverSettings)
    shm: ShmConfig = field(default_factory=ShmConfig)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    profiles: dict[str, _Profile] = field(default_factory=dict)
    streams: dict[str, StreamTable] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.profiles:
            raise cs.FieldProblem("profiles", "at least one [profiles.<name>] table is required")
        page = self.shm.page_size_bytes
        for name, profile in self.profiles.items():
            for i, pool in enumerate(profile.payload_pools):
                if pool.stride_bytes % page:
                    raise cs.FieldProblem(
                        f"profiles.{name}.payload_pools[{i}].stride_bytes",
                        f"{pool.stride_bytes} is not a multiple of shm.page_size_bytes ({page})",
                    )
        default = self.policies.default_profile
        if not default:
            cs.resolve(
                self,
                policies=dataclasses.replace(
                    self.policies, default_profile=next(iter(self.profiles))
                ),
            )
        elif default not in self.profiles:
            raise cs.FieldProblem(
                "policies.default_profile",
                f"profile {default!r} is not defined (known: {', '.join(self.profiles)})",
            )
        by_id: dict[int, str] = {}
        for name, stream in self.streams.items():
            if stream.stream_id in by_id:
                other = by_id[stream.stream_id]
                raise cs.FieldProblem(
                    f"streams.{name}.stream_id",
                    f"stream_id {stream.stream_id} is also used by streams.{other}",
                )
            by_id[stream.stream_id] = name
            if stream.profile not in self.profiles:
                raise cs.FieldProblem(
                    f"streams.{name}.profile", f"profile {stream.profile!r} is not defined"
                )
        if not self.policies.allow_dynamic_streams and not self.streams:
            raise cs.FieldProblem(
                "streams",
                "at least one [streams.<name>] table is required when "
                "policies.allow_dynamic_streams = false",
            )
        for key, rng in self.driver.ranges():
            for sid, name in by_id.items():
                if rng is not None and sid in rng:
                    raise cs.FieldProblem(
                        f"driver.{key}", f"range {rng} contains streams.{name}.stream_id ({sid})"
                    )
        root = posixpath.join(self.shm.base_dir, self.shm.namespace, self.driver.instance_id)
        problem = check_path_length(root, _LONGEST_REGION_PATH)
        if problem:  # #26.6: refused here, before the driver creates the first directory
            raise cs.FieldProblem("shm.base_dir", f"{root}: {problem}")


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """The whole validated driver configuration.

    ``profiles`` keeps file order (the first one is the default profile unless
    ``policies.default_profile`` names another). ``source`` is the file it came from,
    used in later error messages.
    """

    driver: DriverSettings
    shm: ShmConfig
    policies: PoliciesConfig
    profiles: Mapping[str, ProfileConfig]
    streams: tuple[ProvisionedStream, ...] = ()
    source: str = "<memory>"
    _by_stream_id: Mapping[int, ProvisionedStream] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))
        object.__setattr__(
            self, "_by_stream_id", MappingProxyType({s.stream_id: s for s in self.streams})
        )

    def stream_by_id(self, stream_id: int) -> ProvisionedStream | None:
        """The statically configured stream with this id, if any."""
        return self._by_stream_id.get(stream_id)

    @property
    def default_profile(self) -> ProfileConfig | None:
        """Profile used for dynamically created streams."""
        return self.profiles.get(self.policies.default_profile)

    def check_hugepage_strides(self, hugepage_size_bytes: int) -> None:
        """Wire Spec §15.22: with hugepages every stride must be a hugepage multiple.

        The hugepage size is a property of the host, so the agent calls this at
        start-up after probing it; the config loader cannot know it.
        """
        for profile in self.profiles.values():
            for i, pool in enumerate(profile.payload_pools):
                if pool.stride_bytes % hugepage_size_bytes:
                    raise ConfigError(
                        self.source,
                        f"profiles.{profile.name}.payload_pools[{i}].stride_bytes",
                        f"{pool.stride_bytes} is not a multiple of the hugepage size "
                        f"{hugepage_size_bytes} (shm.require_hugepages = true)",
                    )


# --------------------------------------------------------------------------- loading


def load_driver_config(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> DriverConfig:
    """Load and validate a driver TOML file.

    ``env`` defaults to ``os.environ``; pass ``{}`` to ignore the environment.
    """
    return cs.load_file(path, parse_driver_config, env)


def parse_driver_config(
    data: Mapping[str, Any], *, source: str = "<memory>", env: Mapping[str, str] | None = None
) -> DriverConfig:
    """Validate an already-parsed TOML document (also used by embedded drivers)."""
    f = cs.parse_file(DriverFile, data, source, env)
    return DriverConfig(
        driver=f.driver,
        shm=f.shm,
        policies=f.policies,
        profiles={name: p.profile(name) for name, p in f.profiles.items()},
        streams=tuple(
            ProvisionedStream(name=name, stream_id=s.stream_id, profile=s.profile)
            for name, s in f.streams.items()
        ),
        source=source,
    )
