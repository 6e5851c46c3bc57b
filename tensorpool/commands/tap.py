"""`tensorpool tap`: print every tensorpool message on Aeron streams as one JSON line each.

Model. ``tap`` subscribes to one channel on one or more stream ids (default: the control stream
1000; ``--stream-id 1000 1100 1200 1300`` taps control, descriptors, QoS and metadata at once),
decodes each message by the ``(schemaId, templateId)`` in its SBE header
(:func:`tensorpool.specs.decode_any`: wire, driver and bridge schemas) and prints::

    {"ts_ns": ..., "stream_id": ..., "session_id": ..., "length": ...,
     "schema_id": ..., "template_id": ..., "message": "<Name>", "fields": {...}}

* ``ts_ns`` is the local receipt time on the monotonic clock (the clock of MONOTONIC
  announces), ``stream_id``/``session_id`` come from the Aeron frame header, ``length`` is the
  message size in bytes.
* ``fields`` is the decoder's ``to_dict()``: enums print as their names, optional fields holding
  the null sentinel print as ``null``, byte strings (varData, uint8 arrays) as lowercase **hex**
  (hex rather than base64 because it lines up with ``--hex`` input and hexdumps), groups as
  lists of objects. One exception: the ``token`` of a ``ShmDriverShutdownRequest`` prints as
  ``"<redacted>"`` (``""`` when none was sent), so tap output and logs never carry the
  driver's shutdown token (#14.2).
* A message that does not decode prints ``{"ts_ns", "stream_id", "session_id", "length",
  "error": <CodecError.reason>, "detail": ..., "hex": <first 64 bytes>}`` (plus ``schema_id``
  and ``template_id`` when the 8-byte header was readable; for a shutdown request only the
  bytes before its token), and tapping continues.

``--count N`` stops after N lines, ``--duration S`` after S seconds (whichever comes first;
neither: until Ctrl-C or SIGTERM). ``--hex HEX`` decodes one message given on the command line
and prints its line with null ``ts_ns``/``stream_id``/``session_id``; it touches no Aeron at all
and exits 2 with one line on stderr if the message does not decode.

A tap is a plain Aeron subscriber: it joins each stream at the current position (no replay of
older messages) and never publishes, so it does not disturb the producers and consumers it
watches. It needs a media driver shared with them (``--aeron-dir``); ``--embedded`` starts a
private one, which only sees this process.

The formatting core (:func:`message_record`, :func:`jsonable`, :func:`parse_hex`) is pure, so
tests drive it with encoded bytes; :func:`run` owns Aeron, stdout and signals.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
from collections.abc import Buffer
from typing import Any, Final

from tensorpool.commands._common import add_transport_args, run_agent
from tensorpool.endpoints import Endpoints
from tensorpool.transport.agent import AgentTermination, WorkAgent
from tensorpool.transport.process import StopSignals

HEX_PREVIEW_BYTES: Final = 64
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Endpoints()
    p.add_argument(
        "--channel", default=d.control_channel, help="Aeron channel to tap (%(default)s)"
    )
    p.add_argument(
        "--stream-id",
        type=int,
        action="extend",
        nargs="+",
        default=None,
        metavar="ID",
        help="stream id(s) to tap; repeatable, or several after one flag "
        f"(default {d.control_stream_id})",
    )
    p.add_argument("--count", type=int, default=None, metavar="N", help="stop after N messages")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument(
        "--hex",
        default=None,
        metavar="HEX",
        help="decode this one message (hex, whitespace and a 0x prefix allowed) and exit; "
        "no Aeron is used",
    )
    add_transport_args(p, driver=False)


# --- pure formatting ----------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """Turn decoder output into JSON types: enum -> name, bytes -> hex, tuples -> lists."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _shutdown_request_ids() -> tuple[int, int]:
    from tensorpool.specs.generated import driver

    dec = driver.ShmDriverShutdownRequestDecoder
    return dec.SCHEMA_ID, dec.TEMPLATE_ID


#: ``ShmDriverShutdownRequest`` carries the driver's shutdown token (Driver Model §4.13): a
#: tap must not hand it to whoever reads its output or logs (#14.2).
_SHUTDOWN_REQUEST: Final = _shutdown_request_ids()
#: Its SBE header and fixed block; the token (var data) starts right after.
_SHUTDOWN_REQUEST_FIXED_BYTES: Final = 8 + 9
REDACTED: Final = "<redacted>"


def redact(token: Any) -> str:
    """The shutdown token as printed: only whether one was sent (not even its length)."""
    return REDACTED if token else ""


def message_record(
    buf: Buffer, *, ts_ns: int | None, stream_id: int | None, session_id: int | None
) -> dict[str, Any]:
    """The JSON object printed for one message; decoding failures become an ``error`` record.

    Everything in the result is owned (no views into ``buf``), so it may outlive an Aeron
    fragment buffer.
    """
    from tensorpool.specs import CodecError, decode_any, peek_header

    view = memoryview(buf)
    try:
        length = view.nbytes
        record: dict[str, Any] = {
            "ts_ns": ts_ns,
            "stream_id": stream_id,
            "session_id": session_id,
            "length": length,
        }
        try:
            dec = decode_any(buf)
            fields = jsonable(dec.to_dict())  # var data and enums are checked here
        except CodecError as exc:
            try:
                _, template_id, schema_id, _ = peek_header(buf)
            except CodecError:
                pass
            else:
                record["schema_id"] = schema_id
                record["template_id"] = template_id
            record["error"] = exc.reason
            record["detail"] = str(exc)
            preview = HEX_PREVIEW_BYTES
            if (record.get("schema_id"), record.get("template_id")) == _SHUTDOWN_REQUEST:
                preview = _SHUTDOWN_REQUEST_FIXED_BYTES  # #14.2: the token follows: not shown
            record["hex"] = view[:preview].hex()
            return record
        record["schema_id"] = dec.SCHEMA_ID
        record["template_id"] = dec.TEMPLATE_ID
        record["message"] = dec.NAME
        if (dec.SCHEMA_ID, dec.TEMPLATE_ID) == _SHUTDOWN_REQUEST and "token" in fields:
            fields["token"] = redact(fields["token"])
        record["fields"] = fields
        return record
    finally:
        view.release()


def parse_hex(text: str) -> bytes:
    """Bytes from hex text; whitespace anywhere and one leading ``0x`` are ignored."""
    compact = "".join(text.split())
    if compact[:2] in ("0x", "0X"):
        compact = compact[2:]
    if not compact:
        raise ValueError("no bytes given")
    try:
        return bytes.fromhex(compact)
    except ValueError:
        if len(compact) % 2:
            raise ValueError(f"odd number of hex digits ({len(compact)})") from None
        bad = next((c for c in compact if c not in "0123456789abcdefABCDEF"), "?")
        raise ValueError(f"not a hex digit: {bad!r}") from None


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


# --- the command ------------------------------------------------------------------------------
def _run_hex(text: str) -> int:
    from tensorpool.cli import UserError

    try:
        data = parse_hex(text)
    except ValueError as exc:
        raise UserError(f"--hex: {exc}") from None
    record = message_record(data, ts_ns=None, stream_id=None, session_id=None)
    if "error" in record:
        raise UserError(f"--hex: cannot decode: {record['error']}: {record['detail']}")
    sys.stdout.write(dumps(record) + "\n")
    sys.stdout.flush()
    return 0


def _validate(args: argparse.Namespace) -> list[int]:
    from tensorpool.cli import UserError

    if not args.channel.startswith("aeron:"):
        raise UserError(f"--channel: not an Aeron channel URI: {args.channel!r}")
    stream_ids: list[int] = []
    for sid in args.stream_id or [Endpoints().control_stream_id]:
        if not _INT32_MIN <= sid <= _INT32_MAX:
            raise UserError(f"--stream-id: {sid} is not a 32-bit stream id")
        if sid not in stream_ids:
            stream_ids.append(sid)
    if args.count is not None and args.count < 1:
        raise UserError(f"--count: must be >= 1, got {args.count}")
    if args.duration is not None and not args.duration > 0:
        raise UserError(f"--duration: must be > 0, got {args.duration}")
    return stream_ids


def _silence_stdout() -> None:
    """After EPIPE (``tap | head``): point fd 1 at /dev/null so the exit flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _subscribe(ctx: Any, channel: str, stream_id: int, handler: Any) -> Any:
    import pyaeron

    from tensorpool.cli import UserError

    try:
        return ctx.add_subscription(channel, stream_id, handler)
    except pyaeron.AeronError as exc:
        first_line = (str(exc).strip().splitlines() or ["?"])[0]  # Aeron appends a C stack
        raise UserError(f"cannot subscribe to {channel} stream {stream_id}: {first_line}") from None


def run(args: argparse.Namespace) -> int:
    if args.hex is not None:
        return _run_hex(args.hex)
    stream_ids = _validate(args)

    import signal

    from tensorpool.client.settings import ClientSettings
    from tensorpool.commands._common import start_context, transport_config
    from tensorpool.transport.clock import now_ns
    from tensorpool.transport.idle import BackoffIdleStrategy

    ctx = start_context(ClientSettings(transport=transport_config(args)))
    pending: list[str] = []

    def on_message(buffer: Any, header: Any) -> None:
        # The buffer is only valid during this call: format it to an owned string now.
        pending.append(
            dumps(
                message_record(
                    buffer,
                    ts_ns=now_ns(),
                    stream_id=header.stream_id,
                    session_id=header.session_id,
                )
            )
        )

    stop = StopSignals((signal.SIGTERM,)).install()
    out = sys.stdout

    remaining = args.count

    def work() -> int:
        nonlocal remaining
        n = sum(sub.poll() for sub in subs)
        if pending:
            lines = pending if remaining is None else pending[:remaining]
            out.write("\n".join(lines) + "\n")
            out.flush()
            pending.clear()
            if remaining is not None:
                remaining -= len(lines)
                if remaining <= 0:
                    raise AgentTermination
        return n

    try:
        with ctx:
            subs = [_subscribe(ctx, args.channel, sid, on_message) for sid in stream_ids]
            run_agent(
                WorkAgent("tap", work),
                ctx=ctx,
                idle=BackoffIdleStrategy(),
                stop=stop,
                duration_s=args.duration or 0.0,
            )
    except BrokenPipeError:
        _silence_stdout()
    finally:
        stop.restore()
    return 0
