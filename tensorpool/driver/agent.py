"""The SHM driver agent: the I/O shell around the sans-IO ``DriverCore``.

One duty cycle (:meth:`DriverAgent.do_work`, run by an :class:`~tensorpool.transport.AgentRunner`
with a backoff idle strategy, so an idle driver sleeps instead of spinning):

1. retry messages that back-pressure left in the outbox (order per publication is kept, so a
   ``ShmLeaseRevoked`` can never be overtaken by the epoch-bumped announce, §4.9);
2. poll the control stream (Driver Model §4.5). Every message is classified by its 8-byte
   header: schema 901 requests are decoded with the generated flyweights and handed to the
   core; the driver's own outputs echoed back on the shared stream, and wire/bridge traffic,
   are skipped; anything else is counted under a stable reason and logged at exponentially
   spaced counts. A request that cannot be decoded never crashes the driver: if its
   ``correlationId`` is readable it is answered (``UNSUPPORTED`` for a newer schema version,
   §4.4a; ``INVALID_PARAMS`` for a malformed body, §4.6), otherwise it is dropped and counted;
3. run ``core.tick(now)`` when the core's next deadline has come (lease expiry sweep,
   periodic announces, epoch GC, end of the shutdown drain);
4. rewrite the status file once per announce period (:mod:`tensorpool.driver.status`).

Actions returned by the core are executed in order (contract in :mod:`tensorpool.driver.actions`):
messages are encoded into one scratch buffer and offered; ``CreateRegions`` is performed by
:class:`~tensorpool.driver.regions.RegionFiles` and answered at once with
``on_regions_ready``/``on_regions_failed``, whose actions run next; on "out of space" the
epoch GC is run once (``core.reclaim_space``) and creation retried (EPOCH_GC_POLICY); a failed
``mlock`` is fatal (§17) and starts a shutdown with reason ``ERROR``. Each attach request is
handed to the core with the free bytes of ``shm.base_dir`` (``statvfs``), so the core can keep
room for the configured streams when an attach would create a dynamic stream (issue #13.5);
``ReclaimStream`` unmaps and deletes an idle dynamic stream's epochs. Every ``ShmPoolAnnounce``
also refreshes the superblock activity timestamps of that stream's regions, so the files stay
live at the announce cadence even without a producer (§3).

Shutdown: :meth:`request_shutdown` (signal handlers call it; it only sets a flag) starts the
core's drain (§4.13); once ``ShmDriverShutdown`` has been offered the agent lingers briefly —
still polling, still flushing the outbox — so the notice reaches subscribers before the
daemon closes its Aeron client, then ends the runner with ``AgentTermination``.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tensorpool.counters import LatencyHistogram
from tensorpool.driver.actions import (
    Action,
    CreateRegions,
    PublishAnnounce,
    PublishLeaseRevoked,
    PublishShutdown,
    ReclaimStream,
    RetireEpoch,
    SendAttachResponse,
    SendConsumerConfig,
    SendDetachResponse,
    cap_error_message,
)
from tensorpool.driver.config import DriverConfig
from tensorpool.driver.core import (
    TEMPLATE_ATTACH_REQUEST,
    TEMPLATE_DETACH_REQUEST,
    DriverCore,
    DriverState,
)
from tensorpool.driver.regions import RegionError, RegionFiles
from tensorpool.driver.status import build_status_document, write_status
from tensorpool.specs import (
    BRIDGE_SCHEMA_ID,
    DRIVER_SCHEMA_ID,
    WIRE_SCHEMA_ID,
    BufferTooSmall,
    CodecError,
    UnsupportedVersion,
    peek_header,
)
from tensorpool.specs.generated import driver as drv
from tensorpool.specs.generated import wire
from tensorpool.stream_ids import consumer_config_fields
from tensorpool.transport.agent import AgentTermination
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext
from tensorpool.transport.publication import Publisher
from tensorpool.transport.subscription import Subscriber

__all__ = ["DEFAULT_LINGER_NS", "DriverAgent", "log_event"]

log = logging.getLogger("tensorpool.driver")

#: How long the agent keeps polling after ``ShmDriverShutdown`` before it lets the daemon close.
DEFAULT_LINGER_NS = 200_000_000
#: Upper bound of messages kept for retry under back-pressure (per agent).
OUTBOX_LIMIT = 65_536
_MAX_SCRATCH = 16 * 1024 * 1024
_CORRELATION = struct.Struct("<q")
_CORRELATION_OFFSET = 8  # first field, right after the message header
_MIN_STATUS_PERIOD_NS = 50_000_000
_HEADER_LENGTH = 8
#: ShmAttachResponse fixed block (after the 8-byte header), in schema order: correlationId,
#: code, leaseId, leaseExpiryTimestampNs, streamId, epoch, layoutVersion, headerNslots,
#: headerSlotBytes, maxDims (51 bytes = the schema's blockLength).
_ATTACH_BLOCK = struct.Struct("<qiQQIQIIHB")
if _ATTACH_BLOCK.size != drv.ShmAttachResponseDecoder.BLOCK_LENGTH:  # pragma: no cover
    raise ImportError("ShmAttachResponse block layout changed: update _ATTACH_BLOCK")

_TEMPLATE_KEEPALIVE = drv.ShmLeaseKeepaliveDecoder.TEMPLATE_ID
_TEMPLATE_SHUTDOWN_REQUEST = drv.ShmDriverShutdownRequestDecoder.TEMPLATE_ID
#: Messages only a driver sends: seen here because the driver subscribes to its own stream.
_DRIVER_OUTPUTS = frozenset(
    {
        drv.ShmAttachResponseDecoder.TEMPLATE_ID,
        drv.ShmDetachResponseDecoder.TEMPLATE_ID,
        drv.ShmDriverShutdownDecoder.TEMPLATE_ID,
        drv.ShmLeaseRevokedDecoder.TEMPLATE_ID,
    }
)
_OTHER_SCHEMAS = frozenset({WIRE_SCHEMA_ID, BRIDGE_SCHEMA_ID})
_TEMPLATE_CONSUMER_HELLO = wire.ConsumerHelloDecoder.TEMPLATE_ID
#: The requests that always get an answer, by template id (counter and log names).
_REQUEST_NAMES = {TEMPLATE_ATTACH_REQUEST: "attach", TEMPLATE_DETACH_REQUEST: "detach"}


def _error_response(
    template_id: int, correlation_id: int, code: drv.ResponseCode, message: str
) -> SendAttachResponse | SendDetachResponse:
    """The failure answer to an attach or detach request."""
    if template_id == TEMPLATE_ATTACH_REQUEST:
        return SendAttachResponse(correlation_id, code, error_message=message)
    return SendDetachResponse(correlation_id, code, message)


def log_event(level: int, event: str, **fields: object) -> None:
    """One structured log record: ``event k=v ...`` text, fields also attached for JSON output."""
    if log.isEnabledFor(level):
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        log.log(level, "%s %s", event, text, extra={"event": event, "fields": fields})


class DriverAgent:
    """Control-plane loop of one SHM driver (single thread; see the module docstring)."""

    role_name = "tensorpool-shm-driver"

    def __init__(
        self,
        config: DriverConfig,
        ctx: AeronContext,
        core: DriverCore,
        files: RegionFiles,
        *,
        clock: NanoClock = now_ns,
        realtime: Callable[[], int] = time.time_ns,
        status_file: str | None = None,
        aeron_dir: str = "",
        linger_ns: int = DEFAULT_LINGER_NS,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.config = config
        self.core = core
        self.files = files
        self.counters: Counter[str] = Counter()
        #: request received -> handled (response sent or queued, regions created): #19.1
        self.attach_latency = LatencyHistogram()
        self.exit_code = 0
        self._ctx = ctx
        self._clock = clock
        self._realtime = realtime
        self._status_file = status_file
        self._aeron_dir = aeron_dir
        self._linger_ns = linger_ns
        self._connect_timeout_s = connect_timeout_s
        self._started_unix_ns = realtime()
        self._status_period_ns = max(config.policies.announce_period_ns, _MIN_STATUS_PERIOD_NS)
        # Whoever may use the SHM files may read the status (no secrets in it).
        self._status_mode = config.shm.permissions_mode | 0o400
        self._next_status_ns = 0
        self._buf = bytearray(64 * 1024)
        self._outbox: dict[Publisher, deque[bytes]] = {}
        self._outbox_size = 0
        self._ok_templates: dict[tuple[int, int], tuple[object, bytes]] = {}
        self._shutdown_request: tuple[drv.ShutdownReason, str] | None = None
        self._force_stop = False
        self._terminate_at: int | None = None
        self._attach_dec = drv.ShmAttachRequestDecoder()
        self._detach_dec = drv.ShmDetachRequestDecoder()
        self._keepalive_dec = drv.ShmLeaseKeepaliveDecoder()
        self._shutdown_dec = drv.ShmDriverShutdownRequestDecoder()
        self._hello_dec = wire.ConsumerHelloDecoder()
        self._handlers: dict[int, Callable[[Any, int, int], None]] = {
            TEMPLATE_ATTACH_REQUEST: self._on_attach,
            TEMPLATE_DETACH_REQUEST: self._on_detach,
            _TEMPLATE_KEEPALIVE: self._on_keepalive,
            _TEMPLATE_SHUTDOWN_REQUEST: self._on_shutdown_request,
        }
        self._control_pub: Publisher | None = None
        self._announce_pub: Publisher | None = None
        self._sub: Subscriber | None = None
        self.runner_health: Callable[[], Mapping[str, object]] | None = None
        """The runner's health record (#26.3), written into the status file as ``runtime``."""

    # ------------------------------------------------------------------ lifecycle

    def on_start(self) -> None:
        d = self.config.driver
        ctx = self._ctx
        self._control_pub = ctx.add_publication(d.control_channel, d.control_stream_id)
        if (d.announce_channel, d.announce_stream_id) == (d.control_channel, d.control_stream_id):
            self._announce_pub = self._control_pub  # one session: revocation-then-announce order
        else:
            self._announce_pub = ctx.add_publication(d.announce_channel, d.announce_stream_id)
        self._sub = ctx.add_subscription(
            d.control_channel, d.control_stream_id, self._on_control, fragment_limit=64
        )
        # The driver's own subscription is what connects the control publication; without
        # it the first responses would be dropped as NOT_CONNECTED.
        if not self._control_pub.await_connected(self._connect_timeout_s):
            log_event(logging.WARNING, "control_not_connected", channel=d.control_channel)
        now = self._clock()
        self._execute(self.core.startup_gc(now), now)
        self._write_status(now)
        log_event(
            logging.INFO,
            "driver_ready",
            instance=d.instance_id,
            aeron_dir=self._aeron_dir,
            control=f"{d.control_channel}#{d.control_stream_id}",
            announce=f"{d.announce_channel}#{d.announce_stream_id}",
            next_lease_id=self.core.next_lease_id,
        )

    def on_close(self) -> None:
        self._write_status(self._clock(), final=True)

    def request_shutdown(
        self, reason: drv.ShutdownReason = drv.ShutdownReason.NORMAL, message: str = ""
    ) -> None:
        """Begin a graceful shutdown at the next duty cycle (safe from a signal handler)."""
        if self._shutdown_request is None:
            self._shutdown_request = (reason, message)

    def force_stop(self) -> None:
        """Skip the drain: send ``ShmDriverShutdown`` now and stop (second signal)."""
        self._force_stop = True

    @property
    def stopping(self) -> bool:
        return self._terminate_at is not None

    # ------------------------------------------------------------------ duty cycle

    def do_work(self) -> int:
        now = self._clock()
        work = 0
        if self._outbox_size:
            work += self._flush_outbox()
        sub = self._sub
        if sub is not None:
            work += sub.poll()
        core = self.core
        if self._shutdown_request is not None and core.state is DriverState.RUNNING:
            reason, message = self._shutdown_request
            log_event(logging.INFO, "shutdown_begin", reason=reason.name, message=message)
            self._execute(core.begin_shutdown(now, reason, message), now)
            work += 1
        if self._force_stop and self._terminate_at is None:
            # Skip the drain, not the notices (§4.9 per lease, §4.13), nor the short linger
            # that lets them arrive.
            self._execute(core.stop_now(now, drv.ShutdownReason.NORMAL, "forced"), now)
            if self._terminate_at is None:  # the core had stopped already
                self._publish_shutdown(
                    PublishShutdown(now, drv.ShutdownReason.NORMAL, "forced"), now
                )
        deadline = core.next_deadline_ns()
        if deadline is not None and now >= deadline:
            self._execute(core.tick(now), now)
            work += 1
        if now >= self._next_status_ns:
            self._write_status(now)
        if self._terminate_at is not None and now >= self._terminate_at:
            raise AgentTermination
        return work

    # ------------------------------------------------------------------ receive

    def _on_control(self, buffer: Any, header: Any) -> None:
        try:
            _, template_id, schema_id, version = peek_header(buffer)
        except CodecError as exc:
            self._drop(exc.reason)
            return
        if schema_id == WIRE_SCHEMA_ID and template_id == _TEMPLATE_CONSUMER_HELLO:
            self._on_consumer_hello(buffer)
            return
        if schema_id != DRIVER_SCHEMA_ID:
            if schema_id in _OTHER_SCHEMAS:
                self.counters["rx_other_schema"] += 1
            else:
                self._drop("unknown_schema_id")
            return
        handler = self._handlers.get(template_id)
        if handler is None:
            if template_id in _DRIVER_OUTPUTS:
                self.counters["rx_driver_output"] += 1
            else:
                self._drop("unknown_template_id")
            return
        handler(buffer, version, self._clock())

    def _on_consumer_hello(self, buffer: Any) -> None:
        """Per-consumer stream requests (Driver Model §11): decoded here, decided by the core."""
        self.counters["rx_consumer_hello"] += 1
        try:
            dec = self._hello_dec.wrap(buffer)
            actions = self.core.on_consumer_hello(
                dec.stream_id,
                dec.consumer_id,
                dec.mode_raw,
                dec.max_rate_hz,
                dec.descriptor_channel,
                dec.descriptor_stream_id,
            )
        except (CodecError, ValueError) as exc:
            self._drop(getattr(exc, "reason", "malformed_consumer_hello"))
            return
        self._execute(actions, self._clock())

    def _on_attach(self, buffer: Any, version: int, now: int) -> None:
        self._on_request(
            buffer, version, now, TEMPLATE_ATTACH_REQUEST, self._attach_dec,
            self._attach_with_free_space,
        )  # fmt: skip
        self.attach_latency.observe_ns(self._clock() - now)

    def _attach_with_free_space(self, dec: Any, now: int, **kw: Any) -> list[Action]:
        """The core's attach, told how much room ``shm.base_dir`` has right now."""
        return self.core.on_attach_request(dec, now, shm_free_bytes=self.files.free_bytes(), **kw)

    def _on_detach(self, buffer: Any, version: int, now: int) -> None:
        self._on_request(
            buffer, version, now, TEMPLATE_DETACH_REQUEST, self._detach_dec,
            self.core.on_detach_request,
        )  # fmt: skip

    def _on_request(
        self,
        buffer: Any,
        version: int,
        now: int,
        template_id: int,
        decoder: Any,
        handle: Callable[..., list[Action]],
    ) -> None:
        """Attach and detach requests: both must be answered, whatever goes wrong."""
        name = _REQUEST_NAMES[template_id]
        self.counters[f"rx_{name}_request"] += 1
        try:
            dec = decoder.wrap(buffer)
        except UnsupportedVersion:
            self._answer_undecodable(buffer, template_id, version, None, now)
            return
        except CodecError as exc:
            self._answer_undecodable(buffer, template_id, version, exc, now)
            return
        try:
            actions = handle(dec, now, schema_version=dec.acting_version)
        except Exception as exc:  # a core bug must not kill the driver or leave the client hanging
            log.exception("%s request failed inside the core", name)
            self.counters["internal_error"] += 1
            actions = [
                _error_response(
                    template_id,
                    dec.correlation_id,
                    drv.ResponseCode.INTERNAL_ERROR,
                    cap_error_message(f"internal error: {exc!r}"),
                )
            ]
        self._execute(actions, now)

    def _on_keepalive(self, buffer: Any, version: int, now: int) -> None:
        self.counters["rx_keepalive"] += 1
        try:
            dec = self._keepalive_dec.wrap(buffer)
        except CodecError as exc:
            self._drop(f"keepalive_{exc.reason}")
            return
        self._execute(self.core.on_keepalive(dec, now), now)

    def _on_shutdown_request(self, buffer: Any, version: int, now: int) -> None:
        self.counters["rx_shutdown_request"] += 1
        try:
            dec = self._shutdown_dec.wrap(buffer)
        except CodecError as exc:
            self._drop(f"shutdown_request_{exc.reason}")
            return
        core = self.core
        before = core.state
        actions = core.on_shutdown_request(dec, now)
        if core.state is before:
            self.counters["shutdown_request_ignored"] += 1
            n = self.counters["shutdown_request_ignored"]
            if n & (n - 1) == 0:  # 1, 2, 4, ...: a flood of bad requests cannot flood the log
                log_event(
                    logging.WARNING,
                    "shutdown_request_ignored",
                    correlation_id=dec.correlation_id,
                    count=n,
                    why="no shutdown token configured"
                    if not self.config.policies.shutdown_token
                    else (
                        "missing or wrong token" if before is DriverState.RUNNING else before.value
                    ),
                )
        else:
            log_event(
                logging.INFO, "shutdown_begin", correlation_id=dec.correlation_id, by="request"
            )
        self._execute(actions, now)

    def _answer_undecodable(
        self, buffer: Any, template_id: int, version: int, exc: CodecError | None, now: int
    ) -> None:
        """A request whose body cannot be decoded: answer it if its correlationId is readable.

        ``exc`` None means the schema version is not one this driver speaks (§4.4a).
        """
        reason = "unsupported_version" if exc is None else exc.reason
        self._drop(f"{_REQUEST_NAMES[template_id]}_{reason}")
        try:
            (correlation_id,) = _CORRELATION.unpack_from(buffer, _CORRELATION_OFFSET)
        except struct.error:
            return  # not even the correlationId: nobody to answer
        if exc is None:
            actions = self.core.on_incompatible_version(template_id, correlation_id, version)
        else:
            message = cap_error_message(f"malformed request ({exc.reason}): {exc}")
            actions = [
                _error_response(
                    template_id, correlation_id, drv.ResponseCode.INVALID_PARAMS, message
                )
            ]
        self._execute(actions, now)

    def _drop(self, reason: str) -> None:
        counters = self.counters
        key = f"malformed_{reason}"
        counters[key] += 1
        n = counters[key]
        if n & (n - 1) == 0:
            log_event(logging.WARNING, "control_message_dropped", reason=reason, count=n)

    # ------------------------------------------------------------------ actions

    def _execute(self, actions: Iterable[Action], now: int) -> None:
        """Run actions in order; a CreateRegions' follow-up actions run right after it."""
        queue: deque[Action] = deque(actions)
        while queue:
            action = queue.popleft()
            kind = type(action)
            if kind is SendAttachResponse:
                self._send_attach_response(action)  # type: ignore[arg-type]
            elif kind is PublishAnnounce:
                self._publish_announce(action)  # type: ignore[arg-type]
            elif kind is PublishLeaseRevoked:
                self._publish_revoked(action)  # type: ignore[arg-type]
            elif kind is SendDetachResponse:
                self._send_detach_response(action)  # type: ignore[arg-type]
            elif kind is SendConsumerConfig:
                self._send_consumer_config(action)  # type: ignore[arg-type]
            elif kind is CreateRegions:
                queue.extendleft(reversed(self._create_regions(action, now)))  # type: ignore[arg-type]
            elif kind is RetireEpoch:
                self._retire(action)  # type: ignore[arg-type]
            elif kind is ReclaimStream:
                self._reclaim_stream(action)  # type: ignore[arg-type]
            elif kind is PublishShutdown:
                self._publish_shutdown(action, now)  # type: ignore[arg-type]
            else:  # pragma: no cover - the Action union is closed
                raise TypeError(f"unknown action {action!r}")

    def _create_regions(self, action: CreateRegions, now: int) -> list[Action]:
        core = self.core
        try:
            self._create_with_gc(action, now)
        except RegionError as exc:
            self.counters[f"regions_failed_{exc.reason}"] += 1
            log_event(
                logging.ERROR,
                "regions_failed",
                stream=action.stream_id,
                epoch=action.epoch,
                reason=exc.reason,
                detail=exc.detail,
            )
            follow = core.on_regions_failed(action.stream_id, action.epoch, str(exc), now)
            if exc.fatal:
                self.exit_code = 1
                follow += core.begin_shutdown(now, drv.ShutdownReason.ERROR, str(exc))
            return follow
        except Exception as exc:
            log.exception("creating regions of stream %d epoch %d", action.stream_id, action.epoch)
            self.counters["regions_failed_unexpected"] += 1
            return core.on_regions_failed(action.stream_id, action.epoch, repr(exc), now)
        self.counters["regions_created"] += 1
        log_event(
            logging.INFO,
            "epoch_created",
            stream=action.stream_id,
            epoch=action.epoch,
            directory=action.layout.directory,
        )
        return core.on_regions_ready(action.stream_id, action.epoch, now)

    def _create_with_gc(self, action: CreateRegions, now: int) -> None:
        """EPOCH_GC_POLICY: out of space → collect old epochs once, then retry once."""
        try:
            self.files.create(action, now)
        except RegionError as exc:
            if not exc.no_space:
                raise
            log_event(
                logging.WARNING, "regions_no_space", stream=action.stream_id, detail=exc.detail
            )
            self._execute(self.core.reclaim_space(now), now)
            self.files.create(action, now)

    def _retire(self, action: RetireEpoch) -> None:
        if self.files.retire(action):
            self.counters["epochs_deleted"] += 1
            log_event(logging.INFO, "epoch_deleted", stream=action.stream_id, epoch=action.epoch)
        else:
            self.counters["epochs_delete_skipped"] += 1

    def _reclaim_stream(self, action: ReclaimStream) -> None:
        removed = self.files.reclaim_stream(action)
        self.counters["epochs_deleted"] += removed
        log_event(
            logging.INFO,
            "dynamic_stream_reclaimed",
            stream=action.stream_id,
            epochs=list(action.epochs),
            deleted=removed,
        )

    def _send_attach_response(self, a: SendAttachResponse) -> None:
        if a.code == drv.ResponseCode.OK and a.stream_id is not None and a.epoch is not None:
            n = self._encode_ok_response(a)
        else:
            n = self._encode_attach_response(a)
        if n:
            self._send(self._control_pub, n)
        if a.code == drv.ResponseCode.OK:
            log_event(
                logging.INFO,
                "attach_ok",
                correlation_id=a.correlation_id,
                lease=a.lease_id,
                stream=a.stream_id,
                epoch=a.epoch,
            )
        else:
            log_event(
                logging.INFO,
                "attach_refused",
                correlation_id=a.correlation_id,
                code=drv.ResponseCode(a.code).name,
                message=repr(a.error_message),
            )

    def _encode_ok_response(self, a: SendAttachResponse) -> int:
        """OK responses of one epoch differ only in the fixed block: encode the group and
        URIs once per (stream, epoch), then copy and patch the block (2x faster attaches)."""
        key = (a.stream_id, a.epoch)
        template = self._ok_templates.get(key)
        if template is None or template[0] != (a.payload_pools, a.header_region_uri):
            n = self._encode_attach_response(a)
            if not n:
                return 0
            for old in [k for k in self._ok_templates if k[0] == a.stream_id]:
                del self._ok_templates[old]  # one live template per stream
            self._ok_templates[key] = ((a.payload_pools, a.header_region_uri), bytes(self._buf[:n]))
            return n
        data = template[1]
        n = len(data)
        buf = self._buf
        buf[:n] = data
        _ATTACH_BLOCK.pack_into(
            buf,
            _HEADER_LENGTH,
            a.correlation_id,
            a.code,
            a.lease_id,
            a.lease_expiry_timestamp_ns,
            a.stream_id,
            a.epoch,
            a.layout_version,
            a.header_nslots,
            a.header_slot_bytes,
            a.max_dims,
        )
        return n

    def _encode_attach_response(self, a: SendAttachResponse) -> int:
        return self._encode(
            drv.ShmAttachResponseEncoder.encode,
            correlation_id=a.correlation_id,
            code=a.code,
            lease_id=a.lease_id,
            lease_expiry_timestamp_ns=a.lease_expiry_timestamp_ns,
            stream_id=a.stream_id,
            epoch=a.epoch,
            layout_version=a.layout_version,
            header_nslots=a.header_nslots,
            header_slot_bytes=a.header_slot_bytes,
            max_dims=a.max_dims,
            payload_pools=a.payload_pools,
            header_region_uri=a.header_region_uri,
            error_message=a.error_message,
        )

    def _send_detach_response(self, a: SendDetachResponse) -> None:
        n = self._encode(
            drv.ShmDetachResponseEncoder.encode,
            correlation_id=a.correlation_id,
            code=a.code,
            error_message=a.error_message,
        )
        if n:
            self._send(self._control_pub, n)
        log_event(
            logging.INFO,
            "detach",
            correlation_id=a.correlation_id,
            code=drv.ResponseCode(a.code).name,
            message=repr(a.error_message),
        )

    def _send_consumer_config(self, a: SendConsumerConfig) -> None:
        fields = consumer_config_fields(
            a.stream_id, a.consumer_id, a.mode, a.descriptor_channel, a.descriptor_stream_id
        )
        n = self._encode(wire.ConsumerConfigEncoder.encode, **fields)
        if n:
            self._send(self._control_pub, n)
        log_event(
            logging.INFO,
            "consumer_config",
            stream=a.stream_id,
            consumer=a.consumer_id,
            descriptor=f"{a.descriptor_channel}#{a.descriptor_stream_id}",
        )

    def _publish_revoked(self, a: PublishLeaseRevoked) -> None:
        n = self._encode(
            drv.ShmLeaseRevokedEncoder.encode,
            timestamp_ns=a.timestamp_ns,
            lease_id=a.lease_id,
            stream_id=a.stream_id,
            client_id=a.client_id,
            role=a.role,
            reason=a.reason,
            error_message=a.error_message,
        )
        if n:
            self._send(self._control_pub, n)
        log_event(
            logging.INFO,
            "lease_revoked",
            lease=a.lease_id,
            stream=a.stream_id,
            client=a.client_id,
            role=drv.Role(a.role).name,
            reason=drv.LeaseRevokeReason(a.reason).name,
        )

    def _publish_announce(self, a: PublishAnnounce) -> None:
        self.files.refresh(a.stream_id, a.epoch, a.announce_timestamp_ns)
        n = self._encode(
            wire.ShmPoolAnnounceEncoder.encode,
            stream_id=a.stream_id,
            producer_id=a.producer_id,
            epoch=a.epoch,
            announce_timestamp_ns=a.announce_timestamp_ns,
            announce_clock_domain=a.announce_clock_domain,
            layout_version=a.layout_version,
            header_nslots=a.header_nslots,
            header_slot_bytes=a.header_slot_bytes,
            payload_pools=a.payload_pools,
            header_region_uri=a.header_region_uri,
        )
        if n:
            self._send(self._announce_pub, n)
            self.counters["announces_sent"] += 1

    def _publish_shutdown(self, a: PublishShutdown, now: int) -> None:
        n = self._encode(
            drv.ShmDriverShutdownEncoder.encode,
            timestamp_ns=a.timestamp_ns,
            reason=a.reason,
            error_message=a.error_message,
        )
        if n:
            self._send(self._control_pub, n)
        if a.reason == drv.ShutdownReason.ERROR:
            self.exit_code = self.exit_code or 1
        if self._terminate_at is None:
            self._terminate_at = now + self._linger_ns
        log_event(
            logging.INFO,
            "driver_shutdown_published",
            reason=drv.ShutdownReason(a.reason).name,
            message=repr(a.error_message),
        )

    # ------------------------------------------------------------------ send

    def _encode(self, encode: Callable[..., int], **fields: Any) -> int:
        """Encode into the scratch buffer (grown on demand); 0 if the message cannot be built."""
        while True:
            try:
                return encode(self._buf, 0, **fields)
            except BufferTooSmall:
                if len(self._buf) >= _MAX_SCRATCH:
                    break
                self._buf = bytearray(len(self._buf) * 4)
            except CodecError as exc:
                log.error("cannot encode %s: %s", getattr(encode, "__qualname__", encode), exc)
                break
        self.counters["encode_failed"] += 1
        return 0

    def _send(self, pub: Publisher | None, n: int) -> None:
        if pub is None:  # pragma: no cover - only before on_start
            return
        queue = self._outbox.get(pub)
        if queue:  # keep per-publication order behind earlier undelivered messages
            self._enqueue(pub, bytes(self._buf[:n]))
            return
        if pub.offer(self._buf, 0, n):
            return
        if pub.is_closed or not pub.is_connected:
            self.counters["send_dropped_not_connected"] += 1
            return
        self.counters["send_back_pressured"] += 1
        self._enqueue(pub, bytes(self._buf[:n]))

    def _enqueue(self, pub: Publisher, message: bytes) -> None:
        if self._outbox_size >= OUTBOX_LIMIT:
            self.counters["send_dropped_outbox_full"] += 1
            return
        self._outbox.setdefault(pub, deque()).append(message)
        self._outbox_size += 1

    def _flush_outbox(self) -> int:
        sent = 0
        for pub, queue in self._outbox.items():
            while queue:
                if not pub.offer(queue[0]):
                    if pub.is_closed or not pub.is_connected:
                        self.counters["send_dropped_not_connected"] += len(queue)
                        self._outbox_size -= len(queue)
                        queue.clear()
                    break
                queue.popleft()
                self._outbox_size -= 1
                sent += 1
        return sent

    # ------------------------------------------------------------------ status

    def _write_status(self, now: int, *, final: bool = False) -> None:
        self._next_status_ns = now + self._status_period_ns
        path = self._status_file
        if path is None:
            return
        doc = build_status_document(
            self.core.status(now),
            config=self.config,
            pid=os.getpid(),
            aeron_dir=self._aeron_dir,
            started_unix_ns=self._started_unix_ns,
            written_unix_ns=self._realtime(),
            period_ns=self._status_period_ns,
            agent_counters=self.counters,
            live_epochs=self.files.live_epochs(),
        )
        if self.runner_health is not None:
            doc["runtime"] = dict(self.runner_health())
        if final:
            doc["state"] = "STOPPED"
        try:
            write_status(path, doc, self._status_mode)
        except OSError as exc:
            self.counters["status_write_failed"] += 1
            n = self.counters["status_write_failed"]
            if n & (n - 1) == 0:
                log_event(logging.WARNING, "status_write_failed", path=path, error=str(exc))
