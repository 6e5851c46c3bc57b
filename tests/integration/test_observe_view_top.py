"""#19.2 `tensorpool top` under tmux and #19.3 `tensorpool view` in headless Chromium.

One standalone producer of the demo camera's pattern (640x480 uint16, `--pattern moving`,
100 Hz) on the module's media driver. `top` runs in a real terminal (a tmux pane) and the
captured screen must show the stream with a live rate; `view` is loaded by a real browser
(Chromium from Debian, installed by `./dev browser`) and two screenshots a second apart must
show a picture (not a blank page) that changed.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tensorpool.transport.process import stop_process

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None
STREAM = 4242


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorpool", *args]


@pytest.fixture(scope="module")
def camera(media_driver) -> Iterator[dict[str, Any]]:
    work = tempfile.mkdtemp(prefix="tp-observe-view-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    dirs = ["--aeron-dir", media_driver.dir, "--shm-base-dir", base]
    producer = subprocess.Popen(
        _tp("produce", *dirs, "--stream-id", str(STREAM), "--shape", "480,640", "--dtype",
            "uint16", "--rate", "100", "--pattern", "moving", "--quiet"),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    yield {"work": work, "base": base, "dirs": dirs}
    stop_process(producer)
    shutil.rmtree(work, ignore_errors=True)


def _get(url: str) -> tuple[int, bytes, Any]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read(), r.headers


def test_top_live_screen_in_tmux(camera: dict[str, Any]) -> None:
    """The live table in a real terminal shows the stream, its epoch and a frame rate."""
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    session = f"tp-top-{os.getpid()}"
    # COLUMNS: the pane is 200 wide, but a detached session may start the program before
    # tmux applies -x; rich reads COLUMNS first
    cmd = " ".join(
        ["env", "COLUMNS=200", sys.executable, "-m", "tensorpool", "top", "--shm-base-dir",
         camera["base"], "--report-interval", "0.5", "--duration", "90"]
    )  # fmt: skip
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "200", "-y", "30", cmd],
                   check=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        screen = ""
        row = None
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            row = next(
                (ln for ln in screen.splitlines() if re.match(rf"^\W*{STREAM}\s*│", ln)), None
            )
            if row is not None and re.search(r"│\s*\d+\.\d\s*│", row):
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"no live row for stream {STREAM} on screen:\n{screen}")
        assert "frames/s" in screen and "occupancy" in screen
        cells = [c.strip() for c in row.split("│")]
        fps = float(cells[4])
        assert 0 < fps < 150, f"a live rate of the 100 Hz camera, got {fps}: {row}"
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)


def test_top_once_json_with_qos(camera: dict[str, Any]) -> None:
    """Rates from the ring, the producer's command from /proc, the consumer from its QoS."""
    consumer = subprocess.Popen(
        _tp("consume", *camera["dirs"], "--stream-id", str(STREAM), "--mode", "rate-limited",
            "--max-rate-hz", "5", "--report-interval", "100"),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    try:
        # until the camera has a rate and the consumer has mapped the stream and sent a QoS:
        # how long that takes depends on the host's load
        while True:
            out = subprocess.run(
                _tp("top", *camera["dirs"], "--once", "--json", "--report-interval", "1.5"),
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            doc = json.loads(out.stdout)
            (row,) = [s for s in doc["streams"] if s["stream_id"] == STREAM]
            if (row["frames_per_s"] and row["qos_consumers"]) or time.monotonic() > deadline:
                break
    finally:
        stop_process(consumer)
    assert row["epoch"] >= 1 and row["producer_alive"] is True
    assert row["producer_command"] == "produce"
    assert 0 < row["frames_per_s"] < 150  # the 100 Hz camera (slower on a loaded host)
    assert row["mb_per_s"] == pytest.approx(row["frames_per_s"] * 480 * 640 * 2 / 1e6, rel=0.01)
    assert row["nslots"] == 64 and row["committed"] > 0
    assert doc["driver"] is None and row["consumers"] is None
    assert doc["qos"] == "listening"
    assert 0 <= row["announce_age_s"] < 3, "the producer announces every second"
    (qos,) = row["qos_consumers"]
    assert qos["mode"] == "rate-limited" and qos["epoch"] == row["epoch"]
    assert 0 < qos["last_seq_seen"] <= row["newest_seq"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "chromium is not installed and could not be: `./dev browser` installs it from "
        "Debian's packages (apt-get install chromium); .ci/run calls it"
    )


def _screenshot(chromium: str, url: str, path: str, profile: str) -> np.ndarray:
    from PIL import Image

    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--window-size=700,560", "--virtual-time-budget=1500",
         f"--screenshot={path}", url],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    return np.asarray(Image.open(path).convert("L"), dtype=np.int16)


def test_view_in_headless_chromium(camera: dict[str, Any]) -> None:
    """The page shows the live camera: a picture with structure that moves between shots."""
    chromium = _chromium()
    port = _free_port()
    view = subprocess.Popen(
        _tp("view", *camera["dirs"], "--stream-id", str(STREAM), "--bind", str(port)),
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                status, body, _ = _get(url + "stats.json")
                info = json.loads(body)
                if status == 200 and info.get("fps", 0) > 0:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"viewer never showed a frame: {info}")
        # what the page displays, from the same source as its caption
        assert info["stream_id"] == STREAM and info["epoch"] >= 1 and info["seq"] > 0
        assert info["shape"] == [480, 640] and info["dtype"] == "uint16"
        assert 0 < info["fps"] <= 35, "rate-limited to 30 frames/s"
        assert "drops_gap" in info and "drops_late" in info
        status, page, _ = _get(url)
        assert b"/frame" in page and f"stream {STREAM}".encode() in page
        status, jpeg, headers = _get(url + "frame")
        assert headers["Content-Type"] == "image/jpeg" and jpeg[:2] == b"\xff\xd8"
        shots = []
        with tempfile.TemporaryDirectory(prefix="tp-chromium-") as tmp:
            for i in range(2):
                # a profile per run: a second chromium on a busy profile may hand its command
                # line to the first one, which would screenshot its old page
                shots.append(
                    _screenshot(chromium, url, os.path.join(tmp, f"{i}.png"), f"{tmp}/p{i}")
                )
                time.sleep(1.0)
            # one page, live: its script fetched frame after frame (the DOM keeps count)
            dom = subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                 f"--user-data-dir={tmp}/p-dom", "--virtual-time-budget=3000", "--dump-dom",
                 url],
                capture_output=True, text=True, timeout=60, check=True,
            ).stdout  # fmt: skip
    finally:
        stop_process(view)
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
    assert int(attrs["shown"]) >= 3, attrs
    assert int(attrs["last-seq"]) > int(attrs["first-seq"]), "newer frames, one page"
    assert f"stream {STREAM}  seq " in dom, "the caption the script writes"
    a, b = (s[60:530, 20:650] for s in shots)  # the image area, below the caption
    for s in (a, b):
        assert s.std() > 20, "a picture with structure, not a blank or uniform page"
    changed = np.abs(a - b) > 30
    assert changed.mean() > 0.05, "the moving pattern must differ between the two captures"


def test_view_png_and_bad_bind(camera: dict[str, Any]) -> None:
    from PIL import Image

    port = _free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        r = subprocess.run(
            _tp("view", *camera["dirs"], "--stream-id", str(STREAM), "--bind", str(port)),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.returncode == 2 and "cannot listen" in r.stderr, r.stderr
    view = subprocess.Popen(
        _tp("view", *camera["dirs"], "--stream-id", str(STREAM), "--bind", str(port),
            "--format", "png", "--colormap", "viridis"),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body, headers = _get(f"http://127.0.0.1:{port}/frame")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no frame"
            time.sleep(0.2)
    finally:
        stop_process(view)
    img = Image.open(io.BytesIO(body))
    assert img.format == "PNG" and img.mode == "RGB" and img.size == (640, 480)
    meta = json.loads(headers["X-Tensorpool-Frame"])
    assert meta["stream_id"] == STREAM and meta["epoch"] >= 1
