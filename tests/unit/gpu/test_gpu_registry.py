"""#20 pinned pools: the registration bookkeeping core (sans-IO, no GPU, no CuPy).

One test per rule of :mod:`tensorpool.gpu.registry`: register once, unregister on unmap, on epoch
change and on a remap at another address, drop a stale registration that a new range overlaps,
and the failure policy (``error`` / ``staging``). Page alignment is checked on its own.
"""

from __future__ import annotations

import pytest

from tensorpool.gpu.registry import (
    EPOCH_CHANGED,
    REGISTER_FAILED,
    REGISTERED,
    REMAPPED,
    STAGING,
    STALE_OVERLAP,
    MappedRange,
    Register,
    RegistrationCore,
    Unregister,
    page_span,
)

PAGE = 4096
POOL1 = "/dev/shm/tp/s1/epoch-1/payload-1.pool"
POOL2 = "/dev/shm/tp/s1/epoch-1/payload-2.pool"


def mapped(core: RegistrationCore, *ranges: MappedRange) -> list[object]:
    """on_mapped, with every Register reported as pinned (what the CUDA layer does on success)."""
    actions = core.on_mapped(list(ranges))
    for a in actions:
        if isinstance(a, Register):
            core.on_registered(a.path)
    return list(actions)


def test_page_span_rounds_outwards_to_whole_pages() -> None:
    assert page_span(0x10000, PAGE, PAGE) == (0x10000, PAGE)
    assert page_span(0x10000, 1, PAGE) == (0x10000, PAGE)
    assert page_span(0x10000, PAGE + 1, PAGE) == (0x10000, 2 * PAGE)
    assert page_span(0x10010, PAGE, PAGE) == (0x10000, 2 * PAGE)  # crosses into a second page
    assert page_span(0x10FFF, 2, PAGE) == (0x10000, 2 * PAGE)
    start, size = page_span(123_457, 1_000_000, 1 << 21)  # 2 MiB pages
    assert start % (1 << 21) == 0 and size % (1 << 21) == 0
    assert start <= 123_457 and start + size >= 123_457 + 1_000_000


@pytest.mark.parametrize(("address", "length", "page"), [(0, 0, PAGE), (-1, 1, PAGE), (0, 1, 3)])
def test_page_span_refuses_empty_ranges_and_odd_pages(address: int, length: int, page: int) -> None:
    with pytest.raises(ValueError):
        page_span(address, length, page)


def test_a_mapped_pool_is_registered_page_aligned() -> None:
    core = RegistrationCore(PAGE)
    # a pool: 64-byte superblock + 16 slots of 64 KiB = 256 pages and 64 bytes -> 257 pages
    actions = core.on_mapped([MappedRange(POOL1, 1, 0x7F0000001000, 64 + 16 * 65536)])
    assert actions == [Register(POOL1, 1, 0x7F0000001000, 257 * PAGE)]
    assert core.state(POOL1) == "pending"
    core.on_registered(POOL1)
    assert core.state(POOL1) == REGISTERED and core.registrations == 1


def test_the_same_range_is_never_registered_twice() -> None:
    core = RegistrationCore(PAGE)
    r = MappedRange(POOL1, 1, 0x10000, 8 * PAGE)
    assert len(mapped(core, r)) == 1
    assert core.on_mapped([r]) == []
    assert core.on_mapped([r, MappedRange(POOL2, 1, 0x40000, PAGE)]) == [
        Register(POOL2, 1, 0x40000, PAGE)
    ]
    assert core.registrations == 1  # POOL2 not reported yet


def test_unmap_unregisters_and_a_later_map_registers_again() -> None:
    core = RegistrationCore(PAGE)
    r = MappedRange(POOL1, 1, 0x10000, 8 * PAGE)
    mapped(core, r)
    assert core.on_unmapped([POOL1, POOL2]) == [Unregister(POOL1, 1, 0x10000, 8 * PAGE, "unmapped")]
    assert core.state(POOL1) is None and core.unregistrations == 1
    assert core.on_unmapped([POOL1]) == []  # already gone: nothing to unpin
    assert mapped(core, r) == [Register(POOL1, 1, 0x10000, 8 * PAGE)]


def test_an_epoch_change_unregisters_the_old_range_first() -> None:
    core = RegistrationCore(PAGE)
    mapped(core, MappedRange(POOL1, 1, 0x10000, 8 * PAGE))
    actions = mapped(core, MappedRange(POOL1, 2, 0x90000, 8 * PAGE))
    assert actions == [
        Unregister(POOL1, 1, 0x10000, 8 * PAGE, EPOCH_CHANGED),
        Register(POOL1, 2, 0x90000, 8 * PAGE),
    ]
    assert core.counters[EPOCH_CHANGED] == 1


def test_a_remap_at_another_address_unregisters_the_old_range_first() -> None:
    core = RegistrationCore(PAGE)
    mapped(core, MappedRange(POOL1, 1, 0x10000, 8 * PAGE))
    actions = mapped(core, MappedRange(POOL1, 1, 0x20000, 8 * PAGE))
    assert actions == [
        Unregister(POOL1, 1, 0x10000, 8 * PAGE, REMAPPED),
        Register(POOL1, 1, 0x20000, 8 * PAGE),
    ]
    assert core.counters[REMAPPED] == 1


def test_a_range_overlapping_a_stale_registration_drops_the_stale_one() -> None:
    """The old pool went away without an unmap event and its address was reused."""
    core = RegistrationCore(PAGE)
    mapped(core, MappedRange(POOL1, 1, 0x10000, 8 * PAGE))
    actions = mapped(core, MappedRange(POOL2, 1, 0x14000, 8 * PAGE))
    assert actions == [
        Unregister(POOL1, 1, 0x10000, 8 * PAGE, STALE_OVERLAP),
        Register(POOL2, 1, 0x14000, 8 * PAGE),
    ]
    assert core.counters[STALE_OVERLAP] == 1
    # adjacent, not overlapping: both stay
    assert mapped(core, MappedRange(POOL1, 1, 0x1C000, PAGE)) == [Register(POOL1, 1, 0x1C000, PAGE)]


def test_policy_error_fails_and_forgets_the_range() -> None:
    core = RegistrationCore(PAGE, "error")
    r = MappedRange(POOL1, 1, 0x10000, PAGE)
    core.on_mapped([r])
    decision = core.on_register_failed(POOL1, "cudaErrorInvalidValue")
    assert decision.raise_error and decision.reason == "cudaErrorInvalidValue"
    assert core.state(POOL1) is None and core.counters[REGISTER_FAILED] == 1
    assert core.on_mapped([r]) == [Register(POOL1, 1, 0x10000, PAGE)]  # tried again later


def test_policy_staging_keeps_the_range_unpinned_and_never_unregisters_it() -> None:
    core = RegistrationCore(PAGE, "staging")
    r = MappedRange(POOL1, 1, 0x10000, PAGE)
    core.on_mapped([r])
    decision = core.on_register_failed(POOL1, "cudaErrorNotSupported")
    assert not decision.raise_error
    assert core.state(POOL1) == STAGING and core.spans(STAGING) == [(0x10000, PAGE)]
    assert core.on_mapped([r]) == []  # not retried for the same mapping
    assert core.on_unmapped([POOL1]) == []  # never pinned: nothing to unpin
    assert core.state(POOL1) is None


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="on_register_failure"):
        RegistrationCore(PAGE, "ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power of two"):
        RegistrationCore(3000)
