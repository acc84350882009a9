"""Grouped attention: MHA, GQA, MQA and the Sparse Query Attention family (SQA, sSQA, xSQA, xSMQA).

One module covers them all through head counts. With H total heads the head
size is always n_embd / H; Hq query heads and Hkv key/value heads are used, and
query head i reads key/value head i // (Hq / Hkv). Sparse Query Attention
(SQA) uses Hq < H, which shrinks the score computation by H / Hq and the
output projection to Hq * hs -> n_embd.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .gate import apply_gate, gate_flops, gate_params, output_gate
from .registry import FlopSplit, register_attention
from .rope import RotaryEmbedding
from .state import KVCache, KVLayout
from .window import check_window, windowed_attention


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


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_size: int,
                     rope: RotaryEmbedding | None, dropout_p: float, cache: KVCache | None = None,
                     window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, T, Hq*hs), k and v (B, T, Hkv*hs) -> (B, T, Hq*hs): per-head causal softmax attention.

    With a decoding cache ({"k", "v"}: (B, L, Hkv, hs) buffers, see `kv_cache_layout`) the T
    tokens sit at `cache.positions` (T,), increasing: their keys and values are written there and the
    queries attend over the filled prefix 0..cache.length-1, each up to its own position; a prefill of
    positions 0..T-1 attends over its own keys alone, plainly causal. With a `window` or `sinks` (Hq,) see
    window.windowed_attention (the cache is then a ring of the last `window` positions).
    """
    B, T, _ = q.shape
    positions = None if cache is None else cache.positions
    q = q.view(B, T, -1, head_size).transpose(1, 2)  # (B, Hq, T, hs)
    k = k.view(B, T, -1, head_size)  # (B, T, Hkv, hs), as the cache holds them
    v = v.view(B, T, -1, head_size)
    if rope is not None:
        q, k = rope(q, positions), rope(k.transpose(1, 2), positions).transpose(1, 2)
    if window is not None or sinks is not None:
        y = windowed_attention(q, k, v, window, sinks, dropout_p, cache, single_query_attention)  # (B, Hq, T, hs)
        return y.transpose(1, 2).reshape(B, T, q.size(1) * head_size)
    mask, is_causal = None, True
    if cache is not None:
        cache["k"].index_copy_(1, positions, k.to(cache["k"].dtype))
        cache["v"].index_copy_(1, positions, v.to(cache["v"].dtype))
        length = cache.length
        if length != T:  # not a prefill: the cached keys and values, up to the last written position
            n = cache["k"].size(1) if length is None else length
            k, v = cache["k"][:, :n].to(q.dtype), cache["v"][:, :n].to(q.dtype)  # (B, n, Hkv, hs)
            is_causal = False
            # One new token at the end of the filled prefix attends to all of it: no mask to build.
            if length is None or T > 1:
                mask = torch.arange(n, device=q.device) <= positions[:, None]  # (T, n): up to each own position
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, Hkv, n, hs)
    if T == 1 and mask is None and not is_causal and q.device.type == "cpu" and dropout_p == 0.0:
        return single_query_attention(q, k, v).view(B, 1, -1)  # (B, Hq, 1, hs) is (B, 1, Hq*hs) in memory
    # enable_gqa lets the kernel index shared K/V heads instead of materialising repeats.
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                       enable_gqa=q.size(1) != k.size(1))  # (B, Hq, T, hs)
    return y.transpose(1, 2).reshape(B, T, q.size(1) * head_size)


def single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, Hq, 1, hs) over all of k (B, Hkv, n, hs) and v (B, Hkv, n, dv) -> (B, Hq, 1, dv) contiguous, as
    two matmuls.

    A decoding step on a CPU: SDPA's CPU kernel spends most of a call setting up its query tiles for a single
    query, several times what the two matmuls take (docs/benchmarks.md). The g = Hq/Hkv
    query heads of one key/value head are consecutive, so they are rows of one (g, hs) @ (hs, n) product.
    """
    B, hq, _, hs = q.shape
    hkv = k.size(1)
    scores = q.view(B, hkv, hq // hkv, hs) @ k.transpose(-2, -1) * hs**-0.5  # (B, Hkv, g, n)
    return (scores.softmax(-1) @ v).view(B, hq, 1, v.size(-1))


class GroupedAttention(nn.Module):
    """Causal self-attention with Hq query heads sharing Hkv key/value heads; `gate` (none, headwise,
    elementwise): a sigmoid output gate from the input on each head's output (see gate.py)."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        n_query_heads: int | None = None,
        n_kv_heads: int | None = None,
        block_size: int = 1024,
        dropout: float = 0.0,
        bias: bool = False,
        qkv_bias: bool | None = None,
        rope: bool = False,
        window: int | None = None,
        sinks: bool = False,
        preset: str = "mha",
        gate: str = "none",
    ):
        super().__init__()
        self.n_query_heads, self.n_kv_heads = resolve_heads(preset, n_embd, n_head, n_query_heads, n_kv_heads)
        self.n_head = n_head
        self.head_size = n_embd // n_head
        self.dropout = dropout
        qkv_bias = bias if qkv_bias is None else qkv_bias
        q_dim = self.n_query_heads * self.head_size
        kv_dim = self.n_kv_heads * self.head_size
        # One fused projection: a single matmul for q, k and v.
        self.qkv = nn.Linear(n_embd, q_dim + 2 * kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(q_dim, n_embd, bias=bias)
        self.gate = output_gate(gate, n_embd, self.n_query_heads, self.head_size, qkv_bias)
        self.rope = RotaryEmbedding(self.head_size, block_size) if rope else None
        self.window = check_window(window)
        # Learned per-head sink logits (see window.py); 1-D, so the model's AdamW leaves them undecayed.
        self.sinks = nn.Parameter(torch.zeros(self.n_query_heads)) if sinks else None

    def forward(self, x: torch.Tensor, state: KVCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state`, x holds the tokens at `state.positions`, the last
        ones of the `state.length` filled cache positions (see causal_attention)."""
        hq, hkv, hs = self.n_query_heads, self.n_kv_heads, self.head_size
        q, k, v = self.qkv(x).split([hq * hs, hkv * hs, hkv * hs], dim=-1)
        dropout_p = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, hs, self.rope, dropout_p, state, self.window, self.sinks)  # (B, T, Hq*hs)
        return self.out_proj(apply_gate(self.gate, x, y))  # the block drops the output (the residual dropout)

    # The analytic costs (the tests check them against the ones measured from the module).
    @classmethod
    def heads(cls, n_embd: int, n_head: int, n_query_heads: int | None, n_kv_heads: int | None, preset: str,
              **_: Any) -> tuple[int, int]:
        return resolve_heads(preset, n_embd, n_head, n_query_heads, n_kv_heads)

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        hq, hkv = cls.heads(**args)
        hs = args["n_embd"] // args["n_head"]
        qkv_bias = args["bias"] if args["qkv_bias"] is None else args["qkv_bias"]
        return projection_params(args["n_embd"], hq, hkv, hs, args["bias"], args["qkv_bias"],
                                 sinks=args.get("sinks", False)) \
            + gate_params(args.get("gate", "none"), args["n_embd"], hq, hs, qkv_bias)

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        hq, hkv = cls.heads(**args)
        hs = args["n_embd"] // args["n_head"]
        split = projection_flops(context, args["n_embd"], hq, hkv, hs, window=check_window(args.get("window")))
        return FlopSplit(split.linear + gate_flops(args.get("gate", "none"), args["n_embd"], hq, hs), split.quadratic)

    @classmethod
    def decoding_state(cls, **args: Any) -> KVLayout:
        return kv_cache_layout(cls.heads(**args)[1], args["n_embd"] // args["n_head"], check_window(args.get("window")))


for _name in PRESETS:
    register_attention(_name, GroupedAttention, fixed={"preset": _name})
