"""Per-stream epoch counter and epoch garbage collection (Driver Model §6, §10; epoch GC).

Epochs only go up. A stream's next epoch is ``max(current, floor) + 1`` where the
*floor* is the highest epoch the agent found on disk for that stream when it
started (plus any epochs it reports). Because every epoch gets its own directory,
the floor survives a driver restart, so "the driver MUST increment epoch before
reissuing leases" (§10) holds across restarts on the same base directory.

GC policy (the reference implementation's epoch-GC policy; docs/compliance/driver.md, row
EPOCH_GC, maps it to tests): keep the newest ``keep`` epochs (current plus
``keep - 1`` previous) and any epoch a live lease still references; delete an older
epoch only once it has been superseded for at least ``min_age_ns`` (default 3x the
announce period), so a consumer that has not yet seen the epoch-bumped announce can
still finish with the old mapping. At start-up (policy ``epoch_gc_on_startup``)
the age check is skipped: a previous driver's epochs died with it (§10).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = ["EpochHistory"]


class EpochHistory:
    """Epochs of one stream that may still have files on disk."""

    __slots__ = ("_retired", "current", "floor")

    def __init__(self, floor: int = 0, known: Iterable[int] = (), now_ns: int = 0) -> None:
        if floor < 0:
            raise ValueError(f"epoch floor {floor} is negative")
        self.current = 0
        # epoch -> time it stopped being current; the current epoch is absent.
        self._retired: dict[int, int] = {}
        for epoch in known:
            if epoch > 0:
                self._retired[epoch] = now_ns
                floor = max(floor, epoch)
        self.floor = floor

    def advance(self, now_ns: int) -> int:
        """Start a new epoch; the previous current epoch is retired at ``now_ns``."""
        if self.current:
            self._retired[self.current] = now_ns
        self.current = max(self.current, self.floor) + 1
        return self.current

    def on_disk(self) -> list[int]:
        """Every epoch that may have files, ascending (current included)."""
        epochs = list(self._retired)
        if self.current:
            epochs.append(self.current)
        return sorted(epochs)

    def forget_all(self) -> list[int]:
        """The stream is reclaimed: every epoch goes; the next one is still above them all.

        Returns the epochs that may have files (ascending), which the caller deletes.
        """
        epochs = self.on_disk()
        self.floor = max([self.floor, self.current, *epochs])
        self.current = 0
        self._retired.clear()
        return epochs

    def _eligible(self, keep: int, referenced: Collection[int]) -> list[tuple[int, int]]:
        newest = set(self.on_disk()[-keep:]) if keep > 0 else set()
        return [
            (epoch, retired_at)
            for epoch, retired_at in sorted(self._retired.items())
            if epoch not in newest and epoch not in referenced
        ]

    def next_gc_ns(
        self, *, keep: int, min_age_ns: int, referenced: Collection[int] = ()
    ) -> int | None:
        """When the next epoch becomes old enough to collect (None: nothing pending)."""
        eligible = self._eligible(keep, referenced)
        if not eligible:
            return None
        return min(retired_at for _, retired_at in eligible) + min_age_ns

    def gc_candidates(
        self,
        now_ns: int,
        *,
        keep: int,
        min_age_ns: int,
        referenced: Collection[int] = (),
        ignore_age: bool = False,
    ) -> list[int]:
        """Retired epochs that may be deleted now (ascending); they are forgotten."""
        out = [
            epoch
            for epoch, retired_at in self._eligible(keep, referenced)
            if ignore_age or now_ns - retired_at >= min_age_ns
        ]
        for epoch in out:
            del self._retired[epoch]
        return out
