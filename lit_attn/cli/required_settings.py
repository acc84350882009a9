"""Settings a launcher (e.g. `lit-attn sweep`) requires of a run, checked before it trains.

The launcher sets the environment variable LIT_ATTN_EXPECT to a JSON object of dotted config
keys and the values it asked for, e.g. {"model.attention": "gqa", "seed_everything": 1}. A
config file or flag that resolves one of them to another value would train something other
than the run's name says; `check_expected` refuses that run before anything is built or written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

ENV = "LIT_ATTN_EXPECT"

# What `lookup` returns for a key the config does not have.
MISSING = object()


def expected_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings LIT_ATTN_EXPECT asks for ({} when unset or empty)."""
    text = (os.environ if environ is None else environ).get(ENV, "")
    if not text.strip():
        return {}
    try:
        expected = json.loads(text)
    except ValueError:
        expected = None
    if not isinstance(expected, dict):
        raise ValueError(f"{ENV} must be a JSON object of dotted config keys and values, e.g. "
                         f'{{"model.attention": "gqa"}}; got {text!r}: fix or unset it')
    return expected


def agrees(got: Any, want: Any) -> bool:
    """Whether a config value is the one asked for (True is not 1, although Python says they are equal)."""
    return got is not MISSING and got == want and isinstance(got, bool) == isinstance(want, bool)


def mismatch(key: str, got: Any, want: Any) -> str | None:
    """Why `got` is not the `want` asked for `key`, or None when they agree."""
    if agrees(got, want):
        return None
    if got is MISSING:
        return f"the resolved config has no {key}, but the sweep asked for {want!r}"
    return (f"the resolved config trains {key}={got!r}, but the sweep asked for {want!r}; "
            f"a --config or flag overrides the sweep's setting: remove it")


def lookup(config: Any, key: str) -> Any:
    """`key` (dotted) in a jsonargparse Namespace or nested dicts; MISSING when absent."""
    node = config
    for part in key.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, IndexError):
            return MISSING
    return node


def check_expected(config: Any) -> None:
    """Raise a one-line ValueError if `config` (a subcommand's Namespace) differs from LIT_ATTN_EXPECT."""
    for key, want in expected_settings().items():
        reason = mismatch(key, lookup(config, key), want)
        if reason is not None:
            raise ValueError(reason)
