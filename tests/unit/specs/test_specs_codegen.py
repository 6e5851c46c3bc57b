"""The generator: committed modules are fresh, --check works, bad schemas fail loudly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorpool.specs import codegen
from tensorpool.specs.codegen import SchemaError, parse_schema, render_all, snake

ROOT = Path(codegen.__file__).resolve().parents[2]


def test_committed_generated_modules_are_not_stale(tmp_path: Path) -> None:
    """Regenerate into a temp dir; every file must equal the committed one."""
    written = codegen.write_all(tmp_path)
    assert {p.name for p in written} == {"__init__.py", "wire.py", "driver.py", "bridge.py"}
    for path in written:
        committed = codegen.GENERATED_DIR / path.name
        assert committed.read_text() == path.read_text(), f"{committed} is stale: regenerate"


def test_generation_is_deterministic() -> None:
    assert render_all() == render_all()


def test_cli_check_reports_stale_file(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "tensorpool.specs.codegen", "--out", str(tmp_path)]
    first = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, check=False)
    assert first.returncode == 0, first.stderr
    ok = subprocess.run([*run, "--check"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert ok.returncode == 0, ok.stderr
    wire_py = tmp_path / "wire.py"
    wire_py.write_text(wire_py.read_text() + "# edited by hand\n")
    stale = subprocess.run([*run, "--check"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert stale.returncode == 1
    assert "wire.py" in stale.stderr
    assert "driver.py" not in stale.stderr


def test_committed_check_passes() -> None:
    assert codegen.main(["--check"]) == 0


def test_snake_case_names() -> None:
    assert snake("headerNslots") == "header_nslots"
    assert snake("announceTimestampNs") == "announce_timestamp_ns"
    assert snake("payloadOffset") == "payload_offset"
    assert snake("seq") == "seq"
    assert snake("progressMajorDeltaUnits") == "progress_major_delta_units"
    assert snake("URIValue") == "uri_value"
    assert snake("class") == "class_"


HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<sbe:messageSchema xmlns:sbe="http://fixprotocol.io/2016/sbe" package="t" id="5" version="1"
    byteOrder="littleEndian">
  <types>
    <composite name="messageHeader">
      <type name="blockLength" primitiveType="uint16"/>
      <type name="templateId"  primitiveType="uint16"/>
      <type name="schemaId"    primitiveType="uint16"/>
      <type name="version"     primitiveType="uint16"/>
    </composite>
    <composite name="groupSizeEncoding">
      <type name="blockLength" primitiveType="uint16"/>
      <type name="numInGroup"  primitiveType="uint16"/>
    </composite>
    <composite name="varDataEncoding">
      <type name="length"  primitiveType="uint32" maxValue="100"/>
      <type name="varData" primitiveType="uint8" length="0"/>
    </composite>
    {extra}
  </types>
  {messages}
</sbe:messageSchema>
"""


def _schema(tmp_path: Path, messages: str, extra: str = "") -> Path:
    path = tmp_path / "t.xml"
    path.write_text(HEAD.format(messages=textwrap.dedent(messages), extra=extra))
    return path


@pytest.mark.parametrize(
    ("messages", "extra", "match"),
    [
        (
            '<sbe:message name="M" id="1"><data name="d" id="1" type="varDataEncoding"/>'
            '<field name="f" id="2" type="uint8"/></sbe:message>',
            "",
            "fixed field after",
        ),
        (
            '<sbe:message name="M" id="1"><field name="f" id="1" type="uint8" '
            'sinceVersion="1"/></sbe:message>',
            "",
            "sinceVersion",
        ),
        (
            '<sbe:message name="M" id="1"><data name="d" id="1" type="varDataEncoding" '
            'presence="optional"/></sbe:message>',
            "",
            "cannot be optional",
        ),
        (
            '<sbe:message name="M" id="1" blockLength="3"><field name="f" id="1" '
            'type="uint32"/></sbe:message>',
            "",
            "blockLength 3",
        ),
        (
            '<sbe:message name="M" id="1"><field name="f" id="1" type="nope"/></sbe:message>',
            "",
            "unknown type",
        ),
        ("", '<set name="S" encodingType="uint8"><choice name="a">0</choice></set>', "<set>"),
        (
            '<sbe:message name="M" id="1"><field name="offset" id="1" type="uint8"/></sbe:message>',
            "",
            "collides",
        ),
        (
            '<sbe:message name="M" id="1"/><sbe:message name="N" id="1"/>',
            "",
            "duplicate message ids",
        ),
    ],
)
def test_unsupported_schema_constructs_fail_loudly(
    tmp_path: Path, messages: str, extra: str, match: str
) -> None:
    with pytest.raises(SchemaError, match=match):
        parse_schema(_schema(tmp_path, messages, extra))


def test_explicit_block_length_pads_and_constants_take_no_bytes(tmp_path: Path) -> None:
    schema = parse_schema(
        _schema(
            tmp_path,
            """
            <sbe:message name="M" id="1" blockLength="16">
              <field name="a" id="1" type="uint8"/>
              <field name="k" id="2" type="K"/>
              <field name="b" id="3" type="uint32"/>
              <field name="arr" id="4" type="uint8" length="3"/>
            </sbe:message>
            """,
            '<type name="K" primitiveType="uint8" presence="constant">7</type>',
        )
    )
    (msg,) = schema.messages
    assert msg.block_length == 16
    assert [(f.name, f.offset, f.size) for f in msg.fields] == [
        ("a", 0, 1),
        ("k", 1, 0),
        ("b", 1, 4),
        ("arr", 5, 3),
    ]
    assert codegen._struct_fmt(msg.fields, msg.block_length) == "BI3s8x"
