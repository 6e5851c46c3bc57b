"""#30: the viewer and the metrics endpoints answer only requests that name them (DNS rebinding).

A page of ``evil.example`` whose DNS answer is switched to 127.0.0.1 makes the browser send
``Host: evil.example`` to our port; that got 200 (frames, statistics). Real HTTP requests
against a real ``tensorpool view`` process and a real metrics server.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from netports import free_port

from tensorpool.observe.hostcheck import ENV_ALLOW_HOSTS
from tensorpool.observe.metrics import scrape_values, start_metrics
from tensorpool.transport.process import stop_process

TOKEN = "view-s3cret"
ALLOWED = "cam.lab"


def _get(port: int, path: str, host: str | None, headers: dict[str, str] | None = None) -> Any:
    """One GET to 127.0.0.1:port with exactly this Host header (None: none at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def view(media_driver: Any) -> Iterator[int]:
    """``tensorpool view`` with a token and one extra allowed name (no producer needed: the
    page and its statistics are served before any frame)."""
    work = tempfile.mkdtemp(prefix="tp-view-host-")
    token_file = os.path.join(work, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    port = free_port()
    cmd = [sys.executable, "-m", "tensorpool", "view", "--stream-id", "4343"]
    cmd += ["--aeron-dir", media_driver.dir, "--shm-base-dir", os.path.join(work, "shm")]
    cmd += ["--bind", f"127.0.0.1:{port}", "--allow-host", ALLOWED, "--token-file", token_file]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/?token={TOKEN}" in line, line
        yield port
    finally:
        stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)


def _view_stats(port: int) -> dict[str, Any]:
    status, body = _get(port, f"/stats.json?token={TOKEN}", f"127.0.0.1:{port}")
    assert status == 200, body
    return json.loads(body)


def test_30_view_answers_only_its_own_names(view: int) -> None:
    """#30: a foreign Host (or none) gets 421 with one line and is counted, whatever the
    token, and the page, frame and statistics are never sent; localhost names, IP literals
    and ``--allow-host`` names are answered."""
    before = _view_stats(view)["host_refused"]
    refused = ("evil.example", "evil.example:8470", "127.0.0.1.evil.example", None)
    for host in refused:
        for path in ("/", f"/frame?token={TOKEN}", f"/stats.json?token={TOKEN}"):
            status, body = _get(view, path, host)
            assert status == 421, (host, path, status, body)
            assert body.count(b"\n") == 1 and b"not this endpoint's name" in body
    assert _view_stats(view)["host_refused"] == before + 3 * len(refused)
    for host in ("localhost", "LOCALHOST:{port}", "127.0.0.1:{port}", "[::1]:{port}",
                 "cam.lab:{port}", "app.localhost"):  # fmt: skip
        status, body = _get(view, f"/?token={TOKEN}", host.format(port=view))
        assert status == 200 and b"/frame" in body, host


def test_30_view_token(view: int) -> None:
    """#30: with a token every request must carry it (query or bearer), else 403, counted;
    the page passes it on to its frame requests."""
    me = f"127.0.0.1:{view}"
    before = _view_stats(view)["token_refused"]
    for path, headers in (
        ("/", {}),
        ("/frame", {}),
        ("/stats.json?token=wrong", {}),
        ("/", {"Authorization": "Bearer wrong"}),
    ):
        status, body = _get(view, path, me, headers)
        assert status == 403 and body.count(b"\n") == 1, (path, status, body)
    assert _view_stats(view)["token_refused"] == before + 4
    status, page = _get(view, "/", me, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and f"token={TOKEN}".encode() in page


def _scrape(port: int, host: str | None) -> tuple[int, bytes]:
    return _get(port, "/metrics", host)


def test_30_metrics_refuse_a_host_that_is_not_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """#30: the metrics endpoint of every command answers its own names only (421 otherwise,
    counted in ``tensorpool_http_host_refused_total``); ``TENSORPOOL_ALLOW_HOSTS`` adds names."""
    monkeypatch.setenv(ENV_ALLOW_HOSTS, "prom.lab, other.lab")
    server = start_metrics("127.0.0.1:0")
    assert server is not None
    try:
        port = server.port
        for host in ("evil.example", f"evil.example:{port}", None):
            status, body = _scrape(port, host)
            assert status == 421 and b"not this endpoint's name" in body, (host, status)
        for host in ("localhost", f"127.0.0.1:{port}", f"[::1]:{port}", "prom.lab", "other.lab"):
            status, body = _scrape(port, host)
            assert status == 200 and b"process_cpu_seconds_total" in body, (host, status)
        status, body = _scrape(port, "localhost")
        assert scrape_values(body.decode())["tensorpool_http_host_refused_total"] == 3
    finally:
        server.close()
