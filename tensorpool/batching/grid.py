"""A fixed pulse grid for one stream.

Once a stream's integer rate is known, its pulses are assumed to lie on
``origin_ns + n * 1e9 / rate_hz`` for integer ``n`` (the *pulse index*). A message
is assigned to the nearest grid point, so a timestamp may wander up to half a
period either way (jitter) and still land on its own pulse; two messages of one
split pulse land on the same index; a missing pulse just leaves an index unused.

All arithmetic is exact integer arithmetic on ``rate_hz / 1e9``: the period of a
14 Hz source (71 428 571.43 ns) is never rounded to whole nanoseconds, so the
grid does not drift against the batch windows however long it lives.

Ownership: window ``[start, end)`` owns the pulses whose nominal time plus a
quarter period lies in it, i.e. nominal time in ``[start - P/4, end - P/4)``.
Windows are often anchored on a pulse (the first message starts the first
window), which puts pulses exactly on window boundaries; with a plain
``[start, end)`` rule a nanosecond of error in the origin would move such a
pulse into the previous window. The quarter-period lead keeps boundary pulses a
quarter period inside their window, while a stream whose pulses start a little
after the window (phase offsets up to 3/4 of a period) still has all of its
pulses of ``[start, end)`` in that window.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PulseGrid", "slots_for"]

_NS = 1_000_000_000
_NS2 = 2 * _NS


def slots_for(rate_hz: int, batch_length_ns: int) -> int:
    """Nominal pulses per batch, ``round(rate * length)`` (half up), e.g. 14 Hz x 1 s -> 14."""
    return (2 * rate_hz * batch_length_ns + _NS) // _NS2


@dataclass(frozen=True, slots=True)
class PulseGrid:
    """``origin_ns`` is a real pulse time; ``rate_hz`` is the snapped integer rate.

    ``slots_per_batch`` is the nominal pulse count per batch at the current batch
    length. When ``rate * length`` is integral (the normal case) every window has
    exactly that many slots; otherwise a window's slot count is the number of
    nominal pulse times inside it, which :meth:`index_range` gives exactly.
    """

    origin_ns: int
    rate_hz: int
    slots_per_batch: int

    def __post_init__(self) -> None:
        if self.rate_hz < 1:
            raise ValueError(f"rate_hz must be >= 1, got {self.rate_hz}")
        if self.slots_per_batch < 1:
            raise ValueError(f"slots_per_batch must be >= 1, got {self.slots_per_batch}")

    @property
    def period_ns(self) -> float:
        return _NS / self.rate_hz

    def pulse_index(self, ts_ns: int) -> int:
        """Nearest grid index: ``round((ts - origin) / period)``, ties rounding up.

        The ``+ 1e9`` before the floor division is the half-period of the
        rounding: it is what gives every pulse a jitter budget of period/2.
        """
        return ((ts_ns - self.origin_ns) * 2 * self.rate_hz + _NS) // _NS2

    def pulse_time_ns(self, index: int) -> int:
        """Nominal time of pulse ``index``, floored to whole nanoseconds."""
        return self.origin_ns + (index * _NS) // self.rate_hz

    def first_owned_index(self, t_ns: int) -> int:
        """Smallest index whose nominal time + period/4 is ``>= t_ns`` (exact ceiling).

        ``origin + (i + 1/4) * 1e9 / rate >= t``  <=>  ``i >= (4 (t - origin) rate - 1e9) / 4e9``.
        """
        return -((_NS - 4 * (t_ns - self.origin_ns) * self.rate_hz) // (4 * _NS))

    def index_range(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """Half-open index range ``[lo, hi)`` of pulses owned by window ``[start, end)``."""
        return self.first_owned_index(start_ns), self.first_owned_index(end_ns)

    def slot(self, ts_ns: int, window_start_ns: int) -> int:
        """Slot of a timestamp relative to the window starting at ``window_start_ns``."""
        return self.pulse_index(ts_ns) - self.first_owned_index(window_start_ns)

    def windows_ahead(self, index: int, start_ns: int, batch_length_ns: int) -> int:
        """Whole windows from ``start`` to the window owning pulse ``index`` (exact floor).

        Used by gap recovery to jump the active window straight to the window that
        owns a pulse, with the same ownership rule as :meth:`index_range`.
        """
        num = (4 * index + 1) * _NS + 4 * (self.origin_ns - start_ns) * self.rate_hz
        return num // (4 * self.rate_hz * batch_length_ns)

    def with_batch_length(self, batch_length_ns: int) -> PulseGrid:
        """Same origin and rate, slot count for a new batch length (14 -> 28 for 1 s -> 2 s)."""
        return PulseGrid(self.origin_ns, self.rate_hz, slots_for(self.rate_hz, batch_length_ns))
