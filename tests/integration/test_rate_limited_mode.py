"""Consumer mode RATE_LIMITED (Wire Spec §11, §10.1.3): the producer declines per-consumer
streams, so the consumer stays on the shared stream and drops locally to `max_rate_hz`."""

from __future__ import annotations

import time

import numpy as np

from tensorpool.client.consumer import MODE_RATE_LIMITED, Consumer
from tensorpool.client.producer import Producer, StreamConfig
from tensorpool.client.settings import ClientSettings
from tensorpool.transport.clock import ManualClock
from tensorpool.transport.config import TransportConfig
from tensorpool.transport.context import AeronContext


def test_s11_rate_limited_consumer_drops_locally_when_producer_declines(
    media_driver, shm_base
) -> None:
    settings = ClientSettings(
        transport=TransportConfig(aeron_dir=media_driver.dir), shm_base_dir=shm_base
    )
    clock = ManualClock(time.monotonic_ns())  # the consumer's clock; advanced 10 ms per frame
    with AeronContext(settings.transport) as ctx:
        ctx.start()
        producer = Producer(ctx, StreamConfig.for_frame_bytes(3, 4096, header_nslots=256), settings)
        consumer = Consumer(ctx, 3, settings, mode=MODE_RATE_LIMITED, max_rate_hz=10, clock=clock)
        try:
            deadline = time.monotonic() + 10
            while (not consumer.is_mapped or consumer.config_declined is None) and (
                time.monotonic() < deadline
            ):
                clock.set(time.monotonic_ns())
                producer.do_work()
                consumer.poll(lambda f: None)
                time.sleep(0.005)
            assert consumer.is_mapped
            assert consumer.config_declined is True  # §10.1.3: empty channel, stream id 0
            accepted: list[int] = []
            for i in range(100):
                producer.offer(np.full(16, i, np.int64))
                consumer.poll(lambda f: accepted.append(f.seq))
                clock.advance(10_000_000)  # a 100 Hz stream in consumer time
            for _ in range(10):
                consumer.poll(lambda f: accepted.append(f.seq))
            # a fixed 100 ms grid from the first frame; a frame up to a quarter period early
            # for its slot is taken (jitter tolerance), so each slot takes its 80 ms frame
            assert accepted == [0, *range(8, 100, 10)]
            assert consumer.stats.drops["rate_limited"] == 89
            assert consumer.drops_gap == 0  # rate limiting is not loss
        finally:
            consumer.close()
            producer.close()
