"""#30 soak defect (c): each fault waits until the previous one is over, so it is judged alone.

The soak found "a restarted rate limiter is silent": under load 23 on 2 cores the limiter,
killed every 6 s by the schedule, was killed again while its replacement was still starting
(no log line, no "started" event), and each kill counted as not survived. The run loop now
injects the next fault only when no earlier fault is open (`_recovering`).
"""

from __future__ import annotations

from tensorpool.commands.soak import RECOVERY_TIMEOUT_S, Injected, _recovering
from tensorpool.soak.schedule import Fault


def _inj(**kw: object) -> Injected:
    fields: dict[str, object] = {
        "fault": Fault(10.0, "kill9-ratelimiter", "ratelimiter"),
        "at": 100.0,
        "affected": ["consumer-115"],
        "baseline": {"consumer-115": 0},
        "baseline_taken": True,
    }
    fields.update(kw)
    return Injected(**fields)  # type: ignore[arg-type]


def test_30_next_fault_waits_while_a_client_of_the_last_one_has_not_delivered_again() -> None:
    assert _recovering([_inj()], 101.0)
    assert not _recovering([_inj(recovered={"consumer-115": 3.0})], 101.0)


def test_30_next_fault_waits_for_a_replacement_to_run_and_for_a_slow_action() -> None:
    assert _recovering([_inj(baseline_taken=False, recovered={"consumer-115": 1.0})], 101.0)
    assert _recovering([_inj(pending=True, recovered={"consumer-115": 1.0})], 101.0)


def test_30_an_unrecovered_fault_stops_holding_the_schedule_when_its_window_ends() -> None:
    assert not _recovering([_inj()], 100.0 + RECOVERY_TIMEOUT_S + 0.1)
    # a replacement that never ran holds it no longer either
    assert not _recovering([_inj(baseline_taken=False)], 100.0 + RECOVERY_TIMEOUT_S + 0.1)


def test_30_skipped_faults_and_faults_without_clients_hold_nothing() -> None:
    assert not _recovering([_inj(injected=False, baseline_taken=False)], 101.0)
    assert not _recovering([_inj(affected=[], baseline={})], 101.0)
