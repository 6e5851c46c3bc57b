"""Map every region of one stream epoch, validated against its layout (Wire §15.1, §15.5).

Consumers (read-only, with an activity freshness check) and driver-mode producers
(writable) map the same set the same way: header ring first, then each payload pool, all
through the path policy (§15.21a.5). On any failure nothing stays mapped.
"""

from __future__ import annotations

from tensorpool.client.announce import StreamLayout
from tensorpool.shm.errors import ShmError
from tensorpool.shm.paths import PathPolicy
from tensorpool.shm.region import ShmRegion, map_region
from tensorpool.shm.superblock import ExpectedRegion


def map_stream(
    layout: StreamLayout,
    policy: PathPolicy,
    *,
    writable: bool = False,
    now_ns: int | None = None,
    freshness_window_ns: int | None = None,
) -> list[ShmRegion]:
    """`[header ring, pool...]` in layout order; raises `ShmError` (with `.reason`)."""
    if not layout.pools:
        raise ShmError("announce_no_pools", "the layout lists no payload pools")
    common = {"writable": writable, "now_ns": now_ns, "freshness_window_ns": freshness_window_ns}
    regions: list[ShmRegion] = []
    try:
        regions.append(
            map_region(
                layout.header_region_uri,
                ExpectedRegion.header_ring(
                    epoch=layout.epoch,
                    stream_id=layout.stream_id,
                    nslots=layout.header_nslots,
                    layout_version=layout.layout_version,
                ),
                policy,
                **common,  # type: ignore[arg-type]
            )
        )
        for pool in layout.pools:
            if pool.nslots != layout.header_nslots:  # §15.5: one nslots for all regions
                raise ShmError("pool_nslots_mismatch", f"pool {pool.pool_id}")
            regions.append(
                map_region(
                    pool.region_uri,
                    ExpectedRegion.payload_pool(
                        epoch=layout.epoch,
                        stream_id=layout.stream_id,
                        pool_id=pool.pool_id,
                        nslots=pool.nslots,
                        stride_bytes=pool.stride_bytes,
                        layout_version=layout.layout_version,
                    ),
                    policy,
                    **common,  # type: ignore[arg-type]
                )
            )
    except BaseException:
        for r in regions:
            r.close()
        raise
    return regions
