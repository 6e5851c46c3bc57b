"""Traffic generators shared by the batching tests (seconds in, integer ns out)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tensorpool.batching import Batch, RateAwareMessageBatcher

S = 1_000_000_000
#: A realistic epoch (2023-11-14) so that "43 years ago" is still a positive timestamp.
T0 = 1_700_000_000 * S

Msg = tuple[str, int, str]


def at(seconds: float) -> int:
    """Timestamp ``seconds`` after T0, in ns."""
    return T0 + round(seconds * S)


def pulses(sid: str, rate_hz: int, start_s: float, end_s: float, phase_s: float = 0.0) -> list[Msg]:
    """Exact pulses ``T0 + phase + i/rate`` with time in ``[start, end)``; items are unique."""
    out: list[Msg] = []
    i = 0
    origin = T0 + round(phase_s * S)
    lo, hi = at(start_s), at(end_s)
    # First index at or after lo: integer ceiling on exact pulse times.
    i = -((origin - lo) * rate_hz // S)
    while True:
        ts = origin + (i * S) // rate_hz
        if ts >= hi:
            return out
        if ts >= lo:
            out.append((sid, ts, f"{sid}#{i}"))
        i += 1


def merge(*streams: Iterable[Msg]) -> list[Msg]:
    """Arrival order = timestamp order (stable: ties keep argument order)."""
    merged = [m for s in streams for m in s]
    merged.sort(key=lambda m: m[1])
    return merged


def feed_each(b: RateAwareMessageBatcher[str, str], msgs: Sequence[Msg]) -> list[Batch[str, str]]:
    """One poll per message: the batcher sees every message as its own chunk."""
    out: list[Batch[str, str]] = []
    for m in msgs:
        out.extend(b.feed([m]))
    return out


def close_points(
    b: RateAwareMessageBatcher[str, str], msgs: Sequence[Msg]
) -> tuple[list[int], list[Batch[str, str]]]:
    """One poll per message; indices of the polls that closed a batch, and the batches."""
    points: list[int] = []
    batches: list[Batch[str, str]] = []
    for i, m in enumerate(msgs):
        closed = b.feed([m])
        if closed:
            points.append(i)
            batches.extend(closed)
    return points, batches


def converged(
    rates: dict[str, int],
    *,
    gated: Iterable[str] | None = None,
    warm_s: int = 2,
    phases: dict[str, float] | None = None,
    batch_s: int = 1,
) -> tuple[RateAwareMessageBatcher[str, str], list[Batch[str, str]]]:
    """A batcher anchored at T0 - 1 s that has seen exact pulses from -1 s to ``warm_s``.

    The first two windows close on timeout (the rate must be estimated twice, at
    two closes, before a grid is built) and the streams gate from then on; on
    return the active window is ``[warm_s, warm_s + batch_s)``.
    """
    phases = phases or {}
    b: RateAwareMessageBatcher[str, str] = RateAwareMessageBatcher(
        batch_s * S, gated=set(rates) if gated is None else set(gated), start_ns=at(-1)
    )
    traffic = merge(*(pulses(sid, r, -1, warm_s, phases.get(sid, 0.0)) for sid, r in rates.items()))
    batches = b.feed(traffic)
    return b, batches


def delivered(batches: Iterable[Batch[str, str]]) -> list[str]:
    return [item for batch in batches for msgs in batch.messages.values() for _, item in msgs]
