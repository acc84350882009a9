"""Differential attention (Ye et al. 2024, DIFF Transformer, arXiv 2410.05258).

Each differential head i has two query/key maps and one value of twice the head size:
    head_i = (softmax(Q1 K1^T / sqrt(hs)) - lambda softmax(Q2 K2^T / sqrt(hs))) V,
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    out = W_O concat_i((1 - lambda_init) * RMSNorm(head_i)),
with lq1, lk1, lq2, lk2 learnable vectors of the head size shared by the layer's heads,
lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) at depth l = layer_idx + 1 (or the `lambda_init` option), and one
RMSNorm of 2*hs channels applied to every head on its own (the paper's GroupNorm; weight shared by the heads).
With `qk_norm` every query and key map (hs channels) is RMS-normalised before RoPE (kernels.rms_per_head).

Head layout, as the paper's "h = d_model / 2d": the n_head softmax maps of head size hs = n_embd / n_head form
n_head / 2 differential heads, so parameters (plus 6*hs), K/V cache per token (2 * n_embd) and score matmuls
match MHA with n_head heads. With n_kv_heads = Hkv < n_head (GQA, as the paper's code allows) there are Hkv
key maps in Hkv / 2 key/value pairs, and differential head i reads pair i // (n_head / Hkv). The query (key)
channels of map j of head i are the (j * heads + i)-th hs-slice, heads = n_head / 2 (Hkv / 2): the maps of
one side are consecutive, so SDPA's grouped-query indexing pairs them. All maps are one SDPA call against
the 2*hs-wide values (a fused kernel, O(T) memory), so the weighted sums cost twice the value width:
quadratic FLOPs 6 * n_embd * T, not MHA's 4 * n_embd * T.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .heads import projection_flops, projection_params, resolve_heads
from .kernels import rms_per_head, single_query_attention
from .registry import FlopSplit, register_attention
from .rope import RotaryEmbedding
from .state import KVCache, KVLayout


def depth_lambda_init(layer_idx: int) -> float:
    """The paper's lambda_init at depth l = layer_idx + 1: 0.8 - 0.6 * exp(-0.3 * (l - 1))."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


def checked_lambda_init(lambda_init: float | None, layer_idx: int) -> float:
    """`lambda_init` if given (in [0, 1): 1 - lambda_init scales the output), else the depth schedule's."""
    if lambda_init is None:
        return depth_lambda_init(layer_idx)
    if not 0.0 <= lambda_init < 1.0:
        raise ValueError(f"attention 'diff' option lambda_init must be in [0, 1) (the output is scaled by "
                         f"1 - lambda_init), got {lambda_init}; e.g. --model.attention_options '{{\"lambda_init\": "
                         "0.8}', or leave it out for the depth schedule")
    return float(lambda_init)


class DifferentialAttention(nn.Module):
    """Causal differential attention: n_head softmax maps in n_head / 2 differential heads (see the module)."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        n_kv_heads: int | None = None,
        block_size: int = 1024,
        dropout: float = 0.0,
        bias: bool = False,
        qkv_bias: bool | None = None,
        rope: bool = False,
        qk_norm: bool = False,
        layer_idx: int = 0,
        lambda_init: float | None = None,
    ):
        super().__init__()
        self.n_head, self.n_kv_heads = self.heads(n_embd, n_head, n_kv_heads)
        self.head_size = hs = n_embd // n_head
        self.dropout = dropout
        self.lambda_init = checked_lambda_init(lambda_init, layer_idx)
        self.qkv = nn.Linear(n_embd, n_embd + 2 * self.n_kv_heads * hs, bias=bias if qkv_bias is None else qkv_bias)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        # The re-parameterised lambda: four vectors, drawn N(0, 0.1^2) as in the paper's code.
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(hs) * 0.1) for _ in range(4))
        self.head_norm = nn.RMSNorm(2 * hs, eps=1e-5)
        self.rope = RotaryEmbedding(hs, block_size) if rope else None
        self.qk_norm = qk_norm  # every query and key map RMS-normalised before RoPE (no parameters)

    def forward(self, x: torch.Tensor, state: KVCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state` ({"k": (B, L, Hkv, hs), "v": (B, L, Hkv/2, 2*hs)}),
        x holds the tokens at `state.positions`, the last ones of the `state.length` filled positions."""
        positions = None if state is None else state.positions
        q, k, v = self.project(x)
        if self.qk_norm:
            q, k = rms_per_head(q), rms_per_head(k)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        mask, is_causal = None, True
        if state is not None:
            k, v, mask, is_causal = self.cached(k, v, state, positions, state.length)
        maps = self.attend(q, k, v, mask, is_causal)
        return self.out_proj(self.combine(maps))  # the block drops the output (the residual dropout)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q (B, n_head, T, hs), k (B, Hkv, T, hs), v (B, Hkv/2, T, 2*hs) (map layout: module)."""
        B, T, C = x.shape
        hs, hkv = self.head_size, self.n_kv_heads
        q, k, v = self.qkv(x).split([C, hkv * hs, hkv * hs], dim=-1)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, hkv, hs).transpose(1, 2)
        v = v.view(B, T, hkv // 2, 2 * hs).transpose(1, 2)
        return q, k, v

    @staticmethod
    def cached(k: torch.Tensor, v: torch.Tensor, cache: KVCache, positions: torch.Tensor,
               length: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """Write the new keys/values at `positions`; (keys, values, mask, is_causal) to attend over: the new
        ones alone for a prefill of 0..T-1, else the filled prefix, each query up to its own position."""
        T = k.size(2)
        cache["k"].index_copy_(1, positions, k.transpose(1, 2).to(cache["k"].dtype))
        cache["v"].index_copy_(1, positions, v.transpose(1, 2).to(cache["v"].dtype))
        if length == T:
            return k, v, None, True
        n = cache["k"].size(1) if length is None else length
        k = cache["k"][:, :n].transpose(1, 2).to(k.dtype)
        v = cache["v"][:, :n].transpose(1, 2).to(v.dtype)
        # One new token at the end of the filled prefix attends to all of it: no mask to build.
        mask = torch.arange(n, device=k.device) <= positions[:, None] if length is None or T > 1 else None
        return k, v, mask, False

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               is_causal: bool) -> torch.Tensor:
        """Every query map's softmax attention over its key map and its pair's value: (B, n_head, T, 2*hs)."""
        dropout_p = self.dropout if self.training else 0.0
        v = v.repeat(1, 2, 1, 1)  # both key maps of a pair read its value
        if q.size(2) == 1 and mask is None and not is_causal and q.device.type == "cpu" and dropout_p == 0.0:
            return single_query_attention(q, k, v)  # a CPU decoding step: SDPA's setup costs more than its work
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                              enable_gqa=q.size(1) != k.size(1))

    def lambda_full(self) -> torch.Tensor:
        """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (a scalar, computed in float32)."""
        first = torch.exp(torch.dot(self.lambda_q1.float(), self.lambda_k1.float()))
        second = torch.exp(torch.dot(self.lambda_q2.float(), self.lambda_k2.float()))
        return first - second + self.lambda_init

    def combine(self, maps: torch.Tensor) -> torch.Tensor:
        """(B, n_head, T, 2*hs) per-map outputs -> (B, T, n_embd): map 0 minus lambda times map 1 per head,
        each head RMS-normalised and scaled by 1 - lambda_init."""
        B, _, T, width = maps.shape
        first, second = maps.view(B, 2, self.n_head // 2, T, width).unbind(1)
        heads = first - self.lambda_full().to(maps.dtype) * second  # (B, n_head/2, T, 2*hs)
        heads = self.head_norm(heads) * (1 - self.lambda_init)
        return heads.transpose(1, 2).reshape(B, T, self.n_head * self.head_size)

    # The analytic costs (the tests check them against the ones measured from the module).
    @classmethod
    def heads(cls, n_embd: int, n_head: int, n_kv_heads: int | None = None, **_: Any) -> tuple[int, int]:
        """(n_head, Hkv): the query and key maps (values: Hkv / 2 of 2*hs); Hkv defaults to n_head."""
        _, hkv = resolve_heads("mha", n_embd, n_head, None, n_kv_heads)
        for name, value in (("n_head", n_head), ("n_kv_heads", hkv)):
            if value % 2:
                raise ValueError(f"attention 'diff' pairs the maps into differential heads, so {name} must be even "
                                 f"(got {value}); set it to an even number")
        return n_head, hkv

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        """GQA's projections (d x (n_head + 2*Hkv)*hs and out, with their biases) + 4*hs (lambda) + 2*hs (RMSNorm)."""
        hq, hkv = cls.heads(**args)
        checked_lambda_init(args.get("lambda_init"), 0)  # refused before anything is built
        hs = args["n_embd"] // args["n_head"]
        return projection_params(args["n_embd"], hq, hkv, hs, args["bias"], args["qkv_bias"]) + 6 * hs

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        """linear: the projections, as GQA's; quadratic 6*d*T: per query map, q k^T (2*hs*T) and the sum over
        the 2*hs-wide values (4*hs*T)."""
        hq, hkv = cls.heads(**args)
        split = projection_flops(context, args["n_embd"], hq, hkv, args["n_embd"] // args["n_head"])
        return FlopSplit(split.linear, 6 * args["n_embd"] * context)

    @classmethod
    def decoding_state(cls, **args: Any) -> KVLayout:
        """Per token: every key map (Hkv, hs) and every pair's value (Hkv / 2, 2*hs): 2 * Hkv * hs values."""
        hkv, hs = cls.heads(**args)[1], args["n_embd"] // args["n_head"]
        return KVLayout({"k": (hkv, hs), "v": (hkv // 2, 2 * hs)})


register_attention("diff", DifferentialAttention)
