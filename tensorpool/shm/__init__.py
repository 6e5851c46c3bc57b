"""Shared-memory layer: region URIs, path containment, superblocks, header ring, payload
pools, the ``seq_commit`` seqlock and TensorHeader ⇄ numpy (Wire Spec v1.1 §4, §6-§9, §15).

Producer side: :func:`create_region` the header ring and pools (see :class:`EpochLayout`), then
publish frames through a :class:`SlotWriter`. Consumer side: :func:`map_region` what an announce
names (after :class:`PathPolicy` containment and superblock validation), then read frames named
by descriptors through a :class:`SlotReader`. Everything a peer can get wrong raises a
:class:`ShmError` (setup) or is a counted drop (per frame), named by
:class:`tensorpool.counters.Reason`.
"""

from tensorpool.shm.backend import (
    HUGETLBFS_MAGIC,
    PAGE_SIZE,
    validate_stride_bytes,
    verify_hugepages,
)
from tensorpool.shm.errors import (
    BackendError,
    PathRejected,
    ShmError,
    SuperblockError,
    TensorLayoutError,
    UnsupportedPlatform,
    UriError,
)
from tensorpool.shm.layout import (
    HEADER_SLOT_BYTES,
    LAYOUT_VERSION,
    MAGIC,
    MAX_DIMS,
    SUPERBLOCK_SIZE,
    header_slot_offset,
    payload_slot_offset,
)
from tensorpool.shm.paths import PathPolicy, ValidatedPath
from tensorpool.shm.region import EpochLayout, ShmRegion, create_region, map_region, try_map_region
from tensorpool.shm.ring import PoolTable, check_ring_shape, header_index_for
from tensorpool.shm.seqlock import SlotRead, SlotReader, SlotWriter, memory_order_supported
from tensorpool.shm.superblock import (
    ExpectedRegion,
    SuperblockFields,
    check_fresh,
    is_fresh,
    read_superblock,
    validate_superblock,
    write_superblock,
)
from tensorpool.shm.tensor import NUMPY_TO_WIRE, WIRE_TO_NUMPY, TensorLayout
from tensorpool.shm.uri import ShmUri, format_shm_uri, parse_shm_uri

__all__ = [
    "HEADER_SLOT_BYTES",
    "HUGETLBFS_MAGIC",
    "LAYOUT_VERSION",
    "MAGIC",
    "MAX_DIMS",
    "NUMPY_TO_WIRE",
    "PAGE_SIZE",
    "SUPERBLOCK_SIZE",
    "WIRE_TO_NUMPY",
    "BackendError",
    "EpochLayout",
    "ExpectedRegion",
    "PathPolicy",
    "PathRejected",
    "PoolTable",
    "ShmError",
    "ShmRegion",
    "ShmUri",
    "SlotRead",
    "SlotReader",
    "SlotWriter",
    "SuperblockError",
    "SuperblockFields",
    "TensorLayout",
    "TensorLayoutError",
    "UnsupportedPlatform",
    "UriError",
    "ValidatedPath",
    "check_fresh",
    "check_ring_shape",
    "create_region",
    "format_shm_uri",
    "header_index_for",
    "header_slot_offset",
    "is_fresh",
    "map_region",
    "memory_order_supported",
    "parse_shm_uri",
    "payload_slot_offset",
    "read_superblock",
    "try_map_region",
    "validate_stride_bytes",
    "validate_superblock",
    "verify_hugepages",
    "write_superblock",
]
