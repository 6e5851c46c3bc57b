"""The owner of a process's Aeron client (and embedded media driver, if it has one).

Model: one :class:`AeronContext` per process (or per independent component) holds one Aeron
client; publications and subscriptions are made through it and closed with it. Closing runs in
dependency order: publications and subscriptions first, then the client, then the media driver
the context started (if any), so no client ever outlives its driver and no directory is removed
under a live client. A failure while closing one part is logged and the rest still closes.

``TransportConfig.aeron_dir`` picks the driver (see :mod:`tensorpool.transport.config`): None
starts an embedded driver in a private directory (IPC then only reaches this process); a
directory joins an existing driver, which is how several processes share IPC channels.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Self

import pyaeron

from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.mediadriver import (
    MediaDriverError,
    close_media_driver,
    new_private_dir,
    start_media_driver,
)
from tensorpool.transport.publication import DEFAULT_ADMIN_ACTION_RETRIES, Publisher
from tensorpool.transport.subscription import (
    DEFAULT_FRAGMENT_LIMIT,
    FragmentHandler,
    ImageCallback,
    Subscriber,
)

log = logging.getLogger(__name__)


class TransportClosed(RuntimeError):
    """The context is not started, or already closed."""


class AeronContext:
    """Connects to (or starts) a media driver and owns everything made through it."""

    def __init__(self, config: TransportConfig | None = None, *, clock: NanoClock = now_ns) -> None:
        self.config = config or TransportConfig()
        self.clock = clock
        self._driver: pyaeron.MediaDriver | None = None
        self._aeron: pyaeron.Aeron | None = None
        self._dir: str | None = None
        self._publishers: list[Publisher] = []
        self._subscribers: list[Subscriber] = []
        self._closed = False
        self.errors = 0
        self.last_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        if self._closed:
            raise TransportClosed("AeronContext was closed; make a new one")
        if self._aeron is not None:
            return self
        cfg = self.config
        if cfg.aeron_dir is None:
            aeron_dir = new_private_dir(cfg.embedded_parent_dir)
            self._driver = start_media_driver(aeron_dir, cfg)
        elif cfg.aeron_dir == "":
            aeron_dir = pyaeron.default_path()
        else:
            aeron_dir = cfg.aeron_dir
        self._dir = aeron_dir
        try:
            self._aeron = pyaeron.Aeron(context=self._client_context(aeron_dir))
        except pyaeron.AeronError as exc:
            self._close_driver()
            raise MediaDriverError(
                f"cannot connect to a media driver in {aeron_dir} "
                f"(waited {cfg.driver_timeout_ms} ms): {exc}"
            ) from exc
        return self

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
        admin_action_retries: int = DEFAULT_ADMIN_ACTION_RETRIES,
    ) -> Publisher:
        """A publisher on ``channel``/``stream_id``; exclusive (single-writer) by default."""
        aeron = self.aeron
        if exclusive:
            pub: pyaeron.Publication | pyaeron.ExclusivePublication = (
                aeron.add_exclusive_publication(channel, stream_id)
            )
        else:
            pub = aeron.add_publication(channel, stream_id)
        publisher = Publisher(pub, admin_action_retries=admin_action_retries)
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
