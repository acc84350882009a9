"""Grouped attention: MHA, GQA, MQA and the Sparse Query Attention family (SQA, sSQA, xSQA, xSMQA).

One module covers them all through head counts. With H total heads the head
size is always n_embd / H; Hq query heads and Hkv key/value heads are used, and
query head i reads key/value head i // (Hq / Hkv). Sparse Query Attention
(SQA) uses Hq < H, which shrinks the score computation by H / Hq and the
output projection to Hq * hs -> n_embd.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .gate import apply_gate, gate_flops, gate_params, output_gate
from .heads import PRESETS, kv_cache_layout, projection_flops, projection_params, resolve_heads
from .kernels import causal_attention
from .registry import FlopSplit, register_attention
from .rope import RotaryEmbedding
from .state import KVCache, KVLayout
from .window import check_window


class GroupedAttention(nn.Module):
    """Causal self-attention with Hq query heads sharing Hkv key/value heads; `gate` (none, headwise,
    elementwise): a sigmoid output gate from the input on each head's output (see gate.py); `qk_norm`: queries
    and keys RMS-normalised per head before RoPE (see kernels.causal_attention)."""

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
        qk_norm: bool = False,
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
        self.qk_norm = qk_norm  # no parameters (kernels.rms_per_head)

    def forward(self, x: torch.Tensor, state: KVCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state`, x holds the tokens at `state.positions`, the last
        ones of the `state.length` filled cache positions (see causal_attention)."""
        hq, hkv, hs = self.n_query_heads, self.n_kv_heads, self.head_size
        q, k, v = self.qkv(x).split([hq * hs, hkv * hs, hkv * hs], dim=-1)
        dropout_p = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, hs, self.rope, dropout_p, state, self.window, self.sinks,
                             self.qk_norm)  # (B, T, Hq*hs)
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
