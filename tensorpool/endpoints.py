"""How every tensorpool process reaches the control plane: one type, one set of defaults.

Issue #14.1: "how to reach the control plane" used to be declared six times (client
``Channels``, ``ClientSettings``, the driver's and the rate limiter's ``DriverEndpoints``, the
bridge's ``[local]`` table and the Spark ``Connection``), and the copies drifted apart: the
driver's descriptor channel defaulted to a 4 MiB term where everything else used 16 MiB, the
namespace default was ``default`` in one place and ``tensorpool`` in another, and data stream ids
were bounded by uint32-1 in two configs and int32 in two others. Now:

* :class:`Endpoints` is the four (channel, stream id) pairs every process of a deployment must
  agree on: control (announces, SHM-driver requests), descriptors, QoS and metadata. The client
  settings, the driver's ``[driver]`` table, the rate limiter's and bridge's view of the local
  driver and the Spark options all embed it, so they share its defaults and its validator.
* :func:`channel_problem` / :func:`aeron_stream_id_problem` are the one validator. The fields
  carry it as their type (``Channel``, ``AeronStreamId``), so the TOML configs, whose tables
  extend this class (:class:`~tensorpool.config_schema.EndpointKeys`), report a bad value as a
  :class:`~tensorpool.config_util.ConfigError` naming the file and key (environment overrides
  included), and Python callers get a ``ValueError`` naming the field.
* the deployment defaults (namespace, SHM base directory, media-driver directory) live here too,
  so no agent config imports them from ``tensorpool.client``.

Defaults follow the stream-id guidance of Wire Spec §15.11 (control 1000, descriptors 1100,
QoS 1200, metadata 1300, all on Aeron IPC). Term lengths are explicit because Aeron's IPC
default is 64 MiB per publication: control traffic is tiny (4 MiB), while the descriptor log
holds ~170k 44-byte descriptors per 16 MiB, far more than any ring, so a lagging consumer resyncs
long before it back-pressures the producer.

Two different kinds of stream id exist and have different bounds:

* an *Aeron* stream id (the four endpoints above, the bridge's payload stream, the rate
  limiter's forwarding streams) is an ``int32``; tensorpool uses 1..2^31-1;
* a *data* stream id (the tensorpool stream a producer writes, ``stream_id`` in every wire
  message) is a ``uint32`` whose value 0xFFFFFFFF is the SBE null value: 1..2^32-2.

Nothing here touches Aeron, files or the environment except the two ``default_*_dir``
functions, which look at the host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Final

from tensorpool.config_util import (
    INT32_MAX,
    UINT32_MAX,
    AeronStreamId,
    Channel,
    check_aeron_channel,
)

__all__ = [
    "DEFAULT_CONTROL_STREAM_ID",
    "DEFAULT_DESCRIPTOR_STREAM_ID",
    "DEFAULT_METADATA_STREAM_ID",
    "DEFAULT_NAMESPACE",
    "DEFAULT_QOS_STREAM_ID",
    "DEFAULT_SHM_BASE_DIR",
    "ENDPOINT_NAMES",
    "IPC_CONTROL",
    "IPC_DESCRIPTORS",
    "MAX_AERON_STREAM_ID",
    "MAX_DATA_STREAM_ID",
    "Endpoints",
    "aeron_stream_id_problem",
    "channel_problem",
    "config_aeron_dir",
    "data_stream_id_problem",
    "default_aeron_dir",
    "default_shm_base_dir",
]

IPC_CONTROL: Final = "aeron:ipc?term-length=4m"
IPC_DESCRIPTORS: Final = "aeron:ipc?term-length=16m"
DEFAULT_CONTROL_STREAM_ID: Final = 1000
DEFAULT_DESCRIPTOR_STREAM_ID: Final = 1100
DEFAULT_QOS_STREAM_ID: Final = 1200
DEFAULT_METADATA_STREAM_ID: Final = 1300

#: Aeron stream ids are int32; tensorpool uses the positive ones.
MAX_AERON_STREAM_ID: Final = INT32_MAX
#: Data stream ids are uint32 on the wire; 0xFFFFFFFF is the SBE null value.
MAX_DATA_STREAM_ID: Final = UINT32_MAX - 1

#: The namespace directory under the SHM base dir (the reference configuration's value); the
#: driver, standalone producers, the bridge and ``inspect`` all default to it.
DEFAULT_NAMESPACE: Final = "default"
#: One base directory for every component, so a client attached to a driver accepts the
#: driver's paths without flags. Override per deployment.
DEFAULT_SHM_BASE_DIR: Final = "/dev/shm/tensorpool"

#: The four endpoints, in the order the configs list them; key ``<name>_channel`` and
#: ``<name>_stream_id`` in every TOML table and CLI option that sets one.
ENDPOINT_NAMES: Final = ("control", "descriptor", "qos", "metadata")


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


def config_aeron_dir(value: str) -> str:
    """The media driver directory a config's ``aeron_dir`` names: ``value``, or when it is empty
    :func:`default_aeron_dir`.

    #14.1: ``aeron_dir = ""`` has one meaning in every TOML config -- the driver's and the rate
    limiter's ``[driver]``, the bridge's ``[local]`` (and Spark's blank ``aeronDir``): the
    tensorpool default, where ``tensorpool mediadriver``, an embedded ``tensorpool driver`` and
    the client commands serve and look. Aeron's own library default (``/dev/shm/aeron-<user>``,
    where a stock ``aeronmd`` listens) is reached by naming it.
    """
    return value or default_aeron_dir()


# --------------------------------------------------------------------------- the validator


def channel_problem(value: object) -> str | None:
    """Why ``value`` is not an ``aeron:ipc``/``aeron:udp`` channel URI (None if it is)."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    return check_aeron_channel(value)


def _int_problem(value: object, hi: int, what: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {type(value).__name__}"
    if not 1 <= value <= hi:
        return f"{what} {value} must be in 1..{hi}"
    return None


def aeron_stream_id_problem(value: object) -> str | None:
    """Why ``value`` is not a usable Aeron stream id (1..2^31-1), or None."""
    return _int_problem(value, MAX_AERON_STREAM_ID, "Aeron stream id")


def data_stream_id_problem(value: object) -> str | None:
    """Why ``value`` is not a usable tensorpool data stream id (1..2^32-2), or None."""
    return _int_problem(value, MAX_DATA_STREAM_ID, "stream id")


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The control-plane endpoints every process of one deployment must agree on.

    Embedded (by composition or as a base class) in ``ClientSettings``, the driver's
    ``[driver]`` table, the rate limiter's and the bridge's local-driver settings and the Spark
    options; construct it directly in Python code. Invalid values raise ``ValueError`` naming
    the field.
    """

    control_channel: Channel = IPC_CONTROL
    control_stream_id: AeronStreamId = DEFAULT_CONTROL_STREAM_ID
    descriptor_channel: Channel = IPC_DESCRIPTORS
    descriptor_stream_id: AeronStreamId = DEFAULT_DESCRIPTOR_STREAM_ID
    qos_channel: Channel = IPC_CONTROL
    qos_stream_id: AeronStreamId = DEFAULT_QOS_STREAM_ID
    metadata_channel: Channel = IPC_CONTROL
    metadata_stream_id: AeronStreamId = DEFAULT_METADATA_STREAM_ID

    def __post_init__(self) -> None:
        check_endpoints(self)

    @property
    def endpoints(self) -> Endpoints:
        """Just the four endpoints (a subclass instance narrowed to this type)."""
        if type(self) is Endpoints:
            return self
        return Endpoints(**{n: getattr(self, n) for n in _FIELD_NAMES})


def check_endpoints(obj: Any) -> None:
    """The one validator: every ``<name>_channel`` / ``<name>_stream_id`` of ``obj``.

    Subclasses with a ``__post_init__`` of their own call this (a ``slots=True`` dataclass
    cannot use zero-argument ``super()``).
    """
    for name in ENDPOINT_NAMES:
        problem = channel_problem(getattr(obj, f"{name}_channel"))
        if problem is not None:
            raise ValueError(f"{name}_channel: {problem}")
        problem = aeron_stream_id_problem(getattr(obj, f"{name}_stream_id"))
        if problem is not None:
            raise ValueError(f"{name}_stream_id: {problem}")


_FIELD_NAMES: Final = tuple(f.name for f in fields(Endpoints))
DEFAULT_ENDPOINTS: Final = Endpoints()
