"""`tensorpool top`: every stream on the host, live (#19.2).

    tensorpool top                            # refreshes every second until Ctrl-C
    tensorpool top --once --json              # one JSON document for scripts

Reads, without any cooperation from the processes: the header ring of every stream under
``--shm-base-dir/<namespace>/`` (``<instance>/epoch-*`` of standalone producers,
``<instance>/stream-<id>/epoch-*`` of the SHM driver: superblock, occupancy, newest seq and
timestamp, committed seqs; the same read-only scan as ``inspect``), who maps each ring
(``/proc/*/maps``: the writer is the producer), the SHM driver's status file when one runs
there, and QoS and announce messages on the host's media driver when one runs. The model
(rates from two refreshes, rows) is :mod:`tensorpool.observe.top`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

from tensorpool.cli import UserError
from tensorpool.commands._common import add_flag, run_agent
from tensorpool.commands.inspect import (
    HEADER_RING_FILENAME,
    InspectError,
    epoch_dirs,
    inspect_region,
)
from tensorpool.endpoints import (
    DEFAULT_NAMESPACE,
    DEFAULT_SHM_BASE_DIR,
    Endpoints,
    default_aeron_dir,
)
from tensorpool.transport.process import StopSignals, pid_running


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shm-base-dir",
        default=os.environ.get("TENSORPOOL_SHM_BASE_DIR", DEFAULT_SHM_BASE_DIR),
        help="base directory of SHM regions (default %(default)s)",
    )
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="(default %(default)s)")
    add_flag(
        p, "report_interval", old=("--interval",), type=float, default=1.0,
        help="seconds between refreshes",
    )  # fmt: skip
    p.add_argument(
        "--once", action="store_true", help="one snapshot (rates over --report-interval)"
    )
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    p.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    d = Endpoints()
    p.add_argument(
        "--aeron-dir",
        default=os.environ.get("TENSORPOOL_AERON_DIR") or default_aeron_dir(),
        help="media driver to listen to QoS on (default %(default)s; none running: no QoS)",
    )
    p.add_argument("--control-channel", default=d.control_channel, help="(default %(default)s)")
    p.add_argument(
        "--control-stream-id", type=int, default=d.control_stream_id, help="(%(default)s)"
    )
    p.add_argument("--qos-channel", default=d.qos_channel, help="(default %(default)s)")
    p.add_argument("--qos-stream-id", type=int, default=d.qos_stream_id, help="(%(default)s)")
    p.add_argument(
        "--no-qos", action="store_true", help="do not listen to QoS and announce traffic"
    )


def read_regions(base: str, namespace: str) -> dict[int, dict[str, Any]]:
    """stream id -> inspect report of its newest header ring (highest epoch, newest activity)."""
    from tensorpool.shm.paths import PathPolicy

    policy = PathPolicy([base])
    root = os.path.join(base, namespace)
    best: dict[int, tuple[tuple[int, int], dict[str, Any]]] = {}
    now = time.monotonic_ns()
    for d in epoch_dirs(root):
        path = os.path.join(d, HEADER_RING_FILENAME)
        if not os.path.exists(path):
            continue
        try:
            rep = inspect_region(path, policy, now_ns=now, probe=pid_running)
        except (InspectError, OSError):
            continue  # removed or replaced while we looked: the next refresh sees it
        sb = rep["superblock"]
        key = (sb["epoch"], sb["activity_timestamp_ns"])
        sid = int(sb["stream_id"])
        if sid not in best or key > best[sid][0]:
            rep["directory"] = d
            best[sid] = (key, rep)
    out = {sid: rep for sid, (_, rep) in best.items()}
    for rep in out.values():
        ring = rep.get("ring") or {}
        if ring.get("slots_scanned"):
            rep["seqs"] = committed_seqs(rep["path"], policy, int(ring["slots_scanned"]))
    return out


def committed_seqs(path: str, policy: Any, nslots: int) -> list[int] | None:
    """The seqs the ring holds committed right now, sorted: a frame rate that stays right for
    streams whose seqs skip, such as a rate limiter's, which keeps its source's seq numbers
    (:func:`tensorpool.observe.top._frame_rate`)."""
    import mmap

    from tensorpool.shm.errors import ShmError
    from tensorpool.shm.ring import HeaderRingView

    try:
        fd, _ = policy.open(path)
    except (ShmError, OSError):
        return None
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    try:
        ring = HeaderRingView(mm, nslots)
        try:
            scan = ring.scan()
        finally:
            ring.close()
        good = scan.committed & ~scan.misplaced(nslots)
        return sorted((scan.word1[good] >> 1).astype("int64").tolist())
    finally:
        mm.close()


#: tensorpool subcommands that produce streams, recognised in a producer's command line
_ROLES = ("produce", "ratelimiter", "bridge", "driver", "demo", "serve")


def producer_commands(pids: set[int]) -> dict[int, str]:
    """pid -> the tensorpool subcommand it runs (or its program name), from /proc."""
    out: dict[int, str] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        role = next((a for a in argv if a in _ROLES), None)
        out[pid] = role or (os.path.basename(argv[0]) if argv else "")
    return out


class MapScan:
    """Which processes map each stream's header ring, from ``/proc/*/maps`` (local only).

    A writable shared mapping (``rw-s``) is the producer (in driver mode the superblock's pid is
    the driver, which created the file); read-only ones are local consumers. Reading every
    process's maps costs milliseconds, so it is redone at most every ``every_s``. Processes of
    other users are not readable and not counted.
    """

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self._at = -float("inf")
        self._key: frozenset[str] = frozenset()
        self._cache: dict[str, tuple[list[int], list[int]]] = {}

    def get(self, paths: set[str]) -> dict[str, tuple[list[int], list[int]]]:
        now = time.monotonic()
        key = frozenset(paths)
        if key == self._key and now - self._at < self.every_s:
            return self._cache
        found: dict[str, tuple[set[int], set[int]]] = {p: (set(), set()) for p in paths}
        me = os.getpid()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                with open(f"/proc/{entry.name}/maps") as f:
                    for line in f:
                        parts = line.split(maxsplit=5)
                        if len(parts) == 6 and parts[1].endswith("s"):
                            hit = found.get(parts[5].rstrip("\n"))
                            if hit is not None:
                                hit[0 if parts[1][1] == "w" else 1].add(int(entry.name))
            except OSError:  # gone, or another user's
                continue
        self._cache = {p: (sorted(w), sorted(r - w)) for p, (w, r) in found.items()}
        self._at, self._key = now, key
        return self._cache


class QosListener:
    """QoS messages from the host's media driver into a :class:`QosBook` (None: no driver)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from tensorpool.observe.top import QosBook

        self.book = QosBook()
        self.note = ""
        self._ctx: Any = None
        self._subs: list[Any] = []
        if args.no_qos:
            return
        try:
            self._start(args)
        except Exception as exc:  # no media driver, bad channel: top still shows the rings
            self.close()
            self.note = f" (no QoS: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"

    def _start(self, args: argparse.Namespace) -> None:
        from tensorpool.specs import peek_header
        from tensorpool.specs.generated import wire
        from tensorpool.transport.config import TransportConfig
        from tensorpool.transport.context import AeronContext
        from tensorpool.transport.mediadriver import serves

        if not serves(args.aeron_dir):
            raise RuntimeError(f"no media driver in {args.aeron_dir}")
        self._ctx = AeronContext(
            TransportConfig(aeron_dir=args.aeron_dir, client_name="tensorpool-top")
        ).start()
        dec = wire.QosConsumerDecoder()
        book = self.book

        def on_qos(buffer: Any, _header: Any) -> None:
            try:
                _, template_id, schema_id, _ = peek_header(buffer)
                if schema_id != dec.SCHEMA_ID or template_id != dec.TEMPLATE_ID:
                    return
                dec.wrap(buffer)
            except Exception:  # malformed: counted (QosBook.malformed), never fatal
                book.malformed += 1
                return
            book.on_consumer(
                int(dec.stream_id), int(dec.consumer_id), int(dec.epoch),
                int(dec.last_seq_seen), int(dec.drops_gap), int(dec.drops_late),
                int(dec.mode_raw), time.monotonic_ns(),
            )  # fmt: skip

        ann = wire.ShmPoolAnnounceDecoder()

        def on_control(buffer: Any, _header: Any) -> None:
            try:
                _, template_id, schema_id, _ = peek_header(buffer)
                if schema_id != ann.SCHEMA_ID or template_id != ann.TEMPLATE_ID:
                    return  # attach requests, responses, ...: not ours
                ann.wrap(buffer)
            except Exception:  # malformed: counted (QosBook.malformed), never fatal
                book.malformed += 1
                return
            book.on_announce(int(ann.stream_id), int(ann.epoch), time.monotonic_ns())

        self._subs = [
            self._ctx.add_subscription(args.qos_channel, args.qos_stream_id, on_qos),
            self._ctx.add_subscription(args.control_channel, args.control_stream_id, on_control),
        ]

    role_name = "top"

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        pass

    def do_work(self) -> int:
        """Take the QoS and announce messages that have come (the runner's duty cycle)."""
        return sum(sub.poll() for sub in self._subs)

    @property
    def context(self) -> Any:
        return self._ctx

    def poll_for(self, seconds: float) -> None:
        """Take QoS messages for ``seconds`` (``--once``): a short-lived run of the runner."""
        from tensorpool.transport.agent import AgentRunner
        from tensorpool.transport.idle import idle_strategy

        idle = idle_strategy("backoff", max_park_ns=20_000_000)
        AgentRunner(self, idle, context=self._ctx, duration_s=seconds).run()

    def close(self) -> None:
        for sub in self._subs:
            sub.close()
        self._subs = []
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


def read_driver(base: str, namespace: str) -> dict[str, Any] | None:
    from tensorpool.driver.status import STATUS_FILE_NAME, StatusUnavailable, read_status

    try:
        return read_status(os.path.join(base, namespace, STATUS_FILE_NAME))
    except (StatusUnavailable, OSError, ValueError):
        return None


def run(args: argparse.Namespace) -> int:
    from tensorpool.observe.top import render, rows

    if not args.report_interval > 0:
        raise UserError(f"--report-interval must be > 0, got {args.report_interval}")
    if args.json and not args.once:
        raise UserError("--json needs --once (a live table is for people)")
    base = os.path.abspath(args.shm_base_dir)
    title = f"tensorpool top: {base}/{args.namespace}"
    stop = StopSignals((signal.SIGTERM,)).install()
    qos = QosListener(args)
    maps = MapScan()

    def snapshot(memo: dict[int, tuple[int, int]] | None) -> tuple[Any, ...]:
        driver = read_driver(base, args.namespace)
        regions = read_regions(base, args.namespace)
        by_path = maps.get({r["path"] for r in regions.values()})
        mapped = {sid: by_path.get(r["path"], ([], [])) for sid, r in regions.items()}
        pids = {int(r["superblock"].get("pid", 0) or 0) for r in regions.values()}
        for writers, _ in mapped.values():
            pids.update(writers)
        out, new_memo = rows(
            regions, memo, driver, now_ns=time.monotonic_ns(), now_unix_ns=time.time_ns(),
            qos=qos.book, commands=producer_commands(pids - {0}), mapped=mapped,
        )  # fmt: skip
        return out, new_memo, driver

    try:
        _, memo, _ = snapshot(None)
        if args.once:
            qos.poll_for(
                max(args.report_interval, 1.2 if qos.note == "" and not args.no_qos else 0)
            )
            out, _, driver = snapshot(memo)
            if args.json:
                doc = {
                    "shm_base_dir": base,
                    "namespace": args.namespace,
                    "qos": qos.note.strip(" ()") or ("off" if args.no_qos else "listening"),
                    "driver": None
                    if driver is None
                    else {k: driver.get(k) for k in ("instance_id", "pid", "state")},
                    "streams": [r.as_json() for r in out],
                }
                print(json.dumps(doc))
            else:
                from rich.console import Console

                Console().print(render(out, driver, title, qos.note))
            return 0

        from rich.console import Console
        from rich.live import Live

        from tensorpool.transport.idle import idle_strategy

        with Live(console=Console(), auto_refresh=False, screen=False) as live:

            def report(final: bool) -> None:
                nonlocal memo
                if not final:
                    out, memo, driver = snapshot(memo)
                    live.update(render(out, driver, title, qos.note), refresh=True)

            run_agent(
                qos,
                ctx=qos.context,
                idle=idle_strategy("backoff", max_park_ns=20_000_000),
                stop=stop,
                report=report,
                report_interval_s=args.report_interval,
                duration_s=args.duration,
            )
    except KeyboardInterrupt:
        pass
    finally:
        qos.close()
    return 0
