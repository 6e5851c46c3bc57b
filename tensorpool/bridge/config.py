"""Bridge configuration (Bridge Spec v1.0 §10, §4, §7.1, §9, §2.3).

A TOML file with these tables becomes a frozen, validated :class:`BridgeConfig`:

``[bridge]``
    the spec's surface: ``instance_id``, ``payload_channel``/``payload_stream_id``,
    ``control_channel``/``control_stream_id`` (required); ``mtu_bytes``,
    ``chunk_bytes``, ``max_chunk_bytes`` (65535), ``max_payload_bytes`` (2^30),
    ``dest_stream_id_range``, ``forward_metadata`` (true), ``metadata_channel``,
    ``metadata_stream_id``, ``source_metadata_stream_id``, ``forward_qos`` (false),
    ``forward_progress`` (false), ``assembly_timeout_ms`` (250).
``[[mappings]]``
    ``source_stream_id``, ``dest_stream_id`` (0 = allocate from the range),
    ``profile``, ``metadata_stream_id`` (default ``dest_stream_id``),
    ``source_control_stream_id`` and ``dest_control_stream_id`` (0 = disabled).

tensorpool extensions (the spec allows extra keys), all optional:

* ``mappings[].role`` / ``bridge.role``: ``"sender"``, ``"receiver"`` or ``"both"``.
  One file cannot tell which host it runs on, and running every mapping in both
  directions on both hosts is exactly the feedback loop §2.3 warns about, so each
  mapping must get a role, per mapping or through ``bridge.role``.
* ``bridge.receive_payload_channel``, ``bridge.receive_control_channel``,
  ``bridge.receive_metadata_channel``: the channels receiver mappings subscribe to
  (default: the sending ones). A unicast endpoint names the *receiving* host, so a
  process with mappings in both directions (§2.3) listens on a different endpoint than
  it sends to.
* ``[local]``: how the bridge reaches its own host — media driver directory, the SHM
  driver (``driver_mode``) or standalone regions, base directories and the local
  control/descriptor/QoS/metadata streams (Wire Spec §15.11 defaults).
* ``[profiles.<name>]``: ``header_nslots`` and ``payload_pools``; used by receiver
  mappings in standalone mode (``local.driver_mode = false``), where the bridge
  creates the destination regions itself. In driver mode the SHM driver's own
  configuration decides the destination geometry and ``profile`` is informative.

Fail-fast rules (each a :class:`~tensorpool.config_util.ConfigError` naming the file
and key): ``forward_metadata = true`` written explicitly without ``metadata_channel``
(left at its default it merely disables forwarding, §7.1), metadata forwarding without
``metadata_stream_id``; progress or QoS forwarding with a mapping whose control stream
ids are zero (§9); ``dest_stream_id = 0`` without a range; a range overlapping any
control, metadata, QoS, descriptor, payload or statically configured stream id, or too
small for the mappings that need it (§4); duplicate or feedback-prone mappings (§2.3).

Loading has no side effects; environment overrides follow
:mod:`tensorpool.config_util` (``BRIDGE_INSTANCE_ID``, ``LOCAL_AERON_DIR``, … or the
``TENSORPOOL_``-prefixed spelling).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from tensorpool.client.settings import SEC, ClientSettings
from tensorpool.config_util import (
    UINT16_MAX,
    ConfigError,
    EnvOverrides,
    IdRange,
    Section,
    check_bind,
    check_path_component,
    is_power_of_two,
    load_toml,
)
from tensorpool.endpoints import (
    DEFAULT_METADATA_STREAM_ID,
    DEFAULT_NAMESPACE,
    MAX_AERON_STREAM_ID,
    MAX_DATA_STREAM_ID,
    Endpoints,
    channel_problem,
    config_aeron_dir,
    default_shm_base_dir,
    read_endpoints,
)
from tensorpool.fsafety import unsafe_root_reason
from tensorpool.shm.layout import PoolConfig
from tensorpool.transport.channels import ChannelError, channel_mtu
from tensorpool.transport.config import TransportConfig

__all__ = [
    "CHUNK_MESSAGE_OVERHEAD",
    "DEFAULT_ASSEMBLY_TIMEOUT_MS",
    "DEFAULT_MAX_CHUNK_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MTU_BYTES",
    "MTU_HEADROOM_BYTES",
    "BridgeConfig",
    "BridgeMapping",
    "BridgeSettings",
    "ConfigError",
    "LocalSettings",
    "MappingRole",
    "ProfileSpec",
    "effective_chunk_bytes",
    "load_bridge_config",
    "parse_bridge_config",
]

#: Aeron's default channel MTU: ``bridge.mtu_bytes`` when neither the key nor the
#: payload channel's ``mtu=`` parameter says otherwise (§10 "Default: Aeron channel MTU").
DEFAULT_MTU_BYTES: Final = 1408
#: §5.2: chunks default to ``MTU - 128`` to leave room for Aeron and IP/UDP headers.
MTU_HEADROOM_BYTES: Final = 128
DEFAULT_MAX_CHUNK_BYTES: Final = 65535
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1 << 30
DEFAULT_ASSEMBLY_TIMEOUT_MS: Final = 250
#: Bytes of a ``BridgeFrameChunk`` that are not payload when ``headerIncluded`` is FALSE:
#: 8-byte message header, 41-byte block, two 4-byte varData length prefixes.
CHUNK_MESSAGE_OVERHEAD: Final = 8 + 41 + 4 + 4
#: Aeron data frame header; a message fits one UDP datagram if it is <= mtu - 32.
_AERON_DATA_HEADER: Final = 32
_SCHEMA_MAX_PAYLOAD: Final = 1 << 30  # payloadLength maxValue in the bridge schema
_MAX_AERON_ID: Final = MAX_AERON_STREAM_ID  # Aeron stream ids are int32
_MAX_DATA_ID: Final = MAX_DATA_STREAM_ID  # wire stream ids: uint32, 0xFFFFFFFF is null


class MappingRole(enum.StrEnum):
    """Which half of a mapping this process runs (tensorpool extension, see module notes)."""

    SENDER = "sender"
    RECEIVER = "receiver"
    BOTH = "both"

    @property
    def sends(self) -> bool:
        return self is not MappingRole.RECEIVER

    @property
    def receives(self) -> bool:
        return self is not MappingRole.SENDER


def effective_chunk_bytes(mtu_bytes: int, chunk_bytes: int, max_chunk_bytes: int) -> int:
    """§10: ``min(chunk_bytes, mtu_bytes - 128)`` (``mtu_bytes - 128`` when chunk_bytes is
    0/unset), never above ``max_chunk_bytes``: the size every chunk but the last has, and the
    largest ``chunkLength`` a receiver accepts (§5.2)."""
    base = mtu_bytes - MTU_HEADROOM_BYTES
    size = min(chunk_bytes, base) if chunk_bytes > 0 else base
    return min(size, max_chunk_bytes)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """Destination geometry for standalone receivers (``[profiles.<name>]``)."""

    name: str
    header_nslots: int
    pools: tuple[PoolConfig, ...]


@dataclass(frozen=True, slots=True)
class BridgeMapping:
    """One bridged stream; ``dest_stream_id``/``metadata_stream_id`` are already resolved.

    On the wire every message of a mapping carries ``source_stream_id`` (chunks, forwarded
    announces, metadata, progress); the receiver rewrites it to the destination ids. That
    is the only choice compatible with ``dest_stream_id = 0``: the destination id is
    allocated on the receiving host, which the sender cannot know.
    """

    index: int
    source_stream_id: int
    dest_stream_id: int
    profile: str
    metadata_stream_id: int
    source_control_stream_id: int
    dest_control_stream_id: int
    role: MappingRole
    dest_allocated: bool = False
    """True when ``dest_stream_id`` came from ``bridge.dest_stream_id_range``; such a
    mapping may be remapped to another free id when the destination already has a
    producer (§4); a static one fails instead."""

    @property
    def name(self) -> str:
        return f"{self.source_stream_id}->{self.dest_stream_id}"


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    """``[bridge]`` after defaults and validation."""

    instance_id: str
    payload_channel: str
    payload_stream_id: int
    control_channel: str
    control_stream_id: int
    receive_payload_channel: str
    receive_control_channel: str
    receive_metadata_channel: str
    mtu_bytes: int = DEFAULT_MTU_BYTES
    chunk_bytes: int = 0
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    dest_stream_id_range: IdRange | None = None
    forward_metadata: bool = True
    metadata_channel: str = ""
    metadata_stream_id: int = 0
    source_metadata_stream_id: int = DEFAULT_METADATA_STREAM_ID
    forward_qos: bool = False
    forward_progress: bool = False
    assembly_timeout_ms: int = DEFAULT_ASSEMBLY_TIMEOUT_MS
    #: ``HOST:PORT`` of the Prometheus endpoint, "" = off (#19.1; ``--metrics-bind`` overrides)
    metrics_bind: str = ""

    @property
    def chunk_size(self) -> int:
        """Effective chunk size (§10) — also the receiver's ``chunkLength`` bound (§5.2)."""
        return effective_chunk_bytes(self.mtu_bytes, self.chunk_bytes, self.max_chunk_bytes)

    @property
    def assembly_timeout_ns(self) -> int:
        return self.assembly_timeout_ms * 1_000_000

    @property
    def metadata_enabled(self) -> bool:
        """§7.1: forwarding runs only with a channel and a stream id."""
        return self.forward_metadata and bool(self.metadata_channel) and self.metadata_stream_id > 0


@dataclass(frozen=True, slots=True)
class LocalSettings:
    """``[local]``: this host's media driver, SHM driver and local streams."""

    aeron_dir: str | None = ""
    """None = embedded media driver (IPC then only reaches this process); "" = the tensorpool
    default directory, as in every config (:func:`~tensorpool.endpoints.config_aeron_dir`);
    else the directory of the host's media driver."""
    driver_mode: bool = True
    shm_base_dir: str = field(default_factory=default_shm_base_dir)
    namespace: str = DEFAULT_NAMESPACE
    allowed_base_dirs: tuple[str, ...] = ()
    channels: Endpoints = field(default_factory=Endpoints)
    """The local control-plane endpoints (#14.1: the same type and defaults as every client)."""
    announce_period_ms: int = 1000
    attach_timeout_ms: int = 5000

    def client_settings(self) -> ClientSettings:
        """The settings the bridge's local consumers and producers use."""
        return ClientSettings(
            transport=TransportConfig(
                aeron_dir=None if self.aeron_dir is None else config_aeron_dir(self.aeron_dir)
            ),
            channels=self.channels,
            shm_base_dir=self.shm_base_dir,
            namespace=self.namespace,
            allowed_base_dirs=self.allowed_base_dirs,
            announce_period_ns=self.announce_period_ms * 1_000_000,
            qos_period_ns=SEC,
        )


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    bridge: BridgeSettings
    local: LocalSettings
    mappings: tuple[BridgeMapping, ...]
    profiles: Mapping[str, ProfileSpec]
    source: str = "<memory>"
    reserved_stream_ids: frozenset[int] = frozenset()
    """Every stream id the configuration uses; a runtime remap of an allocated destination
    (§4: the first choice already has a producer) skips these."""
    warnings: tuple[str, ...] = ()
    """Suspicious but legal settings (e.g. chunks that will be fragmented); the command
    logs them at start-up."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))

    @property
    def sender_mappings(self) -> tuple[BridgeMapping, ...]:
        return tuple(m for m in self.mappings if m.role.sends)

    @property
    def receiver_mappings(self) -> tuple[BridgeMapping, ...]:
        return tuple(m for m in self.mappings if m.role.receives)


# --------------------------------------------------------------------------- loading


def load_bridge_config(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> BridgeConfig:
    """Load and validate a bridge TOML file (``env`` defaults to ``os.environ``)."""
    file = os.fspath(path)
    data = load_toml(file)
    return parse_bridge_config(data, source=file, env=os.environ if env is None else env)


def parse_bridge_config(
    data: Mapping[str, Any], *, source: str = "<memory>", env: Mapping[str, str] | None = None
) -> BridgeConfig:
    """Validate an already-parsed TOML document."""
    root = Section(data, "", source, EnvOverrides(env))
    bridge_sec = root.opt_table("bridge")
    local_sec = root.opt_table("local")
    profiles_sec = root.opt_table("profiles")
    mapping_secs = root.array_of_tables("mappings", required=True)
    root.finish()
    if not mapping_secs:
        root.fail("mappings", "at least one [[mappings]] entry is required")

    warnings: list[str] = []
    bridge, default_role = _parse_bridge(bridge_sec, warnings)
    local = _parse_local(local_sec)
    profiles = _parse_profiles(profiles_sec)
    raw = [_parse_mapping(sec, i, default_role, bridge) for i, sec in enumerate(mapping_secs)]
    reserved: dict[int, str] = {}
    mappings = _resolve_mappings(raw, mapping_secs, bridge, local, profiles, bridge_sec, reserved)
    return BridgeConfig(
        bridge=bridge,
        local=local,
        mappings=mappings,
        profiles=profiles,
        source=source,
        reserved_stream_ids=frozenset(reserved),
        warnings=tuple(warnings),
    )


def _stream_id(sec: Section, key: str, default: int | None = None, *, lo: int = 1) -> int:
    """An Aeron stream id of the ``[bridge]`` table (0 allowed where ``lo=0``: disabled)."""
    if default is None:
        return sec.req_int(key, lo=lo, hi=_MAX_AERON_ID, env=True)
    return sec.opt_int(key, default, lo=lo, hi=_MAX_AERON_ID, env=True)


def _channel(sec: Section, key: str, default: str | None = None) -> str:
    """A channel URI; ``""`` stays empty (disabled) where that is the default."""
    value = sec.req_str(key, env=True) if default is None else sec.opt_str(key, default, env=True)
    if value == "" and default == "":
        return value
    return sec.checked(key, value, channel_problem(value))


def _parse_bridge(sec: Section, warnings: list[str]) -> tuple[BridgeSettings, MappingRole | None]:
    instance_id = sec.req_str("instance_id", env=True)
    if not instance_id.strip():
        sec.fail("instance_id", "must not be empty")
    payload_channel = _channel(sec, "payload_channel")
    payload_stream_id = _stream_id(sec, "payload_stream_id")
    control_channel = _channel(sec, "control_channel")
    control_stream_id = _stream_id(sec, "control_stream_id")
    metadata_channel = _channel(sec, "metadata_channel", "")
    receive_payload = _channel(sec, "receive_payload_channel", payload_channel)
    receive_control = _channel(sec, "receive_control_channel", control_channel)
    receive_metadata = _channel(sec, "receive_metadata_channel", metadata_channel)

    try:
        channel_mtu_value = channel_mtu(payload_channel)
    except ChannelError as exc:
        sec.fail("payload_channel", str(exc))
    mtu_default = channel_mtu_value if channel_mtu_value is not None else DEFAULT_MTU_BYTES
    mtu_bytes = sec.opt_int("mtu_bytes", mtu_default, lo=MTU_HEADROOM_BYTES + 1, hi=65535, env=True)
    chunk_bytes = sec.opt_int("chunk_bytes", 0, lo=0, hi=UINT16_MAX, env=True)
    max_chunk_bytes = sec.opt_int(
        "max_chunk_bytes", DEFAULT_MAX_CHUNK_BYTES, lo=1, hi=UINT16_MAX, env=True
    )
    max_payload_bytes = sec.opt_int(
        "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES, lo=1, hi=_SCHEMA_MAX_PAYLOAD, env=True
    )
    dest_range = sec.opt_range("dest_stream_id_range", lo=1, hi=_MAX_DATA_ID, env=True)
    explicit_forward_metadata = sec.has("forward_metadata")
    forward_metadata = sec.opt_bool("forward_metadata", True, env=True)
    metadata_stream_id = _stream_id(sec, "metadata_stream_id", 0, lo=0)
    source_metadata_stream_id = _stream_id(
        sec, "source_metadata_stream_id", DEFAULT_METADATA_STREAM_ID
    )
    forward_qos = sec.opt_bool("forward_qos", False, env=True)
    forward_progress = sec.opt_bool("forward_progress", False, env=True)
    timeout_ms = sec.opt_int(
        "assembly_timeout_ms", DEFAULT_ASSEMBLY_TIMEOUT_MS, lo=1, hi=3_600_000, env=True
    )
    role_text = sec.opt_str("role", "", env=True)
    default_role = _role(sec, "role", role_text) if role_text else None
    metrics_bind = sec.opt_str("metrics_bind", "", env=True)
    sec.checked("metrics_bind", metrics_bind, check_bind(metrics_bind))
    sec.finish()

    if forward_metadata and not metadata_channel:
        if explicit_forward_metadata:
            sec.fail(
                "forward_metadata",
                "metadata forwarding is enabled but bridge.metadata_channel is not set "
                "(set it, or forward_metadata = false) (§7.1)",
            )
        warnings.append("metadata forwarding disabled: bridge.metadata_channel is not set (§7.1)")
    if forward_metadata and metadata_channel and metadata_stream_id == 0:
        sec.fail(
            "metadata_stream_id",
            "metadata forwarding needs a nonzero bridge.metadata_stream_id (§7.1)",
        )
    if metadata_channel and metadata_stream_id:
        clash = {payload_stream_id: "payload", control_stream_id: "control"}
        if metadata_stream_id in clash and metadata_channel in (payload_channel, control_channel):
            sec.fail(
                "metadata_stream_id",
                f"{metadata_stream_id} is also the bridge "
                f"{clash[metadata_stream_id]}_stream_id on the same channel",
            )
    if payload_stream_id == control_stream_id and payload_channel == control_channel:
        sec.fail("control_stream_id", "payload and control share one channel and stream id")

    settings = BridgeSettings(
        instance_id=instance_id,
        payload_channel=payload_channel,
        payload_stream_id=payload_stream_id,
        control_channel=control_channel,
        control_stream_id=control_stream_id,
        receive_payload_channel=receive_payload,
        receive_control_channel=receive_control,
        receive_metadata_channel=receive_metadata,
        mtu_bytes=mtu_bytes,
        chunk_bytes=chunk_bytes,
        max_chunk_bytes=max_chunk_bytes,
        max_payload_bytes=max_payload_bytes,
        dest_stream_id_range=dest_range,
        forward_metadata=forward_metadata and bool(metadata_channel),
        metadata_channel=metadata_channel,
        metadata_stream_id=metadata_stream_id,
        source_metadata_stream_id=source_metadata_stream_id,
        forward_qos=forward_qos,
        forward_progress=forward_progress,
        assembly_timeout_ms=timeout_ms,
        metrics_bind=metrics_bind,
    )
    chunk = settings.chunk_size
    if chunk < 1:
        sec.fail("mtu_bytes", f"effective chunk size is {chunk} bytes")
    needed = chunk + CHUNK_MESSAGE_OVERHEAD + _AERON_DATA_HEADER
    if channel_mtu_value is not None and needed > channel_mtu_value:
        sec.fail(
            "chunk_bytes",
            f"a {chunk}-byte chunk needs a {needed}-byte Aeron frame but payload_channel has "
            f"mtu={channel_mtu_value}: lower chunk_bytes/mtu_bytes or raise the channel mtu "
            "(§5.2: chunks should fit the MTU)",
        )
    if channel_mtu_value is None and needed > DEFAULT_MTU_BYTES:
        warnings.append(
            f"{chunk}-byte chunks exceed Aeron's default MTU ({DEFAULT_MTU_BYTES}) and will be "
            f"fragmented: add mtu=... (>= {needed}, a multiple of 32) to payload_channel"
        )
    return settings, default_role


def _role(sec: Section, key: str, text: str) -> MappingRole:
    try:
        return MappingRole(text)
    except ValueError:
        sec.fail(key, f"{text!r} is not one of 'sender', 'receiver', 'both'")


def _parse_local(sec: Section) -> LocalSettings:
    embedded = sec.opt_bool("embedded_media_driver", False, env=True)
    aeron_dir: str | None = sec.opt_str("aeron_dir", "", env=True)
    if embedded:
        aeron_dir = None
    elif aeron_dir:  # #13.1: never a system or shared root
        sec.checked("aeron_dir", aeron_dir, unsafe_root_reason(aeron_dir))
    base = sec.opt_str("shm_base_dir", default_shm_base_dir(), env=True)
    if not os.path.isabs(base):
        sec.fail("shm_base_dir", f"must be an absolute path, got {base!r}")
    sec.checked("shm_base_dir", base, unsafe_root_reason(base))
    namespace = sec.opt_str("namespace", DEFAULT_NAMESPACE, env=True)
    sec.checked("namespace", namespace, check_path_component(namespace))
    allowed = sec.opt_str_list("allowed_base_dirs", (), env=True)
    for d in allowed:
        if not os.path.isabs(d):
            sec.fail("allowed_base_dirs", f"{d!r} is not an absolute path")
    channels = Endpoints(**read_endpoints(sec))  # #14.1: one type, defaults and validator
    local = LocalSettings(
        aeron_dir=aeron_dir,
        driver_mode=sec.opt_bool("driver_mode", True, env=True),
        shm_base_dir=base,
        namespace=namespace,
        allowed_base_dirs=tuple(allowed),
        channels=channels,
        announce_period_ms=sec.opt_int("announce_period_ms", 1000, lo=1, hi=3_600_000, env=True),
        attach_timeout_ms=sec.opt_int("attach_timeout_ms", 5000, lo=1, hi=600_000, env=True),
    )
    sec.finish()
    return local


def _parse_profiles(sec: Section) -> dict[str, ProfileSpec]:
    profiles: dict[str, ProfileSpec] = {}
    for name, psec in sec.tables():
        nslots = psec.opt_int("header_nslots", 64, lo=1, hi=1 << 24)
        if not is_power_of_two(nslots):
            psec.fail("header_nslots", f"{nslots} is not a power of two")
        pools: list[PoolConfig] = []
        seen: set[int] = set()
        for pool_sec in psec.array_of_tables("payload_pools", required=True):
            pool_id = pool_sec.req_int("pool_id", lo=1, hi=UINT16_MAX)
            stride = pool_sec.req_int("stride_bytes", lo=1, hi=_SCHEMA_MAX_PAYLOAD)
            if not is_power_of_two(stride) or stride < 4096:
                pool_sec.fail("stride_bytes", f"{stride} must be a power of two >= 4096")
            if pool_id in seen:
                pool_sec.fail("pool_id", f"duplicate pool_id {pool_id}")
            seen.add(pool_id)
            pool_sec.finish()
            pools.append(PoolConfig(pool_id, stride))
        if not pools:
            psec.fail("payload_pools", "a profile needs at least one payload pool")
        psec.finish()
        profiles[name] = ProfileSpec(name, nslots, tuple(pools))
    return profiles


@dataclass(slots=True)
class _RawMapping:
    source_stream_id: int
    dest_stream_id: int
    profile: str
    metadata_stream_id: int
    source_control_stream_id: int
    dest_control_stream_id: int
    role: MappingRole


def _parse_mapping(
    sec: Section, index: int, default_role: MappingRole | None, bridge: BridgeSettings
) -> _RawMapping:
    source = sec.req_int("source_stream_id", lo=1, hi=_MAX_DATA_ID)
    dest = sec.opt_int("dest_stream_id", 0, lo=0, hi=_MAX_DATA_ID)
    profile = sec.req_str("profile")
    if not profile.strip():
        sec.fail("profile", "must not be empty")
    meta = sec.opt_int("metadata_stream_id", 0, lo=0, hi=_MAX_DATA_ID)
    src_ctl = sec.opt_int("source_control_stream_id", 0, lo=0, hi=_MAX_AERON_ID)
    dst_ctl = sec.opt_int("dest_control_stream_id", 0, lo=0, hi=_MAX_AERON_ID)
    role_text = sec.opt_str("role", "")
    if role_text:
        role = _role(sec, "role", role_text)
    elif default_role is not None:
        role = default_role
    else:
        sec.fail(
            "role",
            "required (or set bridge.role): 'sender' on the host that owns the source stream, "
            "'receiver' on the destination host (§2.3)",
        )
    sec.finish()
    if (bridge.forward_progress or bridge.forward_qos) and (src_ctl == 0 or dst_ctl == 0):
        what = "forward_progress" if bridge.forward_progress else "forward_qos"
        sec.fail(
            "source_control_stream_id" if src_ctl == 0 else "dest_control_stream_id",
            f"bridge.{what} = true needs nonzero source_control_stream_id and "
            "dest_control_stream_id for every mapping (§9)",
        )
    return _RawMapping(source, dest, profile, meta, src_ctl, dst_ctl, role)


def _resolve_mappings(
    raw: list[_RawMapping],
    secs: list[Section],
    bridge: BridgeSettings,
    local: LocalSettings,
    profiles: Mapping[str, ProfileSpec],
    bridge_sec: Section,
    reserved: dict[int, str],
) -> tuple[BridgeMapping, ...]:
    ch = local.channels
    # Stream ids that a dynamically allocated destination must never take (§4, §10).
    reserved.update(
        {
            ch.control_stream_id: "local.control_stream_id",
            ch.descriptor_stream_id: "local.descriptor_stream_id",
            ch.qos_stream_id: "local.qos_stream_id",
            ch.metadata_stream_id: "local.metadata_stream_id",
            bridge.payload_stream_id: "bridge.payload_stream_id",
            bridge.control_stream_id: "bridge.control_stream_id",
            bridge.source_metadata_stream_id: "bridge.source_metadata_stream_id",
        }
    )
    if bridge.metadata_stream_id:
        reserved[bridge.metadata_stream_id] = "bridge.metadata_stream_id"
    for i, m in enumerate(raw):
        where = f"mappings[{i}]"
        reserved.setdefault(m.source_stream_id, f"{where}.source_stream_id")
        for key in ("dest_stream_id", "metadata_stream_id"):
            value = getattr(m, key)
            if value:
                reserved.setdefault(value, f"{where}.{key}")
        for key in ("source_control_stream_id", "dest_control_stream_id"):
            value = getattr(m, key)
            if value:
                reserved.setdefault(value, f"{where}.{key}")

    id_range = bridge.dest_stream_id_range
    if id_range is not None:
        for sid, owner in sorted(reserved.items()):
            if sid in id_range:
                bridge_sec.fail(
                    "dest_stream_id_range",
                    f"range {id_range} overlaps {owner} = {sid}; a bridge range must not "
                    "overlap control, metadata, QoS or statically configured stream ids (§4)",
                )

    seen_source: dict[tuple[int, bool], int] = {}
    seen_dest: dict[int, int] = {}
    free = iter(id_range) if id_range is not None else iter(())
    out: list[BridgeMapping] = []
    for i, (m, sec) in enumerate(zip(raw, secs, strict=True)):
        allocated = False
        dest = m.dest_stream_id
        if dest == 0 and m.role.receives:
            if id_range is None:
                sec.fail(
                    "dest_stream_id",
                    "0 (or unset) means 'allocate', which needs bridge.dest_stream_id_range (§4)",
                )
            dest = next((sid for sid in free if sid not in reserved), 0)
            if dest == 0:
                bridge_sec.fail(
                    "dest_stream_id_range",
                    f"range {id_range} has no free id left for mappings[{i}]",
                )
            reserved[dest] = f"mappings[{i}].dest_stream_id"
            allocated = True
        if m.role.receives:
            if dest == m.source_stream_id and m.role is MappingRole.BOTH:
                sec.fail("dest_stream_id", "a mapping in both roles cannot write its own source")
            if dest in seen_dest:
                sec.fail(
                    "dest_stream_id",
                    f"{dest} is already the destination of mappings[{seen_dest[dest]}]: "
                    "a stream has one exclusive producer (§4)",
                )
            seen_dest[dest] = i
            if not local.driver_mode and m.profile not in profiles:
                sec.fail(
                    "profile",
                    f"no [profiles.{m.profile}] table: standalone receivers "
                    "(local.driver_mode = false) create the destination from it",
                )
        for receiving in (False, True):
            if m.role.receives if receiving else m.role.sends:
                key = (m.source_stream_id, receiving)
                if key in seen_source:
                    sec.fail(
                        "source_stream_id",
                        f"{m.source_stream_id} is already "
                        f"{'received' if receiving else 'sent'} by mappings[{seen_source[key]}]"
                        ": chunks are identified by their source stream id",
                    )
                seen_source[key] = i
        meta = m.metadata_stream_id or dest
        out.append(
            BridgeMapping(
                index=i,
                source_stream_id=m.source_stream_id,
                dest_stream_id=dest,
                profile=m.profile,
                metadata_stream_id=meta,
                source_control_stream_id=m.source_control_stream_id,
                dest_control_stream_id=m.dest_control_stream_id,
                role=m.role,
                dest_allocated=allocated,
            )
        )
    _check_feedback(out, secs)
    return tuple(out)


def _check_feedback(mappings: list[BridgeMapping], secs: list[Section]) -> None:
    """§2.3: one process receiving into a stream it also sends from would loop frames."""
    sent = {m.source_stream_id: m.index for m in mappings if m.role.sends}
    for m in mappings:
        if m.role.receives and m.dest_stream_id in sent:
            other = sent[m.dest_stream_id]
            secs[m.index].fail(
                "dest_stream_id",
                f"{m.dest_stream_id} is written by this mapping and sent by mappings[{other}] "
                "in the same process: a feedback loop (§2.3)",
            )
