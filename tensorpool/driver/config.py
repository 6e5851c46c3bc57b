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
environment (see :mod:`tensorpool.config_util`): ``DRIVER_INSTANCE_ID``,
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

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tensorpool.config_util import (
    UINT16_MAX,
    UINT64_MAX,
    ConfigError,
    EnvOverrides,
    IdRange,
    Section,
    check_bind,
    check_path_component,
    check_path_length,
    is_power_of_two,
    load_toml,
    parse_octal_mode,
    ranges_overlap,
)
from tensorpool.endpoints import (
    DEFAULT_CONTROL_STREAM_ID,
    DEFAULT_DESCRIPTOR_STREAM_ID,
    DEFAULT_METADATA_STREAM_ID,
    DEFAULT_NAMESPACE,
    DEFAULT_QOS_STREAM_ID,
    DEFAULT_SHM_BASE_DIR,
    IPC_CONTROL,
    MAX_AERON_STREAM_ID,
    MAX_DATA_STREAM_ID,
    Endpoints,
    check_endpoints,
    read_aeron_stream_id,
    read_channel,
    read_endpoints,
)
from tensorpool.fsafety import unsafe_root_reason, world_writable_reason
from tensorpool.shm.layout import MAX_NSLOTS, MAX_STRIDE_BYTES, PoolConfig

__all__ = [
    "DEFAULT_ANNOUNCE_PERIOD_MS",
    "DEFAULT_CHANNEL",
    "DEFAULT_CONTROL_STREAM_ID",
    "DEFAULT_DESCRIPTOR_STREAM_ID",
    "DEFAULT_METADATA_STREAM_ID",
    "DEFAULT_QOS_STREAM_ID",
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

#: Wire Spec v1.1: every header slot is exactly 256 bytes.
HEADER_SLOT_BYTES = 256

#: The control channel every tensorpool process uses by default (tensorpool.endpoints).
DEFAULT_CHANNEL = IPC_CONTROL
DEFAULT_INSTANCE_ID = "driver-01"
DEFAULT_BASE_DIR = DEFAULT_SHM_BASE_DIR
DEFAULT_PAGE_SIZE = 4096
#: #13.4: group may read (map read-only), nobody else may write: a writer can truncate a
#: mapped file and SIGBUS every process mapping it. Cross-user producers need "660".
DEFAULT_PERMISSIONS = "640"
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

# Stream ids of data sources are uint32 with 0xFFFFFFFF reserved as the SBE null value.
_MAX_STREAM_ID = MAX_DATA_STREAM_ID
_MS = 1_000_000
#: The deepest file the driver creates below ``<base_dir>/<namespace>/<instance_id>``
#: (driver/streams.py), at the largest ids: the path-length check covers every region file.
_LONGEST_REGION_PATH = "stream-4294967294/epoch-18446744073709551615/payload-65535.pool"


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """Geometry shared by every stream created from this profile."""

    name: str
    header_nslots: int
    payload_pools: tuple[PoolConfig, ...]
    header_slot_bytes: int = HEADER_SLOT_BYTES


@dataclass(frozen=True, slots=True)
class ProvisionedStream:
    """A statically provisioned stream."""

    name: str
    stream_id: int
    profile: str


@dataclass(frozen=True, slots=True)
class DriverSettings(Endpoints):
    """``[driver]``: identity, media driver and the control-plane endpoints.

    The control/descriptor/QoS/metadata endpoints and their defaults are the deployment's
    :class:`~tensorpool.endpoints.Endpoints` (the clients' defaults, #14.1); the announce
    endpoint is the driver's own (default: the control endpoint, where clients listen).
    """

    instance_id: str = DEFAULT_INSTANCE_ID
    aeron_dir: str = ""
    embedded_media_driver: bool = True
    announce_channel: str = DEFAULT_CHANNEL
    announce_stream_id: int = DEFAULT_CONTROL_STREAM_ID
    stream_id_range: IdRange | None = None
    descriptor_stream_id_range: IdRange | None = None
    control_stream_id_range: IdRange | None = None
    #: ``HOST:PORT`` of the Prometheus endpoint, "" = off (#19.1; ``--metrics-bind`` overrides)
    metrics_bind: str = ""

    def __post_init__(self) -> None:
        check_endpoints(self)


@dataclass(frozen=True, slots=True)
class ShmConfig:
    """``[shm]``: where backing files live and how they are checked."""

    base_dir: str = DEFAULT_BASE_DIR
    namespace: str = DEFAULT_NAMESPACE
    require_hugepages: bool = False
    page_size_bytes: int = DEFAULT_PAGE_SIZE
    permissions_mode: int = 0o640
    allowed_base_dirs: tuple[str, ...] = (DEFAULT_BASE_DIR,)
    allow_world_writable: bool = False
    """``permissions_mode`` may include ``o+w`` only when this is set (#13.1)."""


@dataclass(frozen=True, slots=True)
class PoliciesConfig:
    """``[policies]``: lifecycle timing and behaviour switches."""

    allow_dynamic_streams: bool = False
    default_profile: str = ""
    announce_period_ms: int = DEFAULT_ANNOUNCE_PERIOD_MS
    lease_keepalive_interval_ms: int = DEFAULT_KEEPALIVE_INTERVAL_MS
    lease_expiry_grace_intervals: int = DEFAULT_EXPIRY_GRACE_INTERVALS
    prefault_shm: bool = True
    reuse_existing_shm: bool = False
    mlock_shm: bool = False
    cleanup_shm_on_exit: bool = False
    epoch_gc_enabled: bool = True
    epoch_gc_keep: int = DEFAULT_EPOCH_GC_KEEP
    epoch_gc_min_age_ns: int = 3 * DEFAULT_ANNOUNCE_PERIOD_MS * _MS
    epoch_gc_on_startup: bool = False
    shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS
    shutdown_token: str = ""
    max_dynamic_streams: int = DEFAULT_MAX_DYNAMIC_STREAMS
    max_dynamic_streams_per_client: int = DEFAULT_MAX_DYNAMIC_STREAMS_PER_CLIENT
    dynamic_stream_idle_reclaim_ms: int = DEFAULT_DYNAMIC_STREAM_IDLE_RECLAIM_MS
    reserve_shm_for_configured_streams: bool = True

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
    file = os.fspath(path)
    data = load_toml(file)
    return parse_driver_config(data, source=file, env=os.environ if env is None else env)


def parse_driver_config(
    data: Mapping[str, Any], *, source: str = "<memory>", env: Mapping[str, str] | None = None
) -> DriverConfig:
    """Validate an already-parsed TOML document (also used by embedded drivers)."""
    overrides = EnvOverrides(env)
    root = Section(data, "", source, overrides)
    driver_sec = root.opt_table("driver")
    shm_sec = root.opt_table("shm")
    policies_sec = root.opt_table("policies")
    profiles_sec = root.opt_table("profiles")
    streams_sec = root.opt_table("streams")
    root.finish()

    shm = _parse_shm(shm_sec)
    driver = _parse_driver(driver_sec)
    profiles = _parse_profiles(profiles_sec, shm.page_size_bytes)
    policies = _parse_policies(policies_sec, profiles)
    streams = _parse_streams(streams_sec, profiles)

    if not policies.allow_dynamic_streams and not streams:
        raise ConfigError(
            source,
            "streams",
            "at least one [streams.<name>] table is required when "
            "policies.allow_dynamic_streams = false",
        )
    _check_stream_ids(driver, streams, driver_sec)
    instance_root = posixpath.join(shm.base_dir, shm.namespace, driver.instance_id)
    problem = check_path_length(instance_root, _LONGEST_REGION_PATH)
    if problem:  # #26.6: refused here, before the driver creates the first directory
        raise ConfigError(source, "shm.base_dir", f"{instance_root}: {problem}")
    return DriverConfig(
        driver=driver,
        shm=shm,
        policies=policies,
        profiles=profiles,
        streams=streams,
        source=source,
    )


def _parse_driver(sec: Section) -> DriverSettings:
    instance_id = sec.opt_str("instance_id", DEFAULT_INSTANCE_ID, env=True)
    sec.checked("instance_id", instance_id, check_path_component(instance_id))
    shared = read_endpoints(sec)  # #14.1: the deployment's endpoints, one validator
    endpoints = DriverSettings(
        instance_id=instance_id,
        aeron_dir=sec.opt_str("aeron_dir", "", env=True),
        embedded_media_driver=sec.opt_bool("embedded_media_driver", True, env=True),
        **shared,
        announce_channel=read_channel(sec, "announce_channel", shared["control_channel"]),
        announce_stream_id=read_aeron_stream_id(
            sec, "announce_stream_id", shared["control_stream_id"]
        ),
        stream_id_range=sec.opt_range("stream_id_range", lo=1, hi=_MAX_STREAM_ID, env=True),
        descriptor_stream_id_range=sec.opt_range(
            "descriptor_stream_id_range", lo=1, hi=MAX_AERON_STREAM_ID, env=True
        ),
        control_stream_id_range=sec.opt_range(
            "control_stream_id_range", lo=1, hi=MAX_AERON_STREAM_ID, env=True
        ),
        metrics_bind=sec.opt_str("metrics_bind", "", env=True),
    )
    sec.checked("metrics_bind", endpoints.metrics_bind, check_bind(endpoints.metrics_bind))
    if endpoints.aeron_dir and not os.path.isabs(endpoints.aeron_dir):
        sec.checked("aeron_dir", endpoints.aeron_dir, "must be an absolute path (or empty)")
    if endpoints.aeron_dir:  # #13.1: a media driver empties its directory
        sec.checked("aeron_dir", endpoints.aeron_dir, unsafe_root_reason(endpoints.aeron_dir))
    sec.finish()
    return endpoints


def _check_abs_dir(sec: Section, key: str, value: str) -> str:
    if not value.startswith("/"):
        return sec.checked(key, value, f"{value!r} must be an absolute path")
    if any(c in value for c in "?|") or any(c.isspace() for c in value):
        return sec.checked(
            key, value, f"{value!r} must not contain '?', '|' or whitespace (shm:file URI rules)"
        )
    return posixpath.normpath(value)


def _parse_shm(sec: Section) -> ShmConfig:
    base_dir = _check_abs_dir(sec, "base_dir", sec.opt_str("base_dir", DEFAULT_BASE_DIR, env=True))
    sec.checked("base_dir", base_dir, unsafe_root_reason(base_dir))  # #13.1
    namespace = sec.opt_str("namespace", DEFAULT_NAMESPACE, env=True)
    sec.checked("namespace", namespace, check_path_component(namespace))
    page_size = sec.opt_int(
        "page_size_bytes",
        DEFAULT_PAGE_SIZE,
        lo=1,
        env=True,
        check=lambda v: None if is_power_of_two(v) else f"{v} is not a power of two",
    )
    mode_text = sec.opt_str("permissions_mode", DEFAULT_PERMISSIONS, env=True)
    mode = parse_octal_mode(mode_text)
    if mode is None:
        sec.checked(
            "permissions_mode",
            mode_text,
            f'{mode_text!r} is not an octal POSIX mode such as "660" or "0600"',
        )
    allow_world_writable = sec.opt_bool("allow_world_writable", False, env=True)
    if mode is not None:
        sec.checked(
            "permissions_mode",
            mode_text,
            world_writable_reason(mode, allow_world_writable, "shm.allow_world_writable"),
        )
    allowed = sec.opt_str_list("allowed_base_dirs", (), env=True)
    allowed_dirs = tuple(_check_abs_dir(sec, "allowed_base_dirs", d) for d in allowed) or (
        base_dir,
    )
    if not any(base_dir == d or base_dir.startswith(d.rstrip("/") + "/") for d in allowed_dirs):
        sec.checked(
            "allowed_base_dirs",
            "",
            f"shm.base_dir {base_dir!r} is not inside any allowed base dir; clients would "
            "reject every region the driver announces",
        )
    cfg = ShmConfig(
        base_dir=base_dir,
        namespace=namespace,
        require_hugepages=sec.opt_bool("require_hugepages", False, env=True),
        page_size_bytes=page_size,
        permissions_mode=mode if mode is not None else 0,
        allowed_base_dirs=allowed_dirs,
        allow_world_writable=allow_world_writable,
    )
    sec.finish()
    return cfg


def _parse_policies(sec: Section, profiles: Mapping[str, ProfileConfig]) -> PoliciesConfig:
    announce_ms = sec.opt_int("announce_period_ms", DEFAULT_ANNOUNCE_PERIOD_MS, lo=1, env=True)
    default_profile = sec.opt_str("default_profile", "", env=True)
    if not default_profile:
        default_profile = next(iter(profiles))
    elif default_profile not in profiles:
        sec.checked(
            "default_profile",
            default_profile,
            f"profile {default_profile!r} is not defined (known: {', '.join(profiles)})",
        )
    shutdown_token = sec.opt_str("shutdown_token", "", env=True)
    if not shutdown_token.isascii():
        sec.checked("shutdown_token", shutdown_token, "must be ASCII (it is sent as varAscii)")
    cfg = PoliciesConfig(
        allow_dynamic_streams=sec.opt_bool("allow_dynamic_streams", False, env=True),
        default_profile=default_profile,
        announce_period_ms=announce_ms,
        lease_keepalive_interval_ms=sec.opt_int(
            "lease_keepalive_interval_ms", DEFAULT_KEEPALIVE_INTERVAL_MS, lo=1, env=True
        ),
        lease_expiry_grace_intervals=sec.opt_int(
            "lease_expiry_grace_intervals", DEFAULT_EXPIRY_GRACE_INTERVALS, lo=1, env=True
        ),
        prefault_shm=sec.opt_bool("prefault_shm", True, env=True),
        reuse_existing_shm=sec.opt_bool("reuse_existing_shm", False, env=True),
        mlock_shm=sec.opt_bool("mlock_shm", False, env=True),
        cleanup_shm_on_exit=sec.opt_bool("cleanup_shm_on_exit", False, env=True),
        epoch_gc_enabled=sec.opt_bool("epoch_gc_enabled", True, env=True),
        epoch_gc_keep=sec.opt_int("epoch_gc_keep", DEFAULT_EPOCH_GC_KEEP, lo=1, env=True),
        epoch_gc_min_age_ns=sec.opt_int(
            "epoch_gc_min_age_ns", 3 * announce_ms * _MS, lo=0, hi=UINT64_MAX, env=True
        ),
        epoch_gc_on_startup=sec.opt_bool("epoch_gc_on_startup", False, env=True),
        shutdown_timeout_ms=sec.opt_int(
            "shutdown_timeout_ms", DEFAULT_SHUTDOWN_TIMEOUT_MS, lo=0, env=True
        ),
        shutdown_token=shutdown_token,
        max_dynamic_streams=sec.opt_int(
            "max_dynamic_streams", DEFAULT_MAX_DYNAMIC_STREAMS, lo=0, env=True
        ),
        max_dynamic_streams_per_client=sec.opt_int(
            "max_dynamic_streams_per_client",
            DEFAULT_MAX_DYNAMIC_STREAMS_PER_CLIENT,
            lo=0,
            env=True,
        ),
        dynamic_stream_idle_reclaim_ms=sec.opt_int(
            "dynamic_stream_idle_reclaim_ms", DEFAULT_DYNAMIC_STREAM_IDLE_RECLAIM_MS, lo=0, env=True
        ),
        reserve_shm_for_configured_streams=sec.opt_bool(
            "reserve_shm_for_configured_streams", True, env=True
        ),
    )
    sec.finish()
    return cfg


def _parse_profiles(sec: Section, page_size: int) -> dict[str, ProfileConfig]:
    profiles: dict[str, ProfileConfig] = {}
    for name, psec in sec.tables():
        nslots = psec.opt_int(
            "header_nslots",
            DEFAULT_HEADER_NSLOTS,
            lo=1,
            hi=MAX_NSLOTS,  # u32 on the wire, a power of two (#13.4)
            check=lambda v: None if is_power_of_two(v) else f"{v} is not a power of two",
        )
        psec.opt_int(
            "header_slot_bytes",
            HEADER_SLOT_BYTES,
            check=lambda v: (
                None
                if v == HEADER_SLOT_BYTES
                else f"must be {HEADER_SLOT_BYTES} (fixed by the Wire Specification)"
            ),
        )
        pool_secs = psec.array_of_tables("payload_pools", required=True)
        if not pool_secs:
            psec.fail("payload_pools", "must contain at least one pool")
        pools: list[PoolConfig] = []
        seen: set[int] = set()
        for pool_sec in pool_secs:
            pool_id = pool_sec.req_int("pool_id", hi=UINT16_MAX)
            if pool_id in seen:
                pool_sec.fail("pool_id", f"pool_id {pool_id} is used twice in profile {name!r}")
            seen.add(pool_id)
            stride = pool_sec.req_int(
                "stride_bytes",
                lo=1,
                hi=MAX_STRIDE_BYTES,  # u32 on the wire, a power of two (#13.4)
                check=lambda v: _stride_problem(v, page_size),
            )
            pool_nslots = pool_sec.opt_int("nslots", nslots)
            if pool_nslots != nslots:
                pool_sec.fail(
                    "nslots",
                    f"must equal header_nslots ({nslots}): pools share the header's slot index",
                )
            pool_sec.finish()
            pools.append(PoolConfig(pool_id, stride))
        psec.finish()
        profiles[name] = ProfileConfig(name=name, header_nslots=nslots, payload_pools=tuple(pools))
    sec.finish()
    if not profiles:
        raise ConfigError(sec.file, "profiles", "at least one [profiles.<name>] table is required")
    return profiles


def _stride_problem(stride: int, page_size: int) -> str | None:
    if not is_power_of_two(stride):
        return f"{stride} is not a power of two"
    if stride % page_size:
        return f"{stride} is not a multiple of shm.page_size_bytes ({page_size})"
    return None


def _parse_streams(
    sec: Section, profiles: Mapping[str, ProfileConfig]
) -> tuple[ProvisionedStream, ...]:
    streams: list[ProvisionedStream] = []
    by_id: dict[int, str] = {}
    for name, ssec in sec.tables():
        stream_id = ssec.req_int("stream_id", lo=1, hi=_MAX_STREAM_ID)
        if stream_id in by_id:
            ssec.fail(
                "stream_id", f"stream_id {stream_id} is also used by streams.{by_id[stream_id]}"
            )
        by_id[stream_id] = name
        profile = ssec.req_str("profile")
        if profile not in profiles:
            ssec.fail("profile", f"profile {profile!r} is not defined")
        ssec.finish()
        streams.append(ProvisionedStream(name=name, stream_id=stream_id, profile=profile))
    sec.finish()
    return tuple(streams)


def _check_stream_ids(
    driver: DriverSettings,
    streams: tuple[ProvisionedStream, ...],
    driver_sec: Section,
) -> None:
    """Driver Model §11: ranges are well-formed and overlap nothing else."""
    named = [
        ("stream_id_range", driver.stream_id_range),
        ("descriptor_stream_id_range", driver.descriptor_stream_id_range),
        ("control_stream_id_range", driver.control_stream_id_range),
    ]
    ranges = [(k, r) for k, r in named if r is not None]
    for i, (key_a, a) in enumerate(ranges):
        for key_b, b in ranges[i + 1 :]:
            if ranges_overlap(a, b):
                driver_sec.checked(key_b, "", f"range {b} overlaps driver.{key_a} ({a})")
    reserved = {
        "control_stream_id": driver.control_stream_id,
        "announce_stream_id": driver.announce_stream_id,
        "qos_stream_id": driver.qos_stream_id,
        "descriptor_stream_id": driver.descriptor_stream_id,
        "metadata_stream_id": driver.metadata_stream_id,
    }
    for key, rng in ranges:
        for id_key, value in reserved.items():
            if value in rng:
                driver_sec.checked(key, "", f"range {rng} contains driver.{id_key} ({value})")
        for stream in streams:
            if stream.stream_id in rng:
                driver_sec.checked(
                    key,
                    "",
                    f"range {rng} contains streams.{stream.name}.stream_id ({stream.stream_id})",
                )
