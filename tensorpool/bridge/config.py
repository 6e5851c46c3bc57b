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
:mod:`tensorpool.config_schema` (``BRIDGE_INSTANCE_ID``, ``LOCAL_AERON_DIR``, … or the
``TENSORPOOL_``-prefixed spelling).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Final, NoReturn

from tensorpool import config_schema as cs
from tensorpool.client.settings import SEC, ClientSettings
from tensorpool.config_schema import ConfigError
from tensorpool.config_util import UINT16_MAX, check_aeron_channel
from tensorpool.endpoints import (
    DEFAULT_METADATA_STREAM_ID,
    DEFAULT_NAMESPACE,
    MAX_AERON_STREAM_ID,
    MAX_DATA_STREAM_ID,
    Endpoints,
    config_aeron_dir,
    default_shm_base_dir,
)
from tensorpool.shm.profiles import HeaderSlots, ProfileConfig, ProfileTable
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
    "ProfileConfig",
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


def _role(value: str) -> str | None:
    if value in ("", *MappingRole):
        return None
    return f"{value!r} is not one of 'sender', 'receiver', 'both'"


def _optional_channel(value: str) -> str | None:
    return None if value == "" else check_aeron_channel(value)


#: A ``role`` key ("" = not set here).
_Role = Annotated[str, cs.Rule(_role)]
#: A stream id where 0 means "disabled" or "not set".
_AeronIdOr0 = Annotated[int, cs.int_in(0, MAX_AERON_STREAM_ID)]
_DataIdOr0 = Annotated[int, cs.int_in(0, MAX_DATA_STREAM_ID)]


@cs.table
class BridgeSettings(cs.Table):
    """``[bridge]`` (§10); unset ``receive_*`` channels are the sending ones, an unset
    ``mtu_bytes`` is the payload channel's ``mtu=`` or Aeron's default."""

    instance_id: cs.NonEmpty
    payload_channel: cs.Channel
    payload_stream_id: cs.AeronStreamId
    control_channel: cs.Channel
    control_stream_id: cs.AeronStreamId
    receive_payload_channel: cs.Channel | None = None
    receive_control_channel: cs.Channel | None = None
    receive_metadata_channel: Annotated[str, cs.Rule(_optional_channel)] | None = None
    mtu_bytes: Annotated[int, cs.int_in(MTU_HEADROOM_BYTES + 1, 65535)] | None = None
    chunk_bytes: Annotated[int, cs.int_in(0, UINT16_MAX)] = 0
    max_chunk_bytes: Annotated[int, cs.int_in(1, UINT16_MAX)] = DEFAULT_MAX_CHUNK_BYTES
    max_payload_bytes: Annotated[int, cs.int_in(1, _SCHEMA_MAX_PAYLOAD)] = DEFAULT_MAX_PAYLOAD_BYTES
    dest_stream_id_range: Annotated[cs.IdRange | None, cs.id_range(1, MAX_DATA_STREAM_ID)] = None
    forward_metadata: cs.Bool | None = None
    """None (unset): forward when ``metadata_channel`` is set; true without it is an error."""
    metadata_channel: Annotated[str, cs.Rule(_optional_channel)] = ""
    metadata_stream_id: _AeronIdOr0 = 0
    source_metadata_stream_id: cs.AeronStreamId = DEFAULT_METADATA_STREAM_ID
    forward_qos: cs.Bool = False
    forward_progress: cs.Bool = False
    assembly_timeout_ms: Annotated[int, cs.int_in(1, 3_600_000)] = DEFAULT_ASSEMBLY_TIMEOUT_MS
    role: _Role = ""
    """The role of mappings that do not name their own ("" = each mapping must)."""
    #: ``HOST:PORT`` of the Prometheus endpoint, "" = off (#19.1; ``--metrics-bind`` overrides)
    metrics_bind: cs.Bind = ""

    def __post_init__(self) -> None:
        for name in ("payload", "control", "metadata"):
            if getattr(self, f"receive_{name}_channel") is None:
                cs.resolve(self, **{f"receive_{name}_channel": getattr(self, f"{name}_channel")})
        try:
            channel_mtu_value = channel_mtu(self.payload_channel)
        except ChannelError as exc:
            raise cs.FieldProblem("payload_channel", str(exc)) from None
        if self.mtu_bytes is None:
            cs.resolve(self, mtu_bytes=channel_mtu_value or DEFAULT_MTU_BYTES)
        if self.forward_metadata and not self.metadata_channel:
            raise cs.FieldProblem(
                "forward_metadata",
                "metadata forwarding is enabled but bridge.metadata_channel is not set "
                "(set it, or forward_metadata = false) (§7.1)",
            )
        if self.forward_metadata is not False and self.metadata_channel:  # noqa: SIM102
            if self.metadata_stream_id == 0:
                raise cs.FieldProblem(
                    "metadata_stream_id",
                    "metadata forwarding needs a nonzero bridge.metadata_stream_id (§7.1)",
                )
        if self.metadata_channel and self.metadata_stream_id:
            clash = {self.payload_stream_id: "payload", self.control_stream_id: "control"}
            same = self.metadata_channel in (self.payload_channel, self.control_channel)
            if self.metadata_stream_id in clash and same:
                raise cs.FieldProblem(
                    "metadata_stream_id",
                    f"{self.metadata_stream_id} is also the bridge "
                    f"{clash[self.metadata_stream_id]}_stream_id on the same channel",
                )
        if (self.payload_stream_id, self.payload_channel) == (
            self.control_stream_id,
            self.control_channel,
        ):
            raise cs.FieldProblem(
                "control_stream_id", "payload and control share one channel and stream id"
            )
        chunk = self.chunk_size
        if chunk < 1:
            raise cs.FieldProblem("mtu_bytes", f"effective chunk size is {chunk} bytes")
        needed = chunk + CHUNK_MESSAGE_OVERHEAD + _AERON_DATA_HEADER
        if channel_mtu_value is not None and needed > channel_mtu_value:
            raise cs.FieldProblem(
                "chunk_bytes",
                f"a {chunk}-byte chunk needs a {needed}-byte Aeron frame but payload_channel has "
                f"mtu={channel_mtu_value}: lower chunk_bytes/mtu_bytes or raise the channel mtu "
                "(§5.2: chunks should fit the MTU)",
            )

    @property
    def chunk_size(self) -> int:
        """Effective chunk size (§10) — also the receiver's ``chunkLength`` bound (§5.2)."""
        assert self.mtu_bytes is not None  # resolved in __post_init__
        return effective_chunk_bytes(self.mtu_bytes, self.chunk_bytes, self.max_chunk_bytes)

    @property
    def assembly_timeout_ns(self) -> int:
        return self.assembly_timeout_ms * 1_000_000

    @property
    def metadata_enabled(self) -> bool:
        """§7.1: forwarding runs only with a channel and a stream id."""
        return (
            self.forward_metadata is not False
            and bool(self.metadata_channel)
            and self.metadata_stream_id > 0
        )

    def warnings(self) -> list[str]:
        """Suspicious but legal settings, for the command to log at start-up."""
        out = []
        if self.forward_metadata is None and not self.metadata_channel:
            out.append("metadata forwarding disabled: bridge.metadata_channel is not set (§7.1)")
        needed = self.chunk_size + CHUNK_MESSAGE_OVERHEAD + _AERON_DATA_HEADER
        if channel_mtu(self.payload_channel) is None and needed > DEFAULT_MTU_BYTES:
            out.append(
                f"{self.chunk_size}-byte chunks exceed Aeron's default MTU ({DEFAULT_MTU_BYTES}) "
                f"and will be fragmented: add mtu=... (>= {needed}, a multiple of 32) to "
                "payload_channel"
            )
        return out


@cs.table
class LocalSettings(cs.EndpointKeys):
    """``[local]``: this host's media driver, SHM driver and local streams; the endpoints and
    ``aeron_dir`` are the shared :class:`~tensorpool.config_schema.EndpointKeys`."""

    embedded_media_driver: cs.Bool = False
    """True: a private embedded media driver (IPC then only reaches this process)."""
    driver_mode: cs.Bool = True
    shm_base_dir: cs.ShmDir = field(default_factory=default_shm_base_dir)
    namespace: cs.PathName = DEFAULT_NAMESPACE
    allowed_base_dirs: tuple[cs.AbsDir, ...] = ()
    announce_period_ms: Annotated[int, cs.int_in(1, 3_600_000)] = 1000
    attach_timeout_ms: Annotated[int, cs.int_in(1, 600_000)] = 5000

    @property
    def channels(self) -> Endpoints:
        """The local control-plane endpoints (#14.1: the same type as every client's)."""
        return self.endpoints

    def client_settings(self) -> ClientSettings:
        """The settings the bridge's local consumers and producers use."""
        aeron_dir = None if self.embedded_media_driver else config_aeron_dir(self.aeron_dir)
        return ClientSettings(
            transport=TransportConfig(aeron_dir=aeron_dir),
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
    profiles: Mapping[str, ProfileConfig]
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


@cs.table
class _Profile(ProfileTable):
    """``[profiles.<name>]`` of standalone receivers (64 header slots unless set)."""

    header_nslots: HeaderSlots = 64


@cs.table
class _MappingTable(cs.Table):
    """``[[mappings]]`` as written (§10); 0 ids mean "allocate" / "disabled"."""

    source_stream_id: cs.DataStreamId
    profile: cs.NonEmpty
    dest_stream_id: _DataIdOr0 = 0
    metadata_stream_id: _DataIdOr0 = 0
    source_control_stream_id: _AeronIdOr0 = 0
    dest_control_stream_id: _AeronIdOr0 = 0
    role: _Role = ""


@cs.table
class _BridgeFile(cs.Table):
    bridge: BridgeSettings
    mappings: tuple[_MappingTable, ...]
    local: LocalSettings = field(default_factory=LocalSettings)
    profiles: dict[str, _Profile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.mappings:
            raise cs.FieldProblem("mappings", "at least one [[mappings]] entry is required")
        for i, m in enumerate(self.mappings):
            if not (m.role or self.bridge.role):
                raise cs.FieldProblem(
                    f"mappings[{i}].role",
                    "required (or set bridge.role): 'sender' on the host that owns the source "
                    "stream, 'receiver' on the destination host (§2.3)",
                )
            b = self.bridge
            if (b.forward_progress or b.forward_qos) and 0 in (
                m.source_control_stream_id,
                m.dest_control_stream_id,
            ):
                what = "forward_progress" if b.forward_progress else "forward_qos"
                key = "source" if m.source_control_stream_id == 0 else "dest"
                raise cs.FieldProblem(
                    f"mappings[{i}].{key}_control_stream_id",
                    f"bridge.{what} = true needs nonzero source_control_stream_id and "
                    "dest_control_stream_id for every mapping (§9)",
                )
        for name, profile in self.profiles.items():
            for i, pool in enumerate(profile.payload_pools):
                if pool.stride_bytes < 4096:
                    raise cs.FieldProblem(
                        f"profiles.{name}.payload_pools[{i}].stride_bytes",
                        f"{pool.stride_bytes} must be a power of two >= 4096",
                    )


def load_bridge_config(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> BridgeConfig:
    """Load and validate a bridge TOML file (``env`` defaults to ``os.environ``)."""
    return cs.load_file(path, parse_bridge_config, env)


def parse_bridge_config(
    data: Mapping[str, Any], *, source: str = "<memory>", env: Mapping[str, str] | None = None
) -> BridgeConfig:
    """Validate an already-parsed TOML document."""
    f = cs.parse_file(_BridgeFile, data, source, env)
    profiles = {name: p.profile(name) for name, p in f.profiles.items()}
    reserved: dict[int, str] = {}
    mappings = _resolve_mappings(f, profiles, reserved, source)
    return BridgeConfig(
        bridge=f.bridge,
        local=f.local,
        mappings=mappings,
        profiles=profiles,
        source=source,
        reserved_stream_ids=frozenset(reserved),
        warnings=tuple(f.bridge.warnings()),
    )


def _resolve_mappings(
    f: _BridgeFile, profiles: Mapping[str, ProfileConfig], reserved: dict[int, str], source: str
) -> tuple[BridgeMapping, ...]:
    """Allocate destinations from the range and apply the rules that span mappings (§4, §2.3)."""

    def fail(key: str, reason: str) -> NoReturn:
        raise ConfigError(source, key, reason)

    bridge, local, raw = f.bridge, f.local, f.mappings
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
                fail(
                    "bridge.dest_stream_id_range",
                    f"range {id_range} overlaps {owner} = {sid}; a bridge range must not "
                    "overlap control, metadata, QoS or statically configured stream ids (§4)",
                )

    seen_source: dict[tuple[int, bool], int] = {}
    seen_dest: dict[int, int] = {}
    free = iter(id_range) if id_range is not None else iter(())
    out: list[BridgeMapping] = []
    for i, m in enumerate(raw):
        role = MappingRole(m.role or bridge.role)
        where = f"mappings[{i}]"
        allocated = False
        dest = m.dest_stream_id
        if dest == 0 and role.receives:
            if id_range is None:
                fail(
                    f"{where}.dest_stream_id",
                    "0 (or unset) means 'allocate', which needs bridge.dest_stream_id_range (§4)",
                )
            dest = next((sid for sid in free if sid not in reserved), 0)
            if dest == 0:
                fail(
                    "bridge.dest_stream_id_range",
                    f"range {id_range} has no free id left for mappings[{i}]",
                )
            reserved[dest] = f"mappings[{i}].dest_stream_id"
            allocated = True
        if role.receives:
            if dest == m.source_stream_id and role is MappingRole.BOTH:
                fail(
                    f"{where}.dest_stream_id", "a mapping in both roles cannot write its own source"
                )
            if dest in seen_dest:
                fail(
                    f"{where}.dest_stream_id",
                    f"{dest} is already the destination of mappings[{seen_dest[dest]}]: "
                    "a stream has one exclusive producer (§4)",
                )
            seen_dest[dest] = i
            if not local.driver_mode and m.profile not in profiles:
                fail(
                    f"{where}.profile",
                    f"no [profiles.{m.profile}] table: standalone receivers "
                    "(local.driver_mode = false) create the destination from it",
                )
        for receiving in (False, True):
            if role.receives if receiving else role.sends:
                key = (m.source_stream_id, receiving)
                if key in seen_source:
                    fail(
                        f"{where}.source_stream_id",
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
                role=role,
                dest_allocated=allocated,
            )
        )
    _check_feedback(out, source)
    return tuple(out)


def _check_feedback(mappings: list[BridgeMapping], source: str) -> None:
    """§2.3: one process receiving into a stream it also sends from would loop frames."""
    sent = {m.source_stream_id: m.index for m in mappings if m.role.sends}
    for m in mappings:
        if m.role.receives and m.dest_stream_id in sent:
            other = sent[m.dest_stream_id]
            raise ConfigError(
                source,
                f"mappings[{m.index}].dest_stream_id",
                f"{m.dest_stream_id} is written by this mapping and sent by mappings[{other}] "
                "in the same process: a feedback loop (§2.3)",
            )
