"""Name -> attention registry: the one place that lists attention names and what each one costs.

An entry (`AttentionSpec`) holds the builder and four descriptions that the rest of
the code reads instead of knowing the families: the heads it uses, its parameters,
its forward FLOPs per token, and what a decoding cache keeps per token. Every
callable of an entry takes the same keyword arguments as the builder: the
`COMMON_ARGS` plus the attention's own options.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import nn

# Every builder accepts these keyword arguments (it may ignore some of them), with these defaults
# where a caller leaves one out (n_embd and n_head it must give); anything else a builder accepts
# is an attention-specific option.
COMMON_ARGS: dict[str, Any] = {"n_embd": None, "n_head": None, "n_query_heads": None, "n_kv_heads": None,
                               "block_size": 1024, "dropout": 0.0, "bias": False, "qkv_bias": None, "rope": False}


class FlopSplit(NamedTuple):
    """Forward FLOPs of one attention layer per token, split by how they grow with the context length T.

    Conventions (those of torch's FlopCounterMode): a multiply-accumulate is 2 FLOPs and only
    matrix multiplications count; the score matrix counts in full (T per query), as a dense
    kernel computes it.
    """

    linear: int  # projections and other per-token work: independent of T
    quadratic: int  # work against every context token (scores, weighted sum): proportional to T

    @property
    def total(self) -> int:
        return self.linear + self.quadratic

    def scale(self, factor: int) -> FlopSplit:
        return FlopSplit(self.linear * factor, self.quadratic * factor)


@dataclass(frozen=True)
class AttentionSpec:
    """A registered attention: how to build it and what it costs.

    build(**args) -> nn.Module mapping (B, T, C) -> (B, T, C) causally, output projection named `out_proj`;
    heads(**args) -> (query heads, key/value heads) it really uses;
    params(**args) -> parameters of one layer;
    flops(context, **args) -> FlopSplit of one layer's forward per token at context T;
    cache(**args) -> {name: per-token shape} of what decoding keeps for every past token of one layer.
    `fixed` holds keyword arguments bound at registration (e.g. a preset), passed to all five.
    """

    name: str
    build: Callable[..., nn.Module]
    heads: Callable[..., tuple[int, int]]
    params: Callable[..., int]
    flops: Callable[..., FlopSplit]
    cache: Callable[..., dict[str, tuple[int, ...]]]
    fixed: dict[str, Any] = field(default_factory=dict)

    def options(self) -> list[str]:
        """The attention-specific options (the builder's arguments beyond COMMON_ARGS and `fixed`)."""
        params = inspect.signature(self.build).parameters
        return [p for p in params if p not in COMMON_ARGS and p not in self.fixed
                and params[p].kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]

    def arguments(self, options: dict[str, Any] | None, common: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of every callable: common ones, checked options, fixed ones."""
        options = dict(options or {})
        allowed = self.options()
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            hint = f"its options are: {', '.join(allowed)}" if allowed else "it takes no options"
            raise ValueError(f"attention {self.name!r} got unknown option(s) {', '.join(unknown)}; {hint}")
        unexpected = sorted(set(common) - set(COMMON_ARGS))
        if unexpected or common.get("n_embd") is None or common.get("n_head") is None:
            raise TypeError(f"attention {self.name!r} takes n_embd, n_head and optionally "
                            f"{', '.join(list(COMMON_ARGS)[2:])}; got {', '.join(sorted(common))}")
        return {**COMMON_ARGS, **common, **options, **self.fixed}


_REGISTRY: dict[str, AttentionSpec] = {}


def register_attention(
    name: str,
    build: Callable[..., nn.Module],
    *,
    heads: Callable[..., tuple[int, int]],
    params: Callable[..., int],
    flops: Callable[..., FlopSplit],
    cache: Callable[..., dict[str, tuple[int, ...]]],
    fixed: dict[str, Any] | None = None,
) -> AttentionSpec:
    """Register an attention under `name` (case-insensitive); see AttentionSpec for the callables."""
    key = name.lower()
    if key in _REGISTRY:
        raise ValueError(f"attention {name!r} is already registered")
    spec = AttentionSpec(key, build, heads, params, flops, cache, dict(fixed or {}))
    _REGISTRY[key] = spec
    return spec


def unregister_attention(name: str) -> None:
    """Remove a registered attention (for tests and notebooks that register their own)."""
    _REGISTRY.pop(name.lower(), None)


def attention_names() -> list[str]:
    return sorted(_REGISTRY)


def get_attention(name: str) -> AttentionSpec:
    try:
        return _REGISTRY[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown attention {name!r}; choose one of: {', '.join(attention_names())}") from None


def attention_options(name: str) -> list[str]:
    """The attention-specific options of `name` (beyond COMMON_ARGS)."""
    return get_attention(name).options()


def build_attention(name: str, options: dict[str, Any] | None = None, **common: Any) -> nn.Module:
    """Build attention `name` from the common arguments and its own `options`."""
    spec = get_attention(name)
    return spec.build(**spec.arguments(options, common))
