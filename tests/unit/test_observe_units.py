"""#19 without processes: image rules of the viewer, the bind option, the config keys, the top
model's rates, the latency histogram, and the demo camera's changing mean (#19.4)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tensorpool.commands.produce import Pattern
from tensorpool.config_util import ConfigError, parse_bind
from tensorpool.counters import LatencyHistogram
from tensorpool.driver.config import parse_driver_config
from tensorpool.observe.render import encode, to_image
from tensorpool.observe.top import QOS_FRESH_NS, QosBook, rows


def test_2d_is_grayscale_with_auto_contrast() -> None:
    a = np.full((40, 50), 1000, np.uint16)
    a[:, 25:] = 1100  # a 12-bit camera's small range must still be black and white
    img = to_image(a)
    assert img.mode == "L" and img.size == (50, 40)
    px = np.asarray(img)
    assert px[:, :25].max() <= 1 and px[:, 25:].min() >= 254


def test_colormap_and_rgb_and_other_shapes() -> None:
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    assert to_image(a, "viridis").mode == "RGB"
    rgb = np.zeros((8, 9, 3), np.uint8)
    rgb[..., 0] = 200
    img = to_image(rgb)
    assert img.mode == "RGB" and img.size == (9, 8) and img.getpixel((0, 0)) == (200, 0, 0)
    for other in (np.arange(100.0), np.zeros((3, 4, 5)), np.zeros(0), np.array([np.nan, 1.0])):
        plot = to_image(other)
        assert plot.size == (640, 240)  # a plotted row and a histogram, never an exception
    png = encode(a, "png")
    assert Image.open(io.BytesIO(png)).format == "PNG"


@pytest.mark.parametrize(
    ("text", "want"),
    [("9100", ("127.0.0.1", 9100)), (":0", ("127.0.0.1", 0)), ("0.0.0.0:80", ("0.0.0.0", 80)),
     ("[::1]:9", ("::1", 9))],
)  # fmt: skip
def test_bind_defaults_to_loopback(text: str, want: tuple[str, int]) -> None:
    assert parse_bind(text) == want


@pytest.mark.parametrize("text", ["x", "1:2:99999", "host:", "a b:1"])
def test_bad_bind_is_a_message(text: str) -> None:
    assert isinstance(parse_bind(text), str)


def _driver_doc(bind: str) -> dict:
    profile = {"header_nslots": 16, "payload_pools": [{"pool_id": 1, "stride_bytes": 4096}]}
    return {
        "driver": {"metrics_bind": bind},
        "profiles": {"p": profile},
        "policies": {"allow_dynamic_streams": True},
    }


def test_metrics_bind_config_key_is_checked() -> None:
    cfg = parse_driver_config(_driver_doc("9100"), source="d.toml", env={})
    assert cfg.driver.metrics_bind == "9100"
    with pytest.raises(ConfigError) as err:
        parse_driver_config(_driver_doc("nope"), source="d.toml", env={})
    assert err.value.file == "d.toml" and err.value.key == "driver.metrics_bind"


def test_latency_histogram_is_cumulative() -> None:
    h = LatencyHistogram((0.001, 0.01))
    for ns in (500_000, 2_000_000, 3_000_000, 50_000_000):
        h.observe_ns(ns)
    assert h.cumulative() == [("0.001", 1), ("0.01", 3), ("+Inf", 4)]
    assert h.sum_s == pytest.approx(0.0555)


def _region(seq: int, ts: int) -> dict:
    return {
        "superblock": {"nslots": 8, "epoch": 3, "pid": 1, "pid_alive": True},
        "ring": {
            "occupancy": {"committed": 4, "in_progress": 0},
            "newest_committed_seq": seq,
            "newest_timestamp_ns": ts,
            "pools": [{"pool_id": 1, "slots": 4, "values_bytes": 4 * 1000}],
        },
    }


def test_top_rates_from_two_snapshots() -> None:
    first, memo = rows({7: _region(100, 0)}, None, None, now_ns=1_000_000_000, now_unix_ns=0)
    assert first[0].frames_per_s is None  # one snapshot: no rate yet
    second, _ = rows({7: _region(150, 0)}, memo, None, now_ns=1_500_000_000, now_unix_ns=0)
    r = second[0]
    assert r.frames_per_s == pytest.approx(100.0)
    assert r.mb_per_s == pytest.approx(100.0 * 1000 / 1e6)
    assert r.occupancy == 0.5 and r.epoch == 3 and r.consumers is None


def test_top_driver_columns() -> None:
    driver = {
        "streams": [{"stream_id": 7, "epoch": 3, "consumer_count": 2, "producer_lease_id": 5}],
        "leases": [{"stream_id": 7}, {"stream_id": 7}, {"stream_id": 7}],
        "written_unix_ns": 1_000_000_000,
    }
    (r,), _ = rows({7: _region(1, 0)}, None, driver, now_ns=1, now_unix_ns=3_000_000_000)
    assert (r.consumers, r.leases, r.producer_lease) == (2, 3, True)
    assert r.driver_status_age_s == pytest.approx(2.0)


def test_demo_camera_moves_and_its_mean_changes() -> None:
    """#19.4: the picture moves (the disc) and the mean intensity differs between batches."""
    p = Pattern("moving", (480, 640), np.uint16)
    frames = []
    for seq in (0, 50, 100, 150):
        a = np.zeros((480, 640), np.uint16)
        p.fill(a, seq)
        frames.append(a)
    means = [f.mean() for f in frames]
    assert max(means) - min(means) > 200, means
    bright = [np.argwhere(f == 4095).mean(axis=0) for f in frames]  # the disc's centre
    assert np.linalg.norm(bright[0] - bright[1]) > 50


def test_qos_book_forgets_silent_consumers() -> None:
    book = QosBook()
    book.on_consumer(7, 1, 2, 100, 3, 4, 2, now_ns=0)
    book.on_consumer(7, 2, 2, 90, 0, 0, 1, now_ns=QOS_FRESH_NS)
    book.on_consumer(8, 1, 1, 5, 0, 0, 1, now_ns=QOS_FRESH_NS)
    (a, b) = book.consumers(7, QOS_FRESH_NS)
    assert (a.consumer_id, a.mode, a.drops_gap, a.drops_late) == (1, "rate-limited", 3, 4)
    assert b.mode == "stream"
    (only,) = book.consumers(7, QOS_FRESH_NS + 1)  # consumer 1 has been silent too long
    assert only.consumer_id == 2
    (r, r8), _ = rows({7: _region(100, 0)}, None, None, now_ns=QOS_FRESH_NS + 1, now_unix_ns=0,
                      qos=book)  # fmt: skip
    assert [c.consumer_id for c in r.qos_consumers] == [2] and r.qos_drops == (0, 0)
    assert r8.stream_id == 8 and r8.newest_seq is None  # heard on QoS only: still listed
    assert r.announce_age_s is None
    book.on_announce(7, 2, now_ns=QOS_FRESH_NS)
    (r, _), _ = rows({7: _region(100, 0)}, None, None, now_ns=QOS_FRESH_NS + 500_000_000,
                     now_unix_ns=0, qos=book)  # fmt: skip
    assert r.announce_age_s == pytest.approx(0.5)


def test_metrics_server_serves_process_metrics_and_refuses_a_taken_port() -> None:
    import socket
    import urllib.request

    from tensorpool.observe.metrics import scrape_values, start_metrics

    assert start_metrics("") is None  # default: off
    server = start_metrics("127.0.0.1:0")
    assert server is not None
    try:
        with urllib.request.urlopen(server.url, timeout=5) as r:
            values = scrape_values(r.read().decode())
        assert values["process_resident_memory_bytes"] > 1e6
        with pytest.raises(ValueError, match="cannot listen"):
            start_metrics(f"127.0.0.1:{server.port}")
    finally:
        server.close()
    with socket.socket() as s:  # closed: the port is free again (TIME_WAIT aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))
    with pytest.raises(ValueError, match="not HOST:PORT"):
        start_metrics("localhost:http")


def test_collector_reads_again_when_the_agent_thread_races_it() -> None:
    """A dict that grows under a snapshot raises RuntimeError: read again, never fail."""
    from prometheus_client.core import GaugeMetricFamily

    from tensorpool.observe.metrics import _SnapshotCollector

    calls = []

    class Racing(_SnapshotCollector):
        def _read(self) -> list:
            calls.append(1)
            if len(calls) < 3:
                raise RuntimeError("dictionary changed size during iteration")
            return [GaugeMetricFamily("x", "x", value=1)]

    assert [m.name for m in Racing().collect()] == ["x"] and len(calls) == 3


def test_top_counts_frames_in_the_ring_when_seqs_skip() -> None:
    """A rate limiter keeps its source's seqs (every 10th): frames/s is what the ring got,
    not how far the seq moved; when the ring turned over, the seq distance is all there is."""
    first = _region(100, 0)
    first["seqs"] = list(range(10, 101, 10))
    _, memo = rows({7: first}, None, None, now_ns=0, now_unix_ns=0)
    later = _region(200, 0)
    later["seqs"] = [100, *range(130, 201, 10)]  # 9 slots, one from before: 8 new frames
    (r,), _ = rows({7: later}, memo, None, now_ns=1_000_000_000, now_unix_ns=0)
    assert r.frames_per_s == pytest.approx(8.0)
    turned = _region(1000, 0)
    turned["seqs"] = list(range(930, 1001, 10))  # every slot newer than 100: the ring wrapped
    (r,), _ = rows({7: turned}, memo, None, now_ns=1_000_000_000, now_unix_ns=0)
    assert r.frames_per_s == pytest.approx(90.0)  # 900 seqs, one frame per 10 seqs
    turned["seqs"] = list(range(993, 1001))  # a producer's own consecutive seqs
    (r,), _ = rows({7: turned}, memo, None, now_ns=1_000_000_000, now_unix_ns=0)
    assert r.frames_per_s == pytest.approx(900.0)
    del turned["seqs"]  # no ring scan: the seq distance is all there is
    (r,), _ = rows({7: turned}, memo, None, now_ns=1_000_000_000, now_unix_ns=0)
    assert r.frames_per_s == pytest.approx(900.0)
