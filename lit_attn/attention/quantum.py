"""Quantum self-attention (QSA), simulated exactly with torch tensor ops.

Per head, with d = head size and n = ceil(log2 d) qubits (qubit 0 is the most
significant bit of a basis-state index, as in PennyLane):

- encoding: psi = x / ||x||, zero-padded to 2^n amplitudes (real);
- each of the three circuits (query, key, value) is `repetitions` times
  [RX(a_i) RY(b_i) on every qubit i, CNOT ring i -> i+1 mod n (none for n = 1),
  RY(c_i) on every qubit]: 3n angles per repetition;
- q_i, k_j: <Z> on qubit 0 after the query / key circuit (one scalar per token);
- v_j: <P_m> after the value circuit for d fixed Pauli strings P_1..P_d, drawn once
  from `pauli_seed` (distinct, never the all-identity string);
- scores a_ij = exp(-(q_i - k_j)^2) for j <= i only;
- "average": out_i = sum_j a_ij v_j / sum_j a_ij;  "softmax": softmax_j(a_ij / sqrt(d)) v_j;
- heads are concatenated and go through the output projection `out_proj`.

`qsa` gives every context position t its own three circuits (the original
formulation; the token at position t uses circuits t), `qsa_fixed` shares one
triple between all positions. With n_head > 1 the channels are split into
heads as usual and every head has its own circuits.

Simulation: see `quantum_sim` (every readout is one quadratic form x^T O x / x^T x).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .kernels import no_autocast
from .quantum_sim import (
    _QuadraticForms,
    circuit_unitary,
    cnot_ring_permutation,
    draw_pauli_strings,
    pauli_matrices,
    z0_string,
)
from .registry import FlopSplit, register_attention
from .state import KVCache, KVLayout

NORMALIZATIONS = ("average", "softmax")
N_CIRCUITS = 3  # query, key, value
N_ROTATIONS = 3  # RX(a), RY(b) before the CNOT ring, RY(c) after it


def n_qubits(head_size: int) -> int:
    """Qubits for amplitude-encoding a head_size-vector: ceil(log2 head_size)."""
    if head_size < 2:
        raise ValueError(f"quantum self-attention needs a head size of at least 2 channels, got {head_size}")
    return math.ceil(math.log2(head_size))


def circuit_param_count(
    n_embd: int, n_head: int = 1, block_size: int = 1, per_token: bool = True, repetitions: int = 1
) -> int:
    """Circuit angles of one QSA layer: 9n per head (x block_size if per_token) x repetitions.

    n = ceil(log2(n_embd / n_head)). Single head: 9n (`qsa_fixed`), 9n * block_size (`qsa`);
    3n of them per circuit.
    """
    per_circuit = N_ROTATIONS * n_qubits(n_embd // n_head) * repetitions
    return N_CIRCUITS * per_circuit * n_head * (block_size if per_token else 1)


def attention_param_count(
    n_embd: int, n_head: int = 1, block_size: int = 1, per_token: bool = True, repetitions: int = 1, bias: bool = True
) -> int:
    """All parameters of one QSA layer: the circuit angles plus the n_embd -> n_embd output projection."""
    out_proj = n_embd * n_embd + (n_embd if bias else 0)
    return circuit_param_count(n_embd, n_head, block_size, per_token, repetitions) + out_proj


class _AverageAttention(torch.autograd.Function):
    """q (B, H, T), k (B, H, L), v (B, H, L, d), allowed (T, L) bool, dropout multiplier m (B, H, T, L) or None
    -> (B, H, T, d): y_i = sum_j a_ij m_ij v_j / sum_j a_ij over the allowed j, with a_ij = exp(-(q_i - k_j)^2).

    The analytic backward works in place on two (B, H, T, L) buffers where autograd through
    the elementwise chain allocates and reads one per op.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                drop: torch.Tensor | None) -> torch.Tensor:
        diff = q.unsqueeze(-1) - k.unsqueeze(-2)  # (B, H, T, L)
        a = diff.square().neg_().exp_().mul_(allowed)  # (B, H, T, L)
        # q, k lie in [-1, 1] and every row allows its own position, so a row sum is >= exp(-4) > 0.
        s = a.sum(-1, keepdim=True)  # (B, H, T, 1)
        weights = a if drop is None else a * drop
        y = (weights @ v) / s  # (B, H, T, d)
        ctx.save_for_backward(diff, a, weights, s, v, y, drop)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        diff, a, weights, s, v, y, drop = ctx.saved_tensors
        grad = grad / s  # (B, H, T, d)
        grad_v = weights.mT @ grad  # (B, H, L, d)
        # dL/da_ij = (m_ij g_i.v_j - g_i.y_i) / s_i, then da_ij/dq_i = -da_ij/dk_j = -2 (q_i - k_j) a_ij.
        grad_a = grad @ v.mT  # (B, H, T, L)
        if drop is not None:
            grad_a.mul_(drop)
        grad_a.sub_((grad * y).sum(-1, keepdim=True)).mul_(a).mul_(diff)
        return grad_a.sum(-1).mul_(-2), grad_a.sum(-2).mul_(2), grad_v, None, None


class QuantumSelfAttention(nn.Module):
    """Quantum self-attention with per-token (`qsa`) or shared (`qsa_fixed`) circuits.

    Args (besides the common ones; rope, qkv_bias are ignored: q and k are scalars
    from circuits, and there are no q/k/v projections):
        per_token: one circuit triple per context position (`qsa`) or one for all (`qsa_fixed`).
        normalization: "average" (the paper's: sum_j a_ij v_j / sum_j a_ij) or "softmax".
        repetitions: how many times the RX RY / CNOT ring / RY ansatz is stacked per circuit.
        pauli_seed: seed that picks the value circuit's d Pauli strings (the same in every layer).

    Attributes read by callbacks: `n_circuit_params` (the trained circuit angles, i.e. the
    quantum parameters; see `circuit_param_count`), `n_qubits`, `head_size`, `per_token`.
    """

    # why --model.qk_norm is refused (registry)
    no_qk_norm = "has no query and key vectors to normalise (its q and k are one circuit readout each)"

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
        per_token: bool = True,
        normalization: str = "average",
        repetitions: int = 1,
        pauli_seed: int = 0,
    ):
        super().__init__()
        _heads(n_embd, n_head, n_query_heads, n_kv_heads, block_size, per_token, normalization, repetitions)
        self.n_head = n_head
        self.head_size = n_embd // n_head
        self.n_qubits = n_qubits(self.head_size)
        self.per_token = per_token
        self.block_size = block_size
        self.normalization = normalization
        self.repetitions = repetitions
        self.dropout = dropout

        # Angles of every circuit: (positions, heads, circuit q/k/v, repetition, rotation a/b/c, qubit).
        # Stored flat (1-D) on purpose: the model's AdamW decays tensors with dim >= 2, and
        # rotation angles are periodic, so pulling them towards 0 would be meaningless.
        self._angle_shape = (block_size if per_token else 1, n_head, N_CIRCUITS, repetitions, N_ROTATIONS,
                             self.n_qubits)
        self.angles = nn.Parameter(torch.empty(math.prod(self._angle_shape)).uniform_(0.0, 2 * math.pi))
        self.n_circuit_params = self.angles.numel()
        assert self.n_circuit_params == circuit_param_count(n_embd, n_head, block_size, per_token, repetitions)

        # The Pauli strings are part of the function, so they live in the state_dict: a
        # checkpoint reloads to the same readouts whatever pauli_seed the new module got.
        self.register_buffer("pauli_strings", draw_pauli_strings(self.head_size, self.n_qubits, pauli_seed))
        self.register_buffer("ring", cnot_ring_permutation(self.n_qubits), persistent=False)
        self.register_buffer("causal", torch.ones(block_size, block_size, dtype=torch.bool).tril(), persistent=False)

        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)

    def circuit_angles(self, positions: int | torch.Tensor | None = None) -> torch.Tensor:
        """(P, H, 3, repetitions, 3, n) angles of the circuits at `positions`: all (None), the first T (an
        int T) or those of a LongTensor (P,). `qsa_fixed` has one set for every position: P = 1."""
        angles = self.angles.view(self._angle_shape)
        if not self.per_token or positions is None:
            return angles
        return angles[:positions] if isinstance(positions, int) else angles[positions]

    def observables(self, positions: int | torch.Tensor | None = None,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(P, H, 2 + d, d, d) real symmetric matrices: Re(U^H O U) for O = Z_0 (query), Z_0 (key),
        P_1..P_d (value), restricted to the d unpadded amplitudes; `positions` as in `circuit_angles`."""
        cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        d = self.head_size
        # The zero padding of the encoding never reaches columns >= d of U.
        u = circuit_unitary(self.circuit_angles(positions).to(dtype), self.ring)[..., :d]  # (P, H, 3, D, d)
        u = torch.cat([u[:, :, :2], u[:, :, 2:].expand(-1, -1, d, -1, -1)], 2)  # (P, H, 2 + d, D, d)
        codes = torch.cat([z0_string(self.n_qubits, u.device).expand(2, -1), self.pauli_strings])  # (2 + d, n)
        return (u.mH @ pauli_matrices(codes, cdtype) @ u).real

    def readouts(self, x: torch.Tensor, positions: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, C) tokens at `positions` (T,) (default 0..T-1) -> q (B, H, T), k (B, H, T), v (B, H, T, d),
        computed in float32 or float64."""
        B, T, C = x.shape
        H, d = self.n_head, self.head_size
        if self.per_token and T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size} (one circuit set per position)")
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        # Exact expectations need full precision: no autocast to bf16/fp16 in here.
        with no_autocast(x.device.type):
            obs = self.observables(T if positions is None else positions, dtype)  # (P, H, 2 + d, d, d), P = T or 1
            eye = torch.eye(d, dtype=dtype, device=x.device).expand(*obs.shape[:2], 1, d, d)
            obs = torch.cat([obs, eye], 2).flatten(0, 1)  # (P * H, 3 + d, d, d): the identity gives x^T x
            tokens = x.to(dtype).view(B, T, H, d).permute(1, 2, 0, 3)  # (T, H, B, d)
            # One matrix per circuit set: positions x heads (`qsa`) or heads, shared by all positions.
            tokens = tokens.reshape(T * H, B, d) if self.per_token else tokens.transpose(0, 1).reshape(H, T * B, d)
            r = _QuadraticForms.apply(tokens, obs)  # (P * H, N, 3 + d), N = B or T * B
            # psi = x / ||x||; the clamp (F.normalize's eps 1e-12, squared) keeps a zero token's readouts at 0, not NaN.
            r = r[..., :-1] / r[..., -1:].clamp_min(1e-24)  # (P * H, N, 2 + d)
            r = r.view(T, H, B, 2 + d) if self.per_token else r.view(H, T, B, 2 + d).transpose(0, 1)
            # Contiguous: attend's batched matmuls fall back to a loop over the batch on this strided view.
            r = r.permute(2, 1, 0, 3).contiguous()  # (B, H, T, 2 + d)
        return r[..., 0], r[..., 1], r[..., 2:]

    def forward(self, x: torch.Tensor, state: KVCache | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C).

        With a decoding `state` ({"k": (B, L, H), "v": (B, L, H, d)} buffers) x holds the tokens at
        `state.positions` (T,), increasing: their key and value readouts are stored there and each token attends
        over the filled prefix 0..state.length-1 of the cache up to its own position (a prefill attends over its
        own readouts).
        """
        if state is None:
            return self.attend(*self.readouts(x), out_dtype=x.dtype)
        ck, cv, positions = state["k"], state["v"], state.positions  # (B, L, H), (B, L, H, d), (T,)
        if self.per_token and ck.size(1) > self.block_size:
            raise ValueError(f"a cache of {ck.size(1)} positions exceeds block_size {self.block_size} "
                             "(one circuit set per position)")
        q, k, v = self.readouts(x, positions)  # (B, H, T), (B, H, T), (B, H, T, d)
        ck.index_copy_(1, positions, k.transpose(1, 2).to(ck.dtype))
        cv.index_copy_(1, positions, v.transpose(1, 2).to(cv.dtype))
        T, length = x.size(1), state.length
        if length == T:  # a prefill: its own readouts are all there is
            return self.attend(q, k, v, out_dtype=x.dtype)
        n = ck.size(1) if length is None else length
        # Each token ends the filled prefix up to it, so `attend`'s default mask is right unless torch.compile
        # traces the whole buffer (length None).
        allowed = torch.arange(n, device=x.device) <= positions[:, None] if length is None else None  # (T, n)
        k = ck[:, :n].transpose(1, 2).to(q.dtype)  # (B, H, n)
        v = cv[:, :n].transpose(1, 2).to(q.dtype).contiguous()  # (B, H, n, d); contiguous: see `readouts`
        return self.attend(q, k, v, out_dtype=x.dtype, allowed=allowed)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None = None,
               allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Scores, normalisation and output projection from the readouts: q (B, H, T), k (B, H, L),
        v (B, H, L, d), allowed (T, L) bool (default causal, the T queries being the last T of the L
        positions) -> (B, T, C)."""
        B, H, T = q.shape
        L, d = v.shape[-2:]
        with no_autocast(v.device.type):
            if allowed is None:
                # Built once; only `qsa_fixed` may see L > block_size, and then builds a larger one.
                allowed = self.causal[L - T : L, :L]
                if L > self.causal.size(0):
                    allowed = torch.ones(L, L, dtype=torch.bool, device=v.device).tril()[L - T :]
            if self.normalization == "average":
                # Dropout of the normalised weights = dropout of a_ij before the per-row division.
                drop = self.attn_dropout(v.new_ones(B, H, T, L)) if self.training and self.dropout > 0 else None
                y = _AverageAttention.apply(q, k, v, allowed, drop)  # (B, H, T, d)
            else:
                a = torch.exp(-(q.unsqueeze(-1) - k.unsqueeze(-2)).square())  # (B, H, T, L): a_ij, pairwise
                w = (a / math.sqrt(self.head_size)).masked_fill(~allowed, float("-inf")).softmax(-1)
                y = self.attn_dropout(w) @ v  # (B, H, T, d)
        y = y.transpose(1, 2).reshape(B, T, H * d).to(out_dtype or v.dtype)
        return self.out_proj(y)  # the block drops the output (the residual dropout)

    # The analytic costs (the tests check them against the ones measured from the module).
    @classmethod
    def heads(cls, **args: Any) -> tuple[int, int]:
        return _heads(**args)

    @classmethod
    def parameter_count(cls, **args: Any) -> int:
        return _params(**args)

    @classmethod
    def flop_split(cls, context: int, **args: Any) -> FlopSplit:
        return _flops(context, **args)

    @classmethod
    def decoding_state(cls, **args: Any) -> KVLayout:
        return _cache(**args)


def _heads(n_embd: int, n_head: int, n_query_heads: int | None, n_kv_heads: int | None, block_size: int,
           per_token: bool, normalization: str = "average", repetitions: int = 1, **_: Any) -> tuple[int, int]:
    """(H, H) after checking every setting (ValueError with the fix)."""
    name = "qsa" if per_token else "qsa_fixed"
    for arg, value in (("n_embd", n_embd), ("n_head", n_head), ("block_size", block_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; the head size must be n_embd / n_head")
    for arg, value in (("n_query_heads", n_query_heads), ("n_kv_heads", n_kv_heads)):
        if value is not None and value != n_head:
            raise ValueError(
                f"attention {name!r} has one query, key and value circuit set per head, so {arg} must equal "
                f"n_head={n_head} (got {value}); drop {arg}"
            )
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r} for attention {name!r}; choose average or softmax")
    if not isinstance(repetitions, int) or isinstance(repetitions, bool) or repetitions < 1:
        raise ValueError(f"repetitions must be a positive integer, got {repetitions!r}")
    if n_embd // n_head < 2:
        raise ValueError(
            f"attention {name!r} needs at least 2 channels per head (n_embd / n_head = {n_embd}/{n_head} "
            f"= {n_embd // n_head}); use fewer heads"
        )
    return n_head, n_head


def _params(n_embd: int, n_head: int, block_size: int, per_token: bool, bias: bool, repetitions: int = 1,
            **args: Any) -> int:
    _heads(n_embd, n_head, block_size=block_size, per_token=per_token, repetitions=repetitions, **args)
    return attention_param_count(n_embd, n_head, block_size, per_token, repetitions, bias)


def _flops(context: int, n_embd: int, n_head: int, **args: Any) -> FlopSplit:
    """Per token: the 3 + d quadratic-form readouts x^T O x of every head (2*d^2*(3 + d)), the output
    projection (2*C^2), and the weighted sum of values (2*C*T). Building the circuits' observables is
    per batch, not per token, and is left out."""
    _heads(n_embd, n_head, **args)
    d = n_embd // n_head
    return FlopSplit(linear=n_head * 2 * d * d * (3 + d) + 2 * n_embd * n_embd, quadratic=2 * n_embd * context)


def _cache(n_embd: int, n_head: int, **args: Any) -> KVLayout:
    _heads(n_embd, n_head, **args)
    return KVLayout({"k": (n_head,), "v": (n_head, n_embd // n_head)})  # one key scalar and d value readouts per head


for _name, _per_token in (("qsa", True), ("qsa_fixed", False)):
    # q and k are scalars read from circuits: there is nothing for rotary embeddings to rotate.
    register_attention(_name, QuantumSelfAttention, rope=False, fixed={"per_token": _per_token})
