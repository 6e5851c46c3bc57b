"""The I/O shell of the lease machine: the control stream to and from the driver (§4).

:class:`DriverClient` holds the clock and an inbox at the process's
:class:`~tensorpool.client.conductor.ClientConductor` (which polls and decodes the control
stream once for every client); it feeds the driver's messages to the sans-IO
:class:`~tensorpool.client.lease.LeaseMachine` (client/lease.py, which holds the protocol
rules and the state table) and encodes and offers the requests the machine returns.
"""

from __future__ import annotations

import logging
import os
import random
from typing import TYPE_CHECKING

from tensorpool.client.lease import (
    SEC,
    Action,
    AttachFailed,
    AttachPhase,
    LeaseMachine,
    LeaseTimings,
    NoticeNotConfirmed,
    SendAttach,
    SendDetach,
    SendKeepalive,
    is_transient_refusal,
)
from tensorpool.specs import CodecError
from tensorpool.specs.generated import driver as dp
from tensorpool.transport.clock import NanoClock, now_ns

if TYPE_CHECKING:
    from tensorpool.client.conductor import ClientConductor

log = logging.getLogger(__name__)


def default_client_id() -> int:
    """Unique per client process and lease (§4.8); random bits avoid pid reuse collisions."""
    return ((os.getpid() & 0xFFFF) << 15 | random.getrandbits(15)) & 0x7FFFFFFF or 1


class DriverClient:
    """Sends the lease machine's requests and feeds it the driver's control messages.

    `do_work(now)` returns the events (`Attached`, `LeaseLost`, ...) for the owner.
    """

    def __init__(
        self,
        conductor: ClientConductor,
        stream_id: int,
        role: int,
        *,
        client_id: int | None = None,
        timings: LeaseTimings | None = None,
        publish_mode: int | None = None,
        clock: NanoClock = now_ns,
    ) -> None:
        self.machine = LeaseMachine(
            stream_id,
            role,
            client_id if client_id is not None else default_client_id(),
            timings=timings,
            publish_mode=publish_mode,
        )
        self._clock = clock
        self._conductor = conductor
        self._ctx = conductor.ctx
        self._pub = conductor.control_pub
        self._inbox = conductor.register_lease(stream_id)
        self._buf = bytearray(512)
        self._events: list[Action] = []
        self._unsent_attach: SendAttach | None = None
        self._generation = self._ctx.generation
        self.control_drops: dict[str, int] = {}

    @property
    def client_id(self) -> int:
        return self.machine.client_id

    @property
    def state(self) -> AttachPhase:
        return self.machine.state

    @property
    def lease_id(self) -> int | None:
        return self.machine.lease_id

    @property
    def holds_lease(self) -> bool:
        """Attached, possibly confirming a revoke/shutdown notice with the driver (#14 §2)."""
        return self.machine.holds_lease

    def _drop(self, reason: str) -> None:
        self.control_drops[reason] = self.control_drops.get(reason, 0) + 1

    def _take_inbox(self) -> None:
        """Feed the machine what the conductor decoded for it (on the owner's thread)."""
        m = self.machine
        for dec, _ in self._inbox.drain():
            if isinstance(dec, str):  # a control message the conductor could not decode
                self._drop(dec)
                continue
            now = self._clock()
            try:
                if isinstance(dec, dp.ShmAttachResponseDecoder):
                    self._events += m.on_attach_response(dec, now)
                elif isinstance(dec, dp.ShmLeaseRevokedDecoder):
                    self._events += m.on_lease_revoked(dec, now)
                elif isinstance(dec, dp.ShmDriverShutdownDecoder):
                    dec.reason  # noqa: B018 - unknown reasons are rejected
                    self._events += m.on_driver_shutdown(now, dec.timestamp_ns)
                elif isinstance(dec, dp.ShmDetachResponseDecoder):
                    self._events += m.on_detach_response(dec, now)
            except CodecError as exc:
                self._drop(exc.reason)

    def do_work(self, now: int | None = None) -> list[Action]:
        now = self._clock() if now is None else now
        m = self.machine
        ctx = self._ctx
        self._conductor.poll(now)  # also notices a lost media driver and reconnects (#13.2)
        if ctx.generation != self._generation:
            self._generation = ctx.generation
            self._unsent_attach = None
            self._inbox.drain()  # what the old driver said is void
            self._events += m.on_transport_reset(now)
        self._take_inbox()
        if m.state is AttachPhase.UNATTACHED:
            self._events += m.attach(now)
        self._events += m.tick(now)
        unsent = self._unsent_attach
        if unsent is not None:
            # an attach that found no subscriber (driver not up yet) is re-offered until it
            # goes out or the machine gives up on it, instead of waiting out the timeout
            self._unsent_attach = None
            pending = m.pending_correlation_id
            if (
                m.state in (AttachPhase.ATTACHING, AttachPhase.CONFIRMING)
                and pending == unsent.correlation_id
            ):
                self._events.append(unsent)
        out: list[Action] = []
        events, self._events = self._events, []
        for ev in events:
            if isinstance(ev, SendAttach | SendKeepalive | SendDetach):
                if not self._send(ev):
                    if isinstance(ev, SendKeepalive):
                        out += m.on_keepalive_failed(now)
                    elif isinstance(ev, SendAttach):
                        self._unsent_attach = ev
            else:
                if isinstance(ev, AttachFailed):
                    # a refusal that ends with an old lease's expiry repeats every 250 ms:
                    # the owner says once why it waits (#13.3)
                    level = (
                        logging.DEBUG
                        if is_transient_refusal(ev.code, ev.message)
                        else logging.WARNING
                    )
                    log.log(level, "attach to stream %d failed: %s", m.stream_id, ev.message)
                elif isinstance(ev, NoticeNotConfirmed):
                    log.warning(
                        "stream %d: a %s notice for our lease %s was not from the driver "
                        "(it still holds the lease): ignored",
                        m.stream_id,
                        ev.notice,
                        m.lease_id,
                    )
                out.append(ev)
        return out

    def _send(self, ev: SendAttach | SendKeepalive | SendDetach) -> bool:
        buf = self._buf
        if isinstance(ev, SendAttach):
            n = dp.ShmAttachRequestEncoder.encode(
                buf,
                0,
                correlation_id=ev.correlation_id,
                stream_id=ev.stream_id,
                client_id=ev.client_id,
                role=ev.role,
                expected_layout_version=ev.expected_layout_version,
                max_dims=0,
                publish_mode=ev.publish_mode,
                require_hugepages=ev.require_hugepages,
            )
        elif isinstance(ev, SendKeepalive):
            n = dp.ShmLeaseKeepaliveEncoder.encode(
                buf,
                0,
                lease_id=ev.lease_id,
                stream_id=ev.stream_id,
                client_id=ev.client_id,
                role=ev.role,
                client_timestamp_ns=ev.client_timestamp_ns,
            )
        else:
            n = dp.ShmDetachRequestEncoder.encode(
                buf,
                0,
                correlation_id=ev.correlation_id,
                lease_id=ev.lease_id,
                stream_id=ev.stream_id,
                client_id=ev.client_id,
                role=ev.role,
            )
        return self._pub.offer(buf, 0, n)

    def driver_silent(self, now: int | None = None) -> list[Action]:
        """Report that the driver stopped announcing; the lease is dropped and retried."""
        return self.machine.on_driver_silent(self._clock() if now is None else now)

    def confirm_lease(self, reason: str, now: int | None = None) -> None:
        """The owner doubts the lease (the driver announces a newer epoch of the stream): the
        confirmation probe goes out at the next :meth:`do_work`, its outcome as events."""
        self._events += self.machine.on_lease_doubted(reason, self._clock() if now is None else now)

    def close(self, timeout_ns: int = SEC) -> None:
        """Best-effort detach (§4.9): send it, wait briefly for the response."""
        now = self._clock()
        for ev in self.machine.detach(now):
            if isinstance(ev, SendDetach):
                self._send(ev)
        deadline = now + timeout_ns
        while self.machine.state is AttachPhase.DETACHING and self._clock() < deadline:
            self._conductor.poll()
            self._take_inbox()
            self.machine.tick(self._clock())
        self.machine.close()  # answered or not: a lease we still hold expires at the driver
        self._conductor.unregister(self._inbox)
