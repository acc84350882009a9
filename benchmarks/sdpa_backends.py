"""Which scaled_dot_product_attention kernel each attention variant runs, from the PyTorch profiler.

For every grouped variant (and noq) one attention layer runs forward + backward under
torch.profiler; the table lists the aten SDPA kernels that ran forward and backward, any op
that would materialise repeated K/V heads (repeat, repeat_interleave, index_select), and the
median time of forward + backward. CPU in float32 by default; on CUDA in bf16 autocast.
The timed passes are interleaved across the variants (every repetition runs each variant once,
in an order that alternates), with torch's threads pinned (--threads); the range is min-max.

    python -m benchmarks.sdpa_backends                            # CPU, d=256, 16 heads, T=1024
    python -m benchmarks.sdpa_backends --device cuda --batch 8    # GPU (bf16): expect flash everywhere
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench import train_step_memory
from lit_attn.attention import build_attention
from lit_attn.cli.console import quiet_native_stderr
from lit_attn.cli.toolcli import ToolParser, available_memory, check_device, check_threads, gib

VARIANTS = ("mha", "gqa", "mqa", "sqa", "ssqa", "xsqa", "xsmqa", "noq")
REPEAT_OPS = ("aten::repeat", "aten::repeat_interleave", "aten::index_select")


def short(name: str) -> str:
    return name.removeprefix("aten::_scaled_dot_product_").removeprefix("aten::") or name


def sdpa_kernels(events, backward: bool) -> list[str]:
    """aten SDPA implementation ops (not the dispatcher entry point) of one direction."""
    names = {e.key for e in events if e.key.startswith("aten::_scaled_dot_product") or e.key.startswith("aten::_flash")
             or e.key.startswith("aten::_efficient")}
    return sorted(short(n) for n in names if n.endswith("_backward") == backward)


def check_memory(args) -> None:
    """ValueError if the variants' layers at --batch x --seq-len would not fit in the free RAM (CPU only)."""
    fixed, per_token, probe = 0, 0.0, min(args.seq_len, 16)
    for name in VARIANTS:
        attn = build_attention(name, None, n_embd=args.n_embd, n_head=args.n_head, block_size=probe)
        x = torch.randn(1, probe, args.n_embd, requires_grad=True)
        f, t = train_step_memory(attn, lambda attn=attn, x=x: attn(x).sum(), probe)
        # Every variant keeps its layer, its input and that input's gradient between the timed passes.
        fixed, per_token = fixed + f + 2 * 4 * args.batch * args.seq_len * args.n_embd, max(per_token, t)
    need, free = fixed + per_token * args.batch * args.seq_len, available_memory()
    if free is not None and need > free:
        raise ValueError(f"batch {args.batch} x T={args.seq_len} needs about {gib(need)} of memory (estimated), "
                         f"{gib(free)} is available; pass a smaller --batch or --seq-len")


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options (a jsonargparse Namespace), checked: sizes, device, memory on CPU."""
    parser = ToolParser(prog="python -m benchmarks.sdpa_backends", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=str, default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--n-embd", type=int, default=256, help="model width d")
    parser.add_argument("--n-head", type=int, default=16, help="heads H (a divisor of d)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence T")
    parser.add_argument("--batch", type=int, default=2, help="sequences per pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward+backward passes per variant (median)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch intra-op threads, pinned for the whole run (default: torch's at start)")
    args = parser.parse_args(argv)
    if min(args.n_embd, args.n_head, args.seq_len, args.batch, args.repeats, args.threads) < 1:
        parser.error("--n-embd, --n-head, --seq-len, --batch, --repeats and --threads must be >= 1")
    try:
        check_threads(args.threads)
        check_device(args.device)
        for name in VARIANTS:  # every variant's own constraints on the sizes (e.g. heads dividing d)
            build_attention(name, None, n_embd=args.n_embd, n_head=args.n_head, block_size=1)
        if torch.device(args.device).type == "cpu":  # CUDA raises when full; the kernel kills a CPU process
            check_memory(args)
    except ValueError as e:
        parser.error(str(e).strip().splitlines()[0])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; return 0, or exit 2 after a one-line error."""
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = "bf16 autocast" if device.type == "cuda" else "float32"
    print(f"torch {torch.__version__}, {device} ({dtype}), d={args.n_embd}, {args.n_head} heads, "
          f"T={args.seq_len}, batch {args.batch}, {torch.get_num_threads()} threads (pinned)")

    steps, found = {}, {}
    for name in VARIANTS:
        attn = build_attention(name, None, n_embd=args.n_embd, n_head=args.n_head, block_size=args.seq_len).to(device)
        x = torch.randn(args.batch, args.seq_len, args.n_embd, device=device, requires_grad=True)

        def step(attn=attn, x=x):
            with amp:
                y = attn(x)
            y.float().sum().backward()

        step()  # warm-up
        with quiet_native_stderr(), profile(activities=activities) as prof:  # the profiler's start/stop lines
            step()
            sync()
        events = prof.key_averages()
        repeats = sorted({short(e.key) for e in events if e.key in REPEAT_OPS}) or ["none"]
        steps[name] = step
        found[name] = (getattr(attn, "n_query_heads", args.n_head), getattr(attn, "n_kv_heads", args.n_head),
                       sdpa_kernels(events, False), sdpa_kernels(events, True), repeats)

    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for rep in range(args.repeats):
        for name in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
            sync()
            t0 = time.perf_counter()
            steps[name]()
            sync()
            times[name].append(time.perf_counter() - t0)

    print(f"{'attention':>9} {'Hq':>3} {'Hkv':>3}  {'forward kernel':<34} {'backward kernel':<43} {'K/V repeat':<10} "
          f"{'fwd+bwd ms':>10} {'range ms':>13}")
    for name in VARIANTS:
        hq, hkv, fwd, bwd, repeats = found[name]
        ms = [t * 1e3 for t in times[name]]
        print(f"{name:>9} {hq:>3} {hkv:>3}  {', '.join(fwd) or '-':<34} {', '.join(bwd) or '-':<43} "
              f"{', '.join(repeats):<10} {statistics.median(ms):>10.1f} {f'{min(ms):.1f}-{max(ms):.1f}':>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
