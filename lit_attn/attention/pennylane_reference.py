"""An independent reference for quantum self-attention: QSA's readouts simulated by PennyLane's `default.qubit`.

The one copy used by tests/test_attention_quantum.py (agreement of readouts and gradients) and
benchmarks/bench_qsa.py (timing against PennyLane). It rebuilds each circuit gate by gate in
PennyLane (amplitude embedding, then per repetition RX RY on every qubit, a CNOT ring, RY) and
measures PennyLane observables, so it shares nothing with `QuantumSelfAttention`'s unitaries
and quadratic forms except the angles and the Pauli strings it reads from the layer.

Importing this module needs PennyLane (`pip install -e ".[dev]"`); `lit_attn.attention` does not import it.
"""

from __future__ import annotations

from collections.abc import Callable

import pennylane as qml
import torch

from .quantum import QuantumSelfAttention

_PAULI = {1: qml.PauliX, 2: qml.PauliY, 3: qml.PauliZ}  # the layer's codes: 0=I, 1=X, 2=Y, 3=Z


def qsa_circuit(n_qubits: int, diff_method: str = "backprop") -> Callable:
    """A torch QNode `circuit(features, angles, observables) -> [expval, ...]` of one QSA circuit.

    features (..., d) are amplitude-embedded (padded with zeros, normalised); angles
    (..., repetitions, 3, n) are per repetition the RX and RY angles before the CNOT ring and
    the RY angles after it. Leading dimensions of both are broadcast (one simulation per row).
    """
    wires = list(range(n_qubits))

    @qml.qnode(qml.device("default.qubit", wires=n_qubits), interface="torch", diff_method=diff_method)
    def circuit(features, angles, observables):
        qml.AmplitudeEmbedding(features, wires=wires, pad_with=0.0, normalize=True)
        for r in range(angles.shape[-3]):
            for i in wires:
                qml.RX(angles[..., r, 0, i], wires=i)
                qml.RY(angles[..., r, 1, i], wires=i)
            if n_qubits > 1:
                for i in wires:
                    qml.CNOT(wires=[i, (i + 1) % n_qubits])
            for i in wires:
                qml.RY(angles[..., r, 2, i], wires=i)
        return [qml.expval(o) for o in observables]

    return circuit


def pennylane_readouts(
    attn: QuantumSelfAttention, x: torch.Tensor, angles: torch.Tensor | None = None, *,
    diff_method: str = "backprop", broadcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, T), k (B, H, T), v (B, H, T, d) of `attn` for x (B, T, C), simulated by PennyLane.

    angles: the layer's flat circuit angles to simulate with (default `attn.angles`); pass a
    detached float64 leaf to get PennyLane's gradients apart from the layer's own.
    diff_method: PennyLane's differentiation ("backprop" through torch, or "parameter-shift").
    broadcast: one QNode call per head and circuit kind over all B x T tokens (parameter
    broadcasting, fast); False makes one call per token (what parameter-shift needs).
    """
    B, T, _ = x.shape
    n, d, H = attn.n_qubits, attn.head_size, attn.n_head
    paulis = [qml.prod(*[_PAULI[c](w) for w, c in enumerate(s) if c]) for s in attn.pauli_strings.tolist()]
    z0 = [qml.PauliZ(0)]
    circuit = qsa_circuit(n, diff_method)
    flat = attn.angles if angles is None else angles
    per_position = flat.view(attn._angle_shape)  # (P, H, 3 circuits, repetitions, 3, n), P = block_size or 1
    per_position = per_position[:T] if attn.per_token else per_position.expand(T, *per_position.shape[1:])
    q, k, v = [], [], []
    for h in range(H):
        feats = x[..., h * d : (h + 1) * d]  # (B, T, d)
        if broadcast:
            f = feats.reshape(B * T, d)  # token-major within each batch row
            a = (per_position[:, h].unsqueeze(0).expand(B, *per_position[:, h].shape)
                 .reshape(B * T, *per_position.shape[2:]))
            q.append(circuit(f, a[:, 0], z0)[0].reshape(B, T))
            k.append(circuit(f, a[:, 1], z0)[0].reshape(B, T))
            v.append(torch.stack(circuit(f, a[:, 2], paulis), -1).reshape(B, T, d))
        else:
            def token(b: int, t: int, kind: int, obs: list, feats=feats, h=h) -> list[torch.Tensor]:
                return circuit(feats[b, t], per_position[t, h, kind], obs)

            q.append(torch.stack([torch.stack([token(b, t, 0, z0)[0] for t in range(T)]) for b in range(B)]))
            k.append(torch.stack([torch.stack([token(b, t, 1, z0)[0] for t in range(T)]) for b in range(B)]))
            v.append(torch.stack([torch.stack([torch.stack(token(b, t, 2, paulis)) for t in range(T)])
                                  for b in range(B)]))
    return torch.stack(q, 1), torch.stack(k, 1), torch.stack(v, 1)
