"""Training speed of the Sparse Query Attention paper's models: time per batch of the seven grouped
variants next to the paper's L40S figures.

The model is the paper's layout (lit_attn.config.SPARSE_QUERY_LAYOUT, also configs/sqa_wikipedia.yaml:
d=256, 8 layers, 16 heads, SwiGLU 768, RoPE, RMSNorm, vocab 10k, context 1024), trained on random
tokens with fused AdamW and gradient clipping, bf16 autocast on CUDA (float32 on CPU). Per variant:
`--warmup` untimed steps, then `--steps` timed ones (synchronized only at both ends). Prints time per
batch, its ratio to MHA beside the paper's figures (1x L40S), tokens/s and MFU (analytic FLOPs over
the device's peak from Lightning's table, or --peak-flops).

    python -m benchmarks.bench_sqa_paper                                # GPU: batch 128, 50 steps
    python -m benchmarks.bench_sqa_paper --batch 2 --seq-len 128 --steps 3 --warmup 1   # a CPU smoke run
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import get_available_flops

from benchmarks.sqa_paper_table import PAPER
from lit_attn.analytic import gpt_train_flops_per_token
from lit_attn.config import SPARSE_QUERY_LAYOUT
from lit_attn.toolcli import ToolParser
from lit_attn.transformer import Transformer

# The Sparse Query Attention write-up's published time per batch (s), 1x L40S, batch 128, context 1024, bf16.
PAPER_L40S = {name: result.s_per_batch for name, result in PAPER.items()}


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


def main() -> None:
    parser = ToolParser(prog="python -m benchmarks.bench_sqa_paper", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=str, default=",".join(PAPER_L40S), help="comma-separated attention names")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per variant")
    parser.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--peak-flops", type=float, default=None, help="the device's peak FLOP/s, for MFU")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in PAPER_L40S]
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(PAPER_L40S)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but no CUDA device is visible; use --device cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = args.peak_flops or get_available_flops(device, dtype)
    if args.seq_len < 1 or args.batch < 1:
        sys.exit("error: --seq-len and --batch must be positive integers")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, {dtype}, batch {args.batch}, context {args.seq_len}, {args.steps} timed steps"
          f"{', compiled' if args.compile else ''}; paper: 1x L40S, batch 128, context 1024")
    print(f"{'attention':>9} {'params':>11} {'s/batch':>8} {'vs MHA':>7} {'paper s/batch':>13} {'paper vs MHA':>12} "
          f"{'tokens/s':>10} {'MFU':>6}")
    base = None
    for variant in variants:
        torch.manual_seed(0)
        config = dataclasses.replace(SPARSE_QUERY_LAYOUT, attention=variant, block_size=args.seq_len)
        model = Transformer(config).to(device).train()
        seconds = time_per_batch(model, device, args.batch, args.seq_len, args.steps, args.warmup, args.compile)
        base = base or (seconds if variant == "mha" else None)
        flops = gpt_train_flops_per_token(config)
        mfu = f"{flops * args.batch * args.seq_len / seconds / peak:.1%}" if peak and flops else "n/a"
        ratio = f"{seconds / base:.3f}" if base else "-"
        paper_ratio = PAPER_L40S[variant] / PAPER_L40S["mha"]
        tokens_per_s = args.batch * args.seq_len / seconds
        print(f"{variant:>9} {sum(p.numel() for p in model.parameters()):>11,} {seconds:>8.4f} {ratio:>7} "
              f"{PAPER_L40S[variant]:>13.4f} {paper_ratio:>12.3f} {tokens_per_s:>10,.0f} {mfu:>6}")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
