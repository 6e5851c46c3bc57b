"""Issue #28.1: one client conductor per process (per Aeron context and endpoints).

All producers and consumers of a context share one Aeron client, one subscription to the
control stream and one to the metadata stream, and each control message is decoded once, not
once per client. Real embedded media driver, real SHM files, Aeron's own counters in cnc.dat.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import time
from collections import Counter

import numpy as np

from tensorpool.client.conductor import ClientConductor
from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.transport.cnc import CLIENT_HEARTBEAT_TYPE, read_counters, subscriber_images
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
DEADLINE_S = 30.0  # generous: the host is loaded; the waits poll for the condition


def _settings(shm_base: str) -> ClientSettings:
    return ClientSettings(
        transport=TransportConfig(), shm_base_dir=shm_base, announce_period_ns=20_000_000
    )


def _stream(stream_id: int) -> StreamConfig:
    return StreamConfig(stream_id, header_nslots=16, pools=(PoolConfig(1, 4096),))


def _drive(clients: list, until, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for c in clients:
            if isinstance(c, Producer):
                c.do_work()
            else:
                c.poll(lambda f: None)
        time.sleep(0.002)


def test_28_1_clients_of_one_context_share_one_aeron_client_and_control_subscription() -> None:
    """Two producers and three consumers on two streams: one conductor (five holders), one
    Aeron client registered with the media driver, one subscription on the control stream
    and one on the metadata stream (per-client subscriptions would count five and three)."""
    with tempfile.TemporaryDirectory(dir=SHM_ROOT) as shm_base, AeronContext() as ctx:
        s = _settings(shm_base)
        producers = [Producer(ctx, _stream(sid), s) for sid in (21, 22)]
        consumers = [Consumer(ctx, sid, s) for sid in (21, 21, 22)]
        try:
            clients = [*producers, *consumers]
            conductors = {id(c._conductor) for c in clients}
            assert len(conductors) == 1
            assert producers[0]._conductor.holders == len(clients)
            _drive(clients, lambda: all(c.is_mapped for c in consumers), "the mappings")
            counters = read_counters(ctx.dir)
            types = Counter(t for t, _ in counters)
            assert types[CLIENT_HEARTBEAT_TYPE] == 1
            ch = s.channels
            # one subscription, one image: the process's one shared control publication
            assert subscriber_images(counters, ch.control_stream_id) == 1
            assert subscriber_images(counters, ch.metadata_stream_id) == 1
        finally:
            for c in [*consumers, *producers]:
                c.close()
        assert producers[0]._conductor.holders == 0


def test_28_1_each_control_message_is_decoded_once_for_all_consumers() -> None:
    """Three consumers of one stream: the conductor's ``decoded`` counter equals the number of
    messages the control, metadata and QoS streams carried (counted by a raw subscription of
    the test; the producer's QoS lane brings it its consumers' QosConsumer, §10.1.3), not three
    times the announces; every consumer still maps and reads frames."""
    with tempfile.TemporaryDirectory(dir=SHM_ROOT) as shm_base, AeronContext() as ctx:
        s = _settings(shm_base)
        ch = s.channels
        conductor = ClientConductor.acquire(ctx, ch)  # exists before any message is sent
        raw = Counter()
        raw_subs = [
            ctx.add_subscription(
                ch.control_channel, ch.control_stream_id, lambda b, h: raw.update(["control"])
            ),
            ctx.add_subscription(
                ch.metadata_channel, ch.metadata_stream_id, lambda b, h: raw.update(["meta"])
            ),
            ctx.add_subscription(
                ch.qos_channel, ch.qos_stream_id, lambda b, h: raw.update(["qos"])
            ),
        ]
        producer = Producer(ctx, _stream(31), s)
        consumers = [Consumer(ctx, 31, s) for _ in range(3)]
        clients = [producer, *consumers]
        try:
            _drive(clients, lambda: all(c.is_mapped for c in consumers), "the mappings")
            start = producer.stats.announces
            _drive(clients, lambda: producer.stats.announces >= start + 5, "five announces")
            producer.offer(np.zeros(8, np.uint8))
            got = [0, 0, 0]

            def count(i: int):
                def on_frame(frame: object) -> None:
                    got[i] += 1

                return on_frame

            deadline = time.monotonic() + DEADLINE_S
            while not all(got):
                assert time.monotonic() < deadline, "a consumer got no frame"
                for i, c in enumerate(consumers):
                    c.poll(count(i))
            # quiesce: nobody sends now; both sides read everything that was sent
            before = -1
            while before != (conductor.counters["decoded"], sum(raw.values())):
                before = (conductor.counters["decoded"], sum(raw.values()))
                time.sleep(0.05)
                conductor.poll()
                for sub in raw_subs:
                    sub.poll()
            assert raw["control"] >= 5
            assert raw["qos"] >= 3  # each consumer's first QoS, and the producer's
            assert conductor.counters["decoded"] == raw["control"] + raw["meta"] + raw["qos"]
            assert conductor.counters["dispatched"] >= 3 * 5  # each announce to 3 consumers
        finally:
            for c in [*consumers, producer]:
                c.close()
            conductor.release()


def test_28_1_a_client_handles_its_messages_only_on_the_thread_that_polls_it() -> None:
    """The thread rule: the conductor, polled through consumer A on this thread, only queues
    what concerns consumer B; B acts on it (maps) when B is polled, here on another thread.
    So clients of one context may live on different threads (a Spark keeper thread next to
    the plan thread) without one thread touching another's client."""
    with tempfile.TemporaryDirectory(dir=SHM_ROOT) as shm_base, AeronContext() as ctx:
        s = _settings(shm_base)
        producer = Producer(ctx, _stream(41), s)
        a, b = Consumer(ctx, 41, s), Consumer(ctx, 41, s)
        try:
            _drive([producer, a], lambda: a.is_mapped, "consumer A's mapping")
            assert not b.is_mapped
            assert b._inbox.items, "B's announces are queued for B"
            errors: list[BaseException] = []

            def poll_b() -> None:
                deadline = time.monotonic() + DEADLINE_S
                try:
                    while not b.is_mapped and time.monotonic() < deadline:
                        # the producer keeps announcing (on this thread now): on a loaded
                        # host the announces queued for B may be stale when B gets to them
                        producer.do_work()
                        b.poll(lambda f: None)
                        time.sleep(0.001)
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            t = threading.Thread(target=poll_b)
            t.start()
            t.join()
            assert not errors
            assert b.is_mapped
        finally:
            for c in (a, b, producer):
                c.close()


def test_s10_1_1_an_announce_sent_before_a_consumer_registered_is_before_its_join() -> None:
    """§10.1.1 with a shared subscription: a consumer's join time is at least when it
    registered with the conductor. An announce already in the log then (its own control
    subscription would never have seen it) is ignored as ``announce_before_join``."""
    with tempfile.TemporaryDirectory(dir=SHM_ROOT) as shm_base, AeronContext() as ctx:
        s = _settings(shm_base)
        producer = Producer(ctx, _stream(51), s)
        early = Consumer(ctx, 52, s)  # keeps the conductor's images linked meanwhile
        try:
            _drive([producer, early], lambda: producer.stats.announces >= 1, "an announce")
            # producer.do_work polls the conductor before it announces: after the do_work
            # that announced, the announce is still unread in the log
            n = producer.stats.announces
            deadline = time.monotonic() + DEADLINE_S
            while producer.stats.announces == n:
                assert time.monotonic() < deadline, "no further announce"
                producer.do_work()
            late = Consumer(ctx, 51, s)
            try:
                late.poll(lambda f: None)
                assert late.stats.control["announce_before_join"] >= 1
                assert not late.is_mapped
            finally:
                late.close()
        finally:
            early.close()
            producer.close()


def test_28_1_two_processes_conductors_may_spell_the_control_channel_differently() -> None:
    """The conductor's control-plane publications stay each client's own log (exclusive, under
    a lock). Concurrent ones are shared by every client of the media driver on the same channel
    and stream, so a second client (another process: here a second Aeron client of the same
    media driver) asking for another ``term-length`` on the control stream was refused
    ("existing publication has different 'term-length'"), which killed a rate limiter whose
    config spelled the channel differently from its producers'."""
    with (
        tempfile.TemporaryDirectory(dir=SHM_ROOT) as shm_base,
        AeronContext() as ctx_a,
        AeronContext(TransportConfig(aeron_dir=ctx_a.dir)) as ctx_b,
    ):
        base = _settings(shm_base)
        one_m = dataclasses.replace(base.channels, control_channel="aeron:ipc?term-length=1m")
        four_m = dataclasses.replace(base.channels, control_channel="aeron:ipc?term-length=4m")
        producer = Producer(ctx_a, _stream(31), dataclasses.replace(base, channels=four_m))
        consumer = Consumer(ctx_b, 31, dataclasses.replace(base, channels=one_m))
        try:
            _drive([producer, consumer], lambda: consumer.is_mapped, "the mapping")
        finally:
            consumer.close()
            producer.close()
