"""``[profiles.<name>]``: the one schema of a stream geometry in a config file (#26.5).

The SHM driver's file and the bridge's (standalone receivers create their destination regions
themselves) describe profiles with the same keys and rules: ``header_nslots`` (a power of two,
u32 on the wire) and ``payload_pools = [{pool_id, stride_bytes}, ...]`` (strides are powers of
two, #13.4; pool ids are unique). ``nslots`` may repeat ``header_nslots`` (the reference
configs write it) but never differ: pools share the header's slot index. ``header_slot_bytes``
is fixed at 256 by the Wire Specification. Each file kind subclasses :class:`ProfileTable` to
give ``header_nslots`` its own default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from tensorpool.config_schema import Table, table
from tensorpool.config_util import (
    UINT16_MAX,
    UINT32_MAX,
    FieldProblem,
    NonNegative,
    int_in,
    power_of_two,
)
from tensorpool.shm.layout import MAX_NSLOTS, MAX_STRIDE_BYTES, PoolConfig

__all__ = ["HEADER_SLOT_BYTES", "HeaderSlots", "PoolTable", "ProfileConfig", "ProfileTable"]

#: Wire Spec v1.1: every header slot is exactly 256 bytes.
HEADER_SLOT_BYTES = 256
#: A header ring's slot count: u32 on the wire, a power of two (#13.4).
HeaderSlots = Annotated[int, int_in(1, MAX_NSLOTS, power_of_two)]


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """Geometry shared by every stream created from this profile (validated)."""

    name: str
    header_nslots: int
    payload_pools: tuple[PoolConfig, ...]
    header_slot_bytes: int = HEADER_SLOT_BYTES


def _is_256(value: int) -> str | None:
    if value == HEADER_SLOT_BYTES:
        return None
    return f"must be {HEADER_SLOT_BYTES} (fixed by the Wire Specification)"


@table
class PoolTable(Table):
    """``payload_pools[i]`` as written."""

    pool_id: Annotated[int, int_in(0, UINT16_MAX)]
    stride_bytes: Annotated[int, int_in(1, MAX_STRIDE_BYTES, power_of_two)]
    nslots: NonNegative | None = None


@table
class ProfileTable(Table):
    """``[profiles.<name>]`` as written; :meth:`pools` is what regions are built from."""

    payload_pools: tuple[PoolTable, ...]
    header_nslots: HeaderSlots = 1024
    header_slot_bytes: Annotated[int, int_in(0, UINT32_MAX, _is_256)] = HEADER_SLOT_BYTES

    def __post_init__(self) -> None:
        if not self.payload_pools:
            raise FieldProblem("payload_pools", "must contain at least one pool")
        seen: set[int] = set()
        for i, pool in enumerate(self.payload_pools):
            if pool.pool_id in seen:
                raise FieldProblem(
                    f"payload_pools[{i}].pool_id", f"pool_id {pool.pool_id} is used twice"
                )
            seen.add(pool.pool_id)
            if pool.nslots is not None and pool.nslots != self.header_nslots:
                raise FieldProblem(
                    f"payload_pools[{i}].nslots",
                    f"must equal header_nslots ({self.header_nslots}): pools share the "
                    "header's slot index",
                )

    def profile(self, name: str) -> ProfileConfig:
        """The validated profile, named by its table."""
        pools = tuple(PoolConfig(p.pool_id, p.stride_bytes) for p in self.payload_pools)
        return ProfileConfig(name, self.header_nslots, pools)
