"""#30.5: memory growth between minute 5 and the end, per part that ran as one process."""

from __future__ import annotations

from tensorpool.commands.soak import _growth


def _snap(pid: int, rss: int, anon: int) -> dict[str, int]:
    return {"pid": pid, "rss_kib": rss, "anon_kib": anon, "open_files": 5, "mappings": 100}


def test_30_5_growth_is_per_part_in_percent_and_the_largest_is_reported() -> None:
    before = {"driver-a": _snap(1, 1000, 500), "serve": _snap(2, 2000, 1000)}
    after = {"driver-a": _snap(1, 1010, 500), "serve": _snap(2, 2200, 1100)}
    g = _growth(before, after)
    assert g["parts"]["driver-a"] == {"rss_pct": 1.0, "anon_pct": 0.0}
    assert g["max_rss_pct"] == 10.0 and g["max_anon_pct"] == 10.0


def test_30_5_a_restarted_or_gone_part_is_not_compared() -> None:
    before = {"ratelimiter": _snap(1, 1000, 500), "consumer-101": _snap(2, 1000, 500)}
    after = {"ratelimiter": _snap(9, 3000, 1500)}  # a new process; consumer-101 gone
    assert _growth(before, after) == {"parts": {}, "max_rss_pct": None, "max_anon_pct": None}
