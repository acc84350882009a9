"""Quantum self-attention (QSA, seed 000), simulated exactly with torch tensor ops.

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

`qsa` gives every context position t its own three circuits (the seed's
"original"; the token at position t uses circuits t), `qsa_fixed` shares one
triple between all positions. With n_head > 1 the channels are split into
heads as usual and every head has its own circuits.

Simulation: for a real amplitude vector psi, <psi|U^H P U|psi> = psi^T Re(U^H P U) psi,
so after building each circuit's 2^n x 2^n unitary from its angles (a few Kronecker
products, independent of the batch), every readout of every token is one quadratic
form, all evaluated by a single einsum.
"""

from __future__ import annotations

import contextlib
import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .registry import register_attention

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

    n = ceil(log2(n_embd / n_head)). Single head: 9n (`qsa_fixed`), 9n * block_size (`qsa`).
    Seed 000's table writes 3n per circuit, i.e. one of the three circuits.
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


def kron_qubits(mats: torch.Tensor) -> torch.Tensor:
    """(..., n, 2, 2) one 2x2 matrix per qubit -> (..., 2^n, 2^n), qubit 0 the leftmost factor."""
    out = mats[..., 0, :, :]
    for i in range(1, mats.size(-3)):  # a loop over qubits (n <= ~6), batched over everything else
        m = mats[..., i, :, :]
        out = torch.einsum("...ij,...kl->...ikjl", out, m).flatten(-4, -3).flatten(-2, -1)
    return out


def pauli_matrices(strings: torch.Tensor, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    """(m, n) Pauli codes (0=I, 1=X, 2=Y, 3=Z) -> (m, 2^n, 2^n) matrices."""
    return kron_qubits(_PAULI.to(device=strings.device, dtype=dtype)[strings])


def z0_observable(n: int, dtype: torch.dtype = torch.complex64, device: torch.device | None = None) -> torch.Tensor:
    """Z on qubit 0 as a (2^n, 2^n) matrix."""
    codes = torch.zeros(1, n, dtype=torch.long, device=device)
    codes[0, 0] = 3
    return pauli_matrices(codes, dtype)[0]


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


def rotation_layer(rx: torch.Tensor | None, ry: torch.Tensor) -> torch.Tensor:
    """RY(ry_i) RX(rx_i) on every qubit (RX first; none if rx is None): (..., n) angles -> (..., 2^n, 2^n)."""
    c, s = torch.cos(ry / 2), torch.sin(ry / 2)
    gate = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # (..., n, 2, 2) RY, real
    if rx is not None:
        cx, sx = torch.cos(rx / 2), torch.sin(rx / 2)
        # RY(b) RX(a) = [[cb ca + i sb sa, -sb ca - i cb sa], [sb ca - i cb sa, cb ca - i sb sa]] (c/s of half angles)
        re = torch.stack([torch.stack([c * cx, -s * cx], -1), torch.stack([s * cx, c * cx], -1)], -2)
        im = torch.stack([torch.stack([s * sx, -c * sx], -1), torch.stack([-c * sx, -s * sx], -1)], -2)
        gate = torch.complex(re, im)
    else:
        gate = torch.complex(gate, torch.zeros_like(gate))
    return kron_qubits(gate)


def circuit_unitary(angles: torch.Tensor, ring: torch.Tensor | None = None) -> torch.Tensor:
    """(..., repetitions, 3, n) angles [a, b, c] -> (..., 2^n, 2^n) unitary of the ansatz (complex)."""
    n = angles.size(-1)
    ring = cnot_ring_permutation(n).to(angles.device) if ring is None else ring
    u = None
    for r in range(angles.size(-3)):  # repetitions
        a, b, c = angles[..., r, 0, :], angles[..., r, 1, :], angles[..., r, 2, :]
        layer = rotation_layer(a, b)[..., ring, :]  # CNOT ring after the RX RY layer: a row permutation
        layer = rotation_layer(None, c) @ layer
        u = layer if u is None else layer @ u
    return u


def readout_observables(unitaries: torch.Tensor, observables: torch.Tensor) -> torch.Tensor:
    """Re(U^H P U) for every circuit U (..., D, D) and observable P (m, D, D) -> (..., m, D, D), real.

    For a real state psi, <psi|U^H P U|psi> = psi^T Re(U^H P U) psi, since the imaginary
    part of a Hermitian matrix is antisymmetric.
    """
    u = unitaries.unsqueeze(-3)  # (..., 1, D, D)
    return (u.mH @ observables @ u).real


def full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on `device` (if it has autocast at all: the meta device used for FLOP counting has not)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def amplitude_encode(x: torch.Tensor, n: int) -> torch.Tensor:
    """(..., d) -> (..., 2^n) real amplitudes: x / ||x||, zero-padded."""
    x = F.normalize(x, dim=-1, eps=1e-12)  # eps: a zero vector stays zero instead of NaN
    return F.pad(x, (0, 2**n - x.size(-1)))


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
        self.n_head = n_head
        self.head_size = n_embd // n_head
        if self.head_size < 2:
            raise ValueError(
                f"attention {name!r} needs at least 2 channels per head (n_embd / n_head = {n_embd}/{n_head} "
                f"= {self.head_size}); use fewer heads"
            )
        self.n_qubits = n_qubits(self.head_size)
        self.per_token = per_token
        self.block_size = block_size
        self.normalization = normalization
        self.repetitions = repetitions
        self.dropout = dropout

        # Angles of every circuit: (positions, heads, circuit q/k/v, repetition, rotation a/b/c, qubit).
        # Stored flat (1-D) on purpose: the model's AdamW decays tensors with dim >= 2, and
        # rotation angles are periodic, so pulling them towards 0 would be meaningless.
        self._angle_shape = (block_size if per_token else 1, n_head, N_CIRCUITS, repetitions, N_ROTATIONS, self.n_qubits)
        self.angles = nn.Parameter(torch.empty(math.prod(self._angle_shape)).uniform_(0.0, 2 * math.pi))
        self.n_circuit_params = self.angles.numel()
        assert self.n_circuit_params == circuit_param_count(n_embd, n_head, block_size, per_token, repetitions)

        # The Pauli strings are part of the function, so they live in the state_dict: a
        # checkpoint reloads to the same readouts whatever pauli_seed the new module got.
        self.register_buffer("pauli_strings", draw_pauli_strings(self.head_size, self.n_qubits, pauli_seed))
        self.register_buffer("ring", cnot_ring_permutation(self.n_qubits), persistent=False)

        self.out_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def circuit_angles(self, T: int | None = None) -> torch.Tensor:
        """(P, H, 3, repetitions, 3, n) angles; P = T positions for `qsa`, 1 for `qsa_fixed`."""
        angles = self.angles.view(self._angle_shape)
        return angles[:T] if self.per_token and T is not None else angles

    def observables(self, T: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(P, H, 2 + d, D, D) real matrices: Re(U^H O U) for O = Z_0 (query), Z_0 (key), P_1..P_d (value)."""
        cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        angles = self.circuit_angles(T).to(dtype)
        u = circuit_unitary(angles, self.ring)  # (P, H, 3, D, D)
        z0 = z0_observable(self.n_qubits, cdtype, angles.device)[None]  # (1, D, D)
        paulis = pauli_matrices(self.pauli_strings, cdtype)  # (d, D, D)
        obs_q = readout_observables(u[:, :, 0], z0)  # (P, H, 1, D, D)
        obs_k = readout_observables(u[:, :, 1], z0)  # (P, H, 1, D, D)
        obs_v = readout_observables(u[:, :, 2], paulis)  # (P, H, d, D, D)
        return torch.cat([obs_q, obs_k, obs_v], dim=2)

    def readouts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, C) -> q (B, H, T), k (B, H, T), v (B, H, T, d), computed in float32 or float64."""
        B, T, C = x.shape
        if self.per_token and T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size} (one circuit set per position)")
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        # Exact expectations need full precision: no autocast to bf16/fp16 in here.
        with full_precision(x.device):
            psi = amplitude_encode(x.to(dtype).reshape(B, T, self.n_head, self.head_size), self.n_qubits)  # (B, T, H, D)
            obs = self.observables(T, dtype)  # (P, H, 2 + d, D, D), P = T or 1
            eq = "bthi,thmij,bthj->bhtm" if self.per_token else "bthi,hmij,bthj->bhtm"
            r = torch.einsum(eq, psi, obs if self.per_token else obs[0], psi)  # (B, H, T, 2 + d)
        return r[..., 0], r[..., 1], r[..., 2:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(*self.readouts(x), out_dtype=x.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Scores, normalisation and output projection from the readouts: q, k (B, H, T), v (B, H, T, d) -> (B, T, C)."""
        B, H, T, d = v.shape
        with full_precision(v.device):
            a = torch.exp(-(q.unsqueeze(-1) - k.unsqueeze(-2)).square())  # (B, H, T, T): a_ij, pairwise
            causal = torch.ones(T, T, dtype=torch.bool, device=v.device).tril()
            if self.normalization == "average":
                # q, k lie in [-1, 1], so a_ij >= exp(-4) > 0: the row sums never vanish.
                a = a.masked_fill(~causal, 0.0)
                w = a / a.sum(-1, keepdim=True)
            else:
                w = (a / math.sqrt(self.head_size)).masked_fill(~causal, float("-inf")).softmax(-1)
            y = self.attn_dropout(w) @ v  # (B, H, T, d)
        y = y.transpose(1, 2).reshape(B, T, H * d).to(out_dtype or v.dtype)
        return self.resid_dropout(self.out_proj(y))


register_attention("qsa", partial(QuantumSelfAttention, per_token=True))
register_attention("qsa_fixed", partial(QuantumSelfAttention, per_token=False))
