"""``tensorpool view``: the newest frame of a stream, live in a browser (#19.3).

Model: an ordinary consumer in rate-limited mode (``--max-rate-hz``, default 30) on the main
thread keeps an owned copy of the newest validated frame; a small HTTP server (its own thread,
127.0.0.1 by default) serves one page that fetches ``/frame`` again as soon as the previous
image has loaded, at most at the consumer's rate. An image is encoded only when a browser asks
and only once per frame (cached by seq), so the viewer costs the producer nothing (it is a
consumer: the ring is lossy, nobody waits for it) and costs itself one copy per kept frame
plus one encode per displayed frame. With no browser connected it only copies.

Who may look (#30): a request is answered only when its ``Host`` names this viewer
(:class:`~tensorpool.observe.hostcheck.HostCheck`: localhost names, IP literals, the bound name,
``--allow-host``), else ``421`` (``host_refused``), so a web page cannot read frames through DNS
rebinding. With a token (``--token-file`` / ``TENSORPOOL_VIEW_TOKEN``) every request must also
carry it (``?token=`` -- the printed URL has it and the page passes it on -- or
``Authorization: Bearer``), else ``403`` (``token_refused``).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote

import numpy as np

from tensorpool.observe.hostcheck import HostCheck
from tensorpool.observe.render import encode

log = logging.getLogger("tensorpool.observe.view")


@dataclass(frozen=True, slots=True)
class Kept:
    """One owned frame and what the page shows about it."""

    array: np.ndarray
    seq: int
    epoch: int
    timestamp_ns: int


class FrameStore:
    """The newest frame, handed from the consumer thread to HTTP threads under one lock."""

    def __init__(self, stream_id: int, fmt: str, colormap: str) -> None:
        self.stream_id = stream_id
        self.fmt = fmt
        self.colormap = colormap
        self._lock = threading.Lock()
        self._kept: Kept | None = None
        self._encoded: tuple[int, int, bytes] | None = None  # (epoch, seq, image)
        self.stats: dict[str, Any] = {  # until the first second's numbers
            "fps": 0.0, "source_seq_per_s": 0.0, "frames": 0, "drops_gap": 0, "drops_late": 0,
            "drops": {},
        }  # fmt: skip
        self.encodes = 0

    def put(self, kept: Kept) -> None:
        with self._lock:
            self._kept = kept

    def newest(self) -> Kept | None:
        return self._kept

    def set_stats(self, stats: dict[str, Any]) -> None:
        self.stats = stats  # one reference store: readers see the old or the new dict

    def image(self) -> tuple[bytes, dict[str, Any]] | None:
        """The newest frame encoded (once per frame) and its description, or None yet."""
        with self._lock:
            kept = self._kept
            cached = self._encoded
        if kept is None:
            return None
        if cached is None or cached[:2] != (kept.epoch, kept.seq):
            data = encode(kept.array, self.fmt, self.colormap)
            self.encodes += 1
            cached = (kept.epoch, kept.seq, data)
            with self._lock:
                self._encoded = cached
        info = {
            "stream_id": self.stream_id,
            "seq": kept.seq,
            "epoch": kept.epoch,
            "timestamp_ns": kept.timestamp_ns,
            # the producer stamps CLOCK_MONOTONIC (the same clock host-wide): an age, not a date
            "age_ms": (time.monotonic_ns() - kept.timestamp_ns) / 1e6,
            "shape": list(kept.array.shape),
            "dtype": kept.array.dtype.name,
            **self.stats,
        }
        return cached[2], info


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>tensorpool view: stream {stream_id}</title>
<style>
body {{ background:#111; color:#ddd; font:14px system-ui, sans-serif; margin:16px; }}
#info {{ font-family: ui-monospace, monospace; margin-bottom:8px; white-space:pre; }}
img {{ image-rendering: pixelated; max-width: 100%; border:1px solid #333; }}
</style></head>
<body>
<div id="info">stream {stream_id}: waiting for frames ...</div>
<img id="frame" alt="newest frame of stream {stream_id}">
<script>
const img = document.getElementById("frame"), info = document.getElementById("info");
const minGapMs = {min_gap_ms}, auth = "{auth}";
let lastSeq = -1, shown = 0;
async function next() {{
  const t0 = performance.now();
  try {{
    const r = await fetch("/frame?after=" + lastSeq + auth, {{cache: "no-store"}});
    if (r.status === 200) {{
      const d = JSON.parse(r.headers.get("X-Tensorpool-Frame"));
      const url = URL.createObjectURL(await r.blob());
      await new Promise(ok => {{ img.onload = ok; img.onerror = ok; img.src = url; }});
      URL.revokeObjectURL(url);
      lastSeq = d.seq;
      shown += 1;  // how many frames this page has shown (tests read it from the DOM)
      document.body.dataset.shown = shown;
      document.body.dataset.firstSeq ??= d.seq;
      document.body.dataset.lastSeq = d.seq;
      info.textContent = `stream ${{d.stream_id}}  seq ${{d.seq}}  epoch ${{d.epoch}}  ` +
        `${{d.dtype}}[${{d.shape.join("x")}}]  timestamp_ns ${{d.timestamp_ns}} ` +
        `(${{d.age_ms.toFixed(0)}} ms ago)\\n` +
        `${{d.fps.toFixed(1)}} frames/s shown (source seq ${{d.source_seq_per_s.toFixed(1)}}/s)  ` +
        `drops gap ${{d.drops_gap}} late ${{d.drops_late}}`;
      document.title = `stream ${{d.stream_id}} seq ${{d.seq}}`;
    }}
  }} catch (e) {{ info.textContent = "viewer not reachable: " + e; }}
  setTimeout(next, Math.max(0, minGapMs - (performance.now() - t0)));
}}
next();
</script></body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        host = self.headers.get("Host")
        if not self.server.hosts.allows(host):
            self._send(HTTPStatus.MISDIRECTED_REQUEST, "text/plain", HostCheck.refusal(host))
            return
        if not self._authorized(query):
            self.server.token_refused += 1
            self._send(
                HTTPStatus.FORBIDDEN,
                "text/plain",
                b"tensorpool view: this viewer needs its token (open the URL it printed)\n",
            )
            return
        if path == "/":
            self._send(HTTPStatus.OK, "text/html; charset=utf-8", self.server.page)
        elif path == "/frame":
            got = self.server.store.image()
            if got is None:
                self._send(HTTPStatus.NO_CONTENT, "text/plain", b"")
                return
            data, info = got
            ctype = "image/png" if self.server.store.fmt == "png" else "image/jpeg"
            self._send(HTTPStatus.OK, ctype, data, {"X-Tensorpool-Frame": json.dumps(info)})
        elif path == "/stats.json":
            got = self.server.store.image()
            info = got[1] if got else {"stream_id": self.server.store.stream_id}
            refused = {"host_refused": self.server.hosts.refused}
            body = json.dumps({**info, **refused, "token_refused": self.server.token_refused})
            self._send(HTTPStatus.OK, "application/json", body.encode())
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")

    def _authorized(self, query: str) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = parse_qs(query).get("token", [""])[-1].encode()
        scheme, _, bearer = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer":
            given = given or bearer.encode()
        return hmac.compare_digest(given, token.encode())

    def _send(
        self, status: HTTPStatus, ctype: str, body: bytes, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the browser left
            self.wfile.write(body)


class ViewServer(ThreadingHTTPServer):
    """The page and the newest frame over HTTP, on a daemon thread."""

    daemon_threads = True

    def __init__(
        self,
        host: str,
        port: int,
        store: FrameStore,
        max_rate_hz: int,
        *,
        allow_hosts: tuple[str, ...] = (),
        token: str | None = None,
    ) -> None:
        super().__init__((host, port), _Handler)
        self.store = store
        self.hosts = HostCheck(host, allow_hosts)
        self.token = token
        self.token_refused = 0
        self._auth = "" if token is None else "&token=" + quote(token, safe="")
        gap = int(1000 / max_rate_hz) if max_rate_hz > 0 else 0
        page = PAGE.format(stream_id=store.stream_id, min_gap_ms=gap, auth=self._auth)
        self.page = page.encode()
        self._thread = threading.Thread(target=self.serve_forever, name="tp-view", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}/" + ("?" + self._auth[1:] if self._auth else "")

    def start(self) -> ViewServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
