"""The producer's protocol decisions, without I/O (Wire Spec §8, §10, §15; Driver Model §4).

:class:`ProducerCore` is fed decoded control messages, lease events from the
:class:`~tensorpool.client.lease.LeaseMachine`, file-operation outcomes and ``now_ns``
from one monotonic clock; it returns *actions* for the agent
(:class:`~tensorpool.client.producer.Producer`) to execute in list order. It never touches
Aeron, mmap, files, sleeps or clocks, so every rule has a unit test
(tests/unit/client/test_producer_core.py). docs/architecture.md shows where it sits.

Execution contract (the same shape as the driver's, driver/actions.py):

* an ``OpenEpoch`` must be answered, before the agent goes on, with
  :meth:`ProducerCore.on_epoch_opened` or :meth:`ProducerCore.on_epoch_failed`, and the
  actions those return are executed next (the announce that names the new files);
* a ``MapLease`` must be answered with :meth:`ProducerCore.on_mapped` or
  :meth:`ProducerCore.on_map_failed`.

The frame hot path (seqlock write, descriptor) stays in the agent: a call into the core per
frame would cost more than the write. The core owns what happens *around* frames: when to
announce, refresh, send metadata and QoS, how to answer a hello, what a lease event means for
the regions, and when an attach wait gives up.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorpool.client.announce import StreamLayout
from tensorpool.client.lease import (
    Attached,
    AttachFailed,
    LeaseLost,
    is_transient_refusal,
)
from tensorpool.client.per_consumer import (
    CloseConsumerStream,
    ConsumerStreams,
    OpenConsumerStream,
    SendConsumerConfig,
)
from tensorpool.specs.generated import wire
from tensorpool.specs.generated.driver import ResponseCode
from tensorpool.stream_ids import read_request

__all__ = [
    "AttachWait",
    "CloseConsumerStream",
    "ConfirmLease",
    "MapLease",
    "OpenConsumerStream",
    "OpenEpoch",
    "ProducerAction",
    "ProducerCore",
    "PublishAnnounce",
    "PublishMetadata",
    "PublishQos",
    "ReportDriverSilent",
    "RetryStreamLock",
    "SendConsumerConfig",
    "Unmap",
]

_MODES = frozenset(int(m) for m in wire.Mode)
_MODE_STREAM = int(wire.Mode.STREAM)


@dataclass(frozen=True, slots=True)
class PublishAnnounce:
    """Standalone: refresh the superblocks' activity stamp and send ``ShmPoolAnnounce``."""

    now_ns: int


@dataclass(frozen=True, slots=True)
class PublishMetadata:
    """``DataSourceAnnounce`` (and ``DataSourceMeta`` when attributes are set)."""

    now_ns: int


@dataclass(frozen=True, slots=True)
class PublishQos:
    """``QosProducer`` with the current epoch and seq."""

    now_ns: int


@dataclass(frozen=True, slots=True)
class OpenEpoch:
    """Standalone: create a fresh epoch's files and write there (§15.2, #13.4)."""

    reason: str


@dataclass(frozen=True, slots=True)
class RetryStreamLock:
    """After a takeover: try to hold the stream lock now that the old producer may be gone."""


@dataclass(frozen=True, slots=True)
class MapLease:
    """Driver mode: map the regions the driver granted, writable."""

    layout: StreamLayout


@dataclass(frozen=True, slots=True)
class Unmap:
    """Stop writing and unmap the regions now (lease lost, Driver Model §4.9)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ReportDriverSilent:
    """Driver mode: no announce for our stream for a freshness window (§10): tell the lease
    machine, which drops the lease and reattaches."""


@dataclass(frozen=True, slots=True)
class ConfirmLease:
    """Driver mode: the driver announces our stream at a newer epoch than the one our lease
    maps, so it may no longer hold that lease (a revoke we never read: the driver restarted
    or stalled past the lease). Ask it (the lease machine's confirmation probe, #14 §2)
    instead of writing on into an epoch no consumer follows; a forged announce is
    contradicted by the driver and costs nothing (issue #30, soak defect)."""

    announced_epoch: int


ProducerAction = (
    PublishAnnounce
    | PublishMetadata
    | PublishQos
    | SendConsumerConfig
    | OpenConsumerStream
    | CloseConsumerStream
    | OpenEpoch
    | RetryStreamLock
    | MapLease
    | Unmap
    | ReportDriverSilent
    | ConfirmLease
)


class ProducerCore:
    """Cadences, hello and lease reactions of one producer (sans-IO)."""

    def __init__(
        self,
        stream_id: int,
        *,
        driver_mode: bool,
        announce_period_ns: int,
        qos_period_ns: int,
        freshness_ns: int,
        lock_pending: bool = False,
        now_ns: int = 0,
        per_consumer: ConsumerStreams | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.driver_mode = driver_mode
        self._announce_period_ns = announce_period_ns
        self._qos_period_ns = qos_period_ns
        self._freshness_ns = freshness_ns
        self.lock_pending = lock_pending
        """Standalone takeover: running without the stream lock until the old one goes."""
        self.attached = False
        """Regions are installed and may be written."""
        self.map_error: str | None = None
        self.attach_failures: list[AttachFailed] = []
        self._announce_now = False
        self._next_announce_ns = 0
        self._next_qos_ns = 0
        self._last_driver_announce_ns = now_ns
        self._pending: list[ProducerAction] = []
        self.per_consumer = per_consumer
        """Per-consumer descriptor streams, when this producer offers them (§10.1.3)."""
        self._epoch: int | None = None
        """Driver mode: the epoch of the mapped lease (None while not attached)."""

    # --- inputs -------------------------------------------------------------------------------
    def on_consumer_hello(
        self,
        stream_id: int,
        consumer_id: int,
        mode_raw: int,
        now_ns: int,
        *,
        max_rate_hz: int = 0,
        descriptor_channel: str = "",
        descriptor_stream_id: int = 0,
    ) -> None:
        """§10.1.3: a consumer gets an announce now (it maps without waiting a period) and a
        ``ConsumerConfig``: a decline unless this producer offers per-consumer streams and
        one is assigned (:class:`~tensorpool.client.per_consumer.ConsumerStreams`); an
        unknown mode reads as STREAM."""
        if stream_id != self.stream_id:
            return
        self._announce_now = True
        mode = mode_raw if mode_raw in _MODES else _MODE_STREAM
        if self.per_consumer is not None:
            self._pending += self.per_consumer.on_hello(
                consumer_id, mode, max_rate_hz, descriptor_channel, descriptor_stream_id, now_ns
            )
        elif not (
            self.driver_mode
            and read_request(mode, max_rate_hz, descriptor_channel, descriptor_stream_id)
        ):  # in driver mode the driver answers per-consumer requests (Driver Model §11)
            self._pending.append(SendConsumerConfig(consumer_id, mode))

    def on_consumer_config(
        self, stream_id: int, consumer_id: int, channel: str, descriptor_stream_id: int, now_ns: int
    ) -> None:
        """Driver mode: the driver assigned (or declined) a consumer's own stream (Driver
        Model §11); an offering producer follows it."""
        if stream_id == self.stream_id and self.per_consumer is not None:
            self._pending += self.per_consumer.on_config(
                consumer_id, channel, descriptor_stream_id, now_ns
            )

    def on_consumer_qos(self, stream_id: int, consumer_id: int, now_ns: int) -> None:
        """§10.1.3: a consumer's ``QosConsumer`` keeps its per-consumer stream alive."""
        if stream_id == self.stream_id and self.per_consumer is not None:
            self.per_consumer.on_qos(consumer_id, now_ns)

    def on_driver_announce(self, stream_id: int, epoch: int, now_ns: int) -> list[ProducerAction]:
        """Driver mode: an announce for our stream proves the driver alive (§10); one at a
        newer epoch than our lease's says the driver moved the stream on without us."""
        if not self.driver_mode or stream_id != self.stream_id:
            return []
        self._last_driver_announce_ns = now_ns
        if self.attached and self._epoch is not None and epoch > self._epoch:
            return [ConfirmLease(epoch)]
        return []

    def on_lease_events(self, events: list[object], now_ns: int) -> list[ProducerAction]:
        """Driver mode: a granted lease is mapped, a lost one unmapped at once (§4.9)."""
        out: list[ProducerAction] = []
        for ev in events:
            if isinstance(ev, Attached):
                self.attached = False
                out.append(MapLease(ev.layout))
            elif isinstance(ev, LeaseLost):
                self.attached = False
                out.append(Unmap(ev.reason))
            elif isinstance(ev, AttachFailed):
                self.attach_failures.append(ev)
        return out

    def on_mapped(self, epoch: int, now_ns: int) -> None:
        """The lease's regions (of ``epoch``) are mapped: announce metadata for the new epoch
        right away, and count driver liveness from now."""
        self.attached = True
        self._epoch = epoch
        self.map_error = None
        self._last_driver_announce_ns = now_ns
        self._announce_now = True

    def on_map_failed(self, error: str) -> None:
        self.attached = False
        self.map_error = error

    def on_epoch_opened(self, now_ns: int) -> list[ProducerAction]:
        """Standalone: the fresh epoch exists; announce it, then the metadata."""
        self.attached = True
        return self._announce_standalone(now_ns)

    def on_epoch_failed(self, now_ns: int) -> list[ProducerAction]:
        """Standalone: no new epoch (retried at the next announce); metadata still goes out."""
        self.attached = False
        return [PublishMetadata(now_ns)]

    def on_stream_lock(self, held: bool) -> None:
        if held:
            self.lock_pending = False

    def closed(self) -> None:
        self.attached = False

    def request_announce(self) -> None:
        """Announce (and send metadata) at the next :meth:`tick`, whatever the period says."""
        self._announce_now = True

    # --- timers -------------------------------------------------------------------------------
    def announce_due(self, now_ns: int) -> bool:
        """Whether the next :meth:`tick` announces (the agent checks the files only then)."""
        return self._announce_now or now_ns >= self._next_announce_ns

    def tick(self, now_ns: int, *, regions_truncated: bool = False) -> list[ProducerAction]:
        """Periodic duties. ``regions_truncated``: a region file shrank under us (#13.4)."""
        out: list[ProducerAction] = []
        if (
            self.driver_mode
            and self.attached
            and now_ns - self._last_driver_announce_ns > self._freshness_ns
        ):  # no announce for our stream: the driver died without notice (§10)
            self._last_driver_announce_ns = now_ns
            out.append(ReportDriverSilent())
        if self.per_consumer is not None:
            self._pending += self.per_consumer.tick(now_ns)
        if self._pending:
            out += self._pending
            self._pending = []
        if self.announce_due(now_ns):
            self._announce_now = False
            self._next_announce_ns = now_ns + self._announce_period_ns
            if self.driver_mode:  # the driver announces its regions (Driver Model §8)
                out.append(PublishMetadata(now_ns))
            elif not self.attached or regions_truncated:
                self.attached = False
                out.append(OpenEpoch("region_truncated" if regions_truncated else "no_regions"))
            else:
                out += self._announce_standalone(now_ns)
        if now_ns >= self._next_qos_ns:
            self._next_qos_ns = now_ns + self._qos_period_ns
            out.append(PublishQos(now_ns))
        return out

    def _announce_standalone(self, now_ns: int) -> list[ProducerAction]:
        out: list[ProducerAction] = [PublishAnnounce(now_ns)]
        if self.lock_pending:
            out.append(RetryStreamLock())
        out.append(PublishMetadata(now_ns))
        return out


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code}"


class AttachWait:
    """When a blocking wait for the producer's lease gives up, and with which message (#13.3).

    A refusal because the stream's producer lease is still held (a crashed predecessor's, which
    the driver expires after its keepalive grace) is waited out until the deadline when
    ``wait_for_held_lease``; any other refusal ends the wait at once.
    """

    def __init__(
        self, stream_id: int, timeout_ns: int, now_ns: int, *, wait_for_held_lease: bool = True
    ) -> None:
        self.stream_id = stream_id
        self.timeout_ns = timeout_ns
        self.deadline_ns = now_ns + timeout_ns
        self.wait_for_held_lease = wait_for_held_lease
        self.refusal = ""
        self.waiting_since_ns: int | None = None
        #: the deadline passed with no answer at all from the driver (not a refusal, not an
        #: unmappable grant): it may be stalled, and may still grant the requests it holds
        self.unanswered = False

    def on_failure(self, failure: AttachFailed, now_ns: int) -> tuple[str | None, str | None]:
        """Returns ``(fatal, note)``: an error message that ends the wait, and a message to log
        once when the wait starts waiting out a held lease."""
        if failure.code is None:
            return None, None  # a timeout or protocol error: the machine retries
        self.refusal = (
            f"driver refused producer attach for stream {self.stream_id}: "
            f"{_code_name(failure.code)} {failure.message}".rstrip()
        )
        if not (self.wait_for_held_lease and is_transient_refusal(failure.code, failure.message)):
            return self.refusal, None
        if self.waiting_since_ns is not None:
            return None, None
        self.waiting_since_ns = now_ns
        left_s = max(0, self.deadline_ns - now_ns) / 1e9
        return None, (
            f"producer stream {self.stream_id}: the driver says {failure.message!r}; a crashed "
            f"producer's lease expires by itself: retrying until then, for up to {left_s:.0f} s "
            "(attach timeout)"
        )

    def expired(self, now_ns: int, map_error: str | None) -> str | None:
        """The error message once the deadline passed (None before)."""
        if now_ns <= self.deadline_ns:
            return None
        timeout_s = self.timeout_ns / 1e9
        if self.refusal:
            return f"{self.refusal}; still refused after {timeout_s:g} s (attach timeout)"
        if map_error is not None:
            return (
                f"attached to stream {self.stream_id} but cannot map the driver's regions: "
                f"{map_error} (is the driver's shm base dir among this client's allowed base "
                "dirs?)"
            )
        self.unanswered = True
        return (
            f"no attach response from the driver for stream {self.stream_id} within "
            f"{timeout_s:g} s (is `tensorpool driver` running?)"
        )
