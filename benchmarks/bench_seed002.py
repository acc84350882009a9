"""Seed 002's training speed: time per batch of the seven grouped variants next to the seed's L40S figures.

The model is configs/sqa_wikipedia.yaml's (d=256, 8 layers, 16 heads, SwiGLU 768, RoPE,
RMSNorm, vocab 10k, context 1024), trained on random tokens with fused AdamW and gradient
clipping, bf16 autocast on CUDA (float32 on CPU). Per variant: `--warmup` untimed steps, then
`--steps` timed ones (synchronized only at both ends). Prints time per batch, its ratio to
MHA beside the published Sparse Query Attention figures (1x L40S), tokens/s and MFU (analytic FLOPs over the device's
peak from Lightning's table, or --peak-flops).

    python -m benchmarks.bench_seed002                                # GPU: batch 128, 50 steps
    python -m benchmarks.bench_seed002 --batch 2 --seq-len 128 --steps 3 --warmup 1   # a CPU smoke run
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch
import yaml
from lightning.fabric.utilities.throughput import get_available_flops

from lit_attn import GPT
from lit_attn.analytic import gpt_train_flops_per_token
from lit_attn.toolcli import ToolParser
from main import DEFAULT_CONFIG

# The Sparse Query Attention write-up's published time per batch (s), 1x L40S, batch 128, context 1024, bf16.
SEED_L40S = {"mha": 0.7173, "gqa": 0.6877, "mqa": 0.6947, "sqa": 0.6417, "ssqa": 0.6468, "xsqa": 0.6251,
             "xsmqa": 0.6250}


def time_per_batch(model: GPT, device: torch.device, batch: int, seq_len: int, steps: int, warmup: int,
                   compile: bool) -> float:
    """Seconds per training step on random tokens, after `warmup` untimed steps."""
    vocab = model.hparams.vocab_size
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
            loss = model._loss(step_fn(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = ToolParser(prog="python -m benchmarks.bench_seed002", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=str, default=",".join(SEED_L40S), help="comma-separated attention names")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per variant")
    parser.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--peak-flops", type=float, default=None, help="the device's peak FLOP/s, for MFU")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in SEED_L40S]
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(SEED_L40S)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but no CUDA device is visible; use --device cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = args.peak_flops or get_available_flops(device, dtype)
    layout = yaml.safe_load((DEFAULT_CONFIG.parent / "sqa_wikipedia.yaml").read_text())["model"]
    layout |= {"vocab_size": 10_000, "block_size": max(args.seq_len, 1)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, {dtype}, batch {args.batch}, context {args.seq_len}, {args.steps} timed steps"
          f"{', compiled' if args.compile else ''}; seed: 1x L40S, batch 128, context 1024")
    print(f"{'attention':>9} {'params':>11} {'s/batch':>8} {'vs MHA':>7} {'seed s/batch':>12} {'seed vs MHA':>11} "
          f"{'tokens/s':>10} {'MFU':>6}")
    base = None
    for variant in variants:
        torch.manual_seed(0)
        model = GPT(**(layout | {"attention": variant})).to(device).train()
        seconds = time_per_batch(model, device, args.batch, args.seq_len, args.steps, args.warmup, args.compile)
        base = base or (seconds if variant == "mha" else None)
        flops = gpt_train_flops_per_token(**(layout | {"attention": variant}), context=args.seq_len)
        mfu = f"{flops * args.batch * args.seq_len / seconds / peak:.1%}" if peak and flops else "n/a"
        ratio = f"{seconds / base:.3f}" if base else "-"
        seed_ratio = SEED_L40S[variant] / SEED_L40S["mha"]
        print(f"{variant:>9} {sum(p.numel() for p in model.parameters()):>11,} {seconds:>8.4f} {ratio:>7} "
              f"{SEED_L40S[variant]:>12.4f} {seed_ratio:>11.3f} {args.batch * args.seq_len / seconds:>10,.0f} {mfu:>6}")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
