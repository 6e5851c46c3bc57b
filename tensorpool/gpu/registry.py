"""Which mapped payload pools are registered with CUDA: the sans-IO bookkeeping core.

``cudaHostRegister`` pins a host range so that copies from it run by DMA at the link's rate
instead of being staged through the driver's bounce buffers. Pinning is a process-wide fact about
an address range, so the rules that keep it sound live here, apart from the CUDA calls:

* a range is registered once (a second ``cudaHostRegister`` of a registered range fails with
  ``cudaErrorHostMemoryAlreadyRegistered``; the core never asks for it);
* a range is unregistered before its mapping goes away (unmap, remap, epoch change): pinned pages
  of an unmapped file would stay pinned, and a new mapping at the same address could not be
  registered;
* a new range that overlaps a registered one means the old mapping went away unnoticed: the old
  registration is dropped first (counted, ``stale_overlap``);
* a failed registration either fails the caller (``error``) or marks the range for staging
  through a pinned bounce buffer (``staging``), as the user chose.

Inputs: :meth:`RegistrationCore.on_mapped`, :meth:`~RegistrationCore.on_unmapped`,
:meth:`~RegistrationCore.on_registered`, :meth:`~RegistrationCore.on_register_failed`.
Outputs: :class:`Register` / :class:`Unregister` actions and :class:`Decision` results for the
thin CUDA layer (:mod:`tensorpool.gpu.cuda`) to execute. No clock is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from tensorpool.counters import DropCounters

POLICIES: Final = ("error", "staging")
Policy = Literal["error", "staging"]

#: State of a range: asked to register, pinned, or copied through the staging buffer.
PENDING: Final = "pending"
REGISTERED: Final = "registered"
STAGING: Final = "staging"

# counter names (every decision that is not the plain path has one)
STALE_OVERLAP: Final = "stale_overlap"
EPOCH_CHANGED: Final = "epoch_changed"
REMAPPED: Final = "remapped"
UNMAPPED: Final = "unmapped"
REGISTER_FAILED: Final = "register_failed"


def page_span(address: int, length: int, page_size: int) -> tuple[int, int]:
    """The whole pages covering ``[address, address + length)``: ``(start, size)``.

    ``cudaHostRegister`` pins whole pages; a file mapping always covers whole pages (the tail of
    the last page is mapped too), so rounding outwards stays inside the mapping.
    """
    if page_size <= 0 or page_size & (page_size - 1):
        raise ValueError(f"page size must be a power of two, got {page_size}")
    if address < 0 or length <= 0:
        raise ValueError(f"empty or negative range: address {address}, length {length}")
    start = address & ~(page_size - 1)
    end = (address + length + page_size - 1) & ~(page_size - 1)
    return start, end - start


@dataclass(frozen=True, slots=True)
class MappedRange:
    """One mapped payload pool as the consumer sees it."""

    path: str
    epoch: int
    address: int
    length: int


@dataclass(frozen=True, slots=True)
class Register:
    """Pin ``[address, address + size)`` (page-aligned) for ``path`` at ``epoch``."""

    path: str
    epoch: int
    address: int
    size: int


@dataclass(frozen=True, slots=True)
class Unregister:
    """Unpin the registration that starts at ``address``; ``why`` names the rule."""

    path: str
    epoch: int
    address: int
    size: int
    why: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What a failed registration means: ``raise_error`` (policy ``error``) or staging."""

    path: str
    reason: str
    raise_error: bool


Action = Register | Unregister


@dataclass(slots=True)
class _Entry:
    path: str
    epoch: int
    address: int
    size: int
    state: str


class RegistrationCore:
    """Registration bookkeeping for the pools of one consumer (one process may hold several)."""

    __slots__ = ("_by_path", "counters", "page_size", "policy", "registrations", "unregistrations")

    def __init__(self, page_size: int, policy: Policy = "error") -> None:
        if policy not in POLICIES:
            raise ValueError(f"on_register_failure must be 'error' or 'staging', got {policy!r}")
        page_span(0, 1, page_size)  # validates the page size
        self.page_size = page_size
        self.policy: Policy = policy
        self._by_path: dict[str, _Entry] = {}
        self.counters = DropCounters()
        self.registrations = 0
        self.unregistrations = 0

    def state(self, path: str) -> str | None:
        """``pending``, ``registered``, ``staging`` or None (not known)."""
        entry = self._by_path.get(path)
        return None if entry is None else entry.state

    def known(self) -> dict[str, str]:
        """Every range's path and state (for status output and tests)."""
        return {path: e.state for path, e in self._by_path.items()}

    def spans(self, state: str) -> list[tuple[int, int]]:
        """``(address, size)`` of every range in ``state`` (page-aligned)."""
        return [(e.address, e.size) for e in self._by_path.values() if e.state == state]

    def on_mapped(self, ranges: list[MappedRange]) -> list[Action]:
        """The pools mapped now. Known ranges are left alone; a path seen at another epoch or
        address is unregistered first; overlaps with a registration of another path too."""
        actions: list[Action] = []
        for r in ranges:
            address, size = page_span(r.address, r.length, self.page_size)
            entry = self._by_path.get(r.path)
            if entry is not None:
                if entry.epoch == r.epoch and entry.address == address and entry.size == size:
                    continue  # the same range: never registered twice
                why = EPOCH_CHANGED if entry.epoch != r.epoch else REMAPPED
                actions.extend(self._drop(entry, why))
            for other in list(self._by_path.values()):
                if other.address < address + size and address < other.address + other.size:
                    actions.extend(self._drop(other, STALE_OVERLAP))
            self._by_path[r.path] = _Entry(r.path, r.epoch, address, size, PENDING)
            actions.append(Register(r.path, r.epoch, address, size))
        return actions

    def on_unmapped(self, paths: list[str]) -> list[Unregister]:
        """These pools are about to be unmapped: unpin them first (staged ones just go)."""
        actions: list[Unregister] = []
        for path in paths:
            entry = self._by_path.get(path)
            if entry is not None:
                actions.extend(self._drop(entry, UNMAPPED))
        return actions

    def on_registered(self, path: str) -> None:
        entry = self._by_path.get(path)
        if entry is not None and entry.state == PENDING:
            entry.state = REGISTERED
            self.registrations += 1

    def on_register_failed(self, path: str, reason: str) -> Decision:
        """The CUDA layer could not pin the range. Policy ``error``: the range is forgotten and
        the caller fails; ``staging``: copies of it go through a pinned staging buffer."""
        self.counters.increment(REGISTER_FAILED)
        entry = self._by_path.get(path)
        if self.policy == "error":
            if entry is not None:
                del self._by_path[path]
            return Decision(path, reason, True)
        if entry is not None:
            entry.state = STAGING
        return Decision(path, reason, False)

    def _drop(self, entry: _Entry, why: str) -> list[Unregister]:
        del self._by_path[entry.path]
        if why != UNMAPPED:
            self.counters.increment(why)
        if entry.state == STAGING:
            return []  # never pinned
        if entry.state == REGISTERED:
            self.unregistrations += 1
        return [Unregister(entry.path, entry.epoch, entry.address, entry.size, why)]
