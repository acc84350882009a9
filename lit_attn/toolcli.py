"""The command-line style of the experiment tools (`python -m lit_attn.bench|compare|sweep`, benchmarks/).

They parse with jsonargparse, like `main.py`, and report a user error as one `error: ...` line
on stderr with exit status 2 (set LIT_ATTN_DEBUG=1 for jsonargparse's full report). Arguments
after a bare `--` are not parsed: they are returned apart, for tools that pass them to main.py.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from jsonargparse import ArgumentParser


def one_line_parse_error(message: str, flags: dict[str, str] | None = None,
                         examples: dict[str, str] | None = None) -> str:
    """jsonargparse's multi-line report on a flag as one line: `--flag='value' is invalid: expected TYPE`.

    `flags` maps a parser key to the flag to show (default `--KEY`); `examples` maps a key to
    what to say is expected instead of the type (e.g. an example of valid JSON).
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    key = re.match(r'Parser key "([^"]+)"', lines[0]) if lines else None
    if key is None:
        return " ".join(lines)
    given = next((m.group(1) for line in lines if (m := re.search(r"(?:Given|Got) value: (.*)$", line))), None)
    reasons = [re.sub(r"<class '(\w+)'>", r"\1", re.sub(r"^(- )?Expected (a )?|\. Got value: .*$", "", line))
               for line in lines[1:] if "Expected" in line]
    reasons = [r for r in reasons if r != "NoneType"] or reasons  # "int or null": saying "int" is the help
    expected = (examples or {}).get(key.group(1)) or "; or ".join(dict.fromkeys(reasons)) or " ".join(lines[1:])
    value = f"={given!r}" if given is not None else ""
    flag = (flags or {}).get(key.group(1), f"--{key.group(1)}")
    return f"{flag}{value} is invalid: expected {expected}"


class ToolParser(ArgumentParser):
    """A jsonargparse parser whose errors are one `error: ...` line and exit status 2."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("LIT_ATTN_DEBUG") or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)
        flags = {a.dest: a.option_strings[-1] for a in self._actions if a.option_strings}
        sys.stderr.write(f"error: {one_line_parse_error(message, flags)} (--help lists the flags)\n")
        sys.exit(2)


def split_extra(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(the tool's own arguments, the arguments after the first bare `--`); argv defaults to sys.argv[1:]."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def csv_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [t.strip() for t in str(text).split(",") if t.strip()]
