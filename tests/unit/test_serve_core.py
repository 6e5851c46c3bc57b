"""#18: the Flight protocol (tickets, hosts/streams options) and the server's read rules."""

from __future__ import annotations

from typing import Any

import pytest

from tensorpool.serve.core import OVERWRITTEN_REASON, BadTicket, LossLedger, NotAnnounced, plan_get
from tensorpool.spark_source.options import TensorPoolOptionError, parse_hosts, parse_source_options
from tensorpool.spark_source.plan.offsets import RingState
from tensorpool.spark_source.rings.flight_protocol import (
    MAX_TICKET_SPAN,
    LossRanges,
    Ticket,
    TicketError,
    decode_loss,
    decode_losses,
    decode_losses_request,
    decode_ticket,
    encode_loss,
    encode_losses,
    encode_losses_request,
    new_loss_key,
)
from tensorpool.spark_source.rings.mapped_rings import REGION_UNAVAILABLE


def ring(oldest: int, head: int, nslots: int = 64, epoch: int = 3) -> RingState:
    return RingState(epoch, oldest, head, nslots)


def test_18_ticket_round_trip() -> None:
    t = Ticket(7, 3, 10, 20, ((10, 12), (15, 20)), False)
    assert decode_ticket(t.encode()) == t
    t = Ticket(7, 3, 10, 20)
    assert decode_ticket(t.encode()) == t


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"{", "not JSON"),
        (b"7", "JSON object"),
        (b'{"stream": 1, "epoch": 1, "first": 0, "end": 1}', "version"),
        (b'{"v": 1, "stream": 0, "epoch": 1, "first": 0, "end": 1}', "'stream'"),
        (b'{"v": 1, "stream": 1, "epoch": -1, "first": 0, "end": 1}', "'epoch'"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": "0", "end": 1}', "'first'"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 5, "end": 4}', "'end'"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": true, "end": 4}', "'first'"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 1, "meta": 1}', "'meta'"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 9, "runs": [[3, 2]]}', "run"),
        (
            b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 9, "runs": [[4, 6], [5, 7]]}',
            "run",
        ),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 2, "end": 9, "runs": [[0, 3]]}', "run"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 9, "runs": [[0, 10]]}', "run"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 9, "runs": 5}', "'runs'"),
        (b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 9, "path": "/x"}', "unknown"),
    ],
)
def test_18_4_bad_tickets_are_refused_with_a_reason(raw: bytes, why: str) -> None:
    with pytest.raises(TicketError, match=why):
        decode_ticket(raw)


def test_18_4_a_ticket_spanning_more_than_any_ring_is_malformed() -> None:
    with pytest.raises(TicketError, match="spans more than"):
        decode_ticket(Ticket(1, 1, 0, MAX_TICKET_SPAN + 1).encode())


def test_18_1_plan_reads_what_the_ring_holds() -> None:
    plan = plan_get(Ticket(1, 3, 10, 20), 3, ring(0, 30), 64)
    assert (plan.lost, plan.first, plan.end, plan.runs) == ([], 10, 20, None)


def test_18_1_overwritten_frames_are_one_loss_range() -> None:
    """Frames below the ring's oldest are lost (one range), the rest is read."""
    plan = plan_get(Ticket(1, 3, 40, 100), 3, ring(60, 124), 64)
    assert plan.lost == [(40, 60, OVERWRITTEN_REASON)]
    assert (plan.first, plan.end) == (60, 100)
    top = 10**15
    plan = plan_get(Ticket(1, 3, top - 64, top), 3, ring(top - 10, top), 64)
    assert plan.lost == [(top - 64, top - 10, OVERWRITTEN_REASON)]


def test_27_3_a_ticket_is_bounded_by_the_ring_it_names() -> None:
    """#27.3: a ticket names at most the frames its stream's ring holds, so no ticket makes
    the server count more loss than one ring's worth; a ring never announced here, or an epoch
    newer than the one announced now, is refused too (the server never saw those frames)."""
    with pytest.raises(BadTicket, match="names 65 frames of stream 1, whose ring holds 64"):
        plan_get(Ticket(1, 3, 0, 65), 3, ring(60, 124), 64)
    with pytest.raises(BadTicket, match="names 1048576 frames"):
        plan_get(Ticket(1, 2, 0, 1 << 20), 3, ring(60, 124), 64)  # another epoch, too
    with pytest.raises(BadTicket, match="names 1048576 frames"):
        plan_get(Ticket(1, 2, 0, 1 << 20), None, None, 64)  # nothing announced now
    # runs name fewer frames than their span: a relay's sparse seqs
    plan = plan_get(Ticket(1, 2, 0, 1 << 20, ((0, 32), ((1 << 20) - 32, 1 << 20))), 3, None, 64)
    assert sum(b - a for a, b, _ in plan.lost) == 64
    with pytest.raises(BadTicket, match="epoch 4 was never announced"):
        plan_get(Ticket(1, 4, 0, 1), 3, ring(0, 30), 64)


def test_30_a_stream_not_announced_here_yet_is_a_retry_not_a_bad_ticket() -> None:
    """#30: a restarted server has not heard its stream announced yet: the ticket may be
    good, so the answer is "try again" (the server maps it to UNAVAILABLE), never a loss."""
    with pytest.raises(NotAnnounced, match="not been announced to this server yet"):
        plan_get(Ticket(1, 3, 0, 1), None, None, None)
    assert not issubclass(NotAnnounced, BadTicket)


def test_18_1_planned_runs_are_clipped_at_the_oldest_frame() -> None:
    runs = ((0, 5), (8, 70), (80, 90))
    plan = plan_get(Ticket(1, 3, 0, 90, runs), 3, ring(60, 124), 90)
    assert plan.lost == [(0, 5, OVERWRITTEN_REASON), (8, 60, OVERWRITTEN_REASON)]
    assert plan.runs is not None and plan.runs.tolist() == [[60, 70], [80, 90]]


def test_18_4_a_range_past_the_head_is_refused() -> None:
    with pytest.raises(BadTicket, match="newest frame is seq 29"):
        plan_get(Ticket(1, 3, 10, 31), 3, ring(0, 30), 64)


def test_18_1_another_epoch_or_no_producer_is_all_lost() -> None:
    for epoch, st in ((4, ring(0, 30)), (None, None)):
        plan = plan_get(Ticket(1, 3, 10, 20), epoch, st, 64)
        assert plan.lost == [(10, 20, REGION_UNAVAILABLE)] and not plan.reads
    plan = plan_get(Ticket(1, 3, 10, 20, ((10, 12), (15, 20))), 4, ring(0, 30), 64)
    assert plan.lost == [(10, 12, REGION_UNAVAILABLE), (15, 20, REGION_UNAVAILABLE)]


def test_18_1_loss_ranges_fold_and_travel() -> None:
    rec = LossRanges()
    for seq in (5, 6, 7, 9):
        rec(seq, "torn_read")
    rec(10, "not_committed")
    rec.add(100, 200, "seq_mismatch")
    ranges = rec.take()
    assert ranges == [
        (5, 8, "torn_read"),
        (9, 10, "torn_read"),
        (10, 11, "not_committed"),
        (100, 200, "seq_mismatch"),
    ]
    assert rec.frames == 105 and rec.take() == []
    assert decode_loss(encode_loss(ranges)) == ranges


def test_18_2_hosts_and_streams_options() -> None:
    o = parse_source_options(
        {"hosts": "camA:8815, camB:9000", "streams": "camA/2,camB:9000/1"}, streaming=True
    )
    assert o.streams == (1, 2) and o.remote is not None
    assert o.remote.address_of(1) == "camB:9000" and o.remote.address_of(2) == "camA:8815"
    assert o.remote.by_address() == {"camB:9000": [1], "camA:8815": [2]}
    assert o.remote.prefer_local_reads and o.remote.access.token is None
    # two servers on one host: streams name host:port
    _, streams = parse_hosts("h:1,h:2", "h:1/5,h:2/6")
    assert streams == ((5, "h:1"), (6, "h:2"))


@pytest.mark.parametrize(
    ("opts", "msg"),
    [
        ({"hosts": "camA", "streams": "camA/1"}, "hosts: expected"),
        ({"hosts": "camA:0", "streams": "camA/1"}, "hosts: expected"),
        ({"hosts": "camA:1,camA:1", "streams": "camA/1"}, "hosts: .* twice"),
        ({"hosts": "camA:1", "streams": "1"}, "streams: with 'hosts'"),
        ({"hosts": "camA:1", "streams": "camB/1"}, "streams: .*not in 'hosts'"),
        ({"hosts": "h:1,h:2", "streams": "h/1"}, "write host:port/id"),
        ({"hosts": "camA:1", "streams": "camA/x"}, "not an integer"),
        ({"hosts": "camA:1,camB:1", "streams": "camA/1,camB/1"}, "unique across hosts"),
        ({"streams": "1", "flightToken": "t"}, "flightToken: only applies with 'hosts'"),
        ({"hosts": "a:1", "streams": "a/1", "includeStreamMetadata": "true"}, "not available"),
        ({"hosts": "a:1", "streams": "a/1", "driver": "true"}, "driver: is not available"),
        ({"hosts": "a:1", "streams": "a/1", "flightTlsRootCerts": "/nonexistent"}, "cannot read"),
    ],
)
def test_18_2_bad_remote_options_name_the_option(opts: dict[str, str], msg: str) -> None:
    with pytest.raises(TensorPoolOptionError, match=msg):
        parse_source_options(opts)


def test_18_2_server_schema_is_the_sources() -> None:
    """The server builds the Spark source's Arrow schema without pyspark: equal, exactly."""
    pytest.importorskip("pyspark")
    from tensorpool.serve.server import arrow_schema
    from tensorpool.spark_source.spark.source import arrow_schema as spark_schema

    for meta in (True, False):
        assert arrow_schema(meta).equals(spark_schema(meta))


def test_18_2_a_loss_range_is_counted_at_once_or_fails_at_its_first_frame() -> None:
    """A server's loss range reaches the task's loss recorder as one call (a range far outside
    the ring costs no loop over its seqs); with failOnDataLoss it fails naming the first."""
    pytest.importorskip("pyspark")
    from types import SimpleNamespace

    from tensorpool.spark_source.spark.source import LossRecorder, TensorPoolDataLossError

    part = SimpleNamespace(
        stream_id=5, epoch=2, region=None, fail_on_data_loss=False, spool_dir=None
    )
    rec = LossRecorder(part, "seq 0..10^12")
    rec.add_range(0, 10**12, "seq_mismatch")
    rec.add_range(7, 7, "seq_mismatch")
    assert rec.count == 10**12 and rec.reasons == {"seq_mismatch": 10**12}
    rec = LossRecorder(SimpleNamespace(**{**vars(part), "fail_on_data_loss": True}), "x")
    with pytest.raises(TensorPoolDataLossError, match="seq_mismatch"):
        rec.add_range(40, 10**12, "seq_mismatch")


# --- read-time loss counted by the server for the query's driver (any executor host) ----------
K1, K2 = "a" * 32, "b" * 32


def test_18_2_a_ticket_carries_the_querys_loss_key() -> None:
    key = new_loss_key()
    t = Ticket(7, 3, 10, 20, None, True, key)
    assert decode_ticket(t.encode()) == t
    assert b"loss" not in Ticket(7, 3, 10, 20).encode()  # batch reads and failOnDataLoss=true
    for bad in ('"A' + "0" * 31 + '"', '"abc"', "17", '"' + "0" * 33 + '"'):
        raw = b'{"v": 1, "stream": 1, "epoch": 1, "first": 0, "end": 1, "loss": %s}' % bad.encode()
        with pytest.raises(TicketError, match="loss key"):
            decode_ticket(raw)
    assert decode_losses_request(encode_losses_request(key)) == key
    for raw in (b"{", b'{"key": "x"}', b'{"key": "%s", "path": "/"}' % K1.encode(), b"[]"):
        with pytest.raises(TicketError):
            decode_losses_request(raw)
    assert decode_losses(encode_losses([(1, 2, 3)])) == [(1, 2, 3)]


def test_18_2_ledger_takes_and_clears_a_keys_counts() -> None:
    """Counts add up per (key, stream, epoch); a take returns the key's counts and forgets
    them; another key's stay; an unknown key gets nothing."""
    led = LossLedger()
    led.record(K1, 5, 2, 10, 0)
    led.record(K1, 5, 2, 4, 1)
    led.record(K1, 6, 1, 3, 2)
    led.record(K2, 5, 2, 7, 3)
    led.record(K1, 5, 2, 0, 4)  # nothing lost: no entry
    assert sorted(led.take(K1, 5)) == [(5, 2, 14), (6, 1, 3)]
    assert led.take(K1, 6) == []
    assert led.take("c" * 32, 6) == []
    assert led.take(K2, 7) == [(5, 2, 7)] and len(led) == 0
    assert led.counters["loss_ledger_frames"] == 24 and led.counters["loss_ledger_taken"] == 3


def test_18_2_ledger_is_bounded_and_evicts_the_stalest_counted() -> None:
    """Invented keys or epochs cannot grow the ledger past its bound: the entry updated
    longest ago goes, and the eviction is counted (with its frames)."""
    led = LossLedger(max_entries=3)
    led.record(K1, 1, 1, 5, 0)
    led.record(K1, 1, 2, 6, 1)
    led.record(K1, 1, 3, 7, 2)
    led.record(K1, 1, 1, 1, 3)  # an update refreshes the entry: (1, 2) is now the stalest
    for epoch in range(100, 110):
        led.record(K2, 1, epoch, 1, 4 + epoch)
    assert len(led) == 3
    assert led.counters["loss_ledger_evicted"] == 10
    assert led.counters["loss_ledger_evicted_frames"] == 6 + 7 + (5 + 1) + 7 * 1
    assert sorted(led.take(K2, 200)) == [(1, 107, 1), (1, 108, 1), (1, 109, 1)]
    led = LossLedger(max_entries=2)
    led.record(K1, 1, 1, 5, 0)
    led.record(K1, 1, 2, 6, 1)
    led.record(K1, 1, 1, 1, 2)
    led.record(K2, 1, 1, 1, 3)  # evicts (K1, 1, 2): updated longest ago
    assert led.take(K1, 4) == [(1, 1, 6)]


def test_18_2_ledger_entries_nobody_takes_expire() -> None:
    led = LossLedger(ttl_ns=100)
    led.record(K1, 1, 1, 5, 0)
    led.record(K2, 1, 1, 5, 50)
    led.record(K1, 1, 1, 1, 60)  # refreshed: lives until 160
    assert led.take(K2, 149) == [(1, 1, 5)] and len(led) == 1
    led.record(K2, 2, 1, 5, 150)
    assert led.take(K1, 170) == [] and led.counters["loss_ledger_expired"] == 1
    assert led.take(K2, 249) == [(2, 1, 5)]


def test_18_2_loss_a_server_counts_is_not_spooled_too(tmp_path: Any) -> None:
    """A Flight read's loss reaches the driver through the server's ledger only; the same
    recorder without a server's count spools it (the local path). The spool is reachable on
    its own host only (how a task decides whether a local read's loss can reach the driver)."""
    pytest.importorskip("pyspark")
    from types import SimpleNamespace

    from tensorpool.spark_source.rings import spool
    from tensorpool.spark_source.spark.source import LossRecorder

    address = spool.make_spool(str(tmp_path))
    try:
        assert spool.reachable(address)
        part = SimpleNamespace(
            stream_id=5, epoch=2, region=None, fail_on_data_loss=False, spool_dir=address
        )
        rec = LossRecorder(part, "seq 0..9")
        rec.counted_by_server()
        rec.add_range(0, 4, "seq_mismatch")
        rec.report()
        assert spool.collect(address, (5,))[0] == {}
        rec = LossRecorder(part, "seq 0..9")
        rec.add_range(0, 4, "seq_mismatch")
        rec.report()
        assert spool.collect(address, (5,))[0] == {5: 4}
    finally:
        spool.remove_spool(address)
    assert not spool.reachable(address)


def test_30_a_request_at_the_instant_the_server_starts_finds_its_state() -> None:
    """#30: the Flight base class starts serving inside its ``__init__``, so a request can
    arrive before the subclass's ``__init__`` goes on (a Spark task retrying across a restart
    of ``serve`` did, while the loss journal replayed): every handler's state is set first.
    The request is made at that instant from a hook between the two (the race injected)."""
    flight = pytest.importorskip("pyarrow.flight")
    from tensorpool.serve.server import TensorPoolFlightServer

    got: list[BaseException] = []

    class Directory:  # nothing announced yet: the server has just started
        def layouts(self) -> dict[int, Any]:
            return {}

        def liveness(self, now_ns: int) -> dict[int, Any]:
            return {}

    class Hook(flight.FlightServerBase):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # serving from here on
            try:
                self.do_get(None, flight.Ticket(Ticket(7, 1, 0, 1).encode()))
            except Exception as exc:
                got.append(exc)

    class Probed(TensorPoolFlightServer, Hook):
        pass

    server = Probed(
        "grpc://127.0.0.1:0", streams=(7,), directory=Directory(), base_dirs=(), shm_base_dir=""
    )
    try:
        assert len(got) == 1 and isinstance(got[0], flight.FlightUnavailableError), got
        assert server.counters["internal_error"] == 0
    finally:
        server.shutdown()
