"""Read the source's loss counters back out of Spark's streaming query progress.

The tensorpool source reports data loss (``failOnDataLoss=false``) in its offsets, which Spark
prints in every progress report: ``progress["sources"][i]["endOffset"]`` is the JSON text
``{"<stream>": {"epoch": E, "seq": S, "lost": L, "lostLate": T}}``. :func:`lost_frames` turns a
progress (``query.lastProgress``, a ``StreamingQueryProgress`` or its ``json``) into
``{stream_id: {"lost": L, "lostLate": T, "total": L + T}}`` summed over tensorpool sources.
Health and lag (#16.2) come from ``latestOffset`` instead: :func:`stream_health` and
:func:`stream_lag`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def _as_dict(progress: Any) -> dict[str, Any]:
    if progress is None:
        return {}
    if isinstance(progress, dict):
        return progress
    if isinstance(progress, str):
        return json.loads(progress)
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        return json.loads(text)
    if callable(text):
        return json.loads(text())
    raise TypeError(f"not a streaming query progress: {type(progress).__name__}")


def _source_docs(progress: Any, field: str) -> Iterator[dict[str, Any]]:
    """Each source's ``field`` (``endOffset`` or ``latestOffset``) of one progress report as
    a dict; sources without it, or whose text is not a JSON object, are left out."""
    for source in _as_dict(progress).get("sources", []):
        raw = source.get(field)
        if not raw:
            continue
        try:
            doc = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        if isinstance(doc, dict):
            yield doc


def lost_frames(progress: Any) -> dict[int, dict[str, int]]:
    """Cumulative lost-frame counters per stream from one progress report."""
    out: dict[int, dict[str, int]] = {}
    for doc in _source_docs(progress, "endOffset"):
        for key, pos in doc.items():
            if not (isinstance(pos, dict) and {"epoch", "seq", "lost", "lostLate"} <= set(pos)):
                continue  # not a tensorpool offset
            sid = int(key)
            acc = out.setdefault(sid, {"lost": 0, "lostLate": 0, "total": 0})
            acc["lost"] += int(pos["lost"])
            acc["lostLate"] += int(pos["lostLate"])
            acc["total"] = acc["lost"] + acc["lostLate"]
    return out


def stream_health(progress: Any) -> dict[int, dict[str, Any]]:
    """Per stream, the health the source reported with this progress (#16.2).

    Read from ``progress["sources"][i]["latestOffset"]`` (the source's ``reportLatestOffset``,
    see :mod:`tensorpool.spark_source.plan.health`): ``{stream_id: {"epoch", "seq", "lag",
    "newestFrameAgeMs", "live", "announceAgeMs", "noProducerMs"}}``.
    """
    out: dict[int, dict[str, Any]] = {}
    for doc in _source_docs(progress, "latestOffset"):
        for key, health in doc.items():
            if isinstance(health, dict) and {"lag", "live"} <= set(health):
                out[int(key)] = dict(health)
    return out


def stream_lag(progress: Any) -> dict[int, int | None]:
    """Frames each stream's producer is ahead of the query after this progress's batch (None:
    not known, the stream was never mapped)."""
    return {sid: h["lag"] for sid, h in stream_health(progress).items()}


def shed_frames(progress: Any) -> dict[int, dict[str, int]]:
    """Per stream, the #17 counters of frames the source left out or flagged on purpose (never
    loss): ``{stream_id: {"late": L, "shedLag": S, "shedMemory": M}}`` from ``endOffset``."""
    out: dict[int, dict[str, int]] = {}
    for doc in _source_docs(progress, "endOffset"):
        for key, pos in doc.items():
            if isinstance(pos, dict) and {"epoch", "seq", "lost"} <= set(pos):
                out[int(key)] = {k: int(pos.get(k, 0)) for k in ("late", "shedLag", "shedMemory")}
    return out


def source_watermark(progress: Any) -> int | None:
    """The source's event-time watermark (ms since the epoch) of #17's ``alignEventTime`` /
    ``lateFrames``: the minimum over live streams, reported in ``latestOffset["source"]``."""
    for doc in _source_docs(progress, "latestOffset"):
        if isinstance(doc.get("source"), dict):
            return doc["source"].get("watermarkMs")
    return None


__all__ = ["lost_frames", "shed_frames", "source_watermark", "stream_health", "stream_lag"]
