"""PulseGrid (seed 000, "PulseGrid"): nearest-pulse rounding, exact windows, ownership."""

from __future__ import annotations

import pytest

from tensorpool.batching import PulseGrid, slots_for

S = 1_000_000_000
ORIGIN = 1_700_000_000 * S + 12_345


def grid14() -> PulseGrid:
    return PulseGrid(ORIGIN, 14, slots_for(14, S))


def test_grid_pulse_index_is_round_of_offset_over_period() -> None:
    g = grid14()
    for n in (-3, 0, 1, 13, 14, 10_000):
        nominal = g.pulse_time_ns(n)
        assert g.pulse_index(nominal) == n
        assert g.pulse_index(nominal + 1) == n


def test_grid_jitter_tolerance_is_half_a_period() -> None:
    """Up to period/2 either way stays on its pulse; further moves to the neighbour."""
    g = grid14()
    nominal = g.pulse_time_ns(100)
    half = S // 28  # 35_714_285 ns
    assert g.pulse_index(nominal + half - 2) == 100
    assert g.pulse_index(nominal - half + 2) == 100
    assert g.pulse_index(nominal + half + 2) == 101
    assert g.pulse_index(nominal - half - 2) == 99


@pytest.mark.parametrize(
    ("rate", "length_ns", "slots"),
    [(14, S, 14), (14, 2 * S, 28), (14, S // 2, 7), (5, S, 5), (1, S, 1), (3, S // 2, 2)],
)
def test_grid_slots_per_batch(rate: int, length_ns: int, slots: int) -> None:
    assert slots_for(rate, length_ns) == slots


def test_grid_batch_length_change_keeps_origin_and_rescales() -> None:
    g2 = grid14().with_batch_length(2 * S)
    assert (g2.origin_ns, g2.rate_hz, g2.slots_per_batch) == (ORIGIN, 14, 28)


def test_grid_windows_own_exactly_rate_times_length_pulses_without_drift() -> None:
    """Exact integer arithmetic: no drift even a million windows (11.6 days) later."""
    g = grid14()
    start = ORIGIN - 3  # windows anchored (almost) on a pulse: the fragile case
    for k in (0, 1, 2, 999, 1_000_000, 1_000_001):
        lo, hi = g.index_range(start + k * S, start + (k + 1) * S)
        assert (lo, hi) == (14 * k, 14 * k + 14)


def test_grid_boundary_pulse_belongs_to_the_window_it_starts() -> None:
    """Ownership = nominal time + period/4 in [start, end): boundary pulses are robust."""
    g = grid14()
    p = S // 14
    pulse = g.pulse_time_ns(70)
    for start in (pulse - p // 5, pulse, pulse + p // 5):
        assert g.index_range(start, start + S)[0] == (70 if start <= pulse + p // 4 else 71)
    # A pulse 1/3 period before the start belongs to the previous window.
    assert g.index_range(pulse + p // 3, pulse + p // 3 + S)[0] == 71


def test_grid_windows_ahead_matches_ownership() -> None:
    g = grid14()
    start = ORIGIN + 40_000_000
    for idx in range(-30, 200):
        k = g.windows_ahead(idx, start, S)
        lo, hi = g.index_range(start + k * S, start + (k + 1) * S)
        assert lo <= idx < hi


def test_grid_slot_relative_to_window() -> None:
    g = grid14()
    start = g.pulse_time_ns(28)
    assert g.slot(g.pulse_time_ns(28), start) == 0
    assert g.slot(g.pulse_time_ns(41), start) == 13
    assert g.slot(g.pulse_time_ns(42), start) == 14


@pytest.mark.parametrize(("rate", "slots"), [(0, 1), (14, 0)])
def test_grid_rejects_impossible_parameters(rate: int, slots: int) -> None:
    with pytest.raises(ValueError):
        PulseGrid(ORIGIN, rate, slots)
