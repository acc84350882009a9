"""Grouped attention: MHA, GQA, MQA and the Sparse Query Attention family (seed 002).

One module covers them all through head counts. With H total heads the head
size is always n_embd / H; Hq query heads and Hkv key/value heads are used, and
query head i reads key/value head i // (Hq / Hkv). Sparse Query Attention
(SQA) uses Hq < H, which shrinks the score computation by H / Hq and the
output projection to Hq * hs -> n_embd.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .registry import register_attention
from .rope import RotaryEmbedding

# name -> (Hq, Hkv) as functions of H (the README's table of grouped variants).
PRESETS: dict[str, tuple[str, str]] = {
    "mha": ("H", "H"),
    "gqa": ("H", "H/4"),
    "mqa": ("H", "1"),
    "sqa": ("H/2", "H/4"),
    "ssqa": ("H/2", "H/2"),
    "xsqa": ("H/4", "H/4"),
    "xsmqa": ("H/4", "1"),
}


def _preset_count(expr: str, n_head: int, preset: str, what: str, flag: str) -> int:
    if expr == "1":
        return 1
    if expr == "H":
        return n_head
    div = int(expr.split("/")[1])
    if n_head % div:
        raise ValueError(
            f"attention {preset!r} uses {what} = n_head/{div}, which needs n_head divisible by {div} "
            f"(got n_head={n_head}); set n_head to a multiple of {div} or give {flag} explicitly"
        )
    return n_head // div


def resolve_heads(
    preset: str, n_embd: int, n_head: int, n_query_heads: int | None = None, n_kv_heads: int | None = None
) -> tuple[int, int]:
    """Return (Hq, Hkv) for a preset, explicit overrides winning; raise ValueError if invalid."""
    for name, value in (("n_embd", n_embd), ("n_head", n_head)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; the head size must be n_embd / n_head")
    q_expr, kv_expr = PRESETS[preset]
    hq = (n_query_heads if n_query_heads is not None
          else _preset_count(q_expr, n_head, preset, "n_query_heads", "n_query_heads"))
    hkv = n_kv_heads if n_kv_heads is not None else _preset_count(kv_expr, n_head, preset, "n_kv_heads", "n_kv_heads")
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


class GroupedAttention(nn.Module):
    """Causal self-attention with Hq query heads sharing Hkv key/value heads."""

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
        preset: str = "mha",
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
        self.resid_dropout = nn.Dropout(dropout)
        self.rope = RotaryEmbedding(self.head_size, block_size) if rope else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hq, hkv, hs = self.n_query_heads, self.n_kv_heads, self.head_size
        q, k, v = self.qkv(x).split([hq * hs, hkv * hs, hkv * hs], dim=-1)
        q = q.view(B, T, hq, hs).transpose(1, 2)  # (B, Hq, T, hs)
        k = k.view(B, T, hkv, hs).transpose(1, 2)  # (B, Hkv, T, hs)
        v = v.view(B, T, hkv, hs).transpose(1, 2)  # (B, Hkv, T, hs)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        # enable_gqa lets the kernel index shared K/V heads instead of materialising repeats.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True, enable_gqa=hq != hkv
        )  # (B, Hq, T, hs)
        y = y.transpose(1, 2).reshape(B, T, hq * hs)
        return self.resid_dropout(self.out_proj(y))


for _name in PRESETS:
    register_attention(_name, partial(GroupedAttention, preset=_name))
