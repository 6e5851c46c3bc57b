"""Thin layer over pyaeron: media driver lifecycle, publishers, subscribers, agents, idling.

Layout (one job per module):
- ``config``      TransportConfig: which media driver, embedded driver options, client timeouts.
- ``mediadriver`` embedded / standalone Aeron media drivers; ``aeronmd`` is its CLI.
- ``context``     AeronContext: owns the client (and an embedded driver), closes in order.
- ``publication`` Publisher: bounded, counted, non-blocking offers and claims.
- ``subscription`` Subscriber: whole messages to a handler, image events, join times.
- ``agent``       Agent protocol, AgentRunner, CompositeAgent.
- ``idle``        idle strategies (busy spin, yield, sleep, backoff; native wrappers).
- ``wakeup``      SemaphoreIdleStrategy / WakePoster: an idle consumer blocks on its own POSIX
                  named semaphore; the producer posts it after each descriptor (posix-ipc).
- ``channels``    Aeron URI builders and parsers.
- ``clock``       now_ns (CLOCK_MONOTONIC) and a ManualClock for tests.

Names are re-exported lazily (PEP 562): importing a light module such as
``tensorpool.transport.config`` must not load pyaeron, so `tensorpool tap --hex` and
`tensorpool inspect` start fast.
"""

from tensorpool.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "AeronContext": "tensorpool.transport.context",
    "Agent": "tensorpool.transport.agent",
    "AgentRunner": "tensorpool.transport.agent",
    "AgentTermination": "tensorpool.transport.agent",
    "BackoffIdleStrategy": "tensorpool.transport.idle",
    "BusySpinIdleStrategy": "tensorpool.transport.idle",
    "ChannelError": "tensorpool.transport.channels",
    "CompositeAgent": "tensorpool.transport.agent",
    "FragmentHandler": "tensorpool.transport.subscription",
    "IdleStrategy": "tensorpool.transport.idle",
    "ImageEvent": "tensorpool.transport.subscription",
    "ImageEventKind": "tensorpool.transport.subscription",
    "ManualClock": "tensorpool.transport.clock",
    "MediaDriverError": "tensorpool.transport.mediadriver",
    "MediaDriverProcess": "tensorpool.transport.mediadriver",
    "NanoClock": "tensorpool.transport.clock",
    "NativeIdleStrategy": "tensorpool.transport.idle",
    "NoOpIdleStrategy": "tensorpool.transport.idle",
    "OfferCounters": "tensorpool.transport.publication",
    "OfferRejected": "tensorpool.transport.publication",
    "Publisher": "tensorpool.transport.publication",
    "SleepingIdleStrategy": "tensorpool.transport.idle",
    "Subscriber": "tensorpool.transport.subscription",
    "TransportClosed": "tensorpool.transport.context",
    "TransportConfig": "tensorpool.transport.config",
    "TransportConfigError": "tensorpool.transport.config",
    "YieldingIdleStrategy": "tensorpool.transport.idle",
    "SemaphoreIdleStrategy": "tensorpool.transport.wakeup",
    "WakePoster": "tensorpool.transport.wakeup",
    "idle_strategy": "tensorpool.transport.idle",
    "ipc_channel": "tensorpool.transport.channels",
    "now_ns": "tensorpool.transport.clock",
    "udp_channel": "tensorpool.transport.channels",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


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
    "SemaphoreIdleStrategy",
    "SleepingIdleStrategy",
    "Subscriber",
    "TransportClosed",
    "TransportConfig",
    "TransportConfigError",
    "WakePoster",
    "YieldingIdleStrategy",
    "idle_strategy",
    "ipc_channel",
    "now_ns",
    "udp_channel",
]
