"""Head counts and the projections' sizes shared by the softmax families (grouped.py, noq.py, differential.py):
the grouped presets, their query and key/value heads, projection parameters and FLOPs, the key/value cache."""

from __future__ import annotations

from typing import NamedTuple

from .derive import FlopSplit
from .state import KVLayout


class HeadPreset(NamedTuple):
    """Head counts of a preset as divisors of the total heads H: Hq = H / query_divisor and
    Hkv = H / kv_divisor, or a single key/value head when kv_divisor is None."""

    query_divisor: int
    kv_divisor: int | None


PRESETS: dict[str, HeadPreset] = {
    "mha": HeadPreset(1, 1),
    "gqa": HeadPreset(1, 4),
    "mqa": HeadPreset(1, None),
    "sqa": HeadPreset(2, 4),
    "ssqa": HeadPreset(2, 2),
    "xsqa": HeadPreset(4, 4),
    "xsmqa": HeadPreset(4, None),
}


def _preset_count(divisor: int | None, n_head: int, preset: str, flag: str) -> int:
    if divisor is None:
        return 1
    if n_head % divisor:
        raise ValueError(
            f"attention {preset!r} uses {flag} = n_head/{divisor}, which needs n_head divisible by {divisor} "
            f"(got n_head={n_head}); set n_head to a multiple of {divisor} or give {flag} explicitly"
        )
    return n_head // divisor


def resolve_heads(
    preset: str, n_embd: int, n_head: int, n_query_heads: int | None = None, n_kv_heads: int | None = None
) -> tuple[int, int]:
    """Return (Hq, Hkv) for a preset, explicit overrides winning; raise ValueError if invalid."""
    for name, value in (("n_embd", n_embd), ("n_head", n_head)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; the head size must be n_embd / n_head")
    q_div, kv_div = PRESETS[preset]
    hq = n_query_heads if n_query_heads is not None else _preset_count(q_div, n_head, preset, "n_query_heads")
    hkv = n_kv_heads if n_kv_heads is not None else _preset_count(kv_div, n_head, preset, "n_kv_heads")
    for name, value in (("n_query_heads", hq), ("n_kv_heads", hkv)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if hq > n_head or n_head % hq:
        raise ValueError(f"n_query_heads={hq} must divide n_head={n_head} "
                         "(query heads are a subset of the n_head heads)")
    if hkv > hq:
        raise ValueError(f"n_query_heads={hq} is smaller than n_kv_heads={hkv}; "
                         "use at most as many key/value heads as query heads")
    if hq % hkv:
        raise ValueError(f"n_query_heads={hq} is not divisible by n_kv_heads={hkv}; "
                         "each key/value head must serve the same number of query heads")
    return hq, hkv


def projection_params(n_embd: int, hq: int, hkv: int, hs: int, bias: bool, qkv_bias: bool | None,
                      query_projection: bool = True, sinks: bool = False) -> int:
    """d*(Hq + 2*Hkv)*hs [+ (Hq + 2*Hkv)*hs] + Hq*hs*d [+ d] [+ Hq], less the Hq*hs query columns without a
    query projection. Brackets: present with qkv_bias (q/k/v), bias (output projection) or sinks (one per head)."""
    width = ((hq if query_projection else 0) + 2 * hkv) * hs
    qkv_bias = bias if qkv_bias is None else qkv_bias
    return n_embd * width + (width if qkv_bias else 0) + hq * hs * n_embd + (n_embd if bias else 0) + \
        (hq if sinks else 0)


def projection_flops(context: int, n_embd: int, hq: int, hkv: int, hs: int, query_projection: bool = True,
                     window: int | None = None) -> FlopSplit:
    """linear 2*d*(Hq + 2*Hkv)*hs + 2*Hq*hs*d (less the query projection's share without one);
    quadratic 4*Hq*hs*T (Q K^T and A V), T capped at the window: the keys a query needs."""
    weights = ((hq if query_projection else 0) + 2 * hkv) * hs * n_embd + hq * hs * n_embd
    attended = context if window is None else min(context, window)
    return FlopSplit(linear=2 * weights, quadratic=4 * hq * hs * attended)


def kv_cache_layout(hkv: int, hs: int, window: int | None = None) -> KVLayout:
    """Per token: the keys and values of every key/value head; of the last `window` tokens with a window."""
    return KVLayout({"k": (hkv, hs), "v": (hkv, hs)}, window)
