"""The rate gate of the rate limiter (RateLimiter Spec §4, §7).

The grid itself lives in :mod:`tensorpool.client.rate_gate`, shared with the consumer's local
``RATE_LIMITED`` drop (one grid, #14 section 1); this module is the rate limiter's name for it.
"""

from __future__ import annotations

from tensorpool.client.rate_gate import (
    MODE_RATE_LIMITED,
    MODE_STREAM,
    NULL_RATE,
    GateStats,
    RateGate,
    idle_hint_ns,
)

__all__ = [
    "MODE_RATE_LIMITED",
    "MODE_STREAM",
    "NULL_RATE",
    "GateStats",
    "RateGate",
    "idle_hint_ns",
]
