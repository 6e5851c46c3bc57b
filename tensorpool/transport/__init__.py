"""Thin layer over pyaeron: media driver lifecycle, publishers, subscribers, agents, idling.

Layout (one job per module):
- ``config``      TransportConfig: which media driver, embedded driver options, client timeouts.
- ``mediadriver`` embedded / standalone Aeron media drivers; ``aeronmd`` is its CLI.
- ``context``     AeronContext: owns the client (and an embedded driver), closes in order.
- ``publication`` Publisher: bounded, counted, non-blocking offers and claims.
- ``subscription`` Subscriber: whole messages to a handler, image events, join times.
- ``agent``       Agent protocol, AgentRunner, CompositeAgent.
- ``idle``        idle strategies (busy spin, yield, sleep, backoff; native wrappers).
- ``channels``    Aeron URI builders and parsers.
- ``clock``       now_ns (CLOCK_MONOTONIC) and a ManualClock for tests.
"""

from tensorpool.transport.agent import Agent, AgentRunner, AgentTermination, CompositeAgent
from tensorpool.transport.channels import ChannelError, ipc_channel, udp_channel
from tensorpool.transport.clock import ManualClock, NanoClock, now_ns
from tensorpool.transport.config import TransportConfig, TransportConfigError
from tensorpool.transport.context import AeronContext, TransportClosed
from tensorpool.transport.idle import (
    BackoffIdleStrategy,
    BusySpinIdleStrategy,
    IdleStrategy,
    NativeIdleStrategy,
    NoOpIdleStrategy,
    SleepingIdleStrategy,
    YieldingIdleStrategy,
    idle_strategy,
)
from tensorpool.transport.mediadriver import MediaDriverError, MediaDriverProcess
from tensorpool.transport.publication import OfferCounters, OfferRejected, Publisher
from tensorpool.transport.subscription import (
    FragmentHandler,
    ImageEvent,
    ImageEventKind,
    Subscriber,
)

__all__ = [
    "AeronContext",
    "Agent",
    "AgentRunner",
    "AgentTermination",
    "BackoffIdleStrategy",
    "BusySpinIdleStrategy",
    "ChannelError",
    "CompositeAgent",
    "FragmentHandler",
    "IdleStrategy",
    "ImageEvent",
    "ImageEventKind",
    "ManualClock",
    "MediaDriverError",
    "MediaDriverProcess",
    "NanoClock",
    "NativeIdleStrategy",
    "NoOpIdleStrategy",
    "OfferCounters",
    "OfferRejected",
    "Publisher",
    "SleepingIdleStrategy",
    "Subscriber",
    "TransportClosed",
    "TransportConfig",
    "TransportConfigError",
    "YieldingIdleStrategy",
    "idle_strategy",
    "ipc_channel",
    "now_ns",
    "udp_channel",
]
