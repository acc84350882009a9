"""Multi-head latent attention (MLA), as in DeepSeek-V2 (arXiv 2405.04434, section 2.1).

Keys and values are up-projected from one compressed latent per token, c = RMSNorm(W_DKV x) of kv_lora_rank
channels: k^C = W_UK c and v = W_UV c, per head. Position enters only through a decoupled RoPE key k^R =
RoPE(W_KR x) of qk_rope_head_dim channels, shared by all heads, beside each head's RoPE query part. Head h scores
[q^C_h; q^R_h] . [k^C_h; k^R] / sqrt(qk_nope_head_dim + qk_rope_head_dim). The query is W_Q x, or, with
`q_lora_rank`, W_UQ RMSNorm(W_DQ x).

Decoding keeps only c and k^R per token. W_UK is absorbed into the query (q^C_h . W_UK,h c = (W_UK,h^T q^C_h) . c)
and W_UV into the output (sum_j p_j W_UV,h c_j = W_UV,h sum_j p_j c_j), so a step attends over the latents
directly, as a multi-query attention with one key/value head of kv_lora_rank (+ qk_rope_head_dim) channels.

With qk_norm each head's query and key [no-RoPE part; RoPE part] are RMS-normalised (kernels.rms_per_head; the
rotation keeps the norm, so before and after RoPE are the same): a decoding step then scales each head's scores by
its keys' norms, computed from the cached latents (see `key_rms`).

With rope=False (learned positions) the decoupled key and query parts stay, unrotated: the same weights then
mean the same thing without positions, and the cache is the same.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import QK_NORM_EPS, rms_per_head
from .registry import FlopSplit, register_attention
from .rope import RotaryEmbedding
from .state import KVCache, KVLayout

NORM_EPS = 1e-6  # DeepSeek-V2's RMSNorm epsilon on the latents


def mla_dims(n_embd: int, n_head: int, kv_lora_rank: int | None = None, q_lora_rank: int | None = None,
             qk_nope_head_dim: int | None = None, qk_rope_head_dim: int | None = None, v_head_dim: int | None = None,
             **_: Any) -> dict[str, Any]:
    """The sizes, each given one or its default from the head size hs = n_embd / n_head, in DeepSeek-V2's
    proportions: qk_nope_head_dim = v_head_dim = hs, qk_rope_head_dim = hs/2 (rounded down to even, at least 2),
    kv_lora_rank = 4 hs (at most n_embd: a compression); q_lora_rank None (a plain query projection)."""
    for name, value in (("n_embd", n_embd), ("n_head", n_head)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; MLA's default head sizes are "
                         "n_embd / n_head")
    hs = n_embd // n_head
    dims = {"kv_lora_rank": min(4 * hs, n_embd) if kv_lora_rank is None else kv_lora_rank,
            "q_lora_rank": q_lora_rank,
            "qk_nope_head_dim": hs if qk_nope_head_dim is None else qk_nope_head_dim,
            "qk_rope_head_dim": max(2, hs // 4 * 2) if qk_rope_head_dim is None else qk_rope_head_dim,
            "v_head_dim": hs if v_head_dim is None else v_head_dim}
    for name, value in dims.items():
        if value is None and name == "q_lora_rank":
            continue  # no query compression
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"attention 'mla': {name} must be a positive integer, got {value!r}; set one in "
                             "--model.attention_options, or leave it out for its default")
    if dims["qk_rope_head_dim"] % 2:
        raise ValueError(f"attention 'mla': qk_rope_head_dim must be even (RoPE rotates channel pairs), got "
                         f"{dims['qk_rope_head_dim']}; set an even one in --model.attention_options")
    return dims


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention: keys and values from a shared low-rank latent, a decoupled RoPE key."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        block_size: int = 1024,
        dropout: float = 0.0,
        bias: bool = False,
        qkv_bias: bool | None = None,
        rope: bool = False,
        qk_norm: bool = False,
        kv_lora_rank: int | None = None,
        q_lora_rank: int | None = None,
        qk_nope_head_dim: int | None = None,
        qk_rope_head_dim: int | None = None,
        v_head_dim: int | None = None,
    ):
        super().__init__()
        dims = mla_dims(n_embd, n_head, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        self.n_head = n_head
        self.kv_lora_rank, self.q_lora_rank = dims["kv_lora_rank"], dims["q_lora_rank"]
        self.nope, self.rope_dim, self.v_dim = dims["qk_nope_head_dim"], dims["qk_rope_head_dim"], dims["v_head_dim"]
        self.scale = (self.nope + self.rope_dim) ** -0.5
        self.dropout = dropout
        qkv_bias = bias if qkv_bias is None else qkv_bias
        q_width = n_head * (self.nope + self.rope_dim)  # per head: [no-RoPE part, RoPE part]
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(n_embd, q_width, bias=qkv_bias)
        else:
            self.q_down = nn.Linear(n_embd, self.q_lora_rank, bias=qkv_bias)
            self.q_norm = nn.RMSNorm(self.q_lora_rank, eps=NORM_EPS)
            self.q_up = nn.Linear(self.q_lora_rank, q_width, bias=False)
        # W_DKV and W_KR as one matmul: [latent, shared RoPE key]
        self.kv_down = nn.Linear(n_embd, self.kv_lora_rank + self.rope_dim, bias=qkv_bias)
        self.kv_norm = nn.RMSNorm(self.kv_lora_rank, eps=NORM_EPS)
        # W_UK and W_UV, per head [keys' no-RoPE part, values]; no bias, so both absorb exactly when decoding
        self.kv_up = nn.Linear(self.kv_lora_rank, n_head * (self.nope + self.v_dim), bias=False)
        self.out_proj = nn.Linear(n_head * self.v_dim, n_embd, bias=bias)
        self.rope = RotaryEmbedding(self.rope_dim, block_size) if rope else None
        self.qk_norm = qk_norm

    def forward(self, x: torch.Tensor, state: KVCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state` ({"c_kv", "k_rope"}: (B, L, ...) buffers, see
        decoding_state), x holds the tokens at `state.positions` (T,), increasing, the last ones of the
        `state.length` filled positions. A prefill (positions 0..T-1) attends with expanded keys and values; later
        steps over the latents."""
        positions = None if state is None else state.positions
        q_nope, q_rope = self.queries(x, positions)
        c_kv, k_rope = self.latents(x, positions)
        if state is not None:
            cache, length = state, state.length
            cache["c_kv"].index_copy_(1, positions, c_kv.to(cache["c_kv"].dtype))
            cache["k_rope"].index_copy_(1, positions, k_rope.to(cache["k_rope"].dtype))
            if length != x.size(1):  # not a prefill: attend over the cached latents
                n = cache["c_kv"].size(1) if length is None else length
                c_kv, k_rope = cache["c_kv"][:, :n].to(x.dtype), cache["k_rope"][:, :n].to(x.dtype)
                # One new token at the end of the filled prefix attends to all of it: no mask to build.
                mask = None if length is not None and x.size(1) == 1 else \
                    torch.arange(n, device=x.device) <= positions[:, None]  # (T, n): up to each own position
                return self.out_proj(self.absorbed_attention(q_nope, q_rope, c_kv, k_rope, mask))
        return self.out_proj(self.expanded_attention(q_nope, q_rope, c_kv, k_rope))

    def queries(self, x: torch.Tensor, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> the queries' no-RoPE parts (B, H, T, nope) and rotated RoPE parts (B, H, T, rope)."""
        B, T, _ = x.shape
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_up(self.q_norm(self.q_down(x)))
        q = q.view(B, T, self.n_head, -1)
        if self.qk_norm:
            q = rms_per_head(q)
        q_nope, q_rope = q.transpose(1, 2).split([self.nope, self.rope_dim], dim=-1)
        return q_nope, self._rotate(q_rope, positions)

    def latents(self, x: torch.Tensor, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> what the cache keeps per token: the normalised latent c (B, T, kv_lora_rank) and the
        rotated shared key (B, T, rope)."""
        c_kv, k_rope = self.kv_down(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        return self.kv_norm(c_kv), self._rotate(k_rope[:, None], positions)[:, 0]

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        return x if self.rope is None else self.rope(x, positions)

    def expanded_attention(self, q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
                           k_rope: torch.Tensor) -> torch.Tensor:
        """Causal attention of T queries over their own T tokens, the keys and values up-projected per head:
        -> (B, T, H * v_head_dim)."""
        B, H, T, _ = q_nope.shape
        k_nope, v = self.kv_up(c_kv).view(B, T, H, -1).transpose(1, 2).split([self.nope, self.v_dim], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, nope + rope)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T, self.rope_dim)], dim=-1)
        if self.qk_norm:  # after k_rope's rotation, which keeps its norm: the same as before it
            k = rms_per_head(k)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True, scale=self.scale)  # (B, H, T, v)
        return y.transpose(1, 2).reshape(B, T, H * self.v_dim)

    def absorbed_attention(self, q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
                           k_rope: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """T queries over n cached latents c_kv (B, n, kv_lora_rank) and shared keys k_rope (B, n, rope), `mask`
        (T, n) True where a query may attend (None: everywhere): W_UK folded into the queries, W_UV applied after
        the weighted sum of latents. -> (B, T, H * v_head_dim)."""
        B, H, T, _ = q_nope.shape
        w_uk, w_uv = self.kv_up.weight.view(H, self.nope + self.v_dim, self.kv_lora_rank).split(
            [self.nope, self.v_dim], dim=1)  # (H, nope, r), (H, v, r)
        q_latent = q_nope @ w_uk  # (B, H, T, r): W_UK,h^T q^C_h
        # Every head reads the same latents and shared key: (B, H*T, r) @ (B, r, n), one matmul for all heads.
        scores = (q_latent.reshape(B, H * T, -1) @ c_kv.transpose(1, 2)
                  + q_rope.reshape(B, H * T, -1) @ k_rope.transpose(1, 2)).view(B, H, T, -1) * self.scale
        if self.qk_norm:
            scores = scores * self.key_rms(c_kv, k_rope, w_uk)[:, :, None, :]
        probs = (scores if mask is None else scores.masked_fill(~mask, float("-inf"))).softmax(-1)
        probs = F.dropout(probs, self.dropout, self.training)
        o_latent = (probs.view(B, H * T, -1) @ c_kv).view(B, H, T, -1)  # (B, H, T, r): sum_j p_j c_j
        y = o_latent @ w_uv.transpose(1, 2)  # (B, H, T, v): W_UV,h applied once, after the sum
        return y.transpose(1, 2).reshape(B, T, H * self.v_dim)

    def key_rms(self, c_kv: torch.Tensor, k_rope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
        """1 / RMS of each head's key [W_UK,h c_j; k^R_j] (B, H, n), the factor qk_norm puts on its scores: a norm
        of the keys cannot be absorbed, so each step up-projects the cached latents' no-RoPE keys (the cache is
        unchanged)."""
        k_nope = torch.einsum("bnr,hdr->bhnd", c_kv, w_uk)  # (B, H, n, nope)
        squares = k_nope.square().sum(-1) + k_rope.square().sum(-1)[:, None]  # (B, H, n)
        return torch.rsqrt(squares / (self.nope + self.rope_dim) + QK_NORM_EPS)

    # The analytic costs (the tests check them against the ones measured from the module).
    @classmethod
    def heads(cls, **args: Any) -> tuple[int, int]:
        """Every head has its own queries, keys and values (up-projected from the shared latent). Checks the sizes,
        as a config asks for its heads first."""
        mla_dims(**args)
        return args["n_head"], args["n_head"]

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        """q: d*H*(nope+rope) [+ H*(nope+rope)], or with q_lora_rank r_q: d*r_q [+ r_q] + r_q (norm) +
        r_q*H*(nope+rope); kv: d*(r + rope) [+ (r + rope)] + r (norm) + r*H*(nope + v); out: H*v*d [+ d].
        Brackets: with qkv_bias (the projections from x) or bias (the output's)."""
        d, H = args["n_embd"], args["n_head"]
        m = mla_dims(**args)
        r, rq, nope, rope, v = (m["kv_lora_rank"], m["q_lora_rank"], m["qk_nope_head_dim"], m["qk_rope_head_dim"],
                                m["v_head_dim"])
        qkv_bias = args["bias"] if args["qkv_bias"] is None else args["qkv_bias"]
        fan_in = d + (1 if qkv_bias else 0)  # a bias adds one input's worth of parameters per output
        q = H * (nope + rope)
        query = fan_in * q if rq is None else fan_in * rq + rq + rq * q
        kv = fan_in * (r + rope) + r + r * H * (nope + v)
        return query + kv + H * v * d + (d if args["bias"] else 0)

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        """The full forward's matmuls: linear 2 * (the weights above, norms and biases aside); quadratic
        2*H*T*(nope + rope) for the scores and 2*H*T*v for the weighted sum."""
        d, H = args["n_embd"], args["n_head"]
        m = mla_dims(**args)
        r, rq, nope, rope, v = (m["kv_lora_rank"], m["q_lora_rank"], m["qk_nope_head_dim"], m["qk_rope_head_dim"],
                                m["v_head_dim"])
        q = H * (nope + rope)
        weights = (d * q if rq is None else d * rq + rq * q) + d * (r + rope) + r * H * (nope + v) + H * v * d
        return FlopSplit(linear=2 * weights, quadratic=2 * H * context * (nope + rope + v))

    @classmethod
    def decoding_state(cls, **args: Any) -> KVLayout:
        """Per token: the latent and the shared RoPE key, whatever the number of heads."""
        m = mla_dims(**args)
        return KVLayout({"c_kv": (m["kv_lora_rank"],), "k_rope": (m["qk_rope_head_dim"],)})


register_attention("mla", MultiHeadLatentAttention)
