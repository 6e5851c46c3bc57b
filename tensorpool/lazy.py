"""Package attributes loaded on first use (PEP 562).

A package's ``__init__`` names what it exports without importing it, so importing one light
part (a config type, the planning layer) does not pull in pyaeron, pyarrow or pyspark through
the package's other parts. One implementation for every package that does this.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``table[name]`` (a module path)
    on first use and keeps the value in the package's namespace, so it is looked up once."""
    namespace = vars(importlib.import_module(package))

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
