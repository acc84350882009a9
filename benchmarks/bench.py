"""Attention benchmark across sequence lengths: time, peak memory and speed-up vs MHA.

For each attention and sequence length T the batch is tokens // T (at least 1), so
every step processes about the same number of tokens, like the Sparse Query Attention paper's
1024x128 ... 200k x 1 grid. One attention layer of that paper's layout (n_embd 256, n_head 16,
RoPE; lit_attn.config.SPARSE_QUERY_LAYOUT), and optionally its full GPT, are timed forward
(no grad) and forward+backward.

The ideal speed-up over MHA is H / Hq: the score part (Q K^T and A V) scales with
the number of query heads. It is what SQA promises at long context, where the score
part dominates; efficiency = measured speed-up / ideal speed-up.

Method: at each part and T the attentions are timed in turns (every round runs each once, in
an order that alternates), with torch's threads pinned (--threads), so machine load hits all
alike; times are medians over the rounds, and bench.csv also has each time's min and max.
Peak CUDA memory is measured beforehand, one attention at a time.

    lit-attn bench --seq-lens 512,1024,2048 --tokens 8192 --out bench_out
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.bench_report import Row, markdown_table, write_csv, write_plot
from lit_attn.analytic import attention_flops_per_token
from lit_attn.attention.heads import PRESETS
from lit_attn.attention.registry import get_attention
from lit_attn.cli.toolcli import (
    ToolParser,
    available_memory,
    check_device,
    check_outputs,
    check_threads,
    cpu_cores,
    csv_list,
    gib,
    parse_attention,
    split_attentions,
    write_outputs,
)
from lit_attn.config import SPARSE_QUERY_LAYOUT, GPTConfig
from lit_attn.transformer import Transformer

__all__ = ["Row", "add_speedups", "build_part", "main", "measure_group", "parse_args", "run_benchmark",
           "time_interleaved"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OUTPUTS = ("bench.md", "bench.csv", "bench.png")  # what main writes into --out


def _sync(device: torch.device) -> None:
    # Kernels are asynchronous on accelerators; without this we would time the launch only.
    if device.type == "cuda":
        torch.cuda.synchronize(device)




def with_attention(base: GPTConfig, attention: str, **changes: Any) -> GPTConfig:
    """`base` with an --attention entry (NAME or NAME{options}) and `changes`; an attention that takes no RoPE gets
    learned positions instead, as the README's attention table counts it. ValueError: an unknown name, a bad option."""
    name, options = parse_attention(attention)
    pos = base.pos if get_attention(name).rope else "learned"
    return dataclasses.replace(base, attention=name, attention_options=options, pos=pos, **changes)


def layout(attention: str, seq_len: int) -> GPTConfig:
    """The benchmarked model: the Sparse Query Attention paper's layout with this attention entry and context."""
    return with_attention(SPARSE_QUERY_LAYOUT, attention, block_size=seq_len)


def build_part(part: str, attention: str, seq_len: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """One attention layer of the layout ("layer") or its full network ("model"), in eval mode."""
    config = layout(attention, seq_len)
    if part == "layer":
        module = config.spec.build(**config.attention_args())
    elif part == "model":
        module = Transformer(config)
    else:
        raise ValueError(f"unknown part {part!r}; choose layer or model")
    # eval() only switches off dropout (0 anyway); forward+backward still builds the graph.
    return module.to(device=device, dtype=dtype).eval()


class _Case:
    """One part of one attention on its input, ready to run forward or forward+backward."""

    def __init__(self, part: str, attention: str, seq_len: int, batch: int, device: torch.device, dtype: torch.dtype):
        self.module = build_part(part, attention, seq_len, device, dtype)
        if part == "layer":
            self.x = torch.randn(batch, seq_len, SPARSE_QUERY_LAYOUT.n_embd, device=device, dtype=dtype)
        else:
            self.x = torch.randint(0, SPARSE_QUERY_LAYOUT.vocab_size, (batch, seq_len), device=device)

    def forward(self) -> None:
        with torch.no_grad():
            self.module(self.x)

    def forward_backward(self) -> None:
        self.module.zero_grad(set_to_none=True)
        self.module(self.x).float().sum().backward()


def time_interleaved(steps: dict[str, Callable[[], None]], device: torch.device, warmup: int,
                     repeats: int) -> dict[str, list[float]]:
    """Wall seconds of every step in each of `repeats` rounds, after `warmup` untimed rounds.

    A round runs each step once, in an order that alternates between rounds, so load from other
    jobs on a shared machine hits all steps alike and their ratios stay stable.
    """
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            _sync(device)
            start = time.perf_counter()
            steps[name]()
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def peak_memory_mib(steps: Sequence[Callable[[], None]], device: torch.device, warmup: int) -> float | None:
    """Peak CUDA memory in MiB of the largest of `steps`, each run alone after `warmup` runs (kernels
    allocate their workspaces on first use); None off CUDA."""
    if device.type != "cuda":
        return None
    peaks = []
    for step in steps:
        for _ in range(warmup):
            step()
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        _sync(device)
        peaks.append(torch.cuda.max_memory_allocated(device) / 2**20)
    return max(peaks)


# Peak CPU memory of a forward+backward step over the bytes autograd saves for backward: the gradients
# of the activations and kernel workspaces come on top. A measured ratio with a margin (docs/benchmarks.md).
PEAK_OVER_SAVED = 2.5


def saved_bytes(forward: Callable[[], object], exclude: Sequence[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while `forward()` runs, storages in `exclude` not counted."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(seen.values())


def train_step_memory(module: nn.Module, forward: Callable[[], object], probe_tokens: int,
                      optimizer_states: int = 0) -> tuple[int, float]:
    """(fixed bytes, bytes per token): the estimated peak memory of one forward+backward of `module`.

    Fixed: weights, their gradients and `optimizer_states` more copies (2 for Adam). Per token:
    PEAK_OVER_SAVED times the bytes saved for backward by `forward()` over `probe_tokens` tokens; the
    attention runs in fused kernels, so saved activations grow linearly with the tokens.
    """
    weights = [*module.parameters(), *module.buffers()]
    fixed = sum(t.nbytes for t in weights) * (2 + optimizer_states)
    return fixed, PEAK_OVER_SAVED * saved_bytes(forward, weights) / probe_tokens


def group_memory(part: str, attentions: Sequence[str], seq_len: int, dtype: torch.dtype) -> tuple[int, float]:
    """(fixed bytes, bytes per token) of `measure_group` on CPU: every attention's weights resident, one
    attention's step (and gradients) at a time."""
    fixed, per_token, weights = 0, 0.0, 0
    probe = min(seq_len, 16)
    for name in attentions:
        # Shapes only at full length (buffers such as RoPE tables grow with it); a short probe runs for real.
        with torch.device("meta"):
            full = build_part(part, name, seq_len, torch.device("meta"), dtype)
        full_bytes = sum(t.nbytes for t in [*full.parameters(), *full.buffers()])
        case = _Case(part, name, probe, 1, torch.device("cpu"), dtype)
        _, t = train_step_memory(case.module, lambda c=case: c.module(c.x).float().sum(), probe)
        fixed, per_token = max(fixed, full_bytes), max(per_token, t)  # the gradients of the one stepping
        weights += full_bytes
    return fixed + weights, per_token


def check_memory(fixed: int, per_token: float, tokens: int, what: str, fix: Callable[[int], str]) -> None:
    """ValueError (one line) if `fixed + per_token * tokens` bytes exceed the available RAM; `fix` gets the
    most tokens that would fit and names the flag that makes it fit."""
    need, free = fixed + per_token * tokens, available_memory()
    if free is not None and need > free:
        raise ValueError(f"{what} needs about {gib(need)} of memory (estimated), {gib(free)} is available; "
                         f"{fix(max(0, int((free - fixed) / per_token)) if per_token else 0)}")


def measure_group(
    part: str, attentions: Sequence[str], seq_len: int, batch: int, device: torch.device, dtype: torch.dtype,
    warmup: int, repeats: int,
) -> list[Row]:
    """Rows of every attention of one part at (batch, seq_len), timed interleaved; speed-ups are filled in later.

    Peak memory (CUDA) is measured first, one attention at a time with nothing else resident;
    then all attentions are built and their forward, and then forward+backward, passes timed in turns.
    """
    peaks = {}
    for name in attentions:
        case = _Case(part, name, seq_len, batch, device, dtype)
        peaks[name] = peak_memory_mib((case.forward, case.forward_backward), device, warmup)
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    cases = {name: _Case(part, name, seq_len, batch, device, dtype) for name in attentions}
    fwd = time_interleaved({n: c.forward for n, c in cases.items()}, device, warmup, repeats)
    fwd_bwd = time_interleaved({n: c.forward_backward for n, c in cases.items()}, device, warmup, repeats)
    rows = []
    for name in attentions:
        hq, hkv = layout(name, seq_len).heads
        rows.append(Row(part, name, seq_len, batch, hq, hkv, statistics.median(fwd[name]),
                        statistics.median(fwd_bwd[name]), peaks[name],
                        fwd_s_min=min(fwd[name]), fwd_s_max=max(fwd[name]),
                        fwd_bwd_s_min=min(fwd_bwd[name]), fwd_bwd_s_max=max(fwd_bwd[name])))
    return rows




def add_speedups(rows: list[Row]) -> list[Row]:
    """Fill speed-ups vs the MHA row with the same part and length, ideal speed-ups and efficiencies."""
    mha = {(r.part, r.seq_len): r for r in rows if r.attention == "mha"}
    for r in rows:
        base = mha.get((r.part, r.seq_len))
        r.ideal_score = SPARSE_QUERY_LAYOUT.n_head / r.n_query_heads
        mha_flops = attention_flops_per_token(layout("mha", r.seq_len))
        r.ideal_flops = mha_flops.total / attention_flops_per_token(layout(r.attention, r.seq_len)).total
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
    """Measure every part x attention x length with batch = max(1, tokens // length); return rows with speed-ups.

    At each part and length the attentions are timed in turns (see `time_interleaved`).
    """
    dev, dt = torch.device(device), DTYPES[dtype]
    rows = []
    for part in parts:
        for seq_len in seq_lens:
            batch = max(1, tokens // seq_len)
            if dev.type == "cpu":  # a CUDA allocation that does not fit raises; the kernel kills a CPU process
                fixed, per_token = group_memory(part, list(dict.fromkeys(attentions)), seq_len, dt)
                check_memory(fixed, per_token, batch * seq_len, f"the {part} at T={seq_len} x batch {batch}",
                             lambda fit, t=seq_len: f"pass --tokens {fit // t * t} or less" if fit >= t
                             else f"pass --seq-lens shorter than {t}")
            group = measure_group(part, list(dict.fromkeys(attentions)), seq_len, batch, dev, dt, warmup, repeats)
            for row in group:
                if log:
                    log(f"{part} {row.attention} T={seq_len} B={batch}: fwd {row.fwd_s:.4g}s "
                        f"({row.fwd_s_min:.4g}-{row.fwd_s_max:.4g}) fwd+bwd {row.fwd_bwd_s:.4g}s "
                        f"({row.fwd_bwd_s_min:.4g}-{row.fwd_bwd_s_max:.4g})")
            rows += group
    return add_speedups(rows)


def add_timing_arguments(p: ToolParser) -> None:
    """--repeats, --warmup, --device, --dtype and --threads: how every benchmark times, the same way."""
    p.add_argument("--repeats", type=int, default=3, help="timed rounds; the median is reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before timing")
    p.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device (default: cuda if available)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on CUDA, float32 otherwise")
    p.add_argument("--threads", type=int, default=min(torch.get_num_threads(), cpu_cores()),
                   help="torch intra-op threads, pinned for the whole run, at most this process's CPU cores "
                        "(default: torch's at start)")


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options of `lit-attn bench` (a jsonargparse Namespace)."""
    p = ToolParser(
        prog="lit-attn bench",
        description="Time one attention layer of the Sparse Query Attention paper's layout (and optionally its "
        "full GPT) per attention and sequence length, with tokens per step constant; print a Markdown table, "
        "write bench.csv and bench.png.",
    )
    p.add_argument("--attention", type=str, default=",".join(PRESETS),
                   help="comma-separated attention names, each optionally with its options as JSON, e.g. "
                        "mha,mha{\"window\": 256},gated_deltanet (default: the seven grouped ones; include mha for "
                        "speed-ups)")
    p.add_argument("--seq-lens", type=str, default="256,1024,4096",
                   help="comma-separated sequence lengths")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per step; batch = max(1, tokens // T)")
    add_timing_arguments(p)
    p.add_argument("--model", action="store_true", help="also time the full GPT of that layout (8 layers, vocab 10000)")
    p.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for bench.csv, bench.png, bench.md")
    p.add_argument("--overwrite", action="store_true", help="replace those files if --out already holds them")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    args.attention = split_attentions(args.attention)
    try:
        args.seq_lens = [int(t) for t in csv_list(args.seq_lens)]
    except ValueError:
        p.error(f"--seq-lens={args.seq_lens!r} is invalid: expected comma-separated integers, e.g. 512,1024")
    if not args.attention:
        p.error("--attention needs at least one name, e.g. --attention mha,sqa")
    if args.repeats < 1 or args.warmup < 0 or args.tokens < 1 or not args.seq_lens or min(args.seq_lens) < 1:
        p.error("--repeats and --tokens and every --seq-lens value must be >= 1, --warmup >= 0")
    for entry in args.attention:
        try:
            layout(entry, max(args.seq_lens))
        except ValueError as e:
            p.error(str(e).strip().splitlines()[0])
    try:
        check_threads(args.threads)
        check_device(args.device)
        check_outputs(args.out, OUTPUTS, args.overwrite)
    except ValueError as e:
        p.error(str(e))
    if args.dtype is None:
        args.dtype = "bfloat16" if torch.device(args.device).type == "cuda" else "float32"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark from the command line; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    parts = ("layer", "model") if args.model else ("layer",)
    torch.set_num_threads(args.threads)
    try:
        rows = run_benchmark(args.attention, args.seq_lens, args.tokens, parts, args.device, args.dtype,
                             args.warmup, args.repeats, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, RuntimeError) as e:  # an unknown attention or device, a size the attention refuses
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2
    table = markdown_table(rows)
    header = (f"device {args.device}, dtype {args.dtype}, {args.tokens} tokens/step, median of {args.repeats} "
              f"rounds after {args.warmup} warm-up, attentions timed in turns, {torch.get_num_threads()} threads; "
              f"speed-ups vs MHA; ideal = H/Hq (score part); eff = speed-up / (H/Hq); "
              f"ideal FLOPs = MHA/variant total attention FLOPs")
    print(header + "\n\n" + table)
    return write_outputs(args.out, {"bench.md": lambda path: path.write_text(header + "\n\n" + table + "\n"),
                                    "bench.csv": lambda path: write_csv(rows, path),
                                    "bench.png": lambda path: write_plot(rows, path)})

if __name__ == "__main__":
    raise SystemExit(main())
