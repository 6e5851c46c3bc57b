"""Issue #28.1: one conductor per process, rate limiter, bridge and Spark included.

A process holding a rate limiter relay (forwarding metadata, progress and QoS), a consumer of
the relay's destination, a Spark announce probe with its metadata tracker, a stream discovery
and a Spark attachment registers exactly one Aeron client with the media driver, has one
subscription per control, metadata and QoS stream, and decodes every control-plane message
once (every ``decode_any`` of the process is the conductor's). Real standalone media driver
process (so the only Aeron clients are this process's), real SHM files, Aeron's own counters
in ``cnc.dat``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from tensorpool.client.conductor import ContextConductor
from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.endpoints import Endpoints
from tensorpool.ratelimiter.agent import RateLimiterAgent
from tensorpool.ratelimiter.config import DriverAccess, MappingConfig, RateLimiterConfig
from tensorpool.spark_source.rings.attach import Attachment
from tensorpool.spark_source.rings.discovery import StreamDiscovery
from tensorpool.spark_source.rings.probe import AnnounceProbe
from tensorpool.transport.cnc import CLIENT_HEARTBEAT_TYPE, read_counters
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import release_shared_context, shared_context
from tensorpool.transport.mediadriver import MediaDriverProcess

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
DEADLINE_S = 60.0  # generous: the host is loaded; the waits poll for the condition
CONTROL, DESC, QOS, META, DEST_DESC = 1000, 1001, 1002, 1003, 1004
SRC, DST = 11, 12


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count every ``decode_any`` of every tensorpool module (the module-level names)."""
    calls = [0]
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "decode_any", None)
        if (
            name.startswith("tensorpool.")
            and callable(f)
            and not name.startswith("tensorpool.specs")
        ):

            def counted(*a: object, _f: Callable[..., object] = f, **k: object) -> object:
                calls[0] += 1
                return _f(*a, **k)

            monkeypatch.setattr(mod, "decode_any", counted)
    return calls


def _settings(transport: TransportConfig, shm: str, desc: int) -> ClientSettings:
    return ClientSettings(
        transport=transport,
        channels=Endpoints(
            control_stream_id=CONTROL,
            descriptor_stream_id=desc,
            qos_stream_id=QOS,
            metadata_stream_id=META,
        ),
        shm_base_dir=shm,
        announce_period_ns=100_000_000,
        qos_period_ns=100_000_000,
    )


def test_28_1_relay_consumer_and_spark_share_one_client_one_subscription_per_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with MediaDriverProcess() as md, tempfile.TemporaryDirectory(dir=SHM_ROOT) as shm:
        transport = TransportConfig(aeron_dir=md.dir)
        src_s, dst_s = _settings(transport, shm, DESC), _settings(transport, shm, DEST_DESC)
        ctx = shared_context(transport)
        hub = ContextConductor.acquire(ctx)
        decodes = _count_decodes(monkeypatch)
        closers: list[Callable[[], object]] = [lambda: release_shared_context(ctx), hub.release]
        try:
            source = Producer(
                ctx,
                StreamConfig(SRC, header_nslots=16, pools=(PoolConfig(1, 4096),), name="src"),
                src_s,
            )
            closers.append(source.close)
            config = RateLimiterConfig(
                instance_id="rl-28",
                descriptor_channel="aeron:ipc",
                descriptor_stream_id=DEST_DESC,
                mappings=(MappingConfig(SRC, DST, "one", max_rate_hz=0),),
                driver=DriverAccess(
                    control_stream_id=CONTROL,
                    descriptor_stream_id=DESC,
                    qos_stream_id=QOS,
                    metadata_stream_id=META,
                    shm_base_dir=shm,
                ),
                forward_progress=True,
                source_control_stream_id=CONTROL,
                dest_control_stream_id=CONTROL,
                forward_qos=True,
                source_qos_stream_id=QOS,
                dest_qos_stream_id=QOS,
            )
            agent = RateLimiterAgent(
                config,
                ctx,
                open_source=lambda m: Consumer(ctx, m.source_stream_id, src_s),
                open_dest=lambda m: Producer(
                    ctx,
                    StreamConfig(DST, header_nslots=16, pools=(PoolConfig(1, 4096),)),
                    dst_s,
                ),
            )
            closers.append(agent.close)
            reader = Consumer(ctx, DST, dst_s)
            closers.append(reader.close)
            # the Spark side: it asks for the process's context by its settings, as in Spark
            probe = AnnounceProbe((SRC,), src_s, map_layout=lambda layout: None)
            closers.append(probe.close)
            meta = probe.meta_tracker()
            att = Attachment((SRC,), src_s, background=False)
            closers.append(att.close)
            disc = StreamDiscovery(ctx, src_s.channels.control_channel, CONTROL, (1, 100))
            closers.append(disc.close)

            frames = [0]

            def on_frame(_f: object) -> None:
                frames[0] += 1

            deadline = time.monotonic() + DEADLINE_S
            payload = np.zeros(64, np.uint8)
            while not (
                frames[0] >= 3
                and SRC in disc.found()
                and SRC in att.layouts()
                and meta.versions_for(SRC, source.epoch)
                and agent.snapshot()["forwarded"]["announce"] >= 1
            ):
                assert time.monotonic() < deadline, "the process's clients did not come up"
                source.offer(payload)
                source.do_work()
                agent.do_work()
                reader.poll(on_frame)
                probe.poll()
                disc.poll()
                att.poll_once()
                time.sleep(0.005)
            assert probe.wait_for_layouts(DEADLINE_S, (SRC,))[SRC].epoch == source.epoch

            # one Aeron client: the media driver serves no other process here
            clients = Counter(t for t, _ in read_counters(md.dir))[CLIENT_HEARTBEAT_TYPE]
            assert clients == 1
            # one subscription per control-plane stream (each client's descriptor stream is
            # its data path and stays its own)
            subs = Counter(sid for _ch, sid in ctx.subscriptions)
            assert {sid: subs[sid] for sid in (CONTROL, QOS, META)} == {
                CONTROL: 1,
                QOS: 1,
                META: 1,
            }
            # decoded once: every decode of the process is the conductor's, and it fanned out
            assert hub.counters["decoded"] > 0
            assert decodes[0] == hub.counters["decoded"]
            assert hub.counters["dispatched"] > hub.counters["decoded"]
        finally:
            for close in reversed(closers):
                close()
