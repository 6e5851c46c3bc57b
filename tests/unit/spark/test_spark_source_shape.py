"""#27.2: the Spark source stays in readable pieces: no module over 600 lines, no function
over 80 (read statically from the source, so a new module is covered the day it is added)."""

from __future__ import annotations

import ast
from pathlib import Path

import tensorpool.spark_source

PACKAGE = Path(tensorpool.spark_source.__file__).resolve().parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_modules(paths: list[Path], limit: int) -> list[str]:
    return [f"{p.relative_to(PACKAGE)}: {_lines(p)} lines" for p in paths if _lines(p) > limit]


def long_functions(source: str, limit: int) -> list[str]:
    """``name: lines`` of each function (methods and nested ones included) over ``limit``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = (node.end_lineno or node.lineno) - first + 1
            if n > limit:
                out.append(f"{node.name}: {n} lines")
    return out


def test_27_2_no_module_over_600_lines() -> None:
    assert long_modules(_modules(), MAX_MODULE_LINES) == []


def test_27_2_no_function_over_80_lines() -> None:
    found = {
        str(p.relative_to(PACKAGE)): bad
        for p in _modules()
        if (bad := long_functions(p.read_text(), MAX_FUNCTION_LINES))
    }
    assert found == {}


def test_27_2_the_shape_checks_see_a_long_module_and_function() -> None:
    """The checks bite: a 601-line module and an 81-line function are reported."""
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = f"def f():\n{body}\n"
    assert long_functions(source, MAX_FUNCTION_LINES) == ["f: 81 lines"]
    assert long_functions(source, 81) == []
    stream = PACKAGE / "spark" / "stream.py"
    assert long_modules([stream], _lines(stream) - 1) == [
        f"spark/stream.py: {_lines(stream)} lines"
    ]
