"""Rate limiter configuration (RateLimiter Spec v1.0 §8).

A TOML file becomes one frozen, validated :class:`RateLimiterConfig`:

``[rate_limiter]`` (the spec's keys)
    required ``instance_id``, ``descriptor_channel``, ``descriptor_stream_id`` (where the
    destination ``FrameDescriptor``s go); optional ``forward_metadata`` (true),
    ``forward_progress`` (false), ``forward_qos`` (false), ``max_rate_hz`` (0 = unlimited),
    ``control_channel`` / ``qos_channel`` (``aeron:ipc?term-length=16m``) and the four
    forwarding stream ids ``source_control_stream_id``, ``dest_control_stream_id``,
    ``source_qos_stream_id``, ``dest_qos_stream_id`` (0 = disabled). One tensorpool
    extension: ``hold`` (how the pending frame is kept, see :mod:`tensorpool.ratelimiter`).
``[[mappings]]`` (at least one)
    ``source_stream_id``, ``dest_stream_id``, ``profile``; optional ``max_rate_hz``
    (default: ``rate_limiter.max_rate_hz``) and ``metadata_stream_id`` (default:
    ``dest_stream_id``).
``[driver]``, ``[shm]``, ``[policies]`` (tensorpool extensions, all optional)
    how to reach the SHM driver the rate limiter attaches through: a subset of the driver's
    own config keys with the *same names*, so one environment (``DRIVER_AERON_DIR``,
    ``SHM_BASE_DIR``, ``POLICIES_LEASE_KEEPALIVE_INTERVAL_MS``, ...) configures both.
    ``driver.config`` may name the driver's TOML file; the rate limiter then checks at load
    time that each mapping's ``profile`` exists there and is the profile the destination
    stream will really get (the attach request carries no profile, Driver Model §4.2). The
    driver's file is read by a loader the caller passes (``load_driver``; the
    ``tensorpool ratelimiter`` command passes the driver's own): agents do not import each
    other (docs/architecture.md, #14.1), so this package never imports ``tensorpool.driver``.

Fail-fast rules (§8): forwarding progress with a zero ``source_control_stream_id`` or
``dest_control_stream_id``, or QoS with a zero ``source_qos_stream_id`` or
``dest_qos_stream_id``, is a :class:`ConfigError` naming the key — checked in
``RateLimiterConfig.__post_init__`` so no construction path can start forwarding with a zero
id. Streams must not form loops: a destination (or metadata) stream id may not be any
mapping's source, two mappings may not share a destination, and a source appears once (one
policy per instance; run another instance for another consumer).

Every scalar key of ``[rate_limiter]``, ``[driver]``, ``[shm]`` and ``[policies]`` can be
overridden from the environment (:mod:`tensorpool.config_schema`), e.g.
``RATE_LIMITER_MAX_RATE_HZ=10`` or ``TENSORPOOL_RATE_LIMITER_MAX_RATE_HZ=10``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

from tensorpool import config_schema as cs
from tensorpool.config_schema import ConfigError
from tensorpool.endpoints import (
    DEFAULT_SHM_BASE_DIR,
    IPC_DESCRIPTORS,
    MAX_AERON_STREAM_ID,
    config_aeron_dir,
)
from tensorpool.transport.config import TransportConfig

__all__ = [
    "DEFAULT_FORWARD_CHANNEL",
    "HOLD_MODES",
    "ConfigError",
    "DriverAccess",
    "MappingConfig",
    "RateLimiterConfig",
    "load_ratelimiter_config",
    "parse_ratelimiter_config",
    "pool_fit_problem",
]

#: §8 default of ``rate_limiter.control_channel`` and ``rate_limiter.qos_channel``.
DEFAULT_FORWARD_CHANNEL: Final = IPC_DESCRIPTORS
#: How the pending frame is held until its rate slot opens (tensorpool extension).
HOLD_MODES: Final = ("auto", "descriptor", "copy")

_MS = 1_000_000
#: A forwarding stream id: 0 = disabled.
_ForwardId = Annotated[int, cs.int_in(0, MAX_AERON_STREAM_ID)]


@dataclass(frozen=True, slots=True)
class MappingConfig:
    """One source -> destination mapping (§8)."""

    source_stream_id: int
    dest_stream_id: int
    profile: str
    max_rate_hz: int = 0
    """Fallback rate (Hz, 0 = unlimited) while no destination consumer asked for one."""
    metadata_stream_id: int = 0
    """``stream_id`` written into forwarded metadata; 0 means ``dest_stream_id``."""

    def __post_init__(self) -> None:
        if self.metadata_stream_id == 0:
            object.__setattr__(self, "metadata_stream_id", self.dest_stream_id)


@cs.table
class _DriverTable(cs.EndpointKeys):
    """``[driver]``: the shared endpoints and ``aeron_dir``, and the driver's own file."""

    config: cs.Str = ""
    """The driver's TOML file, for profile checks ("" = not checked)."""


@cs.table
class _ShmTable(cs.Table):
    """``[shm]``: the driver's keys of the same names."""

    base_dir: cs.ShmDir = DEFAULT_SHM_BASE_DIR
    allowed_base_dirs: tuple[cs.AbsDir, ...] = ()


@cs.table
class _PoliciesTable(cs.Table):
    """``[policies]``: the driver's keys of the same names."""

    announce_period_ms: cs.Positive = 1000
    lease_keepalive_interval_ms: cs.Positive = 1000


@cs.table
class DriverAccess(_DriverTable):
    """How this process reaches the SHM driver: the ``[driver]``, ``[shm]`` and ``[policies]``
    tables in one value."""

    shm_base_dir: cs.ShmDir = DEFAULT_SHM_BASE_DIR
    allowed_base_dirs: tuple[cs.AbsDir, ...] = ()
    announce_period_ms: cs.Positive = 1000
    lease_keepalive_interval_ms: cs.Positive = 1000

    def transport_config(self, client_name: str) -> TransportConfig:
        """How to join the media driver: ``aeron_dir``, "" meaning the tensorpool default."""
        return TransportConfig(aeron_dir=config_aeron_dir(self.aeron_dir), client_name=client_name)


def _check_topology(mappings: tuple[MappingConfig, ...]) -> None:
    """No loops, one producer per destination, one mapping per source."""
    sources: dict[int, int] = {}
    dests: dict[int, int] = {}
    for i, m in enumerate(mappings):
        key = f"mappings[{i}]"
        if m.source_stream_id == m.dest_stream_id:
            raise cs.FieldProblem(f"{key}.dest_stream_id", "must differ from source_stream_id (§3)")
        if m.source_stream_id in sources:
            raise cs.FieldProblem(
                f"{key}.source_stream_id",
                f"stream {m.source_stream_id} is already the source of "
                f"mappings[{sources[m.source_stream_id]}]; one rate policy per instance — run "
                "another rate limiter for another consumer (§4)",
            )
        sources[m.source_stream_id] = i
        if m.dest_stream_id in dests:
            raise cs.FieldProblem(
                f"{key}.dest_stream_id",
                f"stream {m.dest_stream_id} is already the destination of "
                f"mappings[{dests[m.dest_stream_id]}] (a stream has one producer, §3)",
            )
        dests[m.dest_stream_id] = i
    for i, m in enumerate(mappings):
        for attr in ("dest_stream_id", "metadata_stream_id"):
            sid = getattr(m, attr)
            if sid in sources:
                raise cs.FieldProblem(
                    f"mappings[{i}].{attr}",
                    f"stream {sid} is the source of mappings[{sources[sid]}]: the rate limiter "
                    "never publishes on a source stream (§3)",
                )


# --------------------------------------------------------------------------- loading


def _hold(value: str) -> str | None:
    return None if value in HOLD_MODES else f"{value!r} is not one of {', '.join(HOLD_MODES)}"


@cs.table
class _RateLimiterTable(cs.Table):
    """``[rate_limiter]`` (§8)."""

    instance_id: cs.NonEmpty
    descriptor_channel: cs.Channel
    descriptor_stream_id: cs.AeronStreamId
    forward_metadata: cs.Bool = True
    forward_progress: cs.Bool = False
    forward_qos: cs.Bool = False
    max_rate_hz: cs.NonNegative = 0
    control_channel: cs.Channel = DEFAULT_FORWARD_CHANNEL
    source_control_stream_id: _ForwardId = 0
    dest_control_stream_id: _ForwardId = 0
    qos_channel: cs.Channel = DEFAULT_FORWARD_CHANNEL
    source_qos_stream_id: _ForwardId = 0
    dest_qos_stream_id: _ForwardId = 0
    hold: Annotated[str, cs.Rule(_hold)] = "auto"
    metrics_bind: cs.Bind = ""

    def __post_init__(self) -> None:
        # §8: forwarding with a zero stream id MUST fail fast (and so never start).
        zero_rules = (
            ("forward_progress", "source_control_stream_id", "dest_control_stream_id"),
            ("forward_qos", "source_qos_stream_id", "dest_qos_stream_id"),
        )
        for flag, *keys in zero_rules:
            for key in keys:
                if getattr(self, flag) and getattr(self, key) == 0:
                    raise cs.FieldProblem(
                        key,
                        f"must be nonzero when rate_limiter.{flag} = true "
                        "(forwarding does not start with a zero stream id)",
                    )


@cs.table
class RateLimiterConfig(_RateLimiterTable):
    """The whole validated rate limiter configuration: ``[rate_limiter]``, the mappings, how
    to reach the SHM driver, and the file it came from (for messages)."""

    mappings: tuple[MappingConfig, ...] = ()
    driver: DriverAccess = field(default_factory=DriverAccess)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        _RateLimiterTable.__post_init__(self)
        if not self.mappings:
            raise cs.FieldProblem("mappings", "at least one mapping is required")
        _check_topology(self.mappings)


@cs.table
class _MappingTable(cs.Table):
    """``[[mappings]]`` (§8); unset ``max_rate_hz`` inherits ``rate_limiter.max_rate_hz``."""

    source_stream_id: cs.DataStreamId
    dest_stream_id: cs.DataStreamId
    profile: Annotated[str, cs.Rule(lambda v: None if v.strip() else "must name a driver profile")]
    max_rate_hz: cs.NonNegative | None = None
    metadata_stream_id: cs.DataStreamId | None = None


@cs.table
class _RateLimiterFile(cs.Table):
    rate_limiter: _RateLimiterTable
    mappings: tuple[_MappingTable, ...]
    driver: _DriverTable = field(default_factory=_DriverTable)
    shm: _ShmTable = field(default_factory=_ShmTable)
    policies: _PoliciesTable = field(default_factory=_PoliciesTable)

    def __post_init__(self) -> None:
        if not self.mappings:
            raise cs.FieldProblem("mappings", "at least one [[mappings]] entry is required")


#: Reads the SHM driver's TOML file (``tensorpool.driver.config.load_driver_config``): takes the
#: path, returns the driver config, raises ``ConfigError``.
DriverConfigLoader = Callable[[str], Any]


def load_ratelimiter_config(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    *,
    load_driver: DriverConfigLoader | None = None,
) -> RateLimiterConfig:
    """Load and validate a rate limiter TOML file (``env`` defaults to ``os.environ``).

    With ``load_driver``, mappings are also checked against the file ``driver.config`` names.
    """
    return cs.load_file(path, parse_ratelimiter_config, env, load_driver=load_driver)


def parse_ratelimiter_config(
    data: Mapping[str, Any],
    *,
    source: str = "<memory>",
    env: Mapping[str, str] | None = None,
    load_driver: DriverConfigLoader | None = None,
) -> RateLimiterConfig:
    """Validate an already-parsed TOML document.

    ``load_driver`` reads the driver's config for the ``driver.config`` profile checks; without
    it those checks are skipped (the command always passes one).
    """
    f = cs.parse_file(_RateLimiterFile, data, source, env)
    rl = f.rate_limiter
    cfg = cs.build(
        RateLimiterConfig,
        source,
        **cs.fields_of(rl),
        mappings=tuple(
            MappingConfig(
                m.source_stream_id,
                m.dest_stream_id,
                m.profile,
                rl.max_rate_hz if m.max_rate_hz is None else m.max_rate_hz,
                m.metadata_stream_id or 0,
            )
            for m in f.mappings
        ),
        driver=DriverAccess(
            **cs.fields_of(f.driver),
            shm_base_dir=f.shm.base_dir,
            allowed_base_dirs=f.shm.allowed_base_dirs,
            announce_period_ms=f.policies.announce_period_ms,
            lease_keepalive_interval_ms=f.policies.lease_keepalive_interval_ms,
        ),
        source=source,
    )
    if cfg.driver.config and load_driver is not None:
        _check_profiles(cfg, load_driver)
    return cfg


def _check_profiles(cfg: RateLimiterConfig, load_driver_config: DriverConfigLoader) -> None:
    """With ``driver.config``: each mapping's profile must be what its destination gets.

    A statically provisioned destination has its stream's profile; any other destination is
    created on attach (EXISTING_OR_CREATE) from ``policies.default_profile`` — if dynamic
    streams are allowed at all.
    """
    try:
        dcfg = load_driver_config(cfg.driver.config)
    except ConfigError as exc:
        raise ConfigError(cfg.source, "driver.config", f"driver config is invalid: {exc}") from None
    for i, m in enumerate(cfg.mappings):
        key = f"mappings[{i}].profile"
        if m.profile not in dcfg.profiles:
            raise ConfigError(
                cfg.source,
                key,
                f"profile {m.profile!r} is not defined in {cfg.driver.config} "
                f"(known: {', '.join(dcfg.profiles)})",
            )
        static = dcfg.stream_by_id(m.dest_stream_id)
        if static is not None:
            actual = static.profile
        elif dcfg.policies.allow_dynamic_streams:
            rng = dcfg.driver.stream_id_range
            if rng is None or m.dest_stream_id not in rng:
                # The driver would hand out another id, which the attach then refuses.
                raise ConfigError(
                    cfg.source,
                    f"mappings[{i}].dest_stream_id",
                    f"stream {m.dest_stream_id} is neither provisioned in {cfg.driver.config} "
                    f"nor inside its driver.stream_id_range ({rng or 'unset'})",
                )
            actual = dcfg.policies.default_profile
        else:
            raise ConfigError(
                cfg.source,
                f"mappings[{i}].dest_stream_id",
                f"stream {m.dest_stream_id} is not provisioned in {cfg.driver.config} and "
                "dynamic streams are disabled there",
            )
        if actual != m.profile:
            raise ConfigError(
                cfg.source,
                key,
                f"destination stream {m.dest_stream_id} gets profile {actual!r} from "
                f"{cfg.driver.config}, not {m.profile!r}",
            )
        source_profile = _source_profile(dcfg, m.source_stream_id)
        if source_profile is not None:
            src_max = max(p.stride_bytes for p in dcfg.profiles[source_profile].payload_pools)
            dst_max = max(p.stride_bytes for p in dcfg.profiles[m.profile].payload_pools)
            problem = pool_fit_problem(m, src_max, dst_max, f"profile {source_profile!r}")
            if problem:
                raise ConfigError(cfg.source, key, problem)


def _source_profile(dcfg: Any, stream_id: int) -> str | None:
    """The profile the driver gives ``stream_id`` (None: not knowable from its config)."""
    static = dcfg.stream_by_id(stream_id)
    if static is not None:
        return str(static.profile)
    rng = dcfg.driver.stream_id_range
    if dcfg.policies.allow_dynamic_streams and rng is not None and stream_id in rng:
        return str(dcfg.policies.default_profile)
    return None


def pool_fit_problem(m: MappingConfig, src_max: int, dst_max: int, source_what: str) -> str:
    """Why the destination cannot hold the source's frames ('' if it can), naming the sizes.

    #13.7: a destination whose largest pool is smaller than the source's drops every larger
    frame as ``no_pool_fits``, silently, forever. Frame sizes are not known before frames
    flow, so the rule compares what each stream's pools can carry: the destination must
    hold every frame the source can carry. It is applied at ``--check`` (with
    ``driver.config``, from the profiles there) and at start (from the source's announce and
    the destination's attach, whatever ``driver.config`` says).
    """
    if dst_max >= src_max:
        return ""
    return (
        f"destination stream {m.dest_stream_id} (profile {m.profile!r}) holds frames up to "
        f"{dst_max} bytes, but source stream {m.source_stream_id} ({source_what}) carries "
        f"frames up to {src_max} bytes: larger frames would all be dropped as no_pool_fits; "
        "give the destination a profile with a pool of at least that stride"
    )
