"""Time per training step on the CPU with AdamW, with Muon whose Newton–Schulz iteration is torch's (bfloat16), and
with Muon whose iteration is float32 (lit_attn.training.muon: what `--model.optimizer muon` runs on a CPU without
native bfloat16; this machine's kind is printed).

One model layout (default: nanoGPT's shakespeare-char shape, 4 layers, width 128, context 64, batch 12), three
copies from one initialisation; each repetition times `--steps` steps of each optimizer in turn, its order
rotated, so machine noise hits all alike. Prints each one's median time per step over the repetitions, its
min-max, its ratio to AdamW's median, and the machine's load average before and after.

    python -m benchmarks.bench_muon --repeats 7 --steps 5 --threads 1
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from lit_attn import GPT
from lit_attn.cli.toolcli import ToolParser, check_threads
from lit_attn.training.muon import native_bfloat16_cpu

VARIANTS = ("adamw", "muon_bf16_torch", "muon_fp32")


def make_step(variant: str, model_kwargs: dict, batch: torch.Tensor) -> Callable[[], None]:
    """One training step (forward, backward, optimizer step, LR schedule) of `variant`'s model copy."""
    torch.manual_seed(0)
    model = GPT(**model_kwargs, optimizer="adamw" if variant == "adamw" else "muon", total_steps=10**6)
    configured = model.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    if variant != "adamw":  # the library's step (bfloat16 Newton–Schulz) or the float32 one, whatever this CPU is
        optimizer.muon.float32 = variant == "muon_fp32"

    def step() -> None:
        loss = model._loss(model(batch[:, :-1]), batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()

    return step


def main(argv: Sequence[str] | None = None) -> int:
    p = ToolParser(prog="python -m benchmarks.bench_muon", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--steps", type=int, default=5, help="steps per timed round of each optimizer")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds; the median is reported")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the timing is pinned to them)")
    args = p.parse_args(argv)
    sizes = (args.n_layer, args.n_embd, args.n_head, args.block_size, args.batch, args.steps, args.repeats)
    try:
        if min(sizes) < 1:
            raise ValueError("--n-layer, --n-embd, --n-head, --block-size, --batch, --steps and --repeats must be >= 1")
        if args.n_embd % args.n_head:
            raise ValueError(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
        check_threads(args.threads)
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    torch.set_num_threads(args.threads)
    vocab = 65  # Tiny Shakespeare's characters
    model_kwargs = dict(vocab_size=vocab, n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                        block_size=args.block_size, bias=False, dropout=0.0)
    batch = torch.randint(0, vocab, (args.batch, args.block_size + 1), generator=torch.Generator().manual_seed(0))
    steps = {v: make_step(v, model_kwargs, batch) for v in VARIANTS}
    for step in steps.values():  # untimed: allocations, the optimizer's state
        step()
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[v]()
            times[v].append((time.perf_counter() - start) / args.steps)
    load_after = os.getloadavg()
    n_params = sum(p.numel() for p in GPT(**model_kwargs).parameters())
    native = "native bfloat16 (AVX512-BF16 or AMX)" if native_bfloat16_cpu() else "no native bfloat16"
    print(f"CPU with {native}: --model.optimizer muon runs "
          f"{'torch.optim.Muon (bfloat16)' if native_bfloat16_cpu() else 'the float32 Newton-Schulz'} here")
    print(f"{n_params / 1e6:.2f}M parameters, batch {args.batch} x {args.block_size}, {args.threads} thread(s), "
          f"median of {args.repeats} rounds of {args.steps} steps; load average (1, 5, 15 min) "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after")
    base = statistics.median(times["adamw"])
    print(f"{'optimizer':<16} {'ms/step':>8} {'min':>8} {'max':>8} {'x adamw':>8}")
    for v in VARIANTS:
        median = statistics.median(times[v])
        print(f"{v:<16} {median * 1e3:8.1f} {min(times[v]) * 1e3:8.1f} {max(times[v]) * 1e3:8.1f} {median / base:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
