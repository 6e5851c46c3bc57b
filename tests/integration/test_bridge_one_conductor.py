"""#28.1 for the bridge: its sender and receiver are clients of the process's one conductor.

One bridge process bridging a stream to itself over loopback UDP (a sender mapping and a
receiver mapping, ``role`` per mapping), forwarding metadata, progress and QoS, next to the
stream's producer and a consumer of the bridged stream: one subscription per control-plane
stream (the local control and metadata streams, the bridge's control and metadata streams),
and every control-plane message of the process decoded once, by the conductor. Frames still
cross the bridge. Real embedded media driver, real UDP, real SHM files.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from netports import free_udp_ports

from tensorpool.bridge.app import BridgeApp
from tensorpool.bridge.config import parse_bridge_config
from tensorpool.client.conductor import ContextConductor
from tensorpool.client.consumer import Consumer
from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
DEADLINE_S = 60.0  # generous: the host is loaded; the waits poll for the condition
SRC, DEST = 11, 12
BRIDGE_CONTROL, BRIDGE_META = 3001, 3002


def test_28_1_bridge_sender_and_receiver_share_the_process_conductor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = tempfile.mkdtemp(prefix="tp-bridge-28-", dir=SHM_ROOT)
    p_payload, p_control, p_meta = free_udp_ports(3)
    cfg = parse_bridge_config(
        {
            "bridge": {
                "instance_id": "both-28",
                "payload_channel": f"aeron:udp?endpoint=127.0.0.1:{p_payload}",
                "payload_stream_id": 3000,
                "control_channel": f"aeron:udp?endpoint=127.0.0.1:{p_control}",
                "control_stream_id": BRIDGE_CONTROL,
                "metadata_channel": f"aeron:udp?endpoint=127.0.0.1:{p_meta}",
                "metadata_stream_id": BRIDGE_META,
                "forward_progress": True,
                "forward_qos": True,
            },
            "local": {"driver_mode": False, "shm_base_dir": base, "announce_period_ms": 100},
            "profiles": {
                "p": {"header_nslots": 16, "payload_pools": [{"pool_id": 1, "stride_bytes": 4096}]}
            },
            "mappings": [
                {"role": "sender", "source_stream_id": SRC, "dest_stream_id": DEST, "profile": "p",
                 "source_control_stream_id": 1000, "dest_control_stream_id": 1000},
                {"role": "receiver", "source_stream_id": SRC, "dest_stream_id": DEST,
                 "profile": "p", "source_control_stream_id": 1000,
                 "dest_control_stream_id": 1000},
            ],
        },
        env={},
    )  # fmt: skip
    settings = cfg.local.client_settings()
    ch = settings.channels
    closers: list[Callable[[], object]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    ctx = AeronContext(TransportConfig()).start()
    closers.append(ctx.close)
    try:
        hub = ContextConductor.acquire(ctx)
        closers.append(hub.release)
        calls = [0]
        for name, mod in list(sys.modules.items()):
            f = getattr(mod, "decode_any", None)
            if name.startswith("tensorpool.") and callable(f) and "specs" not in name:

                def counted(*a: object, _f: Callable[..., object] = f, **k: object) -> object:
                    calls[0] += 1
                    return _f(*a, **k)

                monkeypatch.setattr(mod, "decode_any", counted)
        producer = Producer(
            ctx,
            StreamConfig(SRC, header_nslots=16, pools=(PoolConfig(1, 4096),), name="src"),
            settings,
        )
        closers.append(producer.close)
        app = BridgeApp(cfg, ctx=ctx)
        closers.append(app.close)
        consumer = Consumer(ctx, DEST, settings)
        closers.append(consumer.close)
        got: list[int] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 3:
            assert time.monotonic() < deadline, f"no frames across the bridge: {app.status()}"
            producer.offer(np.full(16, len(got), np.uint8))
            producer.do_work()
            app.do_work()
            consumer.poll(lambda f: got.append(f.seq))
            time.sleep(0.002)

        subs = Counter(sid for _ch, sid in ctx.subscriptions)
        lanes = (ch.control_stream_id, ch.metadata_stream_id, BRIDGE_CONTROL, BRIDGE_META)
        assert {sid: subs[sid] for sid in lanes} == dict.fromkeys(lanes, 1)
        assert hub.counters["decoded"] > 0
        assert calls[0] == hub.counters["decoded"]  # nobody decodes the control plane again
    finally:
        for close in reversed(closers):
            close()
