"""Prometheus metrics for every tensorpool process (#19.1), read at scrape time.

Why collectors and not ``Counter.inc()`` per frame: the agents already count everything the
issue asks for (frames, bytes, drops by reason, leases, epochs) in plain ints and
:class:`~tensorpool.counters.DropCounters`. A custom collector turns those into metric
families only when Prometheus scrapes, so metrics cost the hot path nothing at all, and the
names stay one vocabulary: the ``reason`` label is the existing reason name.

Threading: ``prometheus_client`` serves scrapes on its own thread while the agent runs on the
main thread. Reads of ints are atomic under the GIL; a snapshot that iterates a dict the agent
grows meanwhile can raise ``RuntimeError``, which :class:`_SnapshotCollector` absorbs by
reading again (it is rare: reason dicts are pre-seeded). A scrape never blocks or slows the agent.

Who may scrape (#30): only requests whose ``Host`` names this endpoint are answered
(:class:`~tensorpool.observe.hostcheck.HostCheck`; others get 421 and are counted in
``tensorpool_http_host_refused_total``), so a web page cannot read the statistics through DNS
rebinding.

Names follow Prometheus conventions: ``tensorpool_`` prefix, base units in the name
(``_bytes``, ``_seconds``), ``_total`` for counters. The list is in docs/observe.md.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from tensorpool.config_util import parse_bind
from tensorpool.counters import LatencyHistogram
from tensorpool.observe.hostcheck import HostCheck

if TYPE_CHECKING:
    from tensorpool.bridge.app import BridgeApp
    from tensorpool.client.consumer import Consumer
    from tensorpool.client.producer import Producer
    from tensorpool.driver.agent import DriverAgent
    from tensorpool.ratelimiter.agent import RateLimiterAgent

log = logging.getLogger("tensorpool.observe.metrics")

_NS = 1e-9


class _SnapshotCollector(Collector):
    """A collector that reads its process's counters once per scrape (``_read``), again if
    the agent thread changed a dict under it."""

    def _read(self) -> list[Metric]:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        for _ in range(5):
            try:
                yield from self._read()
                return
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        log.warning("metrics snapshot kept racing the agent; this scrape is empty")


def _drops(
    name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], Mapping[str, int]]]
) -> CounterMetricFamily:
    """One counter family with a ``reason`` label from reason -> count dicts."""
    fam = CounterMetricFamily(name, doc, labels=[*labels, "reason"])
    for values, counts in rows:
        for reason, n in sorted(counts.items()):
            fam.add_metric([*values, reason], n)
    return fam


def histogram(name: str, doc: str, hist: LatencyHistogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=hist.cumulative(), sum_value=hist.sum_s)


class ProducerCollector(_SnapshotCollector):
    """``tensorpool produce`` (and any Producer): frames and bytes published, drops, epoch."""

    def __init__(self, producer: Producer, attach_latency: LatencyHistogram | None = None) -> None:
        self.producer = producer
        self.attach_latency = attach_latency

    def _read(self) -> list[Metric]:
        p = self.producer
        st = p.stats
        s = [str(p.stream_id)]
        out: list[Metric] = []
        for name, doc, value in (
            ("tensorpool_frames_published", "frames committed to the ring", st.frames),
            ("tensorpool_bytes_published", "payload bytes committed", st.bytes),
            (
                "tensorpool_descriptors_not_sent",
                "frames committed whose descriptor Aeron refused (no subscriber or back pressure)",
                st.descriptors_not_sent,
            ),
            ("tensorpool_announces_sent", "ShmPoolAnnounce messages sent", st.announces),
            (
                "tensorpool_wake_semaphores_removed",
                "dead consumers' wake semaphore files removed (transport/wakeup.py)",
                st.wake_sems_removed,
            ),
        ):
            fam = CounterMetricFamily(name, doc, labels=["stream"])
            fam.add_metric(s, value)
            out.append(fam)
        out.append(
            _drops(
                "tensorpool_producer_drops",
                "frames the producer refused, by reason",
                ["stream"],
                [(s, st.drops.snapshot())],
            )
        )
        epoch = GaugeMetricFamily("tensorpool_epoch", "current epoch", labels=["stream", "role"])
        epoch.add_metric([*s, "producer"], p.epoch or 0)
        out.append(epoch)
        if self.attach_latency is not None:
            out.append(
                histogram(
                    "tensorpool_attach_latency_seconds",
                    "client side: attach request sent -> lease granted",
                    self.attach_latency,
                )
            )
        return out


class ConsumerCollector(_SnapshotCollector):
    """``tensorpool consume`` (and any Consumer): frames accepted, drops by reason, announces."""

    def __init__(self, consumer: Consumer, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.consumer = consumer
        self.clock = clock

    def _read(self) -> list[Metric]:
        c = self.consumer
        st = c.stats
        s = [str(c.stream_id)]
        out: list[Metric] = []
        for name, doc, value in (
            ("tensorpool_frames_accepted", "frames read and validated", st.frames),
            ("tensorpool_bytes_accepted", "payload bytes of accepted frames", st.bytes),
            ("tensorpool_remaps", "times the consumer mapped a new epoch", st.remaps),
            (
                "tensorpool_wake_semaphores_removed",
                "dead consumers' wake semaphore files removed (transport/wakeup.py)",
                st.wake_sems_removed,
            ),
        ):
            fam = CounterMetricFamily(name, doc, labels=["stream"])
            fam.add_metric(s, value)
            out.append(fam)
        # slot-read reasons (their LATE_REASONS sum is QoS drops_late) plus "gap" (QoS drops_gap:
        # seqs never seen); the reason label is the counter's own name
        drops = st.drops.snapshot()
        drops["gap"] = c.drops_gap
        out.append(
            _drops(
                "tensorpool_frames_dropped",
                "frames the consumer missed or refused, by reason (gap: never seen)",
                ["stream"],
                [(s, drops)],
            )
        )
        out.append(
            _drops(
                "tensorpool_control_dropped",
                "control messages refused, by reason",
                ["stream"],
                [(s, st.control.snapshot())],
            )
        )
        epoch = GaugeMetricFamily("tensorpool_epoch", "current epoch", labels=["stream", "role"])
        epoch.add_metric([*s, "consumer"], c.epoch or 0)
        out.append(epoch)
        stamp = c.core.newest_announce_ns
        if stamp:  # the announcer's CLOCK_MONOTONIC: the same clock on one host
            age = GaugeMetricFamily(
                "tensorpool_announce_age_seconds",
                "time since the newest ShmPoolAnnounce this consumer saw",
                labels=["stream"],
            )
            age.add_metric(s, max(self.clock() - stamp, 0) * _NS)
            out.append(age)
        return out


class RunnerCollector(_SnapshotCollector):
    """What every daemon's runner knows (#26.3): is its media driver there, since when lost,
    reconnects. Registered by the runner's command helper, so no daemon goes without it."""

    def __init__(self, health: Callable[[], Mapping[str, object]]) -> None:
        self.health = health  # AgentRunner.health

    def _read(self) -> list[Metric]:
        health = self.health()
        role = [str(health["role"])]
        md = health.get("media_driver")
        connected = GaugeMetricFamily(
            "tensorpool_media_driver_connected",
            "1 while this process's Aeron client is connected to a live media driver",
            labels=["role"],
        )
        out: list[Metric] = [connected]
        if not isinstance(md, dict):  # no context: nothing to lose
            connected.add_metric(role, 1)
            return out
        connected.add_metric(role, 1 if md["connected"] else 0)
        lost = GaugeMetricFamily(
            "tensorpool_media_driver_lost_seconds",
            "how long the media driver has been lost (0 while connected)",
            labels=["role"],
        )
        lost.add_metric(role, float(md["lost_for_s"] or 0.0))
        attempts = GaugeMetricFamily(
            "tensorpool_media_driver_reconnect_attempts",
            "reconnect attempts since the loss was noticed (0 while connected)",
            labels=["role"],
        )
        attempts.add_metric(role, int(md["reconnect_attempts"]))
        reconnects = CounterMetricFamily(
            "tensorpool_media_driver_reconnects",
            "reconnects to a new media driver in the same directory",
            labels=["role"],
        )
        reconnects.add_metric(role, int(md["reconnects"]))
        return [*out, lost, attempts, reconnects]


class DriverCollector(_SnapshotCollector):
    """The SHM driver: streams, epochs, leases by role and state, events, attach latency."""

    ROLES = ("PRODUCER", "CONSUMER")

    def __init__(self, agent: DriverAgent, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.agent = agent
        self.clock = clock

    def _read(self) -> list[Metric]:
        agent = self.agent
        status = agent.core.status(self.clock())
        out: list[Metric] = []
        info = GaugeMetricFamily(
            "tensorpool_driver_info", "driver identity", labels=["instance", "state"]
        )
        info.add_metric([status.instance_id, status.state], 1)
        out.append(info)
        epoch = GaugeMetricFamily("tensorpool_driver_epoch", "stream epoch", labels=["stream"])
        consumers = GaugeMetricFamily(
            "tensorpool_driver_consumers", "consumer leases per stream", labels=["stream"]
        )
        producer = GaugeMetricFamily(
            "tensorpool_driver_producer_attached",
            "1 if the stream has a producer lease",
            labels=["stream"],
        )
        for row in status.streams:
            sid = [str(row.stream_id)]
            epoch.add_metric(sid, row.epoch)
            consumers.add_metric(sid, row.consumer_count)
            producer.add_metric(sid, 1 if row.producer_lease_id is not None else 0)
        out += [epoch, consumers, producer]
        counts: dict[tuple[str, str], int] = {}
        for lease in status.leases:
            key = (lease.role, lease.state)
            counts[key] = counts.get(key, 0) + 1
        leases = GaugeMetricFamily(
            "tensorpool_driver_leases", "live leases by role and state", labels=["role", "state"]
        )
        for role in self.ROLES:  # both roles always present, so a dashboard sees 0, not gaps
            if not any(r == role for r, _ in counts):
                counts[(role, "ACTIVE")] = 0
        for (role, state), n in sorted(counts.items()):
            leases.add_metric([role.lower(), state.lower()], n)
        out.append(leases)
        events = CounterMetricFamily(
            "tensorpool_driver_events",
            "driver events (attaches, epochs, announces, ...) by name",
            labels=["source", "event"],
        )
        dropped: dict[str, int] = {}
        for source, table in (("core", status.counters), ("agent", dict(agent.counters))):
            for name, n in sorted(table.items()):
                if name.startswith("malformed_"):
                    dropped[name.removeprefix("malformed_")] = n
                else:
                    events.add_metric([source, name], n)
        out.append(events)
        out.append(
            _drops(
                "tensorpool_driver_messages_dropped",
                "control messages the driver refused, by reason",
                [],
                [([], dropped)],
            )
        )
        out.append(
            histogram(
                "tensorpool_driver_attach_latency_seconds",
                "attach request seen -> handled (regions created, response sent)",
                agent.attach_latency,
            )
        )
        return out


class RateLimiterCollector(_SnapshotCollector):
    """A rate limiter: accepted (published) and dropped frames per mapping, by reason."""

    def __init__(self, agent: RateLimiterAgent) -> None:
        self.agent = agent

    def _read(self) -> list[Metric]:
        snap = self.agent.snapshot()
        labels = ["source_stream", "dest_stream"]
        fams: dict[str, Metric] = {
            "offered": CounterMetricFamily(
                "tensorpool_ratelimiter_frames_offered",
                "source frames offered to the rate gate",
                labels=labels,
            ),
            "published": CounterMetricFamily(
                "tensorpool_ratelimiter_frames_published",
                "frames republished on the destination stream (accepted by the gate)",
                labels=labels,
            ),
            "published_bytes": CounterMetricFamily(
                "tensorpool_ratelimiter_bytes_published",
                "payload bytes republished",
                labels=labels,
            ),
            "rate_hz": GaugeMetricFamily(
                "tensorpool_ratelimiter_rate_hz", "effective rate limit (0: none)", labels=labels
            ),
        }
        epochs = GaugeMetricFamily(
            "tensorpool_ratelimiter_epoch", "epoch per side", labels=[*labels, "side"]
        )
        dropped: list[tuple[list[str], Mapping[str, int]]] = []
        source_dropped: list[tuple[list[str], Mapping[str, int]]] = []
        for m in snap["mappings"]:
            lv = [str(m["source_stream_id"]), str(m["dest_stream_id"])]
            for key, fam in fams.items():
                fam.add_metric(lv, m[key])
            epochs.add_metric([*lv, "source"], m["source_epoch"] or 0)
            epochs.add_metric([*lv, "dest"], m["dest_epoch"] or 0)
            # superseded: a newer frame replaced it before its slot (the gate's rate drop)
            reasons = {
                "superseded": m["superseded"],
                "discarded_on_reset": m["discarded_on_reset"],
                **m["drops"],
            }
            dropped.append((lv, reasons))
            source_dropped.append((lv, m["source_drops"]))
        out = [*fams.values(), epochs]
        out.append(
            _drops(
                "tensorpool_ratelimiter_frames_dropped",
                "source frames not republished, by reason (superseded: rate limit)",
                labels,
                dropped,
            )
        )
        out.append(
            _drops(
                "tensorpool_ratelimiter_source_frames_dropped",
                "frames the source consumer refused, by reason",
                labels,
                source_dropped,
            )
        )
        out.append(
            _drops(
                "tensorpool_ratelimiter_messages_dropped",
                "control messages refused or not forwarded, by reason",
                [],
                [([], {**snap["counters"], **snap["forward_drops"]})],
            )
        )
        return out


class BridgeCollector(_SnapshotCollector):
    """A bridge: frames, bytes and chunks per mapping and role, reassembly drops by reason."""

    def __init__(self, app: BridgeApp) -> None:
        self.app = app

    def _read(self) -> list[Metric]:
        rows = self.app.status()
        labels = ["mapping", "role"]
        counters = {
            key: CounterMetricFamily(f"tensorpool_bridge_{name}", doc, labels=labels)
            for key, name, doc in (
                ("frames", "frames", "frames sent or reassembled"),
                ("bytes", "bytes", "payload bytes sent or reassembled"),
                ("chunks", "chunks", "payload chunks sent or received"),
            )
        }
        epoch = GaugeMetricFamily(
            "tensorpool_bridge_source_epoch", "source stream epoch", labels=labels
        )
        frame_drops: list[tuple[list[str], Mapping[str, int]]] = []
        chunk_drops: list[tuple[list[str], Mapping[str, int]]] = []
        control_drops: list[tuple[list[str], Mapping[str, int]]] = []
        for row in rows:
            lv = [str(row["mapping"]), str(row["role"])]
            for key, fam in counters.items():
                fam.add_metric(lv, int(row.get(key, 0) or 0))
            epoch.add_metric(lv, int(row.get("source_epoch") or 0))
            if row["role"] == "sender":
                frame_drops.append((lv, {**row["drops"], **row["source_drops"]}))
            else:  # receiver: reassembly drops (assembly_timeout, ...)
                frame_drops.append((lv, row["frame_drops"]))
                chunk_drops.append((lv, row["chunk_drops"]))
            control_drops.append((lv, row["control_drops"]))
        return [
            *counters.values(),
            epoch,
            _drops(
                "tensorpool_bridge_frames_dropped",
                "frames not sent or not reassembled, by reason",
                labels,
                frame_drops,
            ),
            _drops(
                "tensorpool_bridge_chunks_dropped",
                "received chunks refused, by reason",
                labels,
                chunk_drops,
            ),
            _drops(
                "tensorpool_bridge_control_dropped",
                "control messages refused, by reason",
                labels,
                control_drops,
            ),
        ]


class ServeCollector(_SnapshotCollector):
    """``tensorpool serve`` (Arrow Flight): frames served and lost, calls and refusals.

    The server counts in one ``Counter`` (frames, frames_lost, gets, scans, and a name per
    refusal); frames and losses get their own families, everything else is an event.
    """

    def __init__(self, server: Any) -> None:
        self.server = server

    def _read(self) -> list[Metric]:
        counts = dict(self.server.counters)
        frames = CounterMetricFamily("tensorpool_serve_frames", "frames sent to Flight clients")
        frames.add_metric([], counts.pop("frames", 0))
        lost = CounterMetricFamily(
            "tensorpool_serve_frames_lost",
            "frames of a requested range already overwritten in the ring",
        )
        lost.add_metric([], counts.pop("frames_lost", 0))
        events = CounterMetricFamily(
            "tensorpool_serve_events", "Flight calls and refusals by name", labels=["event"]
        )
        for name, n in sorted(counts.items()):
            events.add_metric([name], n)
        return [frames, lost, events]


class MetricsServer:
    """A private registry served over HTTP on its own thread; ``close()`` stops it.

    A private registry (not prometheus_client's global one) so two servers in one process (tests,
    an embedded driver) never see each other's collectors. Process CPU and RSS come from
    prometheus_client's own ``ProcessCollector`` (``process_cpu_seconds_total``,
    ``process_resident_memory_bytes``).
    """

    def __init__(self, host: str, port: int, collectors: Iterable[Collector]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.hosts = HostCheck(host)
        self.registry.register(_HostRefusals(self.hosts))
        for c in collectors:
            self.registry.register(c)
        self._server = _serve(host, port, self.hosts, make_wsgi_app(self.registry))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tp-metrics", daemon=True
        )
        self._thread.start()
        self.host = host
        self.port = int(self._server.server_address[1])

    def add(self, collector: Collector) -> None:
        self.registry.register(collector)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _HostRefusals(Collector):
    def __init__(self, hosts: HostCheck) -> None:
        self.hosts = hosts

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            "tensorpool_http_host_refused",
            "requests refused (421) because their Host header did not name this endpoint",
        )
        fam.add_metric([], self.hosts.refused)
        yield fam


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape is not an event


def _serve(host: str, port: int, hosts: HostCheck, app: Any) -> ThreadingWSGIServer:
    """prometheus_client's WSGI app behind the ``Host`` check, on ``host:port``."""

    def checked(environ: dict[str, Any], start_response: Any) -> Any:
        header = environ.get("HTTP_HOST")
        if not hosts.allows(header):
            body = HostCheck.refusal(header)
            start_response(
                "421 Misdirected Request",
                [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return app(environ, start_response)

    class Server(ThreadingWSGIServer):
        daemon_threads = True

    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    Server.address_family = info[0][0]
    return make_server(info[0][4][0], port, checked, Server, handler_class=_Quiet)


def start_metrics(bind: str, collectors: Iterable[Collector] = ()) -> MetricsServer | None:
    """Serve metrics on ``bind`` (``HOST:PORT`` or ``PORT``); None when ``bind`` is empty.

    Raises ValueError with a one-line reason for a bad bind or a port that is taken.
    """
    if not bind:
        return None
    parsed = parse_bind(bind)
    if isinstance(parsed, str):
        raise ValueError(f"--metrics-bind {parsed}")
    host, port = parsed
    try:
        server = MetricsServer(host, port, collectors)
    except OSError as exc:
        raise ValueError(f"--metrics-bind {bind}: cannot listen: {exc.strerror or exc}") from None
    log.info("metrics on %s", server.url)
    return server


def scrape_values(text: str) -> dict[str, float]:
    """Parse an exposition text into ``{'name{labels}': value}`` (tests, ``top``, benches)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out
