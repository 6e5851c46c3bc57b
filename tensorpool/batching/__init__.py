"""Pulse-aligned batching across streams (seed 000), host-agnostic.

:class:`RateAwareMessageBatcher` cuts ``(stream_id, timestamp_ns, item)`` traffic
into windows that close when every gating stream has delivered the last pulse slot
of the window, instead of after N messages or at a wall-clock tick. It imports
nothing of tensorpool's I/O (no Aeron, no shared memory) and never reads a clock;
the model, invariants and contract departures are documented in
:mod:`tensorpool.batching.batcher`.
"""

from .batcher import (
    ABSENT_BATCHES_FOR_EVICTION,
    DEFAULT_TIMEOUT_FACTOR,
    HOLD_BATCHES,
    INITIAL_RATE_CONFIRMATIONS,
    MAX_ORIGIN_OFFSET_BATCHES,
    RATE_CHANGE_CONFIRMATIONS,
    SNAPSHOT_VERSION,
    Batch,
    CloseReason,
    RateAwareMessageBatcher,
)
from .estimator import DIFF_RING_SIZE, MIN_DIFFS_FOR_GATE, StreamPeriodEstimator
from .grid import PulseGrid, slots_for

__all__ = [
    "ABSENT_BATCHES_FOR_EVICTION",
    "DEFAULT_TIMEOUT_FACTOR",
    "DIFF_RING_SIZE",
    "HOLD_BATCHES",
    "INITIAL_RATE_CONFIRMATIONS",
    "MAX_ORIGIN_OFFSET_BATCHES",
    "MIN_DIFFS_FOR_GATE",
    "RATE_CHANGE_CONFIRMATIONS",
    "SNAPSHOT_VERSION",
    "Batch",
    "CloseReason",
    "PulseGrid",
    "RateAwareMessageBatcher",
    "StreamPeriodEstimator",
    "slots_for",
]
