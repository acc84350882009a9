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

Simulation: for a real amplitude vector psi, <psi|U^H P U|psi> = psi^T Re(U^H P U) psi,
so after building each circuit's 2^n x 2^n unitary from its angles (a few Kronecker
products, independent of the batch), every readout of every token is one quadratic
form. With psi = x / ||x|| zero-padded, that is x^T O x / x^T x for O the top-left d x d
block, so all readouts and the squared norm (O = identity) are one batched matmul
against the tokens' outer products x x^T.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .registry import FlopSplit, register_attention

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


# Single-qubit Pauli matrices indexed by the codes used in Pauli strings: 0=I, 1=X, 2=Y, 3=Z.
_PAULI = torch.tensor(
    [[[1, 0], [0, 1]], [[0, 1], [1, 0]], [[0, -1j], [1j, 0]], [[1, 0], [0, -1]]], dtype=torch.complex128
)


# Rotation R(theta) = cos(theta/2) I - i sin(theta/2) G for the generators G of the ansatz's
# three rotations RX(a), RY(b), RY(c): (3, 2, 2, 2) as [rotation, (I, -iG), row, column].
_ROTATION_BASIS = torch.stack([torch.stack([_PAULI[0], -1j * _PAULI[g]]) for g in (1, 2, 2)])


def kron_qubits(mats: torch.Tensor) -> torch.Tensor:
    """(..., n, 2, 2) one 2x2 matrix per qubit -> (..., 2^n, 2^n), qubit 0 the leftmost factor."""
    out = mats[..., 0, :, :]
    for i in range(1, mats.size(-3)):  # a loop over qubits (n <= ~6), batched over everything else
        m = mats[..., i, :, :]
        out = (out[..., :, None, :, None] * m[..., None, :, None, :]).flatten(-4, -3).flatten(-2, -1)
    return out


def pauli_matrices(strings: torch.Tensor, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    """(m, n) Pauli codes (0=I, 1=X, 2=Y, 3=Z) -> (m, 2^n, 2^n) matrices."""
    return kron_qubits(_PAULI.to(device=strings.device, dtype=dtype)[strings])


def z0_string(n: int, device: torch.device | None = None) -> torch.Tensor:
    """Z on qubit 0 as (1, n) Pauli codes."""
    codes = torch.zeros(1, n, dtype=torch.long, device=device)
    codes[0, 0] = 3
    return codes


def draw_pauli_strings(count: int, n: int, seed: int) -> torch.Tensor:
    """`count` distinct Pauli strings on n qubits, never all-identity, as (count, n) codes 0..3.

    Drawn with a CPU generator so the choice is the same on every machine.
    """
    if count > 4**n - 1:
        raise ValueError(f"cannot draw {count} distinct non-identity Pauli strings on {n} qubits (at most {4**n - 1})")
    g = torch.Generator().manual_seed(seed)
    index = torch.randperm(4**n - 1, generator=g)[:count] + 1  # 0 would be I...I
    digits = 4 ** torch.arange(n - 1, -1, -1)  # base-4 digits, qubit 0 first
    return (index[:, None] // digits) % 4  # (count, n)


def cnot_ring_permutation(n: int) -> torch.Tensor:
    """perm with (R M)[i] = M[perm[i]] for R = the CNOT ring CNOT(n-1, 0) ... CNOT(1, 2) CNOT(0, 1).

    The ring only permutes basis states, so it is applied to a unitary as a row gather.
    For n = 1 there is no ring (identity).
    """
    states = torch.arange(2**n)
    image = states.clone()  # image[x] = R|x>, as a basis index
    if n > 1:
        for control in range(n):
            target = (control + 1) % n
            c_bit = (image >> (n - 1 - control)) & 1
            image = image ^ (c_bit << (n - 1 - target))
    return torch.argsort(image)  # R|x> = |image[x]>, so row image[x] of R M is row x of M


def circuit_unitary(angles: torch.Tensor, ring: torch.Tensor | None = None) -> torch.Tensor:
    """(..., repetitions, 3, n) angles [a, b, c] -> (..., 2^n, 2^n) unitary of the ansatz (complex)."""
    n = angles.size(-1)
    ring = cnot_ring_permutation(n).to(angles.device) if ring is None else ring
    cdtype = torch.complex128 if angles.dtype == torch.float64 else torch.complex64
    half = angles / 2
    cos_sin = torch.stack([half.cos(), half.sin()], -1).to(cdtype)  # (..., R, 3, n, 2)
    gates = torch.einsum("...kqj,kjab->...kqab", cos_sin,
                         _ROTATION_BASIS.to(angles.device, cdtype))  # (..., R, 3, n, 2, 2)
    layers = kron_qubits(gates)  # (..., R, 3, D, D): the RX(a), RY(b), RY(c) layers
    # RY(c) layer after the CNOT ring, which only permutes basis states: a row gather.
    steps = layers[..., 2, :, :] @ (layers[..., 1, :, :] @ layers[..., 0, :, :])[..., ring, :]  # (..., R, D, D)
    u = steps[..., 0, :, :]
    for r in range(1, steps.size(-3)):  # repetitions
        u = steps[..., r, :, :] @ u
    return u


class _QuadraticForms(torch.autograd.Function):
    """(G, N, d) vectors x, (G, M, d, d) symmetric matrices O -> (G, N, M) forms x^T O_m x.

    One matmul of the flattened outer products x x^T against O. The backward uses the
    symmetry, grad_x = 2 (sum_m g_m O_m) x: one pass over the (G, N, d, d) products where
    autograd through the outer product makes two.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)  # (G, N, d*d)
        ctx.save_for_backward(x, obs, outer)
        return torch.bmm(outer, obs.flatten(-2).mT)  # (G, N, M)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, obs, outer = ctx.saved_tensors
        grad_x = grad_obs = None
        if ctx.needs_input_grad[0]:
            weighted = torch.bmm(grad, obs.flatten(-2)).unflatten(-1, obs.shape[-2:])  # (G, N, d, d): sum_m g_m O_m
            grad_x = (weighted @ x.unsqueeze(-1)).squeeze(-1).mul_(2)  # (G, N, d)
        if ctx.needs_input_grad[1]:
            grad_obs = torch.bmm(grad.mT, outer).view_as(obs)  # (G, M, d*d) -> (G, M, d, d)
        return grad_x, grad_obs


class _AverageAttention(torch.autograd.Function):
    """q, k (B, H, T), v (B, H, T, d), causal (T, T) bool, dropout multiplier m (B, H, T, T) or None -> (B, H, T, d):
    y_i = sum_j a_ij m_ij v_j / sum_j a_ij over j <= i, with a_ij = exp(-(q_i - k_j)^2).

    The analytic backward works in place on two (B, H, T, T) buffers where autograd through
    the elementwise chain allocates and reads one per op.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: torch.Tensor,
                drop: torch.Tensor | None) -> torch.Tensor:
        diff = q.unsqueeze(-1) - k.unsqueeze(-2)  # (B, H, T, T)
        a = diff.square().neg_().exp_().mul_(causal)  # (B, H, T, T)
        # q, k lie in [-1, 1], so a_ii >= exp(-4) > 0: no row sum vanishes.
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
        grad_v = weights.mT @ grad  # (B, H, T, d)
        # dL/da_ij = (m_ij g_i.v_j - g_i.y_i) / s_i, then da_ij/dq_i = -da_ij/dk_j = -2 (q_i - k_j) a_ij.
        grad_a = grad @ v.mT  # (B, H, T, T)
        if drop is not None:
            grad_a.mul_(drop)
        grad_a.sub_((grad * y).sum(-1, keepdim=True)).mul_(a).mul_(diff)
        return grad_a.sum(-1).mul_(-2), grad_a.sum(-2).mul_(2), grad_v, None, None


def full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on `device` (if it has autocast at all: the meta device used for FLOP counting has not)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


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
        self.resid_dropout = nn.Dropout(dropout)

    def circuit_angles(self, T: int | None = None) -> torch.Tensor:
        """(P, H, 3, repetitions, 3, n) angles; P = T positions for `qsa`, 1 for `qsa_fixed`."""
        angles = self.angles.view(self._angle_shape)
        return angles[:T] if self.per_token and T is not None else angles

    def observables(self, T: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(P, H, 2 + d, d, d) real symmetric matrices: Re(U^H O U) for O = Z_0 (query), Z_0 (key),
        P_1..P_d (value), restricted to the d unpadded amplitudes."""
        cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        d = self.head_size
        # The zero padding of the encoding never reaches columns >= d of U.
        u = circuit_unitary(self.circuit_angles(T).to(dtype), self.ring)[..., :d]  # (P, H, 3, D, d)
        u = torch.cat([u[:, :, :2], u[:, :, 2:].expand(-1, -1, d, -1, -1)], 2)  # (P, H, 2 + d, D, d)
        codes = torch.cat([z0_string(self.n_qubits, u.device).expand(2, -1), self.pauli_strings])  # (2 + d, n)
        return (u.mH @ pauli_matrices(codes, cdtype) @ u).real

    def readouts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, C) -> q (B, H, T), k (B, H, T), v (B, H, T, d), computed in float32 or float64."""
        B, T, C = x.shape
        H, d = self.n_head, self.head_size
        if self.per_token and T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size} (one circuit set per position)")
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        # Exact expectations need full precision: no autocast to bf16/fp16 in here.
        with full_precision(x.device):
            obs = self.observables(T, dtype)  # (P, H, 2 + d, d, d), P = T or 1
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(*self.readouts(x), out_dtype=x.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Scores, normalisation and output projection from the readouts:
        q, k (B, H, T), v (B, H, T, d) -> (B, T, C)."""
        B, H, T, d = v.shape
        with full_precision(v.device):
            # Built once; only `qsa_fixed` may see T > block_size, and then builds a larger one.
            causal = self.causal[:T, :T]
            if T > self.causal.size(0):
                causal = torch.ones(T, T, dtype=torch.bool, device=v.device).tril()
            if self.normalization == "average":
                # Dropout of the normalised weights = dropout of a_ij before the per-row division.
                drop = self.attn_dropout(v.new_ones(B, H, T, T)) if self.training and self.dropout > 0 else None
                y = _AverageAttention.apply(q, k, v, causal, drop)  # (B, H, T, d)
            else:
                a = torch.exp(-(q.unsqueeze(-1) - k.unsqueeze(-2)).square())  # (B, H, T, T): a_ij, pairwise
                w = (a / math.sqrt(self.head_size)).masked_fill(~causal, float("-inf")).softmax(-1)
                y = self.attn_dropout(w) @ v  # (B, H, T, d)
        y = y.transpose(1, 2).reshape(B, T, H * d).to(out_dtype or v.dtype)
        return self.resid_dropout(self.out_proj(y))


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


def _cache(n_embd: int, n_head: int, **args: Any) -> dict[str, tuple[int, ...]]:
    _heads(n_embd, n_head, **args)
    return {"k": (n_head,), "v": (n_head, n_embd // n_head)}  # one key scalar and d value readouts per head


for _name, _per_token in (("qsa", True), ("qsa_fixed", False)):
    register_attention(_name, QuantumSelfAttention, heads=_heads, params=_params, flops=_flops, cache=_cache,
                       fixed={"per_token": _per_token})
