"""The soak's fault schedule (issue #30 point 2): a pure function of the seed."""

from __future__ import annotations

import itertools

import pytest

from tensorpool.soak.schedule import (
    FAULT_KINDS,
    STALL_MAX_S,
    STALL_MIN_S,
    parse_faults,
    plan,
)

TARGETS = {
    "driver": ["driver-a"],
    "mediadriver": ["md-a"],
    "producer": ["p1", "p2", "p3"],
    "consumer": ["c1", "c2"],
    "ratelimiter": ["rl"],
    "bridge": ["bridge-tx", "bridge-rx"],
    "serve": ["serve"],
    "spark": ["spark"],
}


def test_30_2_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = plan(1, 600, FAULT_KINDS, TARGETS)
    assert a == plan(1, 600, FAULT_KINDS, {k: list(reversed(v)) for k, v in TARGETS.items()})
    assert a != plan(2, 600, FAULT_KINDS, TARGETS)


def test_30_2_every_usable_kind_appears_in_a_long_enough_run_and_targets_its_kind() -> None:
    faults = plan(7, 600, FAULT_KINDS, TARGETS)
    kinds = {f.kind for f in faults}
    assert kinds == set(FAULT_KINDS)  # every kind's component is in TARGETS
    for f in faults:
        if f.kind.startswith(("kill9-", "sigterm-")):
            assert f.target in TARGETS[f.kind.split("-", 1)[1]]
        if f.kind == "spark-restart":  # #30.2: the Spark query is stopped and restarted
            assert f.target == "spark"
        if f.kind == "stall":
            assert STALL_MIN_S <= f.hold_s <= STALL_MAX_S


def test_30_2_faults_stay_inside_the_quiet_margins_and_are_spaced() -> None:
    faults = plan(3, 120, FAULT_KINDS, TARGETS, margin_s=5, min_spacing_s=6)
    times = [f.at_s for f in faults]
    assert times == sorted(times)
    assert all(5 <= t <= 115 for t in times)
    assert all(b - a > 0 for a, b in itertools.pairwise(times))
    assert len(faults) == 110 // 6


def test_30_2_kinds_without_their_component_are_left_out() -> None:
    faults = plan(1, 600, ("kill9-bridge", "kill9-producer"), {"producer": ["p1"]})
    assert faults and {f.kind for f in faults} == {"kill9-producer"}
    assert plan(1, 8, FAULT_KINDS, TARGETS) == []  # no room between the margins
    # no Spark query (the extra not installed, --no-spark): spark-restart is not planned
    no_spark = {k: v for k, v in TARGETS.items() if k != "spark"}
    assert "spark-restart" not in {f.kind for f in plan(1, 600, FAULT_KINDS, no_spark)}


def test_30_2_fault_list_parsing() -> None:
    assert parse_faults("all") == FAULT_KINDS
    assert parse_faults("none") == ()
    assert parse_faults("stall, kill9-driver,stall") == ("stall", "kill9-driver")
    with pytest.raises(ValueError, match="unknown fault kind kill9-toaster"):
        parse_faults("stall,kill9-toaster")
