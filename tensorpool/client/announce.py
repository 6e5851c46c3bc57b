"""Which `ShmPoolAnnounce` a consumer should act on (Wire Spec §10.1.1, §15.1, §15.21).

Announces are soft state replayed by Aeron and repeated every period, so most of
them carry nothing new. This sans-IO tracker decides, per announce, whether to
ignore it (with a named reason), refresh the current mapping, or (re)map a new
epoch; and, per tick, whether the mapping has gone stale because announces
stopped (producer or driver death), in which case the consumer must fail closed.

Rules implemented:
- stream filter; `header_slot_bytes` must be 256 (§8.1);
- freshness: an announce older than `freshness_ns` relative to local receipt is
  ignored; MONOTONIC timestamps compare with the local monotonic clock,
  REALTIME_SYNCED ones with the local realtime clock (§10.1.1);
- join time: for MONOTONIC only, an announce stamped before the subscription
  image carrying it became available is a replay and is ignored (§10.1.1);
- highest epoch wins; an older epoch is ignored; a newer one remaps (§15.21).
  "Highest" counts only epochs that were actually mapped: an announce whose
  regions fail validation must not lock out the stream's real producer.
- after an unmap that must "wait for a new epoch" (the producer's lease was revoked,
  Driver Model §4.9; the superblock ``pid`` changed, §15.14), the mapped epoch itself is
  ignored too: only a strictly higher epoch maps again.

Choice where the spec is silent: after a stale-unmap (no fresh announce for a
whole freshness window) the highest-epoch memory is cleared, so a producer that
comes back with a lower epoch (e.g. its directory was wiped) can still be mapped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

HEADER_SLOT_BYTES = 256
CLOCK_MONOTONIC = 1
CLOCK_REALTIME_SYNCED = 2


@dataclass(frozen=True, slots=True)
class AnnouncedPool:
    """One payload pool as an announce describes it (not the producer's requested
    :class:`~tensorpool.client.producer.PoolConfig`, which has no slot count or URI)."""

    pool_id: int
    nslots: int
    stride_bytes: int
    region_uri: str


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """An owned copy of an announce (decoder flyweights are reused per message)."""

    stream_id: int
    producer_id: int
    epoch: int
    layout_version: int
    header_nslots: int
    header_slot_bytes: int
    header_region_uri: str
    pools: tuple[AnnouncedPool, ...]
    announce_timestamp_ns: int
    clock_domain: int

    @classmethod
    def from_announce(cls, dec: object) -> StreamLayout:
        """Copy the fields of a `ShmPoolAnnounceDecoder` (or attach response) out."""
        pools = tuple(
            AnnouncedPool(
                int(p.pool_id), int(p.pool_nslots), int(p.stride_bytes), str(p.region_uri)
            )
            for p in dec.payload_pools  # type: ignore[attr-defined]
        )
        return cls(
            stream_id=int(dec.stream_id),  # type: ignore[attr-defined]
            producer_id=int(getattr(dec, "producer_id", 0) or 0),
            epoch=int(dec.epoch),  # type: ignore[attr-defined]
            layout_version=int(dec.layout_version),  # type: ignore[attr-defined]
            header_nslots=int(dec.header_nslots),  # type: ignore[attr-defined]
            header_slot_bytes=int(dec.header_slot_bytes),  # type: ignore[attr-defined]
            header_region_uri=str(dec.header_region_uri),  # type: ignore[attr-defined]
            pools=pools,
            announce_timestamp_ns=int(getattr(dec, "announce_timestamp_ns", 0) or 0),
            clock_domain=int(getattr(dec, "announce_clock_domain_raw", CLOCK_MONOTONIC)),
        )


class Verdict(enum.Enum):
    IGNORE = "ignore"
    REFRESH = "refresh"
    MAP = "map"
    UNMAP = "unmap"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""


_OTHER_STREAM = Decision(Verdict.IGNORE, "other_stream")
_BAD_SLOT_BYTES = Decision(Verdict.IGNORE, "announce_bad_header_slot_bytes")
_BAD_CLOCK = Decision(Verdict.IGNORE, "announce_unknown_clock_domain")
_BEFORE_JOIN = Decision(Verdict.IGNORE, "announce_before_join")
_STALE = Decision(Verdict.IGNORE, "announce_stale")
_OLD_EPOCH = Decision(Verdict.IGNORE, "announce_old_epoch")
_REFRESH = Decision(Verdict.REFRESH)
_MAP = Decision(Verdict.MAP)
_REVOKE_CONTRADICTED = Decision(Verdict.MAP, "producer_revoke_contradicted")
_STALE_UNMAP = Decision(Verdict.UNMAP, "announce_timeout")


class AnnounceTracker:
    """Per-stream announce filter and liveness watchdog (sans-IO)."""

    __slots__ = (
        "_await_newer",
        "_last_fresh_ns",
        "_realtime",
        "_revoked_at_ns",
        "epoch",
        "freshness_ns",
        "mapped",
        "stream_id",
    )

    def __init__(
        self,
        stream_id: int,
        freshness_ns: int,
        *,
        realtime_clock: Callable[[], int],
    ) -> None:
        """``realtime_clock``: the agent's realtime clock (ns) for REALTIME_SYNCED announces;
        passed in because the tracker has no clock of its own (issue #28 point 2)."""
        self.stream_id = stream_id
        self.freshness_ns = freshness_ns
        self._realtime = realtime_clock
        self.epoch: int | None = None
        self.mapped = False
        self._await_newer = False
        self._revoked_at_ns = 0
        self._last_fresh_ns = 0

    def on_announce(
        self,
        stream_id: int,
        epoch: int,
        announce_timestamp_ns: int,
        clock_domain: int,
        header_slot_bytes: int,
        join_time_ns: int | None,
        now_ns: int,
    ) -> Decision:
        """`join_time_ns`: when the image that carried this announce became available."""
        if stream_id != self.stream_id:
            return _OTHER_STREAM
        if header_slot_bytes != HEADER_SLOT_BYTES:
            return _BAD_SLOT_BYTES
        if clock_domain == CLOCK_MONOTONIC:
            if join_time_ns is not None and announce_timestamp_ns < join_time_ns:
                return _BEFORE_JOIN
            age = now_ns - announce_timestamp_ns
        elif clock_domain == CLOCK_REALTIME_SYNCED:
            age = self._realtime() - announce_timestamp_ns
        else:
            return _BAD_CLOCK
        if age > self.freshness_ns:
            return _STALE
        if self.epoch is not None and (
            epoch < self.epoch or (epoch == self.epoch and self._await_newer)
        ):
            if (
                epoch == self.epoch
                and self._revoked_at_ns
                and clock_domain == CLOCK_MONOTONIC
                and announce_timestamp_ns > self._revoked_at_ns
            ):
                # Driver §4.9: the driver moves a revoked producer's stream to a new epoch at
                # once, so it never announces the old epoch after the revocation. This announce
                # says the epoch is alive: the revoke did not come from the driver.
                self._await_newer = False
                self._revoked_at_ns = 0
                return _REVOKE_CONTRADICTED
            return _OLD_EPOCH
        if epoch == self.epoch and self.mapped:
            self._last_fresh_ns = now_ns
            return _REFRESH
        return _MAP

    def on_mapped(self, epoch: int, now_ns: int) -> None:
        """Record a successful mapping: only then does its epoch become the floor, so an
        announce whose regions fail validation cannot block the stream's real producer."""
        self.epoch = epoch
        self.mapped = True
        self._await_newer = False
        self._last_fresh_ns = now_ns

    def on_unmapped(
        self, *, forget_epoch: bool = False, await_newer: bool = False, revoked_at_ns: int = 0
    ) -> None:
        """``await_newer``: the mapped epoch is dead for good (revoked producer §4.9, foreign
        writer §15.14); announces of it are ignored until a higher epoch maps.
        ``revoked_at_ns``: the driver time of the producer revocation behind it; an announce
        of the same epoch stamped later contradicts the revocation (it was forged)."""
        self.mapped = False
        self._await_newer = await_newer and self.epoch is not None
        self._revoked_at_ns = revoked_at_ns if self._await_newer else 0
        if forget_epoch:
            self.epoch = None

    def tick(self, now_ns: int) -> Decision | None:
        """UNMAP when a mapped stream has had no fresh announce for a freshness window."""
        if self.mapped and now_ns - self._last_fresh_ns > self.freshness_ns:
            self.mapped = False
            self.epoch = None
            self._await_newer = False
            return _STALE_UNMAP
        return None
