"""Training speed of the Sparse Query Attention paper's models: time per batch of the seven grouped
variants next to the paper's L40S figures.

The model is the paper's layout (lit_attn.config.SPARSE_QUERY_LAYOUT, also configs/sqa_wikipedia.yaml:
d=256, 8 layers, 16 heads, SwiGLU 768, RoPE, RMSNorm, vocab 10k, context 1024), trained on random
tokens with fused AdamW and gradient clipping, bf16 autocast on CUDA (float32 on CPU). Per variant:
`--warmup` untimed steps, then `--steps` timed ones (synchronized only at both ends). Prints time per
batch, its ratio to MHA beside the paper's figures (1x L40S), tokens/s and MFU (analytic FLOPs over
the device's peak from Lightning's table, or --peak-flops).

On CPU the default batch is the largest power of two up to 128 whose estimated memory fits in 80% of the RAM
available (said on stderr); a --batch that does not fit is refused with the memory it needs.

    python -m benchmarks.bench_sqa_paper                                # GPU: batch 128, 50 steps
    python -m benchmarks.bench_sqa_paper --batch 2 --seq-len 128 --steps 3 --warmup 1   # a CPU smoke run
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import get_available_flops

from benchmarks.bench import train_step_memory
from benchmarks.sqa_paper_table import PAPER
from lit_attn.analytic import gpt_train_flops_per_token
from lit_attn.cli.toolcli import ToolParser, available_memory, check_device, csv_list, gib
from lit_attn.config import SPARSE_QUERY_LAYOUT, GPTConfig
from lit_attn.transformer import Transformer

# The Sparse Query Attention write-up's published time per batch (s), 1x L40S, batch 128, context 1024, bf16.
PAPER_L40S = {name: result.s_per_batch for name, result in PAPER.items()}
PAPER_BATCH = 128


def time_per_batch(model: Transformer, device: torch.device, batch: int, seq_len: int, steps: int, warmup: int,
                   compile: bool) -> float:
    """Seconds per training step on random tokens, after `warmup` untimed steps."""
    vocab = model.config.vocab_size
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-4, fused=True)
    step_fn = torch.compile(model) if compile else model
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            t0 = time.perf_counter()
        tokens = torch.randint(vocab, (batch, seq_len + 1), device=device)
        with amp:
            logits = step_fn(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - t0) / steps


def layout(variant: str, seq_len: int) -> GPTConfig:
    """The paper's model with this attention and context."""
    return dataclasses.replace(SPARSE_QUERY_LAYOUT, attention=variant, block_size=seq_len)


def memory_per_batch(variants: Sequence[str], seq_len: int) -> tuple[int, int]:
    """(fixed bytes, bytes per sequence of `seq_len` tokens): the estimated peak CPU memory of a float32
    training step with AdamW, for the largest of `variants`."""
    fixed, per_token, probe = 0, 0.0, min(seq_len, 16)
    for variant in variants:
        with torch.device("meta"):  # shapes only, at full length
            full = sum(t.nbytes for m in [Transformer(layout(variant, seq_len))] for t in [*m.parameters(),
                                                                                         *m.buffers()])
        model = Transformer(layout(variant, probe))
        tokens = torch.randint(model.config.vocab_size, (1, probe + 1))

        def loss(model=model, tokens=tokens):
            logits = model(tokens[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

        _, t = train_step_memory(model, loss, probe, optimizer_states=2)
        fixed, per_token = max(fixed, 4 * full), max(per_token, t)  # weights, gradients, two AdamW moments
    return fixed, int(per_token * seq_len)


def cpu_batch(batch: int | None, variants: Sequence[str], seq_len: int) -> int:
    """The batch to run on CPU: `batch` if it fits in the available RAM, else ValueError; without one, the
    largest power of two up to the paper's 128 that fits in 80% of it (said on stderr)."""
    fixed, per_seq = memory_per_batch(variants, seq_len)
    free = available_memory()
    if free is None:
        return batch or 1
    fits = max(0, (free - fixed) // per_seq)
    if batch is not None:
        if batch > fits:
            fix = f"pass --batch {fits} or less" if fits else "pass a shorter --seq-len"
            raise ValueError(f"batch {batch} x context {seq_len} needs about {gib(fixed + batch * per_seq)} of "
                             f"memory (estimated), {gib(free)} is available; {fix}")
        return batch
    if fits < 1:
        raise ValueError(f"one sequence of context {seq_len} needs about {gib(fixed + per_seq)} of memory "
                         f"(estimated), {gib(free)} is available; pass a shorter --seq-len")
    # A chosen batch leaves a fifth of the free memory to the rest of the machine.
    roomy = max(1, int((0.8 * free - fixed) // per_seq))
    chosen = min(PAPER_BATCH, 1 << (roomy.bit_length() - 1))
    print(f"CPU: batch {chosen} (about {gib(fixed + chosen * per_seq)} of the {gib(free)} available; the paper's "
          f"{PAPER_BATCH} would need {gib(fixed + PAPER_BATCH * per_seq)}); --batch sets it", file=sys.stderr)
    return chosen


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options (a jsonargparse Namespace); the device and variants are checked."""
    parser = ToolParser(prog="python -m benchmarks.bench_sqa_paper", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=str, default=",".join(PAPER_L40S), help="comma-separated attention names")
    parser.add_argument("--batch", type=int, default=None,
                        help=f"sequences per step (default: {PAPER_BATCH} on CUDA; on CPU the largest power of two "
                        f"up to {PAPER_BATCH} whose estimated memory fits in 80% of the free RAM)")
    parser.add_argument("--seq-len", type=int, default=1024, help="context: tokens per sequence")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per variant")
    parser.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--peak-flops", type=float, default=None,
                        help="the device's peak FLOP/s, for MFU (default: Lightning's table; none on CPU)")
    args = parser.parse_args(argv)
    args.variants = csv_list(args.variants)
    unknown = [v for v in args.variants if v not in PAPER_L40S]
    if unknown or not args.variants:
        parser.error(f"--variants {','.join(unknown)}: choose among {', '.join(PAPER_L40S)}")
    if args.seq_len < 1 or (args.batch is not None and args.batch < 1) or args.steps < 1 or args.warmup < 0:
        parser.error("--seq-len, --batch and --steps must be >= 1, --warmup >= 0")
    if args.peak_flops is not None and not args.peak_flops > 0:
        parser.error(f"--peak-flops must be > 0, got {args.peak_flops}")
    try:
        check_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    return args


def run(args, device: torch.device) -> None:
    """Time every variant and print its row."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = args.peak_flops or get_available_flops(device, dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, {dtype}, batch {args.batch}, context {args.seq_len}, {args.steps} timed steps"
          f"{', compiled' if args.compile else ''}; paper: 1x L40S, batch 128, context 1024")
    print(f"{'attention':>9} {'params':>11} {'s/batch':>8} {'vs MHA':>7} {'paper s/batch':>13} {'paper vs MHA':>12} "
          f"{'tokens/s':>10} {'MFU':>6}")
    base = None
    for variant in args.variants:
        torch.manual_seed(0)
        config = layout(variant, args.seq_len)
        model = Transformer(config).to(device).train()
        seconds = time_per_batch(model, device, args.batch, args.seq_len, args.steps, args.warmup, args.compile)
        base = base or (seconds if variant == "mha" else None)
        flops = gpt_train_flops_per_token(config)
        mfu = f"{flops * args.batch * args.seq_len / seconds / peak:.1%}" if peak and flops else "n/a"
        ratio = f"{seconds / base:.3f}" if base else "-"
        paper_ratio = PAPER_L40S[variant] / PAPER_L40S["mha"]
        tokens_per_s = args.batch * args.seq_len / seconds
        print(f"{variant:>9} {sum(p.numel() for p in model.parameters()):>11,} {seconds:>8.4f} {ratio:>7} "
              f"{PAPER_L40S[variant]:>13.4f} {paper_ratio:>12.3f} {tokens_per_s:>10,.0f} {mfu:>6}", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    device = torch.device(args.device)
    try:
        if device.type == "cpu":  # the kernel kills a CPU process that runs out of memory: check first
            args.batch = cpu_batch(args.batch, args.variants, args.seq_len)
        args.batch = args.batch or PAPER_BATCH
        run(args, device)
    except torch.OutOfMemoryError:
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        print(f"error: batch {args.batch} x context {args.seq_len} does not fit in {args.device}'s memory; "
              "pass a smaller --batch or --seq-len", file=sys.stderr)
        return 2
    except ValueError as e:
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
