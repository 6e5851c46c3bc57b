"""Where a stream's SHM regions live, and how big they are (Wire Spec §15.21a).

The driver owns path selection (Driver Model §3), so this module is the single place
that turns ``(config, stream_id, epoch, profile)`` into a :class:`RegionLayout`: the
absolute paths, ``shm:file`` URIs and file sizes of one epoch's header ring and
payload pools. It is pure: the agent creates the files, the core only hands out
layouts. Directory layout (one driver instance serving many streams)::

    <shm.base_dir>/<shm.namespace>/<driver.instance_id>/stream-<stream_id>/epoch-<E>/
        header.ring
        payload-<pool_id>.pool

This follows the recommended ``<base>/<namespace>/<producer_instance_id>/epoch-<E>/``
layout, with the driver instance plus ``stream-<id>`` playing the role of the
producer instance. Epoch-scoped directories let an epoch be dropped as a whole and
let the agent find the highest epoch already used for a stream after a restart
(:func:`parse_epoch_dirname`), which is how epochs keep increasing across restarts.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from tensorpool.driver.config import DriverConfig, ProfileConfig
from tensorpool.shm.epochs import EPOCH_DIR_PREFIX, parse_epoch_dirname
from tensorpool.stream_ids import allocate_stream_id

__all__ = [
    "EPOCH_DIR_PREFIX",
    "HEADER_FILE",
    "LAYOUT_VERSION",
    "MAX_DIMS",
    "STREAM_DIR_PREFIX",
    "SUPERBLOCK_SIZE",
    "PoolRegion",
    "RegionLayout",
    "allocate_stream_id",
    "build_layout",
    "epoch_bytes",
    "epoch_dir",
    "instance_root",
    "parse_epoch_dirname",
    "parse_stream_dirname",
    "pool_file_name",
    "region_uri",
    "stream_root",
]

#: Wire Spec v1.1 §6: every region starts with a 64-byte superblock.
SUPERBLOCK_SIZE = 64
#: SHM layout version this driver creates (Wire Spec v1.1).
LAYOUT_VERSION = 1
#: Wire Spec v1.1 MAX_DIMS; returned in every successful attach (Driver Model §4.2).
MAX_DIMS = 8

HEADER_FILE = "header.ring"
STREAM_DIR_PREFIX = "stream-"

_STREAM_DIR = re.compile(r"^stream-([1-9][0-9]{0,9})$")


def pool_file_name(pool_id: int) -> str:
    """File name of one payload pool inside an epoch directory."""
    return f"payload-{pool_id}.pool"


def instance_root(config: DriverConfig) -> str:
    """Directory holding every stream of this driver instance."""
    return posixpath.join(config.shm.base_dir, config.shm.namespace, config.driver.instance_id)


def stream_root(config: DriverConfig, stream_id: int) -> str:
    """Directory holding every epoch of one stream."""
    return posixpath.join(instance_root(config), f"{STREAM_DIR_PREFIX}{stream_id}")


def epoch_dir(config: DriverConfig, stream_id: int, epoch: int) -> str:
    """Directory of one epoch of one stream."""
    return posixpath.join(stream_root(config, stream_id), f"{EPOCH_DIR_PREFIX}{epoch}")


def parse_stream_dirname(name: str) -> int | None:
    """``"stream-10000"`` → 10000; anything else (including leading zeros) → None."""
    match = _STREAM_DIR.fullmatch(name)
    if not match:
        return None
    value = int(match.group(1))
    return value if value < 0xFFFF_FFFF else None


def region_uri(path: str, *, hugepages: bool) -> str:
    """The ``shm:file`` URI announced for a backing file (Wire Spec §4.1)."""
    if hugepages:
        return f"shm:file?path={path}|require_hugepages=true"
    return f"shm:file?path={path}"


@dataclass(frozen=True, slots=True)
class PoolRegion:
    """One payload pool of one epoch: what clients are told and what the agent creates."""

    pool_id: int
    pool_nslots: int
    stride_bytes: int
    region_uri: str
    path: str
    size_bytes: int

    @property
    def wire_entry(self) -> tuple[int, int, int, str]:
        """``payloadPools`` group entry in schema order (id, nslots, stride, uri)."""
        return (self.pool_id, self.pool_nslots, self.stride_bytes, self.region_uri)


@dataclass(frozen=True, slots=True)
class RegionLayout:
    """Every region of one stream epoch (Driver Model §4.2 ``code=OK`` payload)."""

    stream_id: int
    epoch: int
    layout_version: int
    profile: str
    directory: str
    header_nslots: int
    header_slot_bytes: int
    header_region_uri: str
    header_path: str
    header_size_bytes: int
    payload_pools: tuple[PoolRegion, ...]
    hugepages: bool
    wire_pools: tuple[tuple[int, int, int, str], ...]
    """``payloadPools`` group entries for the attach response and the announce."""


def build_layout(
    config: DriverConfig,
    stream_id: int,
    epoch: int,
    profile: ProfileConfig,
    *,
    hugepages: bool,
) -> RegionLayout:
    """Compute paths, URIs and sizes of one epoch; every pool gets ``header_nslots`` slots."""
    directory = epoch_dir(config, stream_id, epoch)
    nslots = profile.header_nslots
    header_path = posixpath.join(directory, HEADER_FILE)
    pools = tuple(
        PoolRegion(
            pool_id=pool.pool_id,
            pool_nslots=nslots,
            stride_bytes=pool.stride_bytes,
            region_uri=region_uri(
                posixpath.join(directory, pool_file_name(pool.pool_id)), hugepages=hugepages
            ),
            path=posixpath.join(directory, pool_file_name(pool.pool_id)),
            size_bytes=SUPERBLOCK_SIZE + nslots * pool.stride_bytes,
        )
        for pool in profile.payload_pools
    )
    return RegionLayout(
        stream_id=stream_id,
        epoch=epoch,
        layout_version=LAYOUT_VERSION,
        profile=profile.name,
        directory=directory,
        header_nslots=nslots,
        header_slot_bytes=profile.header_slot_bytes,
        header_region_uri=region_uri(header_path, hugepages=hugepages),
        header_path=header_path,
        header_size_bytes=SUPERBLOCK_SIZE + nslots * profile.header_slot_bytes,
        payload_pools=pools,
        hugepages=hugepages,
        wire_pools=tuple(p.wire_entry for p in pools),
    )


def epoch_bytes(profile: ProfileConfig, page_size: int) -> int:
    """Bytes one epoch of ``profile`` occupies on disk: every file rounded up to whole pages.

    Used to keep room for configured streams when a dynamic stream is to be created.
    """
    page = max(page_size, 1)
    nslots = profile.header_nslots
    sizes = [SUPERBLOCK_SIZE + nslots * profile.header_slot_bytes]
    sizes += [SUPERBLOCK_SIZE + nslots * pool.stride_bytes for pool in profile.payload_pools]
    return sum(-(-size // page) * page for size in sizes)
