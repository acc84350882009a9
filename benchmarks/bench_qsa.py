"""Time one QSA layer, forward + backward, against the same computation through PennyLane.

Ours: `QuantumSelfAttention` (unitaries from angles, every readout one quadratic form).
PennyLane: the same circuits on `default.qubit` with parameter broadcasting (one QNode
call per circuit kind, broadcast over all batch x context tokens, backprop through torch),
then the same scores / normalisation / output projection (`attend`). The PennyLane side is
lit_attn.attention.pennylane_reference, the reference tests/test_attention_quantum.py checks against.

Method: torch's intra-op threads are pinned (--threads, default 1), and the four measurements
(ours and PennyLane, layer and readouts) are interleaved: every repetition runs each once, in
an order that alternates between repetitions, so load from other jobs hits all alike. The
first round is untimed. Times are medians over the repetitions; each ratio is PennyLane / ours
per repetition, reported as the median and its min-max range.

    python -m benchmarks.bench_qsa                      # batch 1024, context 16, d = 4 and 16
    python -m benchmarks.bench_qsa --variant qsa_fixed --dims 4 --repeats 5
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from benchmarks.bench import PEAK_OVER_SAVED, saved_bytes
from lit_attn.attention import build_attention
from lit_attn.cli.toolcli import ToolParser, available_memory, check_threads, gib


def fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad_out: torch.Tensor,
            params: list[torch.Tensor]) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    """Seconds of one forward + backward of fn(x) against `grad_out`; returns (seconds, output, grads of params)."""
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    y = fn(x)
    (y * grad_out).sum().backward()
    seconds = time.perf_counter() - t0
    return seconds, y.detach(), [p.grad.clone() for p in params]


def interleaved(cases: dict[str, tuple[Callable, torch.Tensor]], x: torch.Tensor, params: list[torch.Tensor],
                repeats: int) -> tuple[dict[str, list[float]], dict[str, tuple[torch.Tensor, list[torch.Tensor]]]]:
    """Per case, the seconds of `repeats` forward+backward passes taken in turns with the other cases
    (after one untimed round), and the last output and gradients."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    last: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    names = list(cases)
    for rep in range(repeats + 1):
        for name in names if rep % 2 == 0 else names[::-1]:
            fn, grad_out = cases[name]
            seconds, y, grads = fwd_bwd(fn, x, grad_out, params)
            if rep:
                times[name].append(seconds)
            last[name] = (y, grads)
    return times, last


def ratios(slow: list[float], fast: list[float]) -> list[float]:
    """Per-repetition ratios slow / fast."""
    return [a / b for a, b in zip(slow, fast)]


def _cases(attn, pennylane_readouts) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The four timed computations of one layer: ours and PennyLane's, whole layer and readouts only."""
    stack = lambda q, k, v: torch.cat([q.unsqueeze(-1), k.unsqueeze(-1), v], -1).float()  # noqa: E731
    return {
        "ours layer": attn,
        "PL layer": lambda x: attn.attend(*pennylane_readouts(attn, x), out_dtype=x.dtype),
        "ours sim": lambda x: stack(*attn.readouts(x)),
        "PL sim": lambda x: stack(*pennylane_readouts(attn, x)),
    }


def memory_needed(attn, pennylane_readouts, batch: int, context: int, d: int) -> int:
    """Estimated peak bytes of one timed forward+backward at (batch, context), the largest of the four.

    Saved activations are probed on one sequence of c and 2c tokens and fitted as a*T + b*T^2 per
    sequence (the scores are T x T), then scaled by PEAK_OVER_SAVED as in benchmarks.bench.
    """
    c, worst = min(context, 4), 0.0
    for fn in _cases(attn, pennylane_readouts).values():
        s1, s2 = (saved_bytes(lambda n=n, fn=fn: fn(torch.randn(1, n, d, requires_grad=True)).sum(),
                              list(attn.parameters())) for n in (c, 2 * c))
        b = max(0.0, (s2 - 2 * s1) / (2 * c * c))
        a = max(0.0, (s1 - b * c * c) / c)
        worst = max(worst, a * context + b * context * context)
    return int(PEAK_OVER_SAVED * batch * worst) + 3 * 4 * batch * context * d  # x, its gradient, g


def main(argv: Sequence[str] | None = None) -> None:
    parser = ToolParser(prog="python -m benchmarks.bench_qsa", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--dims", type=int, nargs="+", default=[4, 16], help="embedding sizes d (one head)")
    parser.add_argument("--variant", choices=["qsa", "qsa_fixed"], default="qsa")
    parser.add_argument("--normalization", choices=["average", "softmax"], default="average")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, pinned for the whole run")
    args = parser.parse_args(argv)
    if min(args.batch, args.context, args.repeats, args.threads, *args.dims) < 1:
        parser.error("--batch, --context, --repeats, --threads and every --dims value must be >= 1")
    try:
        check_threads(args.threads)
    except ValueError as e:
        parser.error(str(e))
    try:
        import pennylane as qml

        from lit_attn.attention.pennylane_reference import pennylane_readouts
    except ImportError as e:
        parser.error(f"PennyLane is needed ({e}); install it with: pip install -e '.[dev]'")
    torch.set_num_threads(args.threads)
    for d in args.dims:  # every size checked before anything runs: the kernel kills a process out of memory
        attn = build_attention(args.variant, {"normalization": args.normalization}, n_embd=d, n_head=1,
                               block_size=args.context, bias=True)
        need, free = memory_needed(attn, pennylane_readouts, args.batch, args.context, d), available_memory()
        if free is not None and need > free:
            parser.error(f"d={d} at batch {args.batch} x context {args.context} needs about {gib(need)} of memory "
                         f"(estimated), {gib(free)} is available; pass a smaller --batch or --context")

    print(f"torch {torch.__version__}, pennylane {qml.__version__}, {torch.get_num_threads()} threads (pinned), "
          f"{args.variant}, batch {args.batch}, context {args.context}, {args.normalization} normalisation")
    print(f"seconds per forward+backward (median of {args.repeats} interleaved repetitions); 'layer' = the whole "
          "QSA layer, 'sim' = the circuit readouts only; ratio = PennyLane / ours (median, range min-max)")
    print(f"{'d':>3} {'qubits':>6} {'ours layer':>10} {'PL layer':>9} {'ratio':>6} {'ours sim':>9} {'PL sim':>8} "
          f"{'ratio':>6} {'max|dy|':>9} {'max|dgrad|':>10} {'layer range':>13} {'sim range':>13}")
    for d in args.dims:
        torch.manual_seed(0)
        attn = build_attention(args.variant, {"normalization": args.normalization}, n_embd=d, n_head=1,
                               block_size=args.context, bias=True)
        x = torch.randn(args.batch, args.context, d, requires_grad=True)
        g = torch.randn(args.batch, args.context, d)
        # Readouts only: q, k and v concatenated to (B, H, T, 2 + d), against a fixed random cotangent.
        g_sim = torch.randn(args.batch, 1, args.context, 2 + d)
        cases = {name: (fn, g if name.endswith("layer") else g_sim)
                 for name, fn in _cases(attn, pennylane_readouts).items()}
        times, last = interleaved(cases, x, [x, attn.angles], args.repeats)
        med = {name: statistics.median(t) for name, t in times.items()}
        layer = ratios(times["PL layer"], times["ours layer"])
        sim = ratios(times["PL sim"], times["ours sim"])
        (y, grads), (y_pl, grads_pl) = last["ours layer"], last["PL layer"]
        dy = (y - y_pl).abs().max().item()
        dgrad = max((a - b).abs().max().item() for a, b in zip(grads, grads_pl))
        span = lambda r: f"{min(r):.1f}-{max(r):.1f}x"  # noqa: E731
        print(f"{d:>3} {attn.n_qubits:>6} {med['ours layer']:>10.4f} {med['PL layer']:>9.4f} "
              f"{statistics.median(layer):>5.1f}x {med['ours sim']:>9.4f} {med['PL sim']:>8.4f} "
              f"{statistics.median(sim):>5.1f}x {dy:>9.1e} {dgrad:>10.1e} {span(layer):>13} {span(sim):>13}")
    print("max|dy|: outputs, max|dgrad|: gradients w.r.t. the input and the angles, ours vs PennyLane")


if __name__ == "__main__":
    main()
