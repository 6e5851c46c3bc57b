"""Shared builders for the SHM tests (a uniquely named module, importable from test files)."""

from __future__ import annotations

from dataclasses import dataclass

from tensorpool.shm import (
    EpochLayout,
    ExpectedRegion,
    PathPolicy,
    ShmRegion,
    SlotReader,
    SlotWriter,
    SuperblockFields,
    create_region,
    format_shm_uri,
    map_region,
)

STREAM_ID = 77
EPOCH = 5
NOW_NS = 1_000_000_000_000


@dataclass
class Stream:
    """A producer's writable regions plus a consumer's read-only mappings of the same files."""

    layout: EpochLayout
    header: ShmRegion
    pools: list[ShmRegion]
    header_ro: ShmRegion
    pools_ro: list[ShmRegion]
    writer: SlotWriter
    reader: SlotReader
    policy: PathPolicy

    def close(self) -> None:
        self.reader.close()
        self.writer.close()
        for region in (self.header_ro, *self.pools_ro, self.header, *self.pools):
            region.close()


def make_stream(
    base: str, *, nslots: int = 8, strides: dict[int, int] | None = None, epoch: int = EPOCH
) -> Stream:
    strides = strides or {1: 4096}
    layout = EpochLayout(base, "tensorpool", "producer-a", epoch)
    header = create_region(
        layout.header_path,
        SuperblockFields.header_ring(
            epoch=epoch, stream_id=STREAM_ID, nslots=nslots, now_ns=NOW_NS
        ),
    )
    pools = [
        create_region(
            layout.pool_path(pid),
            SuperblockFields.payload_pool(
                epoch=epoch,
                stream_id=STREAM_ID,
                pool_id=pid,
                nslots=nslots,
                stride_bytes=stride,
                now_ns=NOW_NS,
            ),
        )
        for pid, stride in strides.items()
    ]
    policy = PathPolicy([base])
    header_ro = map_region(
        format_shm_uri(layout.header_path),
        ExpectedRegion.header_ring(epoch=epoch, stream_id=STREAM_ID, nslots=nslots),
        policy,
    )
    pools_ro = [
        map_region(
            format_shm_uri(layout.pool_path(pid)),
            ExpectedRegion.payload_pool(
                epoch=epoch, stream_id=STREAM_ID, pool_id=pid, nslots=nslots, stride_bytes=stride
            ),
            policy,
        )
        for pid, stride in strides.items()
    ]
    return Stream(
        layout,
        header,
        pools,
        header_ro,
        pools_ro,
        SlotWriter(header, pools),
        SlotReader(header_ro, pools_ro),
        policy,
    )
