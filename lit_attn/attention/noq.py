"""Query-projection-free attention.

softmax(X Wq (X Wk)^T) X Wv = softmax(X (X Wk Wq^T)^T) X Wv, so Wq can be folded
into Wk and the query is X itself. With one head (head size = n_embd) this is
exact and saves a quarter of the attention's projection parameters. With
H > 1 heads, head h uses the h-th head-size slice of X as its query: a fixed,
not learned, query projection.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .gate import apply_gate, gate_flops, gate_params, output_gate
from .heads import kv_cache_layout, projection_flops, projection_params, resolve_heads
from .kernels import causal_attention
from .registry import FlopSplit, register_attention
from .rope import RotaryEmbedding
from .state import KVCache, KVLayout
from .window import check_window


class NoQueryAttention(nn.Module):
    """Causal attention whose queries are the (pre-normed) input channels; `gate` as GroupedAttention's."""

    # why --model.qk_norm is refused (registry)
    no_qk_norm = "has no queries to normalise (its queries are the input itself)"

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
        gate: str = "none",
    ):
        super().__init__()
        self.n_query_heads, self.n_kv_heads = self.heads(n_embd, n_head, n_query_heads, n_kv_heads)
        self.n_head = n_head
        self.head_size = n_embd // n_head
        self.dropout = dropout
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.kv = nn.Linear(n_embd, 2 * self.n_kv_heads * self.head_size, bias=qkv_bias)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.gate = output_gate(gate, n_embd, self.n_query_heads, self.head_size, qkv_bias)
        self.rope = RotaryEmbedding(self.head_size, block_size) if rope else None
        self.window = check_window(window)
        self.sinks = nn.Parameter(torch.zeros(self.n_query_heads)) if sinks else None  # see window.py

    def forward(self, x: torch.Tensor, state: KVCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state`, x holds the tokens at `state.positions`, the last
        ones of the `state.length` filled cache positions (see causal_attention)."""
        k, v = self.kv(x).split(self.n_kv_heads * self.head_size, dim=-1)
        dropout_p = self.dropout if self.training else 0.0
        y = causal_attention(x, k, v, self.head_size, self.rope, dropout_p, state, self.window, self.sinks)  # (B, T, C)
        return self.out_proj(apply_gate(self.gate, x, y))  # the block drops the output (the residual dropout)

    @classmethod
    def heads(cls, n_embd: int, n_head: int, n_query_heads: int | None, n_kv_heads: int | None,
              **_: Any) -> tuple[int, int]:
        if n_query_heads is not None and n_query_heads != n_head:
            raise ValueError(
                f"attention 'noq' uses every channel of the input as a query, so n_query_heads must equal "
                f"n_head={n_head} (got {n_query_heads}); drop n_query_heads"
            )
        return n_head, resolve_heads("mha", n_embd, n_head, None, n_kv_heads)[1]

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        hq, hkv = cls.heads(**args)
        hs = args["n_embd"] // args["n_head"]
        qkv_bias = args["bias"] if args["qkv_bias"] is None else args["qkv_bias"]
        return projection_params(args["n_embd"], hq, hkv, hs, args["bias"], args["qkv_bias"], query_projection=False,
                                 sinks=args.get("sinks", False)) \
            + gate_params(args.get("gate", "none"), args["n_embd"], hq, hs, qkv_bias)

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        hq, hkv = cls.heads(**args)
        hs = args["n_embd"] // args["n_head"]
        split = projection_flops(context, args["n_embd"], hq, hkv, hs, query_projection=False,
                                 window=check_window(args.get("window")))
        return FlopSplit(split.linear + gate_flops(args.get("gate", "none"), args["n_embd"], hq, hs), split.quadratic)

    @classmethod
    def decoding_state(cls, **args: Any) -> KVLayout:
        # The query is the new token itself: nothing of it is kept.
        return kv_cache_layout(cls.heads(**args)[1], args["n_embd"] // args["n_head"], check_window(args.get("window")))


register_attention("noq", NoQueryAttention)
