"""The range types of lit_attn.bounds as jsonargparse types, and their refusal as one line.

A signature's `PositiveInt`, `UnitInterval`, ... is all the command line needs to refuse a value out of
range, from a flag or a config file, before anything is built: the type's range is the only place it is written.
"""

from __future__ import annotations

import re

from jsonargparse.typing import register_type

from lit_attn.bounds import when_defined

_REFUSAL = re.compile(r"Not of type \w+: (must be .*), got (.*)$")


def _register(cls: type) -> None:
    register_type(cls, cls.base, cls.read)  # a parsed value is a plain int or float


def register_bounded_types() -> None:
    """Make every Bounded type, defined so far or later, a jsonargparse type."""
    when_defined(_register)


def range_refusal(message: str, key: str, hint: str = "") -> str | None:
    """jsonargparse's report on `key` as `--KEY must be ..., got VALUE (HINT)`, where a Bounded type refused
    the value; None for any other report."""
    found = next((m for line in message.splitlines() if (m := _REFUSAL.search(line.strip()))), None)
    if found is None:
        return None
    what = found.group(1)
    if "NoneType" in message:  # X | None: null is valid too
        what += " or null"
    hint = hint.strip().rstrip(".")
    return f"--{key} {what}{f' ({hint})' if hint else ''}, got {found.group(2)}"
