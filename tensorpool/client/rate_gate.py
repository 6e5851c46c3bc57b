"""The rate gate: which frame to take, and when (RateLimiter Spec §4, §7; Wire Spec §11).

One rate grid serves both users: the rate limiter (which republishes the newest source frame
per slot) and a ``RATE_LIMITED`` consumer (which drops frames above ``max_rate_hz`` locally,
using only :meth:`RateGate.is_open` / :meth:`RateGate.published`). It lives in ``client/`` so
the consumer core can use it without importing the rate limiter (an agent above ``client``).

Sans-IO: inputs are source frames (opaque items), remap boundaries, ``ConsumerHello``
rate requests and ``now_ns``; outputs are "publish this item now" decisions. The agent
reports back whether the publish worked (:meth:`RateGate.published`), because only a
frame that really reached the destination uses up a rate slot.

Model
-----
* **Rate slots on a fixed grid.** With rate ``r`` the gate opens slot ``k`` at
  ``anchor + ceil(k * 1e9 / r)`` ns. The grid is anchored by the first publish after start,
  remap or rate change; that first frame is eligible immediately (§4). A publish at time
  ``t`` uses up the slot that contains ``t`` and the next slot opens at the following grid
  point — not at ``t + period`` — so a late wake-up (idle strategy, scheduler) does not push
  every later slot back: a steady 1 kHz source limited to 30 Hz gets 30 frames per second,
  not 29.x. Slots missed while nothing was pending are skipped, never caught up in a burst;
  at most one frame per grid interval, so any one-second window holds at most ``r + 1``.
* **Most recent frame wins.** Between slots the newest frame replaces the pending one in a
  one-slot ``latest_by_key`` :class:`~tensorpool.ingest.IngressBuffer`. :meth:`offer` never
  publishes a rate-limited frame itself; the agent first drains every descriptor Aeron has
  for it and only then asks :meth:`poll`, so when a slot opens the frame published is the
  most recent one available, not the first one that arrived after the slot opened.
* **Unlimited** (rate 0): every frame is published as it arrives (:meth:`offer` returns it);
  nothing is held.
* **Authoritative rate** (§4): a ``ConsumerHello`` from the destination's consumer with
  ``mode=RATE_LIMITED`` sets the rate (0 = unlimited). Wire Spec §11 makes ``max_rate_hz``
  authoritative only in that mode, so a ``STREAM`` hello asks for nothing and the fallback
  (mapping's ``max_rate_hz``, else the global one) stays. No aggregation across consumers:
  the most recent request wins, whoever sent it (the rate limiter runs per consumer).
* **Resets** (§4, §7): :meth:`reset` — on start, on a source epoch change or remap, on a
  destination epoch change — drops the pending frame (in-flight frames of the old epoch
  are gone) and makes the next frame eligible immediately.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from tensorpool.ingest import IngressBuffer

__all__ = [
    "MODE_RATE_LIMITED",
    "MODE_STREAM",
    "NULL_RATE",
    "GateStats",
    "RateGate",
    "idle_hint_ns",
]

MODE_STREAM: Final = 1
MODE_RATE_LIMITED: Final = 2
#: A uint32 ``max_rate_hz`` of all ones is the SBE null value: treated as "no request".
NULL_RATE: Final = 0xFFFF_FFFF
_SEC: Final = 1_000_000_000


def _single_key(_item: object) -> Hashable:
    return 0


@dataclass(slots=True)
class GateStats:
    """What the gate decided, for QoS/inspect-style reporting."""

    offered: int = 0
    published: int = 0
    superseded: int = 0
    """Pending frames replaced by a newer one before their slot opened (throttled away)."""
    discarded_on_reset: int = 0
    """Pending frames dropped at a remap boundary (§7)."""
    resets: int = 0
    rate_changes: int = 0


class RateGate[T]:
    """One mapping's rate policy and its pending frame (use from one thread)."""

    __slots__ = (
        "_anchor",
        "_box",
        "_fallback",
        "_hello_rate",
        "_k",
        "_last_publish",
        "_next",
        "_pending",
        "_rate",
        "hello_consumer_id",
        "stats",
    )

    def __init__(self, fallback_rate_hz: int, *, name: str = "ratelimiter.pending") -> None:
        if fallback_rate_hz < 0:
            raise ValueError(f"fallback_rate_hz must be >= 0, got {fallback_rate_hz}")
        self._fallback = fallback_rate_hz
        self._hello_rate: int | None = None
        self.hello_consumer_id: int | None = None
        self._rate = fallback_rate_hz
        self._pending = IngressBuffer(name, mode="latest_by_key", capacity=1, key=_single_key)
        self._box: list[T] = []
        self._anchor: int | None = None  # None: the next frame is eligible immediately
        self._k = 0
        self._next = 0
        self._last_publish: int | None = None
        self.stats = GateStats()

    # --- policy -----------------------------------------------------------------------------
    @property
    def rate_hz(self) -> int:
        """The rate in force (0 = unlimited)."""
        return self._rate

    @property
    def fallback_rate_hz(self) -> int:
        return self._fallback

    @property
    def hello_rate_hz(self) -> int | None:
        """The rate the destination's consumer asked for, if any."""
        return self._hello_rate

    def on_consumer_hello(self, consumer_id: int, mode: int, max_rate_hz: int) -> bool:
        """Apply a destination consumer's ``ConsumerHello``; True if the rate changed."""
        if mode != MODE_RATE_LIMITED or max_rate_hz == NULL_RATE:
            return False  # no rate request (§11: authoritative only when RATE_LIMITED)
        self._hello_rate = max_rate_hz
        self.hello_consumer_id = consumer_id
        return self._set_rate(max_rate_hz)

    def set_fallback_rate(self, rate_hz: int) -> bool:
        """Change the configured fallback; in force only while no consumer asked for a rate."""
        if rate_hz < 0:
            raise ValueError(f"rate_hz must be >= 0, got {rate_hz}")
        self._fallback = rate_hz
        return self._hello_rate is None and self._set_rate(rate_hz)

    def _set_rate(self, rate: int) -> bool:
        if rate == self._rate:
            return False
        self._rate = rate
        self.stats.rate_changes += 1
        # Re-anchor: the next slot is one new period after the last publish (or right away).
        if rate and self._last_publish is not None:
            self._anchor = self._last_publish
            self._k = 1
            self._next = self._last_publish + -(-_SEC // rate)
        else:
            self._anchor = None
        return True

    # --- frames -----------------------------------------------------------------------------
    def offer(self, item: T, now_ns: int) -> T | None:
        """A source frame arrived. Returns it when it must be published now (unlimited mode);
        otherwise it becomes the pending frame (replacing an older one) and None is returned."""
        self.stats.offered += 1
        if not self._rate:
            return item
        pending = self._pending
        if pending.pending:
            self.stats.superseded += 1
        pending.ingest(item)
        return None

    def is_open(self, now_ns: int) -> bool:
        """True if a frame offered now would be published (the current slot is unused)."""
        return not self._rate or self._anchor is None or now_ns >= self._next

    def poll(self, now_ns: int) -> T | None:
        """The pending frame, if its slot is open now; the caller publishes it and then calls
        :meth:`published` (success) — on failure the slot stays open for the next frame."""
        pending = self._pending
        if not pending.pending:
            return None
        if self._rate and self._anchor is not None and now_ns < self._next:
            return None
        box = self._box
        pending.drain(1, box.append)
        return box.pop() if box else None

    def published(self, now_ns: int) -> None:
        """A frame reached the destination at ``now_ns``: use up the current slot."""
        self.stats.published += 1
        self._last_publish = now_ns
        rate = self._rate
        if not rate:
            return
        anchor = self._anchor
        if anchor is None:
            self._anchor = now_ns
            self._k = 1
            self._next = now_ns + -(-_SEC // rate)
            return
        # Slot c contains now; the next one opens at grid point c + 1 (strictly after now).
        k = (now_ns - anchor) * rate // _SEC + 1
        self._k = k
        self._next = anchor + -(-k * _SEC // rate)

    def take(self, now_ns: int, early_ns: int = 0) -> bool:
        """For a local drop policy (a ``RATE_LIMITED`` consumer, Wire Spec §11): True -- and
        the slot is used up -- if a frame arriving at ``now_ns`` may pass. A frame up to
        ``early_ns`` before its slot opens takes that slot (arrival jitter), so a source at
        exactly the limit is not halved; the grid itself never moves."""
        if not self._rate:
            return True
        if self._anchor is not None:
            if now_ns + early_ns < self._next:
                return False
            now_ns = max(now_ns, self._next)
        self.published(now_ns)
        return True

    def opens_at_ns(self, now_ns: int) -> int | None:
        """When the next slot opens, or None if it is open now (or there is no limit).

        An agent may sleep until then: descriptors wait in the Aeron log meanwhile, and the
        newest of them is the one published when it wakes.
        """
        if not self._rate or self._anchor is None or now_ns >= self._next:
            return None
        return self._next

    def next_slot_ns(self) -> int | None:
        """When a pending frame becomes publishable (None: nothing pending or no limit)."""
        if not self._pending.pending or not self._rate or self._anchor is None:
            return None
        return self._next

    @property
    def has_pending(self) -> bool:
        return self._pending.pending > 0

    def reset(self, now_ns: int) -> int:
        """Remap boundary (start, source epoch change, destination epoch change): drop the
        pending frame and make the next frame eligible at once. Returns frames dropped."""
        dropped = self.discard_pending()
        self.stats.discarded_on_reset += dropped
        self.stats.resets += 1
        self._anchor = None
        self._last_publish = None
        return dropped

    def discard_pending(self) -> int:
        """Forget the pending frame without touching the timer; returns frames dropped."""
        pending = self._pending
        if not pending.pending:
            return 0
        box = self._box
        pending.drain(1, box.append)
        n = len(box)
        box.clear()
        return n

    @property
    def buffer(self) -> IngressBuffer:
        """The pending-frame buffer (for its metrics)."""
        return self._pending


def idle_hint_ns(gates: Iterable[RateGate[Any]], now_ns: int, max_sleep_ns: int) -> int:
    """How long an agent owning ``gates`` may sleep: until the earliest next slot, at most
    ``max_sleep_ns``; 0 when a gate is open now or unlimited (poll actively then)."""
    hint = max_sleep_ns
    for gate in gates:
        opens = gate.opens_at_ns(now_ns)
        if opens is None:
            return 0
        hint = min(hint, opens - now_ns)
    return max(hint, 0)
