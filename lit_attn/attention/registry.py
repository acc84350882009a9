"""Name -> attention-builder registry: the one place that lists attention names."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

# Every builder accepts these keyword arguments (it may ignore some of them);
# anything else it accepts is an attention-specific option.
COMMON_ARGS = (
    "n_embd",
    "n_head",
    "n_query_heads",
    "n_kv_heads",
    "block_size",
    "dropout",
    "bias",
    "qkv_bias",
    "rope",
)

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_attention(name: str, builder: Callable[..., nn.Module] | None = None):
    """Register `builder` under `name`; usable as a decorator or a plain call.

    A builder takes the keyword arguments in `COMMON_ARGS` (plus its own options)
    and returns a module mapping (B, T, C) -> (B, T, C) causally, whose output
    projection is named `out_proj` (it gets the scaled residual init).
    """

    def _register(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name.lower()
        if key in _REGISTRY:
            raise ValueError(f"attention {name!r} is already registered")
        _REGISTRY[key] = fn
        return fn

    return _register(builder) if builder is not None else _register


def attention_names() -> list[str]:
    return sorted(_REGISTRY)


def get_attention(name: str) -> Callable[..., nn.Module]:
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown attention {name!r}; choose one of: {', '.join(attention_names())}"
        ) from None


def attention_options(name: str) -> list[str]:
    """The attention-specific options a builder accepts (beyond COMMON_ARGS)."""
    builder = get_attention(name)
    params = inspect.signature(builder).parameters
    bound = getattr(builder, "keywords", {})  # fixed by functools.partial at registration
    return [
        p for p in params
        if p not in COMMON_ARGS and p not in bound and params[p].kind is not inspect.Parameter.VAR_KEYWORD
    ]


def build_attention(name: str, options: dict[str, Any] | None = None, **common: Any) -> nn.Module:
    """Build attention `name` from the common arguments and its own `options`."""
    builder = get_attention(name)
    options = dict(options or {})
    allowed = attention_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        hint = f"its options are: {', '.join(allowed)}" if allowed else "it takes no options"
        raise ValueError(f"attention {name!r} got unknown option(s) {', '.join(unknown)}; {hint}")
    return builder(**common, **options)
