"""#18.1 / #18.4: ``tensorpool serve`` as a real process, and every way a client can be wrong.

One server (token required) over one real producer; each failure is one test, and each checks
afterwards that the server still answers (it never dies on bad input).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from netports import free_port
from spark_helpers import SHM_ROOT, ProducerProc, check_payload

from tensorpool.transport.mediadriver import MediaDriverProcess
from tensorpool.transport.process import stop_process

flight = pytest.importorskip("pyarrow.flight")

from tensorpool.serve.server import arrow_schema  # noqa: E402
from tensorpool.spark_source.options import FlightAccess  # noqa: E402
from tensorpool.spark_source.rings import flight_protocol as protocol  # noqa: E402
from tensorpool.spark_source.rings import remote  # noqa: E402

SID = 181
BIG = 182  # 1 MiB frames: a full read of the ring is two 32 MiB batches
NSLOTS = 64
TOKEN = "s3cret-token"


class Served:
    """A producer and a ``tensorpool serve`` process over it."""

    def __init__(self, md: MediaDriverProcess, shm: str, token_file: str, *extra: str) -> None:
        self.prod = ProducerProc(md.dir, shm, "--stream-id", str(SID), "--nslots", str(NSLOTS))
        self.next_seq = self.prod.produce(10)
        self.big = ProducerProc(
            md.dir, shm, "--stream-id", str(BIG), "--nslots", str(NSLOTS), "--shape", "262144"
        )
        self.big.produce(NSLOTS)
        self.port = free_port()
        cmd = [sys.executable, "-m", "tensorpool", "serve", "--stream-id", str(SID)]
        cmd += ["--stream-id", str(BIG)]
        cmd += ["--port", str(self.port), "--aeron-dir", md.dir, "--shm-base-dir", shm]
        cmd += ["--token-file", token_file, "--attach-timeout", "20", *extra]
        self.cmd = cmd
        try:
            self.line = self._start()
        except BaseException:  # never leave the producers behind
            self.prod.close()
            self.big.close()
            raise
        self.address = f"127.0.0.1:{self.port}"
        self.access = FlightAccess(token=TOKEN, retry_s=0)
        self.md_dir, self.shm, self.token_file = md.dir, shm, token_file

    def _start(self) -> str:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            assert "tensorpool serve: streams [181, 182]" in line, line
        except BaseException:  # never leave the server behind
            stop_process(self.proc)
            raise
        return line

    def restart(self, sig: int) -> str:
        """Stop the server with ``sig`` and start it again, same port and state; its line."""
        self.proc.send_signal(sig)
        self.proc.communicate(timeout=60)
        return self._start()

    def client(self) -> Any:
        return flight.FlightClient(f"grpc://{self.address}")

    def snapshot(self) -> protocol.StreamSnapshot:
        snap = remote.scan_host(self.address, [SID], self.access)[SID]
        assert snap is not None
        return snap

    def close(self) -> str:
        stop_process(self.proc)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.prod.close()
        self.big.close()
        return err


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    shm = tempfile.mkdtemp(prefix="tp-test-", dir=SHM_ROOT)
    fd, token_file = tempfile.mkstemp(prefix="tp-test-token-")
    os.write(fd, TOKEN.encode() + b"\n")
    os.close(fd)
    try:
        with MediaDriverProcess() as md:
            s = Served(md, shm, token_file)
            try:
                yield s
            finally:
                err = s.close()
                # the server ran to a clean stop and counted what it refused
                assert "stopped;" in err, err
    finally:
        os.unlink(token_file)
        shutil.rmtree(shm, ignore_errors=True)


def _alive(s: Served) -> None:
    """The server still answers a good request after the bad one."""
    assert s.proc.poll() is None
    assert s.snapshot().state.head >= 10


def _read(s: Served, ticket: protocol.Ticket) -> tuple[list[Any], list[tuple[int, str]]]:
    lost: list[tuple[int, str]] = []
    batches = list(remote.fetch(s.address, s.access, ticket, lambda q, w: lost.append((q, w))))
    return batches, lost


def test_18_1_describe_and_read(served: Served) -> None:
    """#18.1: list_flights / get_flight_info describe the stream (layout, epoch, head, oldest,
    liveness); do_get streams its frames in the Spark source's schema, checksums intact."""
    opts = served.access.call_options()
    infos = list(served.client().list_flights(options=opts))
    assert [i.descriptor.path for i in infos] == [[str(SID).encode()], [str(BIG).encode()]]
    info = served.client().get_flight_info(flight.FlightDescriptor.for_path(str(SID)), opts)
    import json

    summary = json.loads(info.schema.metadata[protocol.SUMMARY_KEY])
    assert summary["epoch"] == served.prod.epoch and summary["live"] is True
    assert summary["nslots"] == NSLOTS and summary["oldest"] == 0 and summary["head"] >= 10
    assert summary["region"]["header_uri"].startswith("shm:file?path=")
    snap = served.snapshot()
    batches, lost = _read(served, protocol.Ticket(SID, snap.spec.epoch, 0, 10))
    assert lost == []
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["seq"] for r in rows] == list(range(10))
    assert all(check_payload(r["payload"], r["seq"]) for r in rows)
    assert batches[0].schema.equals(arrow_schema(True))
    from tensorpool.spark_source.spark.source import arrow_schema as spark_schema

    assert arrow_schema(True).equals(spark_schema(True))
    assert arrow_schema(False).equals(spark_schema(False))
    # the planned-runs form reads exactly those seqs
    batches, lost = _read(served, protocol.Ticket(SID, snap.spec.epoch, 2, 9, ((2, 4), (6, 9))))
    assert [r["seq"] for b in batches for r in b.to_pylist()] == [2, 3, 6, 7, 8] and lost == []


@pytest.mark.parametrize("token", [None, "wrong-token", "s3cret-tokeN"])
def test_18_4_token_missing_or_wrong(served: Served, token: str | None) -> None:
    """#18.4: no token, or a wrong one, is refused with an authentication error on every call
    (describe, scan, read), and the server goes on serving."""
    bad = FlightAccess(token=token, retry_s=0)
    want = "no bearer token" if token is None else "wrong bearer token"
    with pytest.raises(flight.FlightUnauthenticatedError, match=want):
        remote.scan_host(served.address, [SID], bad)
    with pytest.raises(flight.FlightUnauthenticatedError, match=want):
        list(remote.fetch(served.address, bad, protocol.Ticket(SID, 1, 0, 1), lambda q, w: None))
    with pytest.raises(flight.FlightUnauthenticatedError, match=want):
        list(served.client().list_flights(options=bad.call_options()))
    _alive(served)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"v": 1, "stream": 181, "epoch": 1, "first": 5, "end": 2}', "'end'"),
        (b'{"v": 1, "stream": 181, "epoch": 1, "first": 0, "end": 5, "path": "/etc"}', "unknown"),
        (b'{"v": 2}', "version"),
    ],
)
def test_18_4_bad_ticket_json(served: Served, raw: bytes, why: str) -> None:
    """#18.4: a malformed ticket is a clear Flight error naming the problem, and a ticket field
    naming a path is refused (the server never touches a path a client names)."""
    client = served.client()
    with pytest.raises(flight.FlightServerError, match=f"bad ticket: .*{why}"):
        client.do_get(flight.Ticket(raw), served.access.call_options()).read_all()
    _alive(served)


def test_18_4_stream_not_served(served: Served) -> None:
    """#18.4: a ticket (or a scan, or a describe) for a stream the server does not serve."""
    with pytest.raises(
        flight.FlightServerError, match=r"stream 999 is not served here \(serves \[181, 182\]\)"
    ):
        list(
            remote.fetch(
                served.address, served.access, protocol.Ticket(999, 1, 0, 1), lambda q, w: None
            )
        )
    with pytest.raises(flight.FlightServerError, match="stream 999 is not served"):
        remote.scan_host(served.address, [999], served.access)
    with pytest.raises(flight.FlightServerError, match="stream 999 is not served"):
        served.client().get_flight_info(
            flight.FlightDescriptor.for_path("999"), served.access.call_options()
        )
    _alive(served)


def test_18_4_range_far_outside_the_ring(served: Served) -> None:
    """#18.4: frames overwritten come back as one loss range (not one message per seq), the
    ring's frames are read; a range past the head is refused; a ticket for an older epoch
    reads nothing and reports all of it lost. With a query's loss key the server also counts
    them for that query's driver (the 'losses' action takes them once); a malformed key is
    refused."""
    served.next_seq = served.prod.produce(3 * NSLOTS)
    snap = served.snapshot()
    oldest, head, epoch = snap.state.oldest, snap.state.head, snap.spec.epoch
    assert oldest > 0 and epoch >= 1
    first = head - NSLOTS
    ranges: list[tuple[int, int, str]] = []

    class Rec:
        def __call__(self, seq: int, why: str) -> None:
            raise AssertionError("per-frame loss for a range")

        def add_range(self, a: int, b: int, why: str) -> None:
            ranges.append((a, b, why))

    key, other = protocol.new_loss_key(), protocol.new_loss_key()
    served.next_seq = served.prod.produce(5)  # the ring moves on: 5 frames of it overwritten
    ticket = protocol.Ticket(SID, epoch, first, head, None, True, key)
    batches = list(remote.fetch(served.address, served.access, ticket, Rec()))
    assert ranges == [(first, first + 5, "seq_mismatch")]
    assert [r["seq"] for b in batches for r in b.to_pylist()] == list(range(first + 5, head))
    with pytest.raises(flight.FlightServerError, match="newest frame is seq"):
        _read(served, protocol.Ticket(SID, epoch, served.next_seq, served.next_seq + 10))
    ranges.clear()
    ticket = protocol.Ticket(SID, epoch - 1, 0, NSLOTS, None, True, key)
    list(remote.fetch(served.address, served.access, ticket, Rec()))
    assert ranges == [(0, NSLOTS, "region_unavailable")]
    assert remote.take_losses(served.address, other, served.access) == []
    got = remote.take_losses(served.address, key, served.access)
    assert sorted(got) == [(SID, epoch - 1, NSLOTS), (SID, epoch, 5)]
    assert remote.take_losses(served.address, key, served.access) == []  # taken once
    with pytest.raises(flight.FlightServerError, match="loss key"):
        list(
            served.client().do_action(
                flight.Action(protocol.ACTION_LOSSES, b'{"key": "../etc"}'),
                served.access.call_options(),
            )
        )
    _alive(served)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_30_3_read_time_loss_survives_a_serve_restart(served: Served, sig: int) -> None:
    """#30.3: a frame a ticket with a loss key did not get stays counted across a restart of
    serve (kill -9 or SIGTERM) until the query's driver takes it, and a take is as durable:
    the driver gets the count exactly once (the journal in serve's state directory)."""
    served.next_seq = served.prod.produce(NSLOTS)  # a full ring, whichever test ran before
    snap = served.snapshot()
    epoch, head = snap.spec.epoch, snap.state.head
    key = protocol.new_loss_key()
    served.next_seq = served.prod.produce(7)  # 7 frames of the ticket's range overwritten
    batches, lost = _read(served, protocol.Ticket(SID, epoch, head - NSLOTS, head, None, True, key))
    assert len(lost) == 7 and sum(b.num_rows for b in batches) == NSLOTS - 7
    line = served.restart(sig)
    assert "loss journal" in line and ".serve-" in line, line
    assert remote.take_losses(served.address, key, served.access) == [(SID, epoch, 7)]
    served.restart(sig)
    assert remote.take_losses(served.address, key, served.access) == []  # taken once
    _alive(served)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_30_3_a_read_resumes_after_serve_restarts_mid_stream(served: Served, sig: int) -> None:
    """#30.3: a ``serve`` that goes away between two chunks of one ticket (the soak's query
    failed its task on "Stream removed") is asked again for the rest once it is back: every
    seq of the ticket arrives once, none is lost, and the task goes on."""
    snap = remote.scan_host(served.address, [BIG], served.access)[BIG]
    assert snap is not None
    epoch, head = snap.spec.epoch, snap.state.head
    lost: list[tuple[int, str]] = []
    patient = FlightAccess(token=TOKEN, retry_s=120)  # a restart on a loaded host
    it = remote.fetch(
        served.address,
        patient,
        protocol.Ticket(BIG, epoch, head - NSLOTS, head),
        lambda q, w: lost.append((q, w)),
    )
    first = next(it)  # the server is now blocked writing the second 32 MiB chunk
    assert first.num_rows == 32
    if sig == signal.SIGKILL:  # gone at once, mid-chunk: the rest comes from the new server
        served.restart(sig)
        rest = list(it)
    else:  # a clean stop waits for the stream it serves: keep reading meanwhile, as a task does
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            restarted = pool.submit(served.restart, sig)
            rest = list(it)
            restarted.result(timeout=120)
    seqs = [s for b in (first, *rest) for s in b.column("seq").to_pylist()]
    assert seqs == list(range(head - NSLOTS, head)) and lost == []


def test_18_4_client_disconnects_mid_stream(served: Served) -> None:
    """#18.4: a client that goes away after the first of two 32 MiB batches (the server is
    blocked writing the second) does not hurt the server: the next client reads normally."""
    snap = remote.scan_host(served.address, [BIG], served.access)[BIG]
    assert snap is not None
    head = snap.state.head
    probe = (
        "import sys, pyarrow.flight as f\n"
        f"c = f.FlightClient('grpc://{served.address}')\n"
        f"o = f.FlightCallOptions(headers=[(b'authorization', b'Bearer {TOKEN}')])\n"
        f"r = c.do_get(f.Ticket(sys.argv[1].encode()), o)\n"
        "r.read_chunk()\n"
        "print('got one', flush=True)\n"
        "import os; os._exit(0)\n"
    )
    t = protocol.Ticket(BIG, snap.spec.epoch, head - NSLOTS, head).encode().decode()
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", probe, t], capture_output=True, text=True, timeout=60
        )
        assert "got one" in out.stdout, out.stderr
    with contextlib.closing(served.client()) as c:
        # and a read cancelled from this side
        r = c.do_get(flight.Ticket(t.encode()), served.access.call_options())
        r.read_chunk()
        r.cancel()
    _alive(served)
    batches, lost = _read(served, protocol.Ticket(BIG, snap.spec.epoch, head - NSLOTS, head))
    assert [b.num_rows for b in batches] == [32, 32] and lost == []
    seqs = [s for b in batches for s in b.column("seq").to_pylist()]
    assert seqs == list(range(head - NSLOTS, head))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_18_1_tls(served: Served, tmp_path: Any) -> None:
    """#18.1: --tls-cert/--tls-key serve grpc+tls: a client trusting the certificate reads (and
    still needs the token); a plaintext client gets nothing."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "tensorpool",
        "serve",
        "--stream-id",
        str(SID),
        "--port",
        str(port),
    ]
    cmd += ["--aeron-dir", served.md_dir, "--shm-base-dir", served.shm, "--attach-timeout", "20"]
    cmd += ["--token-file", served.token_file, "--tls-cert", str(cert), "--tls-key", str(key)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert f"grpc+tls://127.0.0.1:{port}" in proc.stdout.readline()
        address = f"127.0.0.1:{port}"
        tls = FlightAccess(token=TOKEN, tls_root_certs=cert.read_bytes(), retry_s=0)
        snap = remote.scan_host(address, [SID], tls)[SID]
        assert snap is not None and snap.state.head >= 10
        first = snap.state.oldest
        t = protocol.Ticket(SID, snap.spec.epoch, first, first + 5)
        batches = list(remote.fetch(address, tls, t, lambda q, w: None))
        assert [r["seq"] for b in batches for r in b.to_pylist()] == list(range(first, first + 5))
        with pytest.raises(flight.FlightUnauthenticatedError):
            remote.scan_host(
                address, [SID], FlightAccess(tls_root_certs=cert.read_bytes(), retry_s=0)
            )
        with pytest.raises(protocol.RemoteUnavailableError):  # plaintext to a TLS port
            remote.scan_host(address, [SID], FlightAccess(token=TOKEN, retry_s=0, timeout_s=3))
    finally:
        stop_process(proc)


DRIVER_CONTROL = 1718  # a control stream of our own: no other test's driver answers


def test_18_1_driver_mode(tmp_path: Any) -> None:
    """#18.1: ``serve --driver`` learns the stream through the SHM driver (a consumer lease)
    and serves the driver's regions."""
    from pathlib import Path

    from driver_fixtures import DriverProcess, driver_toml

    work = tempfile.mkdtemp(prefix="tp-test-serve-drv-", dir=SHM_ROOT)
    base = os.path.join(work, "shm")
    cfg = os.path.join(work, "driver.toml")
    with MediaDriverProcess() as md:
        Path(cfg).write_text(
            driver_toml(
                base,
                md.dir,
                streams=range(10000, 10001),
                control_stream_id=DRIVER_CONTROL,
                policies={"lease_keepalive_interval_ms": 1000, "lease_expiry_grace_intervals": 10},
            )
        )
        daemon = DriverProcess(cfg, base, os.path.join(work, "driver.log"))
        daemon.start().wait_ready()
        prod = proc = None
        try:
            control = ("--control-stream-id", str(DRIVER_CONTROL))
            prod = ProducerProc(md.dir, base, "--driver", "--stream-id", "10000", *control)
            prod.produce(12)
            port = free_port()
            cmd = [sys.executable, "-m", "tensorpool", "serve", "--driver", "--stream-id", "10000"]
            cmd += ["--port", str(port), "--aeron-dir", md.dir, "--shm-base-dir", base, *control]
            proc = subprocess.Popen(
                [*cmd, "--attach-timeout", "20"], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None and "streams [10000]" in proc.stdout.readline()
            access = FlightAccess(retry_s=0)
            deadline = time.monotonic() + 20  # live once the driver's announce names the producer
            while True:
                snap = remote.scan_host(f"127.0.0.1:{port}", [10000], access)[10000]
                assert snap is not None and snap.spec.epoch == prod.epoch
                if snap.live or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert snap.live
            assert (snap.state.oldest, snap.state.head) == (0, 12)
            t = protocol.Ticket(10000, prod.epoch, 0, 12)
            rows = [
                r
                for b in remote.fetch(f"127.0.0.1:{port}", access, t, lambda q, w: None)
                for r in b.to_pylist()
            ]
            assert [r["seq"] for r in rows] == list(range(12))
            assert all(check_payload(r["payload"], r["seq"]) for r in rows)
        finally:
            if proc is not None:
                stop_process(proc)
            if prod is not None:
                prod.close()
            daemon.stop()
            shutil.rmtree(work, ignore_errors=True)


def test_30_3_a_stream_not_yet_announced_to_a_new_server_is_retried_not_refused() -> None:
    """#30.3: a ``serve`` that has not heard its stream announced yet (just restarted: the
    soak's query failed its task on "bad ticket: stream 108 has not been announced") answers
    UNAVAILABLE, so a read retries until the announce came, instead of failing the task."""
    sid = 183
    shm = tempfile.mkdtemp(prefix="tp-test-", dir=SHM_ROOT)
    proc = prod = None
    try:
        with MediaDriverProcess() as md:
            port = free_port()
            cmd = [sys.executable, "-m", "tensorpool", "serve", "--stream-id", str(sid)]
            cmd += ["--port", str(port), "--aeron-dir", md.dir, "--shm-base-dir", shm]
            proc = subprocess.Popen(
                [*cmd, "--attach-timeout", "0"], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None and f"streams [{sid}]" in proc.stdout.readline()
            address = f"127.0.0.1:{port}"
            ticket = protocol.Ticket(sid, 1, 0, 4)
            client = flight.FlightClient(f"grpc://{address}")
            with pytest.raises(flight.FlightUnavailableError, match="not been announced"):
                client.do_get(flight.Ticket(ticket.encode())).read_all()
            client.close()
            with pytest.raises(protocol.RemoteUnavailableError, match="did not answer for 1 s"):
                list(remote.fetch(address, FlightAccess(retry_s=1), ticket, lambda q, w: None))
            # the producer comes: a read retried until the server heard it gets its frames
            prod = ProducerProc(md.dir, shm, "--stream-id", str(sid), "--nslots", str(NSLOTS))
            prod.produce(4)
            ticket = protocol.Ticket(sid, prod.epoch, 0, 4)
            patient = FlightAccess(retry_s=120)  # the announce on a loaded host
            rows = [
                r
                for b in remote.fetch(address, patient, ticket, lambda q, w: None)
                for r in b.to_pylist()
            ]
            assert [r["seq"] for r in rows] == [0, 1, 2, 3]
    finally:
        if proc is not None:
            stop_process(proc)
        if prod is not None:
            prod.close()
        shutil.rmtree(shm, ignore_errors=True)


def _stats(s: Served) -> dict[str, int]:
    import json

    out = list(s.client().do_action(flight.Action("stats", b""), s.access.call_options()))
    return json.loads(out[0].body.to_pybytes())


def _refused(s: Served, call: Any, counter: str, match: str) -> str:
    """``call`` is refused with one line matching ``match`` (no traceback, no server path),
    counted under ``counter``, and the server still serves."""
    before = _stats(s).get(counter, 0)
    with pytest.raises(flight.FlightServerError, match=match) as err:
        call()
    text = str(err.value)
    assert "Traceback" not in text and ".py" not in text and "\n" not in text.strip(), text
    assert _stats(s).get(counter, 0) == before + 1
    _alive(s)
    return text


def _do_get(s: Served, raw: bytes) -> Any:
    return lambda: s.client().do_get(flight.Ticket(raw), s.access.call_options()).read_all()


def _action(s: Served, kind: str, body: bytes) -> Any:
    return lambda: list(s.client().do_action(flight.Action(kind, body), s.access.call_options()))


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"[" * 100_000, "ticket nests JSON deeper than 4 levels"),
        (b'{"v": 1, "a": ' + b"{" * 10 + b"}" * 10 + b"}", "ticket nests JSON deeper"),
        (
            b'{"v": 1, "stream": 181, "epoch": 1, "first": 0, "end": 2, "runs": [[0, 1e400]]}',
            "field 'runs'",
        ),
        (b" " * (protocol.MAX_REQUEST_BYTES + 1), "ticket is 4194305 bytes; at most 4194304"),
    ],
)
def test_27_3_malformed_tickets_get_one_line_and_are_counted(
    served: Served, raw: bytes, why: str
) -> None:
    """#27.3: a ticket nested 100,000 deep (RecursionError before), with non-finite numbers
    (OverflowError before) or over the size bound is refused with one line naming the field,
    never a traceback, and counted under ``bad_ticket``."""
    _refused(served, _do_get(served, raw), "bad_ticket", f"bad ticket: .*{why}")


@pytest.mark.parametrize(
    ("kind", "body", "why"),
    [
        ("scan", b"[" * 100_000, "scan action's body nests JSON deeper"),
        ("scan", b'{"streams": [Infinity]}', r"'streams' holds inf, not a stream id"),
        ("scan", b'{"streams": [1e400]}', r"'streams' holds inf, not a stream id"),
        ("scan", b'{"streams": [181.0]}', r"'streams' holds 181.0, not a stream id"),
        ("scan", b'{"streams": 181}', r"'streams' must be a list"),
        ("scan", b'{"stream": [181]}', r"needs a JSON body"),
        ("scan", b"x" * (protocol.MAX_REQUEST_BYTES + 1), "at most 4194304"),
        ("losses", b"{" * 100_000, "losses action's body nests JSON deeper"),
    ],
)
def test_27_3_malformed_actions_get_one_line_and_are_counted(
    served: Served, kind: str, body: bytes, why: str
) -> None:
    """#27.3: the same for action bodies, counted under ``bad_action``."""
    _refused(served, _action(served, kind, body), "bad_action", why)


def test_27_3_a_scan_names_a_bounded_number_of_streams_each_scanned_once(served: Served) -> None:
    """#27.3: 60,000 stream ids (29 s of server CPU before) are refused at once, naming the
    bound; ids named twice are scanned once."""
    body = protocol.encode_scan_request([SID] * 60_000)
    _refused(served, _action(served, "scan", body), "bad_action", "names 60000 ids; at most 1024")
    body = protocol.encode_scan_request([SID, BIG] * (protocol.MAX_SCAN_STREAMS // 2))
    scans = _stats(served).get("scans", 0)
    assert len(_action(served, "scan", body)()) == 2  # one table per distinct stream
    assert _stats(served)["scans"] == scans + 1


def test_27_3_a_ticket_cannot_count_more_loss_than_its_ring_holds(served: Served) -> None:
    """#27.3: a ticket for a wrong epoch spanning 2^20 seqs with a loss key added 1,048,576 to
    ``frames_lost`` and to the ledger in one call; now a ticket naming more frames than the
    stream's ring holds is refused and nothing is counted lost; so is an epoch never
    announced."""
    snap = served.snapshot()
    key = protocol.new_loss_key()
    lost = _stats(served).get("frames_lost", 0)
    for ticket, why in (
        (protocol.Ticket(SID, snap.spec.epoch - 1, 0, 1 << 20, None, True, key), "names 1048576"),
        (protocol.Ticket(SID, snap.spec.epoch, 0, NSLOTS + 1, None, True, key), "names 65 frames"),
        (protocol.Ticket(SID, snap.spec.epoch + 7, 0, 1, None, True, key), "never announced"),
    ):
        _refused(served, _do_get(served, ticket.encode()), "bad_ticket", why)
    assert _stats(served).get("frames_lost", 0) == lost
    assert remote.take_losses(served.address, key, served.access) == []
