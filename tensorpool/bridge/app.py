"""One bridge process: its Aeron client, sender and/or receiver agents, and status.

:class:`BridgeApp` joins the host's media driver (``[local]``), builds a
:class:`~tensorpool.bridge.sender.BridgeSender` when the configuration has sender mappings
and a :class:`~tensorpool.bridge.receiver.BridgeReceiver` when it has receiver mappings
(one process may host both, §2.3), and runs them on one duty cycle — on a 2-core host a
thread per agent would only contend for the GIL. :meth:`status` is the per-mapping view
the ``tensorpool bridge`` command prints (frames/s and MB/s are computed by the caller
from two snapshots: :class:`RateMeter`).
"""

from __future__ import annotations

import logging
from typing import Any

from tensorpool.bridge.config import BridgeConfig
from tensorpool.bridge.receiver import BridgeReceiver
from tensorpool.bridge.sender import BridgeSender
from tensorpool.transport.clock import NanoClock, now_ns
from tensorpool.transport.context import AeronContext, release_shared_context, shared_context

log = logging.getLogger(__name__)

__all__ = ["BridgeApp", "RateMeter", "format_status_line"]


class BridgeApp:
    """The agents of one bridge instance on one shared Aeron context (an Agent itself)."""

    def __init__(
        self,
        config: BridgeConfig,
        *,
        ctx: AeronContext | None = None,
        clock: NanoClock = now_ns,
        send_strategy: str = "staging",
    ) -> None:
        self.config = config
        self.role_name = f"bridge[{config.bridge.instance_id}]"
        self._own_ctx = ctx is None
        # the process's one client (#28.1) unless given one; sender and receiver share its
        # conductor: one subscription per local and bridge control stream, decoded once
        self.ctx = ctx or shared_context(config.local.client_settings().transport)
        self.sender: BridgeSender | None = None
        self.receiver: BridgeReceiver | None = None
        try:
            if config.receiver_mappings:
                self.receiver = BridgeReceiver(self.ctx, config, clock=clock)
            if config.sender_mappings:
                self.sender = BridgeSender(self.ctx, config, clock=clock, strategy=send_strategy)
        except BaseException:
            self.close()
            raise

    def on_start(self) -> None:
        pass

    def do_work(self) -> int:
        # a restarted media driver is the runner's business (#26.1: it keeps ``ctx``)
        work = 0
        if self.receiver is not None:
            work += self.receiver.do_work()
        if self.sender is not None:
            work += self.sender.do_work()
        return work

    def on_close(self) -> None:
        self.close()

    def status(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        if self.sender is not None:
            rows.extend(self.sender.status())
        if self.receiver is not None:
            rows.extend(self.receiver.status())
        connected = not self.ctx.media_driver_lost  # #26.3
        for row in rows:
            row["instance_id"] = self.config.bridge.instance_id
            row["media_driver_connected"] = connected
        return rows

    def close(self) -> None:
        for agent in (self.sender, self.receiver):
            if agent is not None:
                try:
                    agent.close()
                except Exception:
                    log.exception("closing %s failed", agent.role_name)
        self.sender = None
        self.receiver = None
        if self._own_ctx:
            self._own_ctx = False
            release_shared_context(self.ctx)


class RateMeter:
    """frames/s and MB/s per mapping between two status snapshots."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[int, int, int]] = {}

    def update(self, rows: list[dict[str, Any]], now_ns: int) -> list[dict[str, Any]]:
        for row in rows:
            key = (str(row["role"]), str(row["mapping"]))
            frames, nbytes = int(row["frames"]), int(row["bytes"])
            prev = self._last.get(key)
            if prev is None:
                row["fps"] = 0.0
                row["mb_s"] = 0.0
            else:
                dt = max(now_ns - prev[2], 1) / 1e9
                row["fps"] = round((frames - prev[0]) / dt, 1)
                row["mb_s"] = round((nbytes - prev[1]) / dt / 1e6, 2)
            self._last[key] = (frames, nbytes, now_ns)
        return rows


def _drops_text(drops: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(drops.items())) or "none"


def format_status_line(row: dict[str, Any]) -> str:
    """One human line per mapping: rate, volume, drops by reason, assembly timeouts."""
    head = (
        f"{row['instance_id']} {row['role']} {row['mapping']}: "
        f"{row.get('fps', 0.0):.1f} frames/s {row.get('mb_s', 0.0):.2f} MB/s "
        f"frames {row['frames']}"
    )
    if not row.get("media_driver_connected", True):
        head += " MEDIA DRIVER LOST"
    if row["role"] == "sender":
        drops = dict(row["drops"])
        if row.get("source_drops_gap"):
            drops["source_gap"] = int(row["source_drops_gap"])
        if row.get("source_drops_late"):
            drops["source_late"] = int(row["source_drops_late"])
        return f"{head} epoch {row['source_epoch']} drops: {_drops_text(drops)}"
    drops = {**row["chunk_drops"], **row["frame_drops"]}
    drops.pop("duplicate_chunk", None)
    state = row.get("destination", "open")
    dest = f"dest {row['dest_stream_id']}" + ("" if state == "open" else f" ({state})")
    return (
        f"{head} {dest} local epoch {row['local_epoch']} "
        f"(source epoch {row['source_epoch']}) assembly timeouts {row['assembly_timeouts']} "
        f"drops: {_drops_text(drops)}"
    )
