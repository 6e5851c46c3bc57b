"""Property tests (hypothesis) of the ingress buffer's invariants, plus a differential test
against a deliberately naive reference model written straight from the seed's rules."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorpool.ingest import (
    DropInfo,
    DropReason,
    IngestResult,
    IngressBuffer,
    IngressOverflowError,
    ReplaceInfo,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LANE_NAMES = ("a", "b", "c", None)  # None -> the default lane


@dataclass(frozen=True)
class Item:
    uid: int
    key: int | None
    lane: str | None


@dataclass
class Config:
    mode: str
    capacity: int
    lanes: bool
    priorities: dict[str, int]
    ordering: str | None
    overflow: str | None


@st.composite
def configs(draw: st.DrawFn, allow_fail: bool = True) -> Config:
    mode = draw(st.sampled_from(["queue", "dedup_set", "latest_by_key"]))
    overflows = ["drop_oldest", "drop_newest", "drop_buffer"] + (["fail"] if allow_fail else [])
    return Config(
        mode=mode,
        capacity=draw(st.integers(1, 6)),
        lanes=draw(st.booleans()),
        priorities={name: draw(st.integers(1, 3)) for name in ("a", "b", "c", "default")},
        ordering=None if mode == "queue" else draw(st.sampled_from(["none", "fifo"])),
        overflow=None if mode != "queue" else draw(st.sampled_from([None, *overflows])),
    )


# An op is ("i", key, lane) | ("d", max_items) | ("r",). Ops are drawn as small integers and
# decoded (cheap to generate, shrink towards "ingest key 0"). Few keys and mostly ingests, so
# re-ingests, evictions, migrations and budget-limited drains are the common case.
def _decode(code: int) -> tuple:
    if code < 72:  # 72% ingests: key 0..4 or None (1 in 6), one of four lanes
        key = (code % 24) // 4
        return ("i", None if key == 5 else key, LANE_NAMES[code % 4])
    if code < 95:
        return ("d", (code - 72) % 5)
    return ("r",)


OPS = st.lists(st.integers(0, 99), min_size=15, max_size=80).map(
    lambda codes: [_decode(c) for c in codes]
)


@dataclass
class Recorder:
    drops: list[DropInfo] = field(default_factory=list)
    replaces: list[ReplaceInfo] = field(default_factory=list)


def build(cfg: Config, rec: Recorder | None = None) -> IngressBuffer:
    kw: dict[str, Any] = {}
    if rec is not None:
        kw["on_drop"] = rec.drops.append
        kw["on_replace"] = rec.replaces.append
    return IngressBuffer(
        "prop",
        mode=cfg.mode,
        capacity=cfg.capacity,
        key=(lambda it: it.key) if cfg.mode != "queue" else None,
        lane=(lambda it: it.lane) if cfg.lanes else None,
        lane_priority=cfg.priorities,
        ordering=cfg.ordering,
        overflow=cfg.overflow,
        **kw,
    )


def run(buf: IngressBuffer, ops: list[tuple], *, resets: bool = True) -> list[tuple]:
    """Apply ops; return a trace of observable results (ingest results and drains)."""
    trace: list[tuple] = []
    uid = 0
    for op in ops:
        if op[0] == "i":
            uid += 1
            try:
                trace.append(("i", buf.ingest(Item(uid, op[1], op[2]))))
            except IngressOverflowError as exc:
                trace.append(("i", "overflow", exc.item.uid))
        elif op[0] == "d":
            out: list[Item] = []
            stats = buf.drain(op[1], out.append)
            trace.append(("d", stats, tuple(it.uid for it in out)))
        elif resets:
            buf.metrics_reset()
    return trace


def _priority(cfg: Config, item: Item) -> int:
    if not cfg.lanes:
        return cfg.priorities["default"]
    return cfg.priorities[item.lane if item.lane is not None else "default"]


# ------------------------------------------------------------------ invariants
@SETTINGS
@given(cfg=configs(), ops=OPS)
def test_prop_pending_never_exceeds_capacity(cfg: Config, ops: list[tuple]) -> None:
    """Seed §5/§11: capacity is a hard, global bound after every ingest and drain."""
    buf = build(cfg)
    uid = 0
    for op in ops:
        if op[0] == "i":
            uid += 1
            with contextlib.suppress(IngressOverflowError):
                buf.ingest(Item(uid, op[1], op[2]))
        elif op[0] == "d":
            buf.drain(op[1], lambda _: None)
        assert 0 <= buf.pending <= cfg.capacity
        assert sum(lm.pending for lm in buf.metrics().lanes.values()) == buf.pending


@SETTINGS
@given(cfg=configs(), ops=OPS)
def test_prop_conservation(cfg: Config, ops: list[tuple]) -> None:
    """ingested = enqueued + deduped + replaced; every admitted item ends up drained,
    dropped, replaced out or still pending -- exactly one of them (seed §12 definitions)."""
    rec = Recorder()
    buf = build(cfg, rec)
    admitted: list[int] = []
    deduped = 0
    drained: list[int] = []
    uid = 0
    for op in [*ops, ("d", cfg.capacity)]:
        if op[0] == "i":
            uid += 1
            try:
                res = buf.ingest(Item(uid, op[1], op[2]))
            except IngressOverflowError:
                continue
            if res is IngestResult.DEDUPED:
                deduped += 1
            elif not (res is IngestResult.DROPPED and op[1] is None and cfg.mode != "queue"):
                admitted.append(uid)
        elif op[0] == "d":
            out: list[Item] = []
            buf.drain(op[1], out.append)
            drained += [it.uid for it in out]
    m = buf.metrics()
    assert m.pending == 0  # the final drain of `capacity` items empties it: "eventually"
    assert m.ingested_total == m.enqueued_total + m.deduped_total + m.replaced_total
    assert m.deduped_total == deduped
    evicted = [
        d.item.uid for d in rec.drops if d.reason not in (DropReason.BAD_KEY, DropReason.OVERFLOW)
    ]
    replaced_out = [r.old.uid for r in rec.replaces]
    outcomes = drained + evicted + replaced_out
    assert sorted(outcomes) == sorted(admitted)  # each admitted item exactly once
    assert m.enqueued_total == m.drained_total + len(evicted)
    assert m.dropped_by_reason["bad_key"] == sum(
        1 for op in ops if op[0] == "i" and op[1] is None and cfg.mode != "queue"
    )


@SETTINGS
@given(cfg=configs(allow_fail=False), ops=OPS)
def test_prop_drain_order_respects_lane_priority(cfg: Config, ops: list[tuple]) -> None:
    """Seed §7: strict priority -- within a drain, priorities never increase, and nothing of a
    higher priority than the last served item is left behind.

    Keyed items get a lane fixed by their key here, so an item's lane is the lane it is
    drained from (migration is covered by the reference-model test).
    """
    buf = build(cfg)
    uid = 0
    for op in ops:
        if op[0] == "i":
            uid += 1
            lane = op[2] if cfg.mode == "queue" or op[1] is None else LANE_NAMES[op[1] % 4]
            buf.ingest(Item(uid, op[1], lane))
        elif op[0] == "d":
            out: list[Item] = []
            buf.drain(op[1], out.append)
            prios = [_priority(cfg, it) for it in out]
            assert prios == sorted(prios, reverse=True)
            if out:
                metrics = buf.metrics()
                floor = prios[-1]
                for name, lm in metrics.lanes.items():
                    if lm.pending and lm.priority > floor:
                        raise AssertionError(f"lane {name} (prio {lm.priority}) left behind")


@SETTINGS
@given(cfg=configs(), ops=OPS)
def test_prop_metrics_totals_equal_sums_of_drain_deltas(cfg: Config, ops: list[tuple]) -> None:
    """Seed §6.1/§12: drain deltas partition the totals (no reset in between)."""
    buf = build(cfg)
    trace = run(buf, [*[op for op in ops if op[0] != "r"], ("d", 0)], resets=False)
    drains = [t[1] for t in trace if t[0] == "d"]
    m = buf.metrics()
    assert m.drain_calls_total == len(drains)
    assert m.drained_total == sum(s.processed for s in drains)
    assert m.dropped_total == sum(s.dropped for s in drains)
    assert m.replaced_total == sum(s.replaced for s in drains)
    assert m.dropped_total == sum(m.dropped_by_reason.values())
    assert m.last_drain == drains[-1]


@SETTINGS
@given(cfg=configs(), ops=OPS)
def test_prop_metrics_reset_changes_no_drain_result(cfg: Config, ops: list[tuple]) -> None:
    """Seed §12: metrics_reset touches no contents, order, lane queues or RR pointers."""
    with_resets = run(build(cfg), ops, resets=True)
    without = run(build(cfg), ops, resets=False)
    assert with_resets == without


@SETTINGS
@given(cfg=configs(), ops=OPS, chunk=st.integers(1, 8))
def test_prop_ingest_many_equals_ingest_loop(cfg: Config, ops: list[tuple], chunk: int) -> None:
    """``ingest_many`` is a faster spelling of the loop, not a different semantics."""
    a, b = build(cfg), build(cfg)
    uid = 0
    batch: list[Item] = []

    def flush() -> None:
        # A refused item ends ingest_many; resuming after it must give the loop's outcome.
        nonlocal batch
        rest = batch
        while rest:
            try:
                b.ingest_many(rest)
                rest = []
            except IngressOverflowError as exc:
                rest = rest[rest.index(exc.item) + 1 :]
        batch = []

    for op in ops:
        if op[0] == "i":
            uid += 1
            it = Item(uid, op[1], op[2])
            with contextlib.suppress(IngressOverflowError):
                a.ingest(it)
            batch.append(it)
            if len(batch) >= chunk:
                flush()
        elif op[0] == "d":
            flush()
            out_a: list[Item] = []
            out_b: list[Item] = []
            assert a.drain(op[1], out_a.append) == b.drain(op[1], out_b.append)
            assert out_a == out_b
    flush()
    assert a.metrics() == b.metrics()


# ------------------------------------------------------------------ reference model
class Model:
    """The seed's rules, transcribed as plainly as possible (lists and linear scans)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.seq = 0
        self.entries: list[dict[str, Any]] = []  # key, item, lane, seen, pos
        self.lanes: list[str] = []  # creation order
        self.evict_last: dict[int, int] = {}
        self.drain_next: dict[int, int] = {}
        self.events: list[tuple] = []

    def prio(self, lane: str) -> int:
        return self.cfg.priorities[lane]

    def klass(self, prio: int) -> list[str]:
        return [ln for ln in self.lanes if self.prio(ln) == prio]

    def in_lane(self, lane: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["lane"] == lane]

    def losing_lane(self) -> str:
        for prio in sorted({self.prio(ln) for ln in self.lanes}):
            cls = self.klass(prio)
            last = self.evict_last.get(prio, -1)
            for i in range(len(cls)):
                j = (last + 1 + i) % len(cls)
                if self.in_lane(cls[j]):
                    self.evict_last[prio] = j
                    return cls[j]
        raise AssertionError

    def ingest(self, it: Item) -> object:
        cfg = self.cfg
        lane = (it.lane or "default") if cfg.lanes else "default"
        if cfg.mode != "queue" and it.key is None:
            self.events.append(("drop", "bad_key", it.uid))
            return IngestResult.DROPPED
        if lane not in self.lanes:
            self.lanes.append(lane)
        if cfg.mode == "queue":
            if len(self.entries) >= cfg.capacity and cfg.overflow == "fail":
                self.events.append(("drop", "overflow", it.uid))
                return ("overflow", it.uid)
            self.seq += 1
            self.entries.append({"item": it, "lane": lane, "seen": self.seq, "pos": self.seq})
            if len(self.entries) > cfg.capacity:
                victim = self.losing_lane()
                mine = sorted(self.in_lane(victim), key=lambda e: e["pos"])
                policy = cfg.overflow or "drop_oldest"
                gone = {"drop_oldest": mine[:1], "drop_newest": mine[-1:]}.get(policy, mine)
                for e in gone:
                    self.entries.remove(e)
                    self.events.append(("drop", policy, e["item"].uid))
                if any(e["item"] is it for e in gone):
                    return IngestResult.DROPPED
            return IngestResult.ENQUEUED
        self.seq += 1
        for e in self.entries:
            if e["key"] == it.key:
                e["seen"] = self.seq
                if e["lane"] != lane:
                    e["lane"] = lane
                    e["pos"] = self.seq
                if cfg.mode == "latest_by_key":
                    self.events.append(("replace", e["item"].uid, it.uid))
                    e["item"] = it
                    return IngestResult.REPLACED
                return IngestResult.DEDUPED
        new = {"key": it.key, "item": it, "lane": lane, "seen": self.seq, "pos": self.seq}
        self.entries.append(new)
        if len(self.entries) > cfg.capacity:
            victim = self.losing_lane()
            lru = min(self.in_lane(victim), key=lambda e: e["seen"])
            self.entries.remove(lru)
            self.events.append(("drop", "evict_lru", lru["item"].uid))
            if lru is new:
                return IngestResult.DROPPED
        return IngestResult.ENQUEUED

    def next_of(self, lane: str) -> dict[str, Any]:
        order = "seen" if (self.cfg.mode != "queue" and self.cfg.ordering == "none") else "pos"
        return min(self.in_lane(lane), key=lambda e: e[order])

    def drain(self, k: int) -> list[int]:
        out: list[int] = []
        for prio in sorted({self.prio(ln) for ln in self.lanes}, reverse=True):
            cls = self.klass(prio)
            m = len(cls)
            start = self.drain_next.get(prio, 0)
            rotation = [cls[(start + i) % m] for i in range(m)]
            while len(out) < k and any(self.in_lane(ln) for ln in rotation):
                for ln in rotation:
                    if len(out) >= k:
                        break
                    if not self.in_lane(ln):
                        continue
                    e = self.next_of(ln)
                    self.entries.remove(e)
                    out.append(e["item"].uid)
                    self.drain_next[prio] = (cls.index(ln) + 1) % m
        return out


@SETTINGS
@given(cfg=configs(), ops=OPS)
def test_prop_matches_reference_model(cfg: Config, ops: list[tuple]) -> None:
    """Every ingest result, drained sequence, drop and replacement equals the naive model's."""
    rec = Recorder()
    buf = build(cfg, rec)
    model = Model(cfg)
    uid = 0
    for op in ops:
        if op[0] == "i":
            uid += 1
            it = Item(uid, op[1], op[2])
            try:
                got: object = buf.ingest(it)
            except IngressOverflowError as exc:
                got = ("overflow", exc.item.uid)
            assert got == model.ingest(it)
        elif op[0] == "d":
            out: list[Item] = []
            buf.drain(op[1], out.append)
            assert [i.uid for i in out] == model.drain(op[1])
        ours = [("drop", d.reason.value, d.item.uid) for d in rec.drops]
        ours += [("replace", r.old.uid, r.new.uid) for r in rec.replaces]
        assert sorted(ours) == sorted(model.events)
        assert buf.pending == len(model.entries)


LONG_OPS = st.lists(st.integers(0, 99), min_size=200, max_size=400).map(
    lambda codes: [_decode(c) for c in codes]
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=configs()
    .filter(lambda c: c.mode != "queue")
    .map(lambda c: Config(c.mode, min(c.capacity, 3), c.lanes, c.priorities, "fifo", None)),
    ops=LONG_OPS,
)
def test_prop_fifo_bookkeeping_survives_long_eviction_runs(cfg: Config, ops: list[tuple]) -> None:
    """Long runs with a tiny capacity: many evictions and migrations retire first-enqueue
    records and trigger their sweeps; the drain order must still be the model's."""
    test_prop_matches_reference_model.hypothesis.inner_test(cfg, ops)  # type: ignore[attr-defined]


def test_fifo_bookkeeping_memory_stays_bounded_under_constant_eviction() -> None:
    """Every eviction leaves a retired record behind; sweeping keeps memory proportional to
    the pending keys, not to the keys ever seen."""
    import tracemalloc

    for lanes in (False, True):
        buf = IngressBuffer(
            "b",
            mode="dedup_set",
            capacity=4,
            key=lambda it: it.key,
            lane=(lambda it: it.lane) if lanes else None,
            ordering="fifo",
        )
        tracemalloc.start()
        for uid in range(2_000):
            buf.ingest(Item(uid, uid, "ab"[uid % 2]))
        warm, _ = tracemalloc.get_traced_memory()
        for uid in range(2_000, 40_000):
            buf.ingest(Item(uid, uid, "ab"[uid % 2]))
        grown, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert grown - warm < 64 * 1024, (lanes, grown - warm)
        out: list[Item] = []
        buf.drain(10, out.append)
        assert [it.uid for it in out] == sorted(it.uid for it in out)
        assert len(out) == 4


# ------------------------------------------------------------------ handlers that re-enter
class HandlerBoom(Exception):
    """Raised by a scripted handler to check that a failing handler leaves exact counts."""


class ReentrantModel(Model):
    """The model's drain with a handler that may ingest into the buffer (or raise) mid-drain.

    Rotation rules of a drain (what a handler that ingests can observe): each priority class
    present when the drain starts is served once, in turn, with the lanes it has when reached
    (rotation size fixed then); after a first round over all of them, a lane found empty at the
    end of a round leaves the rotation for the rest of this drain; when a single lane is left,
    it is drained as long as it has items and budget. An item whose handler raised counts as
    drained.
    """

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.drained: dict[str, int] = {}

    def drain_with(self, k: int, handle: Any) -> int:
        out = 0

        def serve(prio: int, cls: list[str], m: int, ln: str) -> None:
            nonlocal out
            e = self.next_of(ln)
            self.entries.remove(e)
            out += 1
            self.drained[ln] = self.drained.get(ln, 0) + 1
            self.drain_next[prio] = (cls.index(ln) + 1) % m
            handle(e["item"])

        for prio in sorted({self.prio(ln) for ln in self.lanes}, reverse=True):
            if out >= k:
                break
            cls = self.klass(prio)
            m = len(cls)
            if m == 1:
                while out < k and self.in_lane(cls[0]):
                    serve(prio, cls, m, cls[0])
                continue
            start = self.drain_next.get(prio, 0)
            rotation = [cls[(start + i) % m] for i in range(m)]
            for ln in rotation:
                if self.in_lane(ln):
                    serve(prio, cls, m, ln)
                    if out >= k:
                        return out
            turns = [ln for ln in rotation if self.in_lane(ln)]
            while out < k and turns:
                if len(turns) == 1:
                    while out < k and self.in_lane(turns[0]):
                        serve(prio, cls, m, turns[0])
                    break
                for ln in turns:
                    if not self.in_lane(ln):
                        continue
                    serve(prio, cls, m, ln)
                    if out >= k:
                        break
                turns = [ln for ln in turns if self.in_lane(ln)]
        return out


@st.composite
def reentrant_configs(draw: st.DrawFn) -> Config:
    """Mostly several lanes of equal priority and room for many keys: drains then run full
    round-robin rounds in which a handler's ingest can empty (``drop_buffer``, evictions) or
    refill a lane that is about to be visited."""
    mode = draw(st.sampled_from(["queue", "dedup_set", "latest_by_key"]))
    overflows = [None, "drop_oldest", "drop_newest", "drop_buffer", "fail"]
    return Config(
        mode=mode,
        capacity=draw(st.integers(2, 16)),
        lanes=draw(st.sampled_from([True, True, True, False])),
        priorities={
            **{name: draw(st.sampled_from([1, 1, 1, 2])) for name in ("a", "b", "c", "default")},
            "late": 2,
        },
        ordering=None if mode == "queue" else draw(st.sampled_from(["none", "fifo"])),
        overflow=None if mode != "queue" else draw(st.sampled_from(overflows)),
    )


# A drain op here carries a script for its handler: ingests to run after the n-th handed item
# (key, lane) and the item count at which the handler raises (or None).
REENTRANT_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("i"), st.one_of(st.none(), st.integers(0, 30)), st.sampled_from(LANE_NAMES)
        ),
        st.tuples(
            st.just("d"),
            st.integers(0, 40),
            st.lists(
                st.tuples(
                    st.integers(1, 16),
                    st.one_of(st.none(), st.integers(0, 30)),
                    st.sampled_from((*LANE_NAMES, "late")),
                ),
                max_size=6,
            ),
            st.one_of(st.none(), st.integers(1, 16)),
        ),
    ),
    min_size=10,
    max_size=100,
)


def _scripted_handler(
    ingest: Any,
    out: list[int],
    results: list[object],
    nested: list[tuple[int, Item]],
    boom_at: int | None,
    pending: Any,
    seen: list[int],
) -> Any:
    """A handler that records what it gets, ingests ``nested`` items after the n-th item
    (recording the results and the pending depth it then sees) and raises at ``boom_at``."""

    def handle(it: Item) -> None:
        out.append(it.uid)
        for at, nested_item in nested:
            if at == len(out):
                try:
                    results.append(ingest(nested_item))
                except IngressOverflowError as exc:
                    results.append(("overflow", exc.item.uid))
                seen.append(pending())
        if boom_at == len(out):
            raise HandlerBoom

    return handle


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=reentrant_configs(), ops=REENTRANT_OPS)
def test_prop_reentrant_handler_matches_reference_model(cfg: Config, ops: list[tuple]) -> None:
    """Seed §8.3/§12 under re-entry: a handler that ingests into the buffer it is drained from
    (evicting, migrating, opening a new lane) or raises mid-drain sees the exact pending depth
    and leaves exact totals: handed-out order, ingest results, drops and replacements, per-lane
    drained counts and the round-robin position all equal the reference model's.
    """
    rec = Recorder()
    buf = build(cfg, rec)
    model = ReentrantModel(cfg)
    uid = 0
    processed = 0
    for op in ops:
        if op[0] == "i":
            uid += 1
            it = Item(uid, op[1], op[2])
            try:
                got: object = buf.ingest(it)
            except IngressOverflowError as exc:
                got = ("overflow", exc.item.uid)
            assert got == model.ingest(it)
            continue
        _, k, script, boom_at = op
        nested = []
        for at, key, lane in script:
            uid += 1
            nested.append((at, Item(uid, key, lane)))
        ours: list[int] = []
        ours_res: list[object] = []
        ours_seen: list[int] = []
        try:
            stats = buf.drain(
                k,
                _scripted_handler(
                    buf.ingest, ours, ours_res, nested, boom_at, lambda: buf.pending, ours_seen
                ),
            )
            assert (stats.processed, stats.pending) == (len(ours), buf.pending)
        except HandlerBoom:
            assert boom_at == len(ours)
        processed += len(ours)
        theirs: list[int] = []
        theirs_res: list[object] = []
        theirs_seen: list[int] = []
        with contextlib.suppress(HandlerBoom):
            model.drain_with(
                k,
                _scripted_handler(
                    model.ingest,
                    theirs,
                    theirs_res,
                    nested,
                    boom_at,
                    lambda: len(model.entries),
                    theirs_seen,
                ),
            )
        assert ours == theirs
        assert ours_res == theirs_res
        assert ours_seen == theirs_seen  # the depth a handler sees mid-drain is exact
        assert buf.pending == len(model.entries)
        m = buf.metrics()
        assert m.drained_total == processed
        got_lanes = {n: lm.drained_total for n, lm in m.lanes.items() if lm.drained_total}
        assert got_lanes == {n: c for n, c in model.drained.items() if c}
    events = [("drop", d.reason.value, d.item.uid) for d in rec.drops]
    events += [("replace", r.old.uid, r.new.uid) for r in rec.replaces]
    assert sorted(events) == sorted(model.events)
