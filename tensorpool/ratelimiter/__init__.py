"""The rate limiter (RateLimiter Spec v1.0): a fast stream, republished slower for one consumer.

A GUI, a Spark job or a recorder often wants a 1 kHz stream at 10-30 Hz. One rate limiter
instance per consumer consumes the source stream, keeps the most recent frame, and when the
next rate slot opens re-materializes it into the destination stream's own SHM pools and
publishes a ``FrameDescriptor`` for it. The destination is a normal tensorpool stream with
the rate limiter as its only producer (§3), so consumers need nothing special.

Layers (sans-IO cores, thin I/O shells):

``config``   TOML -> :class:`RateLimiterConfig` (§8), fail-fast rules included.
``gate``     :class:`RateGate`: rate slots on a drift-free grid, most-recent-frame selection,
             ``ConsumerHello`` authority, resets at remap boundaries (§4, §7). Pure.
``forward``  :class:`Forwarder`: metadata / progress / QoS rewritten for the destination
             (§6, §6.1). Pure.
``relay``    :class:`MappingRelay`: one mapping's source consumer, gate and destination
             producer; re-materialization and drop accounting (§5).
``agent``    :class:`RateLimiterAgent`: all mappings plus the hello / forwarding streams on
             one duty cycle; ``tensorpool ratelimiter`` runs it.

Sequence identity (§4): a destination frame carries its source's seq (descriptor and
``seq_commit >> 1``), so frames that were throttled or dropped show as gaps downstream.
"""

from tensorpool.ratelimiter.config import (
    ConfigError,
    DriverAccess,
    MappingConfig,
    RateLimiterConfig,
    load_ratelimiter_config,
    parse_ratelimiter_config,
)
from tensorpool.ratelimiter.forward import Forwarder, Route
from tensorpool.ratelimiter.gate import GateStats, RateGate

__all__ = [
    "ConfigError",
    "DriverAccess",
    "Forwarder",
    "GateStats",
    "MappingConfig",
    "MappingRelay",
    "RateGate",
    "RateLimiterAgent",
    "RateLimiterConfig",
    "Route",
    "load_ratelimiter_config",
    "parse_ratelimiter_config",
]


def __getattr__(name: str) -> object:
    # The I/O layers import pyaeron; load them only when asked for.
    if name == "RateLimiterAgent":
        from tensorpool.ratelimiter.agent import RateLimiterAgent

        return RateLimiterAgent
    if name == "MappingRelay":
        from tensorpool.ratelimiter.relay import MappingRelay

        return MappingRelay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
