"""Attention benchmark across sequence lengths: time, peak memory and speed-up vs MHA.

For each attention and sequence length T the batch is tokens // T (at least 1), so
every step processes about the same number of tokens, like seed 002's 1024x128 ...
200k x 1 grid. One attention layer at seed-002 width (n_embd 256, n_head 16, RoPE),
and optionally the full seed-002 GPT, are timed forward (no grad) and forward+backward.

The ideal speed-up over MHA is H / Hq: the score part (Q K^T and A V) scales with
the number of query heads. It is what SQA promises at long context, where the score
part dominates; efficiency = measured speed-up / ideal speed-up.

    python -m lit_attn.bench --seq-lens 512,1024,2048 --tokens 8192 --out bench_out
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .analytic import GROUPED, attention_flops_per_token, attention_heads
from .attention import build_attention

N_EMBD = 256  # seed-002 width
N_HEAD = 16
SEED002_MODEL = dict(
    vocab_size=10000, n_layer=8, n_embd=N_EMBD, n_head=N_HEAD, norm="rmsnorm", pos="rope", ffn="swiglu",
    ffn_hidden=768, bias=True, qkv_bias=False, tie_embeddings=False, final_norm=False,
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Row:
    """One measurement: a part (layer or model) of one attention at one sequence length."""

    part: str
    attention: str
    seq_len: int
    batch: int
    n_query_heads: int
    n_kv_heads: int
    fwd_s: float
    fwd_bwd_s: float
    peak_mem_mib: float | None  # None where it cannot be measured (CPU)
    speedup_fwd: float = float("nan")
    speedup_fwd_bwd: float = float("nan")
    ideal_score: float = float("nan")  # H / Hq
    ideal_flops: float = float("nan")  # MHA / variant total attention FLOPs at this T
    eff_fwd: float = float("nan")  # speedup_fwd / ideal_score
    eff_fwd_bwd: float = float("nan")  # speedup_fwd_bwd / ideal_score


def _sync(device: torch.device) -> None:
    # Kernels are asynchronous on accelerators; without this we would time the launch only.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> tuple[float, float | None]:
    """Median wall seconds of `step` over `repeats` runs after `warmup` runs, and peak memory in MiB (CUDA only)."""
    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return statistics.median(times), peak


def build_part(part: str, attention: str, seq_len: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """One seed-002-width attention layer ("layer") or the full seed-002 GPT ("model"), in eval mode."""
    if part == "layer":
        module = build_attention(
            attention, n_embd=N_EMBD, n_head=N_HEAD, n_query_heads=None, n_kv_heads=None, block_size=seq_len,
            dropout=0.0, bias=True, qkv_bias=False, rope=True,
        )
    elif part == "model":
        from .model import GPT  # imported lazily: Lightning is slow to import and only needed here

        module = GPT(attention=attention, block_size=seq_len, **SEED002_MODEL)
    else:
        raise ValueError(f"unknown part {part!r}; choose layer or model")
    # eval() only switches off dropout (0 anyway); forward+backward still builds the graph.
    return module.to(device=device, dtype=dtype).eval()


def measure(
    part: str, attention: str, seq_len: int, batch: int, device: torch.device, dtype: torch.dtype,
    warmup: int, repeats: int,
) -> Row:
    """Time forward and forward+backward of one part at (batch, seq_len); speed-ups are filled in later."""
    module = build_part(part, attention, seq_len, device, dtype)
    if part == "layer":
        x = torch.randn(batch, seq_len, N_EMBD, device=device, dtype=dtype)
    else:
        x = torch.randint(0, SEED002_MODEL["vocab_size"], (batch, seq_len), device=device)

    def forward() -> None:
        with torch.no_grad():
            module(x)

    def forward_backward() -> None:
        module.zero_grad(set_to_none=True)
        module(x).float().sum().backward()

    fwd_s, peak_fwd = time_step(forward, device, warmup, repeats)
    fwd_bwd_s, peak_bwd = time_step(forward_backward, device, warmup, repeats)
    hq, hkv = attention_heads(attention, N_EMBD, N_HEAD) or (N_HEAD, N_HEAD)
    peaks = [p for p in (peak_fwd, peak_bwd) if p is not None]
    return Row(part, attention, seq_len, batch, hq, hkv, fwd_s, fwd_bwd_s, max(peaks) if peaks else None)


def add_speedups(rows: list[Row]) -> list[Row]:
    """Fill speed-ups vs the MHA row with the same part and length, ideal speed-ups and efficiencies."""
    mha = {(r.part, r.seq_len): r for r in rows if r.attention == "mha"}
    for r in rows:
        base = mha.get((r.part, r.seq_len))
        r.ideal_score = N_HEAD / r.n_query_heads
        mha_flops = attention_flops_per_token("mha", N_EMBD, N_HEAD, r.seq_len)
        own_flops = attention_flops_per_token(r.attention, N_EMBD, N_HEAD, r.seq_len)
        if mha_flops is not None and own_flops is not None:
            r.ideal_flops = mha_flops.total / own_flops.total
        if base is not None:
            r.speedup_fwd = base.fwd_s / r.fwd_s
            r.speedup_fwd_bwd = base.fwd_bwd_s / r.fwd_bwd_s
            r.eff_fwd = r.speedup_fwd / r.ideal_score
            r.eff_fwd_bwd = r.speedup_fwd_bwd / r.ideal_score
    return rows


def run_benchmark(
    attentions: Sequence[str], seq_lens: Sequence[int], tokens: int, parts: Sequence[str] = ("layer",),
    device: str = "cpu", dtype: str = "float32", warmup: int = 1, repeats: int = 3,
    log: Callable[[str], None] | None = None,
) -> list[Row]:
    """Measure every part x attention x length with batch = max(1, tokens // length); return rows with speed-ups."""
    dev, dt = torch.device(device), DTYPES[dtype]
    rows = []
    for part in parts:
        for seq_len in seq_lens:
            batch = max(1, tokens // seq_len)
            for name in attentions:
                row = measure(part, name, seq_len, batch, dev, dt, warmup, repeats)
                if log:
                    log(f"{part} {name} T={seq_len} B={batch}: fwd {row.fwd_s:.4g}s fwd+bwd {row.fwd_bwd_s:.4g}s")
                rows.append(row)
    return add_speedups(rows)


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options of `python -m lit_attn.bench`."""
    p = argparse.ArgumentParser(
        prog="python -m lit_attn.bench",
        description="Time one seed-002 attention layer (and optionally the full seed-002 GPT) per attention and "
        "sequence length, with tokens per step constant; print a Markdown table, write bench.csv and bench.png.",
    )
    p.add_argument("--attention", type=_csv_list, default=list(GROUPED),
                   help="comma-separated attention names (default: the seven grouped ones; include mha for speed-ups)")
    p.add_argument("--seq-lens", type=lambda s: [int(t) for t in _csv_list(s)], default=[256, 1024, 4096],
                   help="comma-separated sequence lengths (default: 256,1024,4096)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per step; batch = max(1, tokens // T) (default 4096)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before timing (default 1)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device (default: cuda if available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on CUDA, float32 otherwise")
    p.add_argument("--model", action="store_true", help="also time the full seed-002 GPT (8 layers, vocab 10000)")
    p.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for bench.csv, bench.png, bench.md")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bfloat16" if torch.device(args.device).type == "cuda" else "float32"
    if args.repeats < 1 or args.warmup < 0 or args.tokens < 1 or not args.seq_lens or min(args.seq_lens) < 1:
        p.error("--repeats and --tokens and every --seq-lens value must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark from the command line; return the exit status."""
    from .bench_report import markdown_table, write_csv, write_plot  # imported here: report code depends on Row

    args = parse_args(argv)
    parts = ("layer", "model") if args.model else ("layer",)
    rows = run_benchmark(args.attention, args.seq_lens, args.tokens, parts, args.device, args.dtype,
                         args.warmup, args.repeats, log=lambda m: print(m, file=sys.stderr, flush=True))
    table = markdown_table(rows)
    header = (f"device {args.device}, dtype {args.dtype}, {args.tokens} tokens/step, median of {args.repeats} "
              f"after {args.warmup} warm-up; speed-ups vs MHA; ideal = H/Hq (score part); eff = speed-up / (H/Hq); "
              f"ideal FLOPs = MHA/variant total attention FLOPs")
    print(header + "\n\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.md").write_text(header + "\n\n" + table + "\n")
    write_csv(rows, args.out / "bench.csv")
    write_plot(rows, args.out / "bench.png")
    print(f"\nwrote {args.out / 'bench.md'}, {args.out / 'bench.csv'}, {args.out / 'bench.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
