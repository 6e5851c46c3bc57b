"""The one error of the ``tensorpool`` format's options, raised only from this package.

A rule that can be checked only when the rings are seen (an epoch that is gone, a start time no
frame reaches, a second writer that differs) is still an option's error: the code that finds it
calls :func:`reject` with the option, so the message has one shape everywhere --
``"<option>: <what is wrong>"``, the option in the spelling the docs use.
"""

from __future__ import annotations

from enum import Enum
from typing import NoReturn


class TensorPoolOptionError(ValueError):
    """An option of the ``tensorpool`` format is unknown or invalid (the message names it)."""


def reject(option: Enum | str, message: str) -> NoReturn:
    """Fail the query: ``option`` (a table row, or a Spark setting such as ``schema``) broke
    the rule ``message`` states."""
    name = option.name if isinstance(option, Enum) else option
    raise TensorPoolOptionError(f"{name}: {message}")


__all__ = ["TensorPoolOptionError", "reject"]
