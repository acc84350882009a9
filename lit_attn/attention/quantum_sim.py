"""Exact simulation of QSA's circuits with torch tensor ops: unitaries from angles, Pauli observables,
and the batched quadratic forms that turn them into readouts.

For a real amplitude vector psi, <psi|U^H P U|psi> = psi^T Re(U^H P U) psi, so after building each
circuit's 2^n x 2^n unitary from its angles (a few Kronecker products, independent of the batch),
every readout of every token is one quadratic form. With psi = x / ||x|| zero-padded, that is
x^T O x / x^T x for O the top-left d x d block, so all readouts and the squared norm (O = identity)
are one batched matmul against the tokens' outer products x x^T.

Qubit 0 is the most significant bit of a basis-state index, as in PennyLane.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

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
