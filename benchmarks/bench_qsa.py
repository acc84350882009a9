"""Time one QSA layer, forward + backward, against the same computation through PennyLane.

Ours: `QuantumSelfAttention` (unitaries from angles, every readout one quadratic form).
PennyLane: the same circuits on `default.qubit` with parameter broadcasting (one QNode
call per circuit kind, broadcast over all batch x context tokens, backprop through torch),
then the same scores / normalisation / output projection (`attend`).

    python benchmarks/bench_qsa.py                      # batch 1024, context 16, d = 4 and 16
    python benchmarks/bench_qsa.py --variant qsa_fixed --dims 4 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_attn.attention import build_attention  # noqa: E402
from lit_attn.attention.quantum import QuantumSelfAttention  # noqa: E402


def pennylane_readouts(attn: QuantumSelfAttention, x: torch.Tensor):
    """q (B, H, T), k (B, H, T), v (B, H, T, d) of `attn` for x (B, T, C), simulated by PennyLane."""
    import pennylane as qml

    B, T, C = x.shape
    n, d, H = attn.n_qubits, attn.head_size, attn.n_head
    wires = list(range(n))
    names = {1: qml.PauliX, 2: qml.PauliY, 3: qml.PauliZ}
    paulis = [qml.prod(*[names[c](w) for w, c in enumerate(s) if c]) for s in attn.pauli_strings.tolist()]
    dev = qml.device("default.qubit", wires=n)

    @qml.qnode(dev, interface="torch", diff_method="backprop")
    def circuit(features, angles, observables):  # features (N, d), angles (N, repetitions, 3, n): broadcast over N
        qml.AmplitudeEmbedding(features, wires=wires, pad_with=0.0, normalize=True)
        for r in range(angles.shape[1]):
            for i in wires:
                qml.RX(angles[:, r, 0, i], wires=i)
                qml.RY(angles[:, r, 1, i], wires=i)
            if n > 1:
                for i in wires:
                    qml.CNOT(wires=[i, (i + 1) % n])
            for i in wires:
                qml.RY(angles[:, r, 2, i], wires=i)
        return [qml.expval(o) for o in observables]

    angles = attn.circuit_angles(T)  # (P, H, 3, repetitions, 3, n), P = T or 1
    angles = angles.expand(T, *angles.shape[1:])  # one angle set per position
    q, k, v = [], [], []
    for h in range(H):
        feats = x[..., h * d : (h + 1) * d].reshape(B * T, d)  # (B*T, d), token-major within each batch row
        per_token = angles[:, h].unsqueeze(0).expand(B, *angles[:, h].shape).reshape(B * T, *angles.shape[2:])
        q.append(circuit(feats, per_token[:, 0], [qml.PauliZ(0)])[0].reshape(B, T))
        k.append(circuit(feats, per_token[:, 1], [qml.PauliZ(0)])[0].reshape(B, T))
        v.append(torch.stack(circuit(feats, per_token[:, 2], paulis), -1).reshape(B, T, d))
    return torch.stack(q, 1), torch.stack(k, 1), torch.stack(v, 1)


def time_fwd_bwd(fn, x: torch.Tensor, grad_out: torch.Tensor, params: list[torch.Tensor], repeats: int):
    """Median seconds of forward + backward; returns (seconds, output, grads)."""
    times = []
    for i in range(repeats + 1):  # the first call warms up and is not timed
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        y = fn(x)
        (y * grad_out).sum().backward()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), y.detach(), [p.grad.clone() for p in params]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--dims", type=int, nargs="+", default=[4, 16], help="embedding sizes d (one head)")
    parser.add_argument("--variant", choices=["qsa", "qsa_fixed"], default="qsa")
    parser.add_argument("--normalization", choices=["average", "softmax"], default="average")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import pennylane as qml

    print(f"torch {torch.__version__}, pennylane {qml.__version__}, {torch.get_num_threads()} threads, "
          f"{args.variant}, batch {args.batch}, context {args.context}, {args.normalization} normalisation")
    print("seconds per forward+backward (median); 'layer' = the whole QSA layer, 'sim' = the circuit readouts only")
    print(f"{'d':>3} {'qubits':>6} {'ours layer':>10} {'PL layer':>9} {'ratio':>6} {'ours sim':>9} {'PL sim':>8} "
          f"{'ratio':>6} {'max|dy|':>9} {'max|dgrad|':>10}")
    for d in args.dims:
        torch.manual_seed(0)
        attn = build_attention(args.variant, {"normalization": args.normalization}, n_embd=d, n_head=1,
                               block_size=args.context, bias=True)
        x = torch.randn(args.batch, args.context, d, requires_grad=True)
        g = torch.randn(args.batch, args.context, d)
        params = [x, attn.angles]
        ours, y, grads = time_fwd_bwd(attn, x, g, params, args.repeats)
        theirs, y_pl, grads_pl = time_fwd_bwd(
            lambda x: attn.attend(*pennylane_readouts(attn, x), out_dtype=x.dtype), x, g, params, args.repeats
        )
        # Readouts only: q, k and v concatenated to (B, H, T, 2 + d), against a fixed random cotangent.
        g_sim = torch.randn(args.batch, 1, args.context, 2 + d)
        stack = lambda q, k, v: torch.cat([q.unsqueeze(-1), k.unsqueeze(-1), v], -1).float()  # noqa: E731
        ours_sim, _, _ = time_fwd_bwd(lambda x: stack(*attn.readouts(x)), x, g_sim, params, args.repeats)
        theirs_sim, _, _ = time_fwd_bwd(lambda x: stack(*pennylane_readouts(attn, x)), x, g_sim, params, args.repeats)
        dy = (y - y_pl).abs().max().item()
        dgrad = max((a - b).abs().max().item() for a, b in zip(grads, grads_pl))
        print(f"{d:>3} {attn.n_qubits:>6} {ours:>10.4f} {theirs:>9.4f} {theirs / ours:>5.1f}x {ours_sim:>9.4f} "
              f"{theirs_sim:>8.4f} {theirs_sim / ours_sim:>5.1f}x {dy:>9.1e} {dgrad:>10.1e}")
    print("max|dy|: outputs, max|dgrad|: gradients w.r.t. the input and the angles, ours vs PennyLane")

if __name__ == "__main__":
    main()
