"""Mamba-2 (Dao & Gu, arXiv 2405.21060): the state-space dual (SSD) layer, a scalar-decay linear recurrence.

Per head, a state h_t (d_state x head_dim) follows
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T,    y_t = h_t^T C_t + D x_t,
with A = -exp(A_log) and D scalars per head, dt_t = softplus(W_dt u_t + dt_bias) per head, and B_t, C_t
(d_state each) shared by the heads of a group (`ngroups`). One projection of the input u gives (z, x, B, C, dt);
x, B and C go through a short causal depthwise convolution (kernel `conv_size`, with bias) and SiLU. The output is
RMSNorm(y * SiLU(z)) per group (the reference code's gated norm, gate before norm), then the output projection.

The n_head heads each have head_dim = expand * n_embd / n_head channels (or `head_dim` when set: then the inner
width is n_head * head_dim). Training runs the chunked form (`chunk_size` tokens a chunk: within a chunk the
quadratic, attention-like form, between chunks the state), so the work is linear in T with a term per chunk (see
`flop_split`). Decoding runs the recurrent form one token at a time; its state per sequence is h for every head and
the convolution's last conv_size - 1 inputs, whatever the length.
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

NORM_EPS = 1e-5  # the reference code's epsilon of the gated RMSNorm
MAX_DEFAULT_D_STATE = 64  # the reference's Mamba2Simple default


def mamba2_dims(n_embd: int, n_head: int, d_state: int | None = None, expand: int = 2, head_dim: int | None = None,
                ngroups: int = 1, chunk_size: int = 64, conv_size: int = 4, **_: Any) -> dict[str, int]:
    """The sizes, checked: head_dim defaults to expand * n_embd / n_head; d_state to min(64, n_embd), since B_t and
    C_t are projected from the n_embd-wide input (a wider state would add values, not directions)."""
    for name, value in (("n_embd", n_embd), ("n_head", n_head)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    options = {"expand": expand, "ngroups": ngroups, "chunk_size": chunk_size, "conv_size": conv_size,
               "d_state": min(MAX_DEFAULT_D_STATE, n_embd) if d_state is None else d_state,
               "head_dim": 1 if head_dim is None else head_dim}
    for name, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"attention 'mamba2': {name} must be a positive integer, got {value!r}; set one in "
                             "--model.attention_options, or leave it out for its default")
    if head_dim is None:
        if expand * n_embd % n_head:
            raise ValueError(f"attention 'mamba2': expand * n_embd = {expand * n_embd} is not divisible by n_head="
                             f"{n_head}; change n_head or expand, or set head_dim in --model.attention_options")
        options["head_dim"] = expand * n_embd // n_head
    if n_head % ngroups:
        raise ValueError(f"attention 'mamba2': n_head={n_head} is not divisible by ngroups={ngroups}; the heads of "
                         "a group share B and C: use a divisor of n_head")
    return options


class Mamba2(nn.Module):
    """Mamba-2's SSD layer: n_head heads of head_dim channels, each a d_state x head_dim state with a scalar decay,
    chunked in training, recurrent when decoding (see the module)."""

    # why --model.qk_norm is refused (registry)
    no_qk_norm = "has no queries and keys to normalise (its C and B are a state-space model's maps)"

    supports_rope = False  # no attention scores to rotate: order comes from the recurrence

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        bias: bool = False,
        qkv_bias: bool | None = None,
        d_state: int | None = None,
        expand: int = 2,
        head_dim: int | None = None,
        ngroups: int = 1,
        chunk_size: int = 64,
        conv_size: int = 4,
    ):
        super().__init__()
        dims = mamba2_dims(n_embd, n_head, d_state, expand, head_dim, ngroups, chunk_size, conv_size)
        self.n_head, self.head_dim, self.d_state, self.ngroups = n_head, dims["head_dim"], dims["d_state"], ngroups
        self.chunk_size, self.conv_size = chunk_size, conv_size
        self.d_inner = n_head * self.head_dim
        conv_dim = self.d_inner + 2 * ngroups * self.d_state  # x, B, C
        in_proj_bias = bias if qkv_bias is None else qkv_bias
        self.in_proj = nn.Linear(n_embd, self.d_inner + conv_dim + n_head, bias=in_proj_bias)  # z, (x, B, C), dt
        self.conv = nn.Conv1d(conv_dim, conv_dim, conv_size, groups=conv_dim)  # depthwise, made causal in forward
        # The reference code's initialisation: A ~ U(1, 16); dt log-uniform in [1e-3, 0.1], dt_bias its inverse
        # softplus; D = 1.
        self.A_log = nn.Parameter(torch.empty(n_head).uniform_(1, 16).log())
        dt = torch.empty(n_head).uniform_(math.log(1e-3), math.log(0.1)).exp().clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.D = nn.Parameter(torch.ones(n_head))
        self.norm_weight = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, n_embd, bias=bias)

    def forward(self, x: torch.Tensor, state: RecurrentState | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); with a decoding `state` ({"h", "conv"}, see decoding_state), x holds the tokens
        that follow those the state has seen: one token runs the recurrent form, more the chunked one from h."""
        Bsz, T, _ = x.shape
        H, P, G, N = self.n_head, self.head_dim, self.ngroups, self.d_state
        z, xbc, dt = self.in_proj(x).split([self.d_inner, self.d_inner + 2 * G * N, H], dim=-1)
        xs, b, c = short_causal_conv(self.conv, xbc, state).split([self.d_inner, G * N, G * N], dim=-1)
        # The recurrence and the norm in float32 whatever the autocast: a state summed over the whole sequence.
        with no_autocast(x.device.type):
            xs = xs.float().view(Bsz, T, H, P).transpose(1, 2)  # (B, H, T, P)
            b, c = (t.float().view(Bsz, T, G, N).transpose(1, 2) for t in (b, c))  # (B, G, T, N)
            dt = F.softplus(dt.float() + self.dt_bias.float()).transpose(1, 2)  # (B, H, T)
            A = -self.A_log.float().exp()
            h = x.new_zeros(Bsz, H, N, P, dtype=torch.float32) if state is None else state["h"].float()
            if state is not None and T == 1:
                y, h = recurrent_ssd(xs, dt, A, b, c, h)
            else:
                y, h = chunk_ssd(xs, dt, A, b, c, h, self.chunk_size)
            if state is not None:
                state["h"].copy_(h)
            y = (y + xs * self.D.float()[:, None, None]).transpose(1, 2)  # (B, T, H, P)
            y = y.reshape(Bsz, T, G, -1) * F.silu(z.float().view(Bsz, T, G, -1))  # gate, then norm per group
            y = F.rms_norm(y, (y.size(-1),), eps=NORM_EPS).reshape(Bsz, T, -1) * self.norm_weight.float()
        return self.out_proj(y.to(x.dtype))

    # The analytic costs (the tests check them against the ones measured from the module).
    @classmethod
    def heads(cls, **args: Any) -> tuple[int, int]:
        """Every head has its own x, dt, decay and state (B and C are shared within a group). Checks the sizes, as
        a config asks for its heads first."""
        mamba2_dims(**args)
        return args["n_head"], args["n_head"]

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        """in_proj: d*(2E + 2GN + H) [+ 2E + 2GN + H], E = H*head_dim; conv: (K + 1)*(E + 2GN), with its bias;
        A_log, dt_bias, D: 3H; norm: E; out_proj: E*d [+ d]. Brackets: with qkv_bias, bias."""
        d, H = args["n_embd"], args["n_head"]
        m = mamba2_dims(**args)
        E, GN, K = H * m["head_dim"], m["ngroups"] * m["d_state"], m["conv_size"]
        in_proj_bias = args["bias"] if args["qkv_bias"] is None else args["qkv_bias"]
        width = 2 * E + 2 * GN + H
        return (d + (1 if in_proj_bias else 0)) * width + (K + 1) * (E + 2 * GN) + 3 * H + E + E * d \
            + (d if args["bias"] else 0)

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        """Per sequence of T tokens: T * (2*d*(2E + 2GN + H) + 2*E*d, the projections; 2*K*(E + 2GN), the
        convolution) plus, per chunk of c tokens, 2 c^2 N per group (C B^T) and, per head, 2 c^2 P (the scores
        times dt x) and 4 c N P (C h, the state update). Split per token as `derive.meta_flops` splits a
        measurement: linear the work at an empty context, 2 f(1) - f(2); quadratic the rest, the chunk term,
        (2GN + 2HP) * (sum of c^2) / T: (2GN + 2HP) min(T, chunk_size) where T <= chunk_size or T is a multiple of
        it, so per token it stops growing at the chunk size, as a sliding window's does."""
        d, H = args["n_embd"], args["n_head"]
        m = mamba2_dims(**args)
        P, N, G, K, C = m["head_dim"], m["d_state"], m["ngroups"], m["conv_size"], m["chunk_size"]
        E = H * P
        per_token = 2 * d * (2 * E + 2 * G * N + H) + 2 * E * d + 2 * K * (E + 2 * G * N)

        def chunk(c: int) -> int:
            return 2 * c * c * G * N + H * (2 * c * c * P + 4 * c * N * P)

        return split_sequence_flops(lambda T: T * per_token + T // C * chunk(C) + chunk(T % C), context)

    @classmethod
    def decoding_state(cls, **args: Any) -> RecurrentLayout:
        """Per sequence, whatever its length: h, (H, d_state, head_dim), and the convolution's last conv_size - 1
        inputs of x, B and C."""
        H = args["n_head"]
        m = mamba2_dims(**args)
        conv_dim = H * m["head_dim"] + 2 * m["ngroups"] * m["d_state"]
        return RecurrentLayout({"h": (H, m["d_state"], m["head_dim"]), "conv": (conv_dim, m["conv_size"] - 1)})


def chunk_ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
              state: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form. x (B, H, T, P), dt (B, H, T), A (H,) (negative), b and c (B, G, T, N), state (B, H, N, P)
    before the first token -> y = h^T C per token (B, H, T, P) and the state after the last. The full chunks run
    batched, a last shorter one on its own (no padding: no work on tokens that are not there)."""
    T = x.size(2)
    full = T // chunk_size * chunk_size
    outputs = []
    for start, end, size in ((0, full, chunk_size), (full, T, T - full)):
        if end > start:
            y, state = _chunks(*(t[:, :, start:end].unflatten(2, (-1, size)) for t in (x, dt, b, c)), A, state)
            outputs.append(y.flatten(2, 3))
    return torch.cat(outputs, dim=2), state


def _chunks(x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, A: torch.Tensor,
            state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """N chunks of L tokens: x (B, H, N, L, P), dt (B, H, N, L), b, c (B, G, N, L, d_state). Within a chunk, with
    gamma_i = A (dt_1 + ... + dt_i) and h the state at its start:
        Y = (C B^T * D)(dt X) + (C exp(gamma)) h;  h <- exp(gamma_L) h + (B exp(gamma_L - gamma))^T (dt X),
    D_ij = exp(gamma_i - gamma_j) for i >= j, else 0 (the heads of a group share C B^T)."""
    Bsz, H, n, L, _ = x.shape
    G = b.size(1)
    gamma = (dt * A[:, None, None]).cumsum(-1)  # (B, H, N, L), <= 0
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # D: (..., L, L)
    xdt = x * dt[..., None]

    def per_head(t: torch.Tensor) -> torch.Tensor:  # (B, G, N, ...) -> (B, G, 1, N, ...): broadcast to its heads
        return t[:, :, None]

    def heads_of(t: torch.Tensor) -> torch.Tensor:  # (B, H, N, ...) -> (B, G, H/G, N, ...)
        return t.unflatten(1, (G, -1))

    scores = (per_head(c @ b.transpose(-1, -2)) * heads_of(decay)).flatten(1, 2)  # (B, H, N, L, L)
    within = scores @ xdt  # (B, H, N, L, P)
    c_decayed = (per_head(c) * heads_of(gamma.exp()[..., None])).flatten(1, 2)  # (B, H, N, L, d_state)
    b_decayed = (per_head(b) * heads_of((gamma[..., -1:] - gamma).exp()[..., None])).flatten(1, 2).transpose(-1, -2)
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # (B, H, N, 1, 1)
    outputs = []
    # Unbound once: indexing chunk n in the loop would cost its backward a zeroed full-size gradient per chunk.
    for within_n, c_n, b_n, xdt_n, decay_n in zip(*(t.unbind(2) for t in (within, c_decayed, b_decayed, xdt,
                                                                          chunk_decay))):
        outputs.append(within_n + c_n @ state)  # the state passes from chunk to chunk
        state = state * decay_n + b_n @ xdt_n
    return torch.stack(outputs, dim=2), state


def recurrent_ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                  state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form, one token at a time; arguments and result as `chunk_ssd`'s. Per token:
    h <- exp(dt A) h + B (dt x)^T;  y = h^T C."""
    G = b.size(1)
    outputs = []
    for t in range(x.size(2)):
        b_t, c_t = (u[:, :, t, None].repeat_interleave(state.size(1) // G, dim=1) for u in (b, c))  # (B, H, 1, N)
        dt_t = dt[:, :, t, None, None]
        state = state * (dt_t * A[:, None, None]).exp() + b_t.transpose(-1, -2) @ (dt_t * x[:, :, t, None])
        outputs.append(c_t @ state)
    return torch.cat(outputs, dim=2), state


register_attention("mamba2", Mamba2, rope=False)
