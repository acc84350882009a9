"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, arXiv 2412.06464): a linear-recurrent layer, no softmax.

Per head, a state S_t (d_k x d_v here: the paper's transposed) follows the gated delta rule
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t,
alpha_t = exp(g_t) with g_t = -exp(A_log) * softplus(W_a x_t + dt_bias) (the paper's code: Mamba-2's decay),
beta_t = sigmoid(W_b x_t). q, k and v come from one projection, each through a short causal depthwise convolution
(kernel `conv_size`) and SiLU; q and k are L2-normalised per head, q scaled by d_k^-1/2. The output of each head is
RMSNorm(o_t) * SiLU(W_g x_t) (one norm weight shared by the heads), then the output projection.

Training runs the chunk-parallel form (the paper's WY/UT representation, `chunk_size` tokens a chunk): within a
chunk a unit lower-triangular solve gives the WY factors, and the state passes from chunk to chunk, so the work is
linear in T with a term per chunk (see `flop_split`). Decoding runs the recurrent form one token at a time; its
state per sequence is S for every head and the convolution's last conv_size - 1 inputs, whatever the length.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .derive import split_sequence_flops
from .kernels import no_autocast, short_causal_conv
from .registry import FlopSplit, register_attention
from .state import RecurrentLayout, RecurrentState

NORM_EPS = 1e-5  # the paper's code's RMSNorm epsilon on the heads' outputs
L2_EPS = 1e-6  # and its L2 normalisation's of q and k


def gdn_dims(n_embd: int, n_head: int, head_k_dim: int | None = None, head_v_dim: int | None = None,
             chunk_size: int = 64, conv_size: int = 4, **_: Any) -> dict[str, int]:
    """The sizes, checked: head_k_dim and head_v_dim default to the head size n_embd / n_head."""
    for name, value in (("n_embd", n_embd), ("n_head", n_head)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if (head_k_dim is None or head_v_dim is None) and n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; gated_deltanet's default head sizes "
                         "are n_embd / n_head (or set head_k_dim and head_v_dim in --model.attention_options)")
    dims = {"head_k_dim": n_embd // n_head if head_k_dim is None else head_k_dim,
            "head_v_dim": n_embd // n_head if head_v_dim is None else head_v_dim,
            "chunk_size": chunk_size, "conv_size": conv_size}
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"attention 'gated_deltanet': {name} must be a positive integer, got {value!r}; set one "
                             "in --model.attention_options, or leave it out for its default")
    return dims


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk-parallel form. q, k (B, H, T, dk), v (B, H, T, dv), g (log alpha) and beta (B, H, T), state
    (B, H, dk, dv) before the first token -> outputs (B, H, T, dv) and the state after the last. The full chunks
    run batched, a last shorter one on its own (no padding: no work on tokens that are not there)."""
    T = q.size(2)
    full = T // chunk_size * chunk_size
    outputs = []
    for start, end, size in ((0, full, chunk_size), (full, T, T - full)):
        if end > start:
            o, state = _chunks(*(t[:, :, start:end].unflatten(2, (-1, size)) for t in (q, k, v, g, beta)), state)
            outputs.append(o.flatten(2, 3))
    return torch.cat(outputs, dim=2), state


def _chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """N chunks of c tokens: q, k (B, H, N, c, dk), v (B, H, N, c, dv), g, beta (B, H, N, c). Within a chunk, with
    gamma_i = g_1 + ... + g_i and S the state at its start:
        W = T (beta Gamma K),  U = T (beta V),  T = (I + A)^-1,  A_ij = beta_i k_i.k_j exp(gamma_i - gamma_j), i > j;
        V' = U - W S;  O = (Q Gamma) S + (Q K^T * D) V';  S <- exp(gamma_c) S + (K exp(gamma_c - gamma))^T V',
    D_ij = exp(gamma_i - gamma_j) for i >= j, else 0."""
    c = q.size(3)
    gamma = g.cumsum(-1)  # (B, H, N, c)
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # D: (..., c, c)
    k_beta = k * beta[..., None]
    # The solve reads the strict lower triangle of A alone (unit diagonal), where D is the decay from j to i.
    a = (k_beta @ k.transpose(-1, -2)) * decay
    rhs = torch.cat([k_beta * gamma.exp()[..., None], v * beta[..., None]], dim=-1)
    w, u = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True).split(
        [k.size(-1), v.size(-1)], dim=-1)
    scores = (q @ k.transpose(-1, -2)) * decay  # (B, H, N, c, c)
    q_decayed = q * gamma.exp()[..., None]
    k_decayed = (k * (gamma[..., -1:] - gamma).exp()[..., None]).transpose(-1, -2)  # (B, H, N, dk, c)
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # (B, H, N, 1, 1)
    outputs = []
    # Unbound once: indexing chunk n in the loop would cost its backward a zeroed full-size gradient per chunk.
    for u_n, w_n, q_n, scores_n, k_n, decay_n in zip(*(t.unbind(2) for t in (u, w, q_decayed, scores, k_decayed,
                                                                           chunk_decay))):
        v_new = u_n - w_n @ state  # (B, H, c, dv): the state passes from chunk to chunk
        outputs.append(q_n @ state + scores_n @ v_new)
        state = state * decay_n + k_n @ v_new
    return torch.stack(outputs, dim=2), state


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form, one token at a time; arguments and result as `chunk_gated_delta_rule`'s. Per token:
    S <- alpha S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q (the gated delta rule, rearranged)."""
    outputs = []
    for t in range(q.size(2)):
        state = state * g[:, :, t].exp()[..., None, None]
        k_t = k[:, :, t, None]  # (B, H, 1, dk)
        v_new = beta[:, :, t, None, None] * (v[:, :, t, None] - k_t @ state)  # (B, H, 1, dv)
        state = state + k_t.transpose(-1, -2) @ v_new
        outputs.append(q[:, :, t, None] @ state)
    return torch.cat(outputs, dim=2), state


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet: n_head heads of the gated delta rule with key and value sizes head_k_dim and head_v_dim
    (default n_embd / n_head), chunk-parallel in training, recurrent when decoding (see the module)."""

    # why --model.qk_norm is refused (registry)
    no_qk_norm = "already L2-normalises its queries and keys per head"

    supports_rope = False  # no attention scores to rotate: order comes from the recurrence

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        bias: bool = False,
        qkv_bias: bool | None = None,
        head_k_dim: int | None = None,
        head_v_dim: int | None = None,
        chunk_size: int = 64,
        conv_size: int = 4,
    ):
        super().__init__()
        dims = gdn_dims(n_embd, n_head, head_k_dim, head_v_dim, chunk_size, conv_size)
        self.n_head = n_head
        self.head_k_dim, self.head_v_dim = dims["head_k_dim"], dims["head_v_dim"]
        self.chunk_size, self.conv_size = chunk_size, conv_size
        qkv_bias = bias if qkv_bias is None else qkv_bias
        width = n_head * (2 * self.head_k_dim + self.head_v_dim)
        self.qkv = nn.Linear(n_embd, width, bias=qkv_bias)
        self.conv = nn.Conv1d(width, width, conv_size, groups=width, bias=False)  # depthwise, made causal in forward
        # The output gate (n_head * dv), then the decay's and beta's inputs (n_head each): one matmul.
        self.gates = nn.Linear(n_embd, n_head * (self.head_v_dim + 2), bias=False)
        # The paper's code's initialisation: A ~ U(0, 16); dt log-uniform in [1e-3, 0.1], dt_bias its inverse softplus.
        self.A_log = nn.Parameter(torch.empty(n_head).uniform_(0, 16).log())
        dt = torch.empty(n_head).uniform_(math.log(1e-3), math.log(0.1)).exp().clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.o_norm = nn.RMSNorm(self.head_v_dim, eps=NORM_EPS)
        self.out_proj = nn.Linear(n_head * self.head_v_dim, n_embd, bias=bias)

    def forward(self, x: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state` ({"S", "conv"}, see decoding_state), x holds the tokens
        that follow those the state has seen: one token runs the recurrent form, more the chunked one from S."""
        B, T, _ = x.shape
        H, dk, dv = self.n_head, self.head_k_dim, self.head_v_dim
        q, k, v = short_causal_conv(self.conv, self.qkv(x), state).split([H * dk, H * dk, H * dv], dim=-1)
        gate, a, b = self.gates(x).split([H * dv, H, H], dim=-1)
        heads = (B, T, H, -1)
        # The recurrence in float32 whatever the autocast: a state summed over the whole sequence.
        with no_autocast(x.device.type):
            q = F.normalize(q.view(heads).float(), dim=-1, eps=L2_EPS) * dk**-0.5
            k = F.normalize(k.view(heads).float(), dim=-1, eps=L2_EPS)
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # (B, T, H): log alpha
            beta = b.float().sigmoid()
            q, k, v = (t.transpose(1, 2) for t in (q, k, v.view(heads).float()))  # (B, H, T, d)
            g, beta = g.transpose(1, 2), beta.transpose(1, 2)
            s = x.new_zeros(B, H, dk, dv, dtype=torch.float32) if state is None else state["S"].float()
            if state is not None and T == 1:
                o, s = recurrent_gated_delta_rule(q, k, v, g, beta, s)
            else:
                o, s = chunk_gated_delta_rule(q, k, v, g, beta, s, self.chunk_size)
            if state is not None:
                state["S"].copy_(s)
        o = self.o_norm(o.transpose(1, 2).to(x.dtype)) * F.silu(gate.view(heads))  # (B, T, H, dv)
        return self.out_proj(o.reshape(B, T, H * dv))

    # The analytic costs (the tests check them against the ones measured from the module).
    @classmethod
    def heads(cls, **args: Any) -> tuple[int, int]:
        """Every head has its own q, k, v and state. Checks the sizes, as a config asks for its heads first."""
        gdn_dims(**args)
        return args["n_head"], args["n_head"]

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        """qkv: d*H*(2dk + dv) [+ H*(2dk + dv)]; conv: K*H*(2dk + dv); gates: d*H*(dv + 2); A_log, dt_bias: 2H;
        norm: dv; out: H*dv*d [+ d]. Brackets: with qkv_bias, bias."""
        d, H = args["n_embd"], args["n_head"]
        m = gdn_dims(**args)
        dk, dv, K = m["head_k_dim"], m["head_v_dim"], m["conv_size"]
        qkv_bias = args["bias"] if args["qkv_bias"] is None else args["qkv_bias"]
        width = H * (2 * dk + dv)
        return (d + (1 if qkv_bias else 0)) * width + K * width + d * H * (dv + 2) + 2 * H + dv \
            + H * dv * d + (d if args["bias"] else 0)

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        """Per sequence of T tokens: T * (2*d*H*(2dk + dv) + 2*d*H*(dv + 2) + 2*H*dv*d, the projections; 2*K*H*(2dk +
        dv), the convolution) plus, per head and chunk of c tokens, c^2 (4dk + 2dv) (K_beta K^T, Q K^T, the scores
        times V'), c(c - 1)(dk + dv) (the solve) and 6 c dk dv (W S, Q S, the state update). Split per token as
        `derive.meta_flops` splits a measurement: linear the work at an empty context, 2 f(1) - f(2); quadratic the
        rest, the chunk term, H (5dk + 3dv) * (sum of c^2) / T: H (5dk + 3dv) min(T, chunk_size) where T <= chunk_size
        or T is a multiple of it, so per token it stops growing at the chunk size, as a sliding window's does."""
        d, H = args["n_embd"], args["n_head"]
        m = gdn_dims(**args)
        dk, dv, K, C = m["head_k_dim"], m["head_v_dim"], m["conv_size"], m["chunk_size"]
        per_token = 2 * d * H * (2 * dk + dv) + 2 * d * H * (dv + 2) + 2 * H * dv * d + 2 * K * H * (2 * dk + dv)

        def chunk(c: int) -> int:
            return H * (c * c * (4 * dk + 2 * dv) + c * (c - 1) * (dk + dv) + 6 * c * dk * dv)

        return split_sequence_flops(lambda T: T * per_token + T // C * chunk(C) + chunk(T % C), context)

    @classmethod
    def decoding_state(cls, **args: Any) -> RecurrentLayout:
        """Per sequence, whatever its length: S, (H, dk, dv), and the convolution's last conv_size - 1 inputs."""
        H = args["n_head"]
        m = gdn_dims(**args)
        dk, dv = m["head_k_dim"], m["head_v_dim"]
        return RecurrentLayout({"S": (H, dk, dv), "conv": (H * (2 * dk + dv), m["conv_size"] - 1)})


register_attention("gated_deltanet", GatedDeltaNet, rope=False)
