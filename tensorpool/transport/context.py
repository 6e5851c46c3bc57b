"""The owner of a process's Aeron client (and embedded media driver, if it has one).

Model: one :class:`AeronContext` per process (or per independent component) holds one Aeron
client; publications and subscriptions are made through it and closed with it. Closing runs in
dependency order: publications and subscriptions first, then the client, then the media driver
the context started (if any), so no client ever outlives its driver and no directory is removed
under a live client. A failure while closing one part is logged and the rest still closes.

``TransportConfig.aeron_dir`` picks the driver (see :mod:`tensorpool.transport.config`): None
starts an embedded driver in a private directory (IPC then only reaches this process); a
directory joins an existing driver, which is how several processes share IPC channels.

Surviving a media driver restart (issue #13.2). A joined media driver can die (``kill -9`` of the
SHM driver that hosts it) and a new one start in the same directory. The Aeron client cannot
follow: its publications and subscriptions are bound to the dead driver for good.
:meth:`AeronContext.maintain` notices the loss (the client closed
itself after ``driver_timeout_ms``, or ``cnc.dat`` now belongs to another driver, which is seen
within one check), and once a live driver serves the directory it closes the dead client
(never touching the directory), makes a new one and re-creates every publication and
subscription inside the same :class:`Publisher`/:class:`Subscriber` objects. The
:class:`~tensorpool.transport.agent.AgentRunner` a context is given to calls it every duty cycle
(#26.1): no agent calls it itself. Holders keep their
references; :attr:`AeronContext.generation` goes up so that protocol owners (lease machines)
know that whatever they had through the old driver is gone.
"""

from __future__ import annotations

import logging
import os
import threading
from types import TracebackType
from typing import Self

import pyaeron

from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.cnc import CncIdentity, read_cnc_identity
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.mediadriver import (
    EmbeddedMediaDriver,
    MediaDriverError,
    close_media_driver,
    is_active,
    new_private_dir,
    start_media_driver,
)
from tensorpool.transport.publication import (
    DEFAULT_ADMIN_ACTION_RETRIES,
    Publisher,
    SharedPublisher,
)
from tensorpool.transport.subscription import (
    DEFAULT_FRAGMENT_LIMIT,
    FragmentHandler,
    ImageCallback,
    Subscriber,
)

log = logging.getLogger(__name__)

HEALTH_CHECK_PERIOD_NS = 100_000_000
"""How often :meth:`AeronContext.maintain` looks at ``cnc.dat`` (a check costs ~10 us)."""

RECONNECT_BACKOFF_MAX_NS = 1_000_000_000
"""Longest wait between reconnect attempts while no live media driver serves the directory."""


class TransportClosed(RuntimeError):
    """The context is not started, or already closed."""


class AeronContext:
    """Connects to (or starts) a media driver and owns everything made through it."""

    def __init__(self, config: TransportConfig | None = None, *, clock: NanoClock = now_ns) -> None:
        self.config = config or TransportConfig()
        self.clock = clock
        self._driver: EmbeddedMediaDriver | None = None
        self._aeron: pyaeron.Aeron | None = None
        self._dir: str | None = None
        self._publishers: list[Publisher] = []
        self._subscribers: list[Subscriber] = []
        self._closed = False
        self.errors = 0
        self.last_error: str | None = None
        self.generation = 0
        """Bumped on each reconnect to a new media driver: everything made through the old one
        (leases, images, sessions) is gone, though Publisher/Subscriber objects stay valid."""
        self.reconnects = 0
        self.lost_reason: str | None = None
        """Why the media driver is considered lost (None while it is fine)."""
        self.lost_since_ns: int | None = None
        """When the loss was noticed (this context's clock); None while connected."""
        self.reconnect_attempts = 0
        """Reconnect attempts since the loss was noticed (0 while connected)."""
        self._cnc: CncIdentity | None = None
        self._maintain_lock = threading.Lock()  # holders of a shared context check it in turn
        self._next_check_ns = 0
        self._reconnect_backoff_ns = HEALTH_CHECK_PERIOD_NS

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        if self._closed:
            raise TransportClosed("AeronContext was closed; make a new one")
        if self._aeron is not None:
            return self
        cfg = self.config
        if cfg.aeron_dir is None:
            aeron_dir = new_private_dir(cfg.embedded_parent_dir)
            self._driver = start_media_driver(aeron_dir, cfg, owns_dir=True)
        elif cfg.aeron_dir == "":
            aeron_dir = pyaeron.default_path()
        else:
            aeron_dir = cfg.aeron_dir
        self._dir = aeron_dir
        cnc = read_cnc_identity(aeron_dir)
        try:
            self._aeron = pyaeron.Aeron(context=self._client_context(aeron_dir))
        except pyaeron.AeronError as exc:
            self._close_driver()
            raise MediaDriverError(
                f"cannot connect to a media driver in {aeron_dir} "
                f"(waited {cfg.driver_timeout_ms} ms): {exc}"
            ) from exc
        # read before connecting: if the driver was replaced in between, the next check sees it
        self._cnc = cnc
        return self

    # -- media driver loss and reconnect (#13.2) -----------------------------------------

    @property
    def media_driver_lost(self) -> bool:
        """True from the moment the loss is noticed until a reconnect succeeds."""
        return self.lost_reason is not None

    def maintain(self, now: int | None = None) -> bool:
        """Check (at most every 100 ms) that the joined media driver is still the one we
        connected to; after a loss, reconnect as soon as a live one serves the directory.

        Returns True when this call reconnected (:attr:`generation` went up). Never raises for
        a lost driver and never blocks longer than a client connect to a live driver. A context
        that owns its embedded driver has nothing to check.
        """
        if self._aeron is None or self._driver is not None or self._closed:
            return False
        if not self._maintain_lock.acquire(blocking=False):
            return False  # another holder of this context is checking it now
        try:
            return self._maintain(now)
        finally:
            self._maintain_lock.release()

    def _maintain(self, now: int | None) -> bool:
        now = self.clock() if now is None else now
        if now < self._next_check_ns:
            return False
        self._next_check_ns = now + HEALTH_CHECK_PERIOD_NS
        if self.lost_reason is None:
            reason = self._loss_reason()
            if reason is None:
                return False
            self.lost_reason = reason
            self.lost_since_ns = now
            self.reconnect_attempts = 0
            self._reconnect_backoff_ns = HEALTH_CHECK_PERIOD_NS
            log.warning("media driver in %s lost (%s); will reconnect", self._dir, reason)
        self.reconnect_attempts += 1
        if self._reconnect():
            return True
        self._next_check_ns = now + self._reconnect_backoff_ns
        self._reconnect_backoff_ns = min(self._reconnect_backoff_ns * 2, RECONNECT_BACKOFF_MAX_NS)
        return False

    def _loss_reason(self) -> str | None:
        assert self._aeron is not None and self._dir is not None
        if self._aeron.is_closed:
            return f"client closed: {self.last_error or 'driver timeout'}"
        current = read_cnc_identity(self._dir)
        if current is None:
            return "cnc.dat is gone"
        if self._cnc is not None and current != self._cnc:
            return f"a new media driver (pid {current.pid}) replaced pid {self._cnc.pid}"
        return None

    def _reconnect(self) -> bool:
        """Replace the dead client by one connected to the live driver now in the directory."""
        assert self._dir is not None
        aeron_dir = self._dir
        cnc = read_cnc_identity(aeron_dir)
        if cnc is None or not is_active(aeron_dir):
            return False  # nobody serves the directory yet
        old, self._aeron = self._aeron, None
        for resource in [*self._subscribers, *self._publishers]:
            try:
                resource.close()
            except Exception:
                log.debug("closing %r of the lost client failed", resource, exc_info=True)
        if old is not None:
            try:
                old.close()
            except Exception:
                log.debug("closing the lost Aeron client failed", exc_info=True)
        try:
            aeron = pyaeron.Aeron(context=self._client_context(aeron_dir))
        except pyaeron.AeronError as exc:
            log.warning("reconnect to the media driver in %s failed: %s", aeron_dir, exc)
            self._aeron = old  # keep a (closed) client so that `aeron` stays usable
            return False
        self._aeron = aeron
        try:
            for resource in [*self._publishers, *self._subscribers]:
                resource.rebind(aeron)
        except pyaeron.AeronError as exc:
            log.warning("re-creating publications on the new media driver failed: %s", exc)
            return False  # lost_reason stays set: the next check reconnects again
        self._cnc = cnc
        self.generation += 1
        self.reconnects += 1
        log.warning(
            "reconnected to the media driver in %s (pid %d) after: %s",
            aeron_dir,
            cnc.pid,
            self.lost_reason,
        )
        self.lost_reason = None
        self.lost_since_ns = None
        self.reconnect_attempts = 0
        return True

    def media_driver_health(self, now: int) -> dict[str, object]:
        """Connected or not, since when, why, and the reconnect attempts so far (#26.3)."""
        since = self.lost_since_ns
        return {
            "connected": not self.media_driver_lost and not self._closed,
            "dir": self._dir,
            "embedded": self.owns_driver,
            "lost_reason": self.lost_reason,
            "lost_for_s": None if since is None else round(max(now - since, 0) / 1e9, 3),
            "reconnect_attempts": self.reconnect_attempts,
            "reconnects": self.reconnects,
        }

    def _client_context(self, aeron_dir: str) -> pyaeron.Context:
        cfg = self.config
        kwargs: dict[str, object] = {
            "dir": aeron_dir,
            "driver_timeout_ms": cfg.driver_timeout_ms,
            # Aeron's default handler exits the process when the media driver goes away;
            # an agent must fail closed and keep running instead (counted, logged).
            "error_handler": self._on_client_error,
        }
        if cfg.client_name is not None:
            kwargs["client_name"] = cfg.client_name
        if cfg.keepalive_interval_ns is not None:
            kwargs["keepalive_interval_ns"] = cfg.keepalive_interval_ns
        if cfg.resource_linger_duration_ns is not None:
            kwargs["resource_linger_duration_ns"] = cfg.resource_linger_duration_ns
        if cfg.idle_sleep_duration_ns is not None:
            kwargs["idle_sleep_duration_ns"] = cfg.idle_sleep_duration_ns
        if cfg.pre_touch_mapped_memory:
            kwargs["pre_touch_mapped_memory"] = True
        return pyaeron.Context(**kwargs)

    def _on_client_error(self, code: int, text: str) -> None:
        self.errors += 1
        self.last_error = f"{code}: {text}"
        if self.errors & (self.errors - 1) == 0:
            log.error("aeron client error %s (%d so far)", self.last_error, self.errors)

    def close(self) -> None:
        """Close subscriptions, publications, the client, then an owned driver (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for resource in [*self._subscribers, *self._publishers]:
            try:
                resource.close()
            except Exception:
                log.exception("closing %r failed", resource)
        self._subscribers.clear()
        self._publishers.clear()
        if self._aeron is not None:
            try:
                self._aeron.close()
            except Exception:
                log.exception("closing the Aeron client failed")
            self._aeron = None
        self._close_driver()

    def _close_driver(self) -> None:
        if self._driver is not None:
            close_media_driver(self._driver)
            self._driver = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- state ----------------------------------------------------------------------------

    @property
    def aeron(self) -> pyaeron.Aeron:
        if self._aeron is None:
            raise TransportClosed("AeronContext is not started" if not self._closed else "closed")
        return self._aeron

    @property
    def dir(self) -> str:
        """The media driver directory in use (give it to other processes to share IPC)."""
        if self._dir is None:
            raise TransportClosed("AeronContext is not started")
        return self._dir

    @property
    def subscriptions(self) -> tuple[tuple[str, int], ...]:
        """(channel, stream id) of every subscription open through this context."""
        return tuple((s.channel, s.stream_id) for s in self._subscribers)

    @property
    def owns_driver(self) -> bool:
        return self._driver is not None

    @property
    def is_closed(self) -> bool:
        return self._closed

    # -- resources ------------------------------------------------------------------------

    def add_publication(
        self,
        channel: str,
        stream_id: int,
        *,
        exclusive: bool = True,
        shared: bool = False,
        admin_action_retries: int = DEFAULT_ADMIN_ACTION_RETRIES,
    ) -> Publisher:
        """A publisher on ``channel``/``stream_id``; exclusive (single-writer) by default.

        ``shared``: an exclusive publication that this process's threads offer on under a lock
        (:class:`SharedPublisher`: the client conductor's control-plane publications)."""
        aeron = self.aeron
        if exclusive or shared:
            pub: pyaeron.Publication | pyaeron.ExclusivePublication = (
                aeron.add_exclusive_publication(channel, stream_id)
            )
        else:
            pub = aeron.add_publication(channel, stream_id)
        kind = SharedPublisher if shared else Publisher
        publisher = kind(pub, admin_action_retries=admin_action_retries)
        self._publishers.append(publisher)
        return publisher

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        handler: FragmentHandler,
        *,
        fragment_limit: int = DEFAULT_FRAGMENT_LIMIT,
        assemble: bool = True,
        guard: bool = True,
        on_image_available: ImageCallback | None = None,
        on_image_unavailable: ImageCallback | None = None,
    ) -> Subscriber:
        """A subscriber delivering whole messages to ``handler(buffer, header)``."""
        subscriber = Subscriber(
            self.aeron,
            channel,
            stream_id,
            handler,
            fragment_limit=fragment_limit,
            assemble=assemble,
            guard=guard,
            clock=self.clock,
            on_image_available=on_image_available,
            on_image_unavailable=on_image_unavailable,
        )
        self._subscribers.append(subscriber)
        return subscriber

    def release(self, resource: Publisher | Subscriber) -> None:
        """Close one publisher/subscriber before the context closes (e.g. consumer left)."""
        resource.close()
        if isinstance(resource, Publisher):
            if resource in self._publishers:
                self._publishers.remove(resource)
        elif resource in self._subscribers:
            self._subscribers.remove(resource)


# -- one context per process (#28.1) ------------------------------------------------------------
_SHARED: dict[tuple[int, TransportConfig], list[object]] = {}  # key -> [context, holders]
_SHARED_LOCK = threading.Lock()


def shared_context(config: TransportConfig) -> AeronContext:
    """This process's one started :class:`AeronContext` for ``config``: the components of a
    process that are not handed a context (the Spark source's attachments, probes and
    discovery) share it, so the process has one Aeron client and, through its
    :class:`~tensorpool.client.conductor.ContextConductor`, one subscription per stream.
    Pair with :func:`release_shared_context`; the last release closes it."""
    key = (os.getpid(), config)
    with _SHARED_LOCK:
        held = _SHARED.get(key)
        if held is None or held[0].is_closed:  # type: ignore[attr-defined]
            held = _SHARED[key] = [AeronContext(config).start(), 0]
        held[1] += 1  # type: ignore[operator]
        return held[0]  # type: ignore[return-value]


def release_shared_context(ctx: AeronContext) -> None:
    """Give back a :func:`shared_context`; the last holder closes it."""
    with _SHARED_LOCK:
        for key, held in list(_SHARED.items()):
            if held[0] is ctx:
                held[1] -= 1  # type: ignore[operator]
                if held[1] > 0:  # type: ignore[operator]
                    return
                del _SHARED[key]
                break
    ctx.close()


def shared_contexts() -> int:
    """How many shared contexts this process holds open."""
    with _SHARED_LOCK:
        return len(_SHARED)


def _forget_shared_after_fork() -> None:
    """A forked child must not use its parent's clients (their threads did not fork)."""
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    _SHARED.clear()


os.register_at_fork(after_in_child=_forget_shared_after_fork)
