"""One "host" of the multi-host Flight test (#18.3): its own SHM, media driver, producer and
``tensorpool serve``, optionally in a private mount namespace.

Run as ``unshare -m --propagation private python serve_host.py --mount DIR ...``: DIR gets a
private tmpfs, so the SHM and Aeron files under it exist only for this process and its
children (Spark's processes, outside the namespace, see an empty DIR). Commands on stdin, events
on stdout as JSON lines:

* ``produce N``   -- publish N frames (``{"event": "produced", "next_seq": S}``);
* ``kill-serve``  -- SIGKILL the server (``{"event": "serve-killed"}``);
* ``start-serve`` -- start it again on the same port (``{"event": "serve-started"}``);
* ``exit``        -- stop everything; the tmpfs goes with the namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from spark_helpers import ProducerProc  # noqa: E402

from tensorpool.transport.mediadriver import MediaDriverProcess  # noqa: E402
from tensorpool.transport.process import stop_process  # noqa: E402


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def start_serve(a: argparse.Namespace, aeron: str, shm: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tensorpool", "serve", "--stream-id", str(a.stream_id)]
    cmd += ["--port", str(a.port), "--aeron-dir", aeron, "--shm-base-dir", shm]
    cmd += ["--attach-timeout", "20"]
    if a.token_file:
        cmd += ["--token-file", a.token_file]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if "tensorpool serve:" not in line:
        raise SystemExit(f"serve did not start: {line!r}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--stream-id", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--nslots", type=int, default=256)
    ap.add_argument("--token-file", default=None)
    a = ap.parse_args()
    if a.mount and os.path.ismount(a.mount) is False:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tpserve", a.mount], check=True)
    aeron, shm = os.path.join(a.mount, "aeron"), os.path.join(a.mount, "shm")
    os.makedirs(shm, exist_ok=True)
    with MediaDriverProcess(aeron_dir=aeron) as md:
        prod = ProducerProc(md.dir, shm, "--stream-id", str(a.stream_id), "--nslots", str(a.nslots))
        serve = start_serve(a, md.dir, shm)
        try:
            emit(event="ready", epoch=prod.epoch, mnt_ns=os.readlink("/proc/self/ns/mnt"))
            for line in sys.stdin:
                cmd = line.split()
                if not cmd:
                    continue
                if cmd[0] == "produce":
                    emit(event="produced", next_seq=prod.produce(int(cmd[1])))
                elif cmd[0] == "kill-serve":
                    serve.kill()
                    serve.wait()
                    emit(event="serve-killed")
                elif cmd[0] == "start-serve":
                    serve = start_serve(a, md.dir, shm)
                    emit(event="serve-started")
                elif cmd[0] == "exit":
                    break
        finally:
            stop_process(serve)
            prod.close()
    emit(event="closed")


if __name__ == "__main__":
    main()
