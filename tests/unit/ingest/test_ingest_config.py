"""Issue #7 rule 1 (configuration surface) and the seed's configuration decisions (§10, §11)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tensorpool.ingest import (
    DEFAULT_LANE,
    IngressBuffer,
    Mode,
    Ordering,
    Overflow,
)


def _key(x: object) -> object:
    return x


def test_rule1_three_modes_by_name_or_enum() -> None:
    for mode in ("dedup_set", "latest_by_key", "queue", Mode.QUEUE):
        buf = IngressBuffer("b", mode=mode, capacity=3, key=_key)
        assert buf.mode is Mode(mode)
    with pytest.raises(ValueError, match="mode must be one of"):
        IngressBuffer("b", mode="dedupSet", capacity=3, key=_key)


def test_s11_capacity_is_required_without_default() -> None:
    """Seed §11: capacity is explicitly chosen by the domain -- there is no default."""
    with pytest.raises(TypeError):
        IngressBuffer("b", mode="queue")  # type: ignore[call-arg]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="capacity must be >= 1"):
            IngressBuffer("b", mode="queue", capacity=bad)
    for bad_type in (True, 2.0, "8", None):
        with pytest.raises(TypeError, match="capacity must be an int"):
            IngressBuffer("b", mode="queue", capacity=bad_type)  # type: ignore[arg-type]


def test_rule1_keyed_modes_require_a_key_function() -> None:
    for mode in ("dedup_set", "latest_by_key"):
        with pytest.raises(ValueError, match="needs a key function"):
            IngressBuffer("b", mode=mode, capacity=1)
    assert IngressBuffer("b", mode="queue", capacity=1).pending == 0


def test_rule1_callables_and_name_are_validated() -> None:
    with pytest.raises(TypeError, match="on_drop must be callable"):
        IngressBuffer("b", mode="queue", capacity=1, on_drop=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lane_priority must be"):
        IngressBuffer("b", mode="queue", capacity=1, lane_priority=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        IngressBuffer("", mode="queue", capacity=1)


def test_rule1_ordering_values_and_default() -> None:
    buf = IngressBuffer("b", mode="dedup_set", capacity=1, key=_key)
    assert buf.ordering is Ordering.NONE
    buf = IngressBuffer("b", mode="latest_by_key", capacity=1, key=_key, ordering="fifo")
    assert buf.ordering is Ordering.FIFO
    with pytest.raises(ValueError, match="ordering must be one of"):
        IngressBuffer("b", mode="dedup_set", capacity=1, key=_key, ordering="lifo")
    assert IngressBuffer("b", mode="queue", capacity=1).ordering is None


def test_s5_3_queue_overflow_default_is_drop_oldest_and_policies_are_named() -> None:
    """Seed §5.3: queue needs an explicit overflow policy; the v1 default is drop oldest."""
    assert IngressBuffer("b", mode="queue", capacity=1).overflow is Overflow.DROP_OLDEST
    for policy in ("drop_oldest", "drop_newest", "drop_buffer", "fail"):
        assert IngressBuffer("b", mode="queue", capacity=1, overflow=policy).overflow == policy
    with pytest.raises(ValueError, match="overflow must be one of"):
        IngressBuffer("b", mode="queue", capacity=1, overflow="block")


def test_s11_keyed_modes_reject_an_overflow_policy() -> None:
    """Seed §11: keyed modes always evict LRU from the losing lane; no other policy."""
    with pytest.raises(ValueError, match="overflow applies to mode 'queue' only"):
        IngressBuffer("b", mode="dedup_set", capacity=1, key=_key, overflow="drop_oldest")
    assert IngressBuffer("b", mode="dedup_set", capacity=1, key=_key).overflow is None


def test_s10_lane_none_or_absent_means_default_lane() -> None:
    """Seed §10.1: no classifier, or a classifier returning None, means lane "default"."""
    plain = IngressBuffer("b", mode="queue", capacity=4)
    plain.ingest(1)
    assert plain.lanes == (DEFAULT_LANE,)
    laned = IngressBuffer("b", mode="queue", capacity=4, lane=lambda x: None if x < 10 else "x")
    laned.ingest(1)
    laned.ingest(11)
    assert laned.lanes == (DEFAULT_LANE, "x")
    assert laned.lane_pending(DEFAULT_LANE) == 1
    assert laned.lane_pending("never") == 0


def test_s10_unknown_lanes_get_priority_1_mapping_or_callable() -> None:
    """Seed §10.1: higher number = higher priority; unknown lanes default to 1."""
    by_map = IngressBuffer(
        "b", mode="queue", capacity=4, lane=lambda x: x[0], lane_priority={"urgent": 3}
    )
    by_fn = IngressBuffer(
        "b",
        mode="queue",
        capacity=4,
        lane=lambda x: x[0],
        lane_priority=lambda ln: 3 if ln == "urgent" else 1,
    )
    for buf in (by_map, by_fn):
        buf.ingest(("other", 1))
        buf.ingest(("urgent", 2))
        lanes = buf.metrics().lanes
        assert lanes["other"].priority == 1
        assert lanes["urgent"].priority == 3
        out: list[object] = []
        buf.drain(2, out.append)
        assert out == [("urgent", 2), ("other", 1)]


def test_s10_bad_lane_priority_is_a_clear_error_and_ingests_nothing() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        IngressBuffer("b", mode="queue", capacity=1, lane=str, lane_priority={"x": 0})
    with pytest.raises(TypeError, match="must be an int"):
        IngressBuffer("b", mode="queue", capacity=1, lane=str, lane_priority={"x": 1.5})
    buf = IngressBuffer(
        "b", mode="latest_by_key", capacity=2, key=_key, lane=str, lane_priority=lambda ln: "hi"
    )
    with pytest.raises(TypeError, match="priority of lane '7' must be an int"):
        buf.ingest(7)
    assert buf.pending == 0
    assert buf.metrics().ingested_total == 0
    assert buf.lanes == ()


def test_s7_unhashable_lane_is_a_clear_type_error() -> None:
    buf = IngressBuffer("b", mode="queue", capacity=2, lane=lambda x: [x])
    with pytest.raises(TypeError, match="unhashable"):
        buf.ingest(1)
    assert buf.pending == 0


def test_rule1_introspection_and_repr() -> None:
    buf = IngressBuffer("pending.frames", mode="latest_by_key", capacity=1, key=_key)
    buf.ingest(5)
    assert (buf.name, buf.capacity, buf.pending, len(buf)) == ("pending.frames", 1, 1, 1)
    assert "pending.frames" in repr(buf) and "latest_by_key" in repr(buf)


def test_s3_host_agnostic_imports_nothing_of_tensorpool_io() -> None:
    """Seed §3: the primitive assumes no host. In a fresh interpreter, importing it loads no
    other tensorpool package (no Aeron, SHM, client or Spark code)."""
    code = (
        "import sys, tensorpool.ingest\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tensorpool', 'pyaeron', "
        "'pyspark', 'numpy'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    loaded = ast.literal_eval(out.strip())
    assert loaded, "the import itself must show up"
    assert all(m == "tensorpool" or m.startswith("tensorpool.ingest") for m in loaded), loaded
