"""The soak's fault schedule: a pure function of (seed, duration, fault kinds, targets).

The same seed gives the same schedule on every host, so a failing run is repeated by its seed
alone. Faults are spread evenly over the run (one slot per fault, a seeded offset inside the
slot) so no kind is starved and two faults never land on the same instant; the first and last
``margin_s`` are kept quiet so warm-up and the final accounting see a steady system.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Component kinds the soak runs; each can be killed (-9) or stopped (SIGTERM) and restarted.
COMPONENTS: tuple[str, ...] = (
    "driver",
    "mediadriver",
    "producer",
    "consumer",
    "ratelimiter",
    "bridge",
    "serve",
)

#: Fault kinds that need no particular component kind beyond the topology's.
OTHER_FAULTS: tuple[str, ...] = (
    "stall",  # SIGSTOP for 1-5 s, then SIGCONT
    "producer-restart",  # SIGTERM + start again at once, inside the old lease's window
    "consumer-churn",  # an extra consumer joins, reads a while, leaves
    "forge-announce",
    "forge-descriptor",
    "forge-revoke",
    "forge-shutdown",
    "fs-full",  # the SHM directory's filesystem driven near full
    "spark-restart",
)

FAULT_KINDS: tuple[str, ...] = (
    *(f"kill9-{c}" for c in COMPONENTS),
    *(f"sigterm-{c}" for c in COMPONENTS),
    *OTHER_FAULTS,
)

STALL_MIN_S = 1.0
STALL_MAX_S = 5.0
CHURN_MIN_S = 8.0
CHURN_MAX_S = 20.0


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: at ``at_s`` seconds after the warm-up, ``kind`` hits ``target``
    (a process name of the topology, or "" for faults that pick no process); ``hold_s`` is
    the stall or churn length."""

    at_s: float
    kind: str
    target: str
    hold_s: float = 0.0


def parse_faults(text: str) -> tuple[str, ...]:
    """``all``, ``none`` or a comma list of :data:`FAULT_KINDS` (unknown names are an error)."""
    text = text.strip()
    if text == "all":
        return FAULT_KINDS
    if text in ("", "none"):
        return ()
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(
            f"unknown fault kind {', '.join(unknown)}; known: all, none, {', '.join(FAULT_KINDS)}"
        )
    return kinds


def target_kind(kind: str) -> str | None:
    """The component kind a fault picks its target among (None: no process target)."""
    if kind.startswith(("kill9-", "sigterm-")):
        return kind.split("-", 1)[1]
    if kind == "producer-restart":
        return "producer"
    if kind == "stall":
        return "*"
    if kind == "spark-restart":
        return "spark"
    return None


def plan(
    seed: int,
    duration_s: float,
    kinds: Sequence[str],
    targets: Mapping[str, Sequence[str]],
    *,
    margin_s: float = 5.0,
    min_spacing_s: float = 6.0,
) -> list[Fault]:
    """The schedule for one run, sorted by time.

    ``targets`` maps a component kind to the names of its processes (sorted by the caller or
    not: they are sorted here). Kinds whose component is absent are left out; every other kind
    appears at least once when the run is long enough for ``min_spacing_s`` per fault, and
    the kinds cycle in a seeded order after that. Returns [] when no fault fits.
    """
    rng = random.Random(seed)
    names = {k: sorted(v) for k, v in targets.items() if v}
    every = sorted(n for v in names.values() for n in v)
    usable = []
    for kind in kinds:
        tk = target_kind(kind)
        if tk is None or (tk == "*" and every) or tk in names:
            usable.append(kind)
    window = duration_s - 2 * margin_s
    if not usable or window < min_spacing_s:
        return []
    n = int(window // min_spacing_s)
    order = list(usable)
    rng.shuffle(order)
    picked = [order[i % len(order)] for i in range(n)]
    slot = window / n
    faults = []
    for i, kind in enumerate(picked):
        at = margin_s + i * slot + rng.uniform(0.0, slot * 0.5)
        tk = target_kind(kind)
        target = "" if tk is None else rng.choice(every if tk == "*" else names[tk])
        hold = 0.0
        if kind == "stall":
            hold = round(rng.uniform(STALL_MIN_S, STALL_MAX_S), 3)
        elif kind == "consumer-churn":  # long enough for a Python process to start on a busy host
            hold = round(rng.uniform(CHURN_MIN_S, CHURN_MAX_S), 3)
        faults.append(Fault(round(at, 3), kind, target, hold))
    return faults
