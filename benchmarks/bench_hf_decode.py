"""Cached greedy decoding: lit-attn's `generate` vs Hugging Face transformers' `generate`, on the same weights.

The model is GPT-2-shaped (`--layout gpt2`: nanoGPT's character model, 6 layers, width 384, 6 heads,
vocab 65, block 512; `tiny` is a seconds-long check), randomly initialised from a fixed seed and exported
with `lit_attn.hf.to_hf_model`. Per batch size both continue the same random prompt: HF with
`generate(do_sample=False, max_new_tokens=N, min_new_tokens=N)`, lit-attn with `generate(N, temperature=0)`,
timed in turns (benchmarks.bench.time_interleaved) with torch's threads pinned. Time to first token is a
generation of one token (the prompt's prefill and one step), timed the same way. Printed per batch:
tokens/s and time to first token (median, min-max over the rounds), the ratio lit-attn / HF tokens/s
(median and range of the per-round ratios), whether the tokens are equal, and the load average before and
after (the benchmark's own threads count in it; above them the machine is busy with other work). With
--out DIR the rows also go to DIR/hf_decode.csv (which `lit-attn cost-card --hf-decode` reads as the reference
for its decode column) and the report to DIR/hf_decode.md.

    python -m benchmarks.bench_hf_decode --threads 1 --repeats 5 --out hf_decode_out
"""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench import DTYPES, add_timing_arguments, time_interleaved
from lit_attn.cli.toolcli import ToolParser, check_device, check_outputs, check_threads, csv_list, write_outputs
from lit_attn.config import GPTConfig
from lit_attn.transformer import Transformer

LAYOUTS = {
    "gpt2": GPTConfig(vocab_size=65, n_layer=6, n_embd=384, n_head=6, block_size=512),
    "tiny": GPTConfig(vocab_size=32, n_layer=2, n_embd=32, n_head=4, block_size=64),
}


@dataclasses.dataclass
class Row:
    """One batch size: per-round seconds of each side, and how their tokens compare."""

    batch: int
    new_tokens: int
    lit: list[float]  # seconds of one generation, per round
    hf: list[float]
    lit_first: list[float]  # seconds to the first token, per round
    hf_first: list[float]
    equal: bool
    first_difference: int | None  # the first new-token index where they differ
    load: tuple[float, float]  # 1-minute load average before and after

    def tokens_per_s(self, times: list[float]) -> list[float]:
        return [self.batch * self.new_tokens / t for t in times]

    @property
    def ratios(self) -> list[float]:
        """lit-attn / HF tokens/s of each round (both were timed in it, in turns)."""
        return [h / t for t, h in zip(self.lit, self.hf)]


def build(layout: str, device: str = "cpu", dtype: str = "float32") -> tuple[Transformer, torch.nn.Module]:
    """(lit-attn model, its transformers export): seeded random weights, in eval mode."""
    from lit_attn.hf import to_hf_model

    torch.manual_seed(0)
    model = Transformer(LAYOUTS[layout]).to(device=device, dtype=DTYPES[dtype]).eval()
    return model, to_hf_model(model)


def generators(model: Transformer, hf: torch.nn.Module, idx: torch.Tensor, n: int,
               outputs: dict[str, torch.Tensor]) -> dict[str, Callable[[], None]]:
    """The two timed calls, each generating n tokens after idx and keeping them in `outputs`."""
    prompt = idx.size(1)
    mask = torch.ones_like(idx)

    def lit() -> None:
        outputs["lit-attn"] = model.generate(idx, n, temperature=0)[:, prompt:]

    @torch.no_grad()
    def hugging_face() -> None:
        out = hf.generate(idx, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                          pad_token_id=0)
        outputs["HF"] = out[:, prompt:]

    return {"lit-attn": lit, "HF": hugging_face}


def run_batch(model: Transformer, hf: torch.nn.Module, batch: int, prompt: int, new_tokens: int,
              warmup: int, repeats: int) -> Row:
    """Time both sides at one batch size, in turns; compare their tokens."""
    device = model.tok_emb.weight.device
    idx = torch.randint(0, model.config.vocab_size, (batch, prompt), device=device)
    load = os.getloadavg()[0]
    outputs: dict[str, torch.Tensor] = {}
    first = time_interleaved(generators(model, hf, idx, 1, outputs), device, warmup, repeats)
    full = time_interleaved(generators(model, hf, idx, new_tokens, outputs), device, warmup, repeats)
    differs = (outputs["lit-attn"] != outputs["HF"]).any(0).nonzero()
    return Row(batch, new_tokens, full["lit-attn"], full["HF"], first["lit-attn"], first["HF"], len(differs) == 0,
               int(differs[0, 0]) if len(differs) else None, (load, os.getloadavg()[0]))


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def report(row: Row, threads: int) -> str:
    """The lines printed for one batch size."""
    lines = [f"batch {row.batch}: lit-attn / HF tokens/s {_spread(row.ratios, '.2f')}; tokens "
             + ("equal" if row.equal else f"DIFFER from new token {row.first_difference}")]
    for name, times, first in (("lit-attn", row.lit, row.lit_first), ("HF", row.hf, row.hf_first)):
        lines.append(f"  {name:8} {_spread(row.tokens_per_s(times), ',.0f')} tokens/s, first token "
                     f"{_spread([t * 1e3 for t in first], '.1f')} ms")
    busy = max(row.load) > threads + 0.5
    lines.append(f"  load average {row.load[0]:.2f} before, {row.load[1]:.2f} after, on {os.cpu_count()} CPUs"
                 + (f": busy (more than this benchmark's {threads} threads)" if busy else ""))
    return "\n".join(lines)


CSV_COLUMNS = ("layout", "device", "dtype", "threads", "batch", "prompt", "new_tokens", "lit_tokens_per_sec",
               "hf_tokens_per_sec", "ratio", "ratio_min", "ratio_max", "tokens_equal", "load_before", "load_after")


def write_csv(rows: Sequence[Row], args: Any, path: Path) -> None:
    """One line per batch size: medians of tokens/s and of the per-round ratios, their range, the load."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            writer.writerow([args.layout, args.device, args.dtype, args.threads, r.batch, args.prompt, r.new_tokens,
                             round(statistics.median(r.tokens_per_s(r.lit)), 1),
                             round(statistics.median(r.tokens_per_s(r.hf)), 1), round(statistics.median(r.ratios), 3),
                             round(min(r.ratios), 3), round(max(r.ratios), 3), r.equal, *(round(x, 2) for x in r.load)])


def parse_args(argv: Sequence[str] | None = None):
    p = ToolParser(prog="python -m benchmarks.bench_hf_decode", description="Time cached greedy decoding, "
                   "lit-attn vs Hugging Face transformers' generate, on the same GPT-2-shaped weights.")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="gpt2",
                   help="gpt2: 6 layers, width 384, vocab 65, block 512; tiny: a quick check")
    p.add_argument("--batches", type=str, default="1,8", help="comma-separated batch sizes")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=256, help="generated tokens")
    add_timing_arguments(p)
    p.add_argument("--out", type=Path | None, default=None,
                   help="also write hf_decode.csv and hf_decode.md into this directory")
    p.add_argument("--overwrite", action="store_true", help="replace the files if --out already holds them")
    p.set_defaults(repeats=5)
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        args.batches = [int(b) for b in csv_list(args.batches)]
    except ValueError:
        p.error(f"--batches {args.batches!r}: expected comma-separated integers, e.g. 1,8")
    try:
        check_threads(args.threads)
        check_device(args.device)
        if args.out is not None:
            check_outputs(args.out, OUTPUTS, args.overwrite)
    except ValueError as e:
        p.error(str(e))
    block = LAYOUTS[args.layout].block_size
    if not args.batches or min(args.batches) < 1:
        p.error("--batches needs integers >= 1, e.g. 1,8")
    if not (args.prompt >= 1 and args.new_tokens >= 1 and args.prompt + args.new_tokens <= block):
        p.error(f"--prompt and --new-tokens must be >= 1 with prompt + new tokens <= block size {block}")
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1, --warmup >= 0")
    args.dtype = args.dtype or ("bfloat16" if torch.device(args.device).type == "cuda" else "float32")
    return args


OUTPUTS = ("hf_decode.csv", "hf_decode.md")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        model, hf = build(args.layout, args.device, args.dtype)
    except ValueError as e:  # transformers missing (the message says how to install it)
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    lines = [f"{args.layout} layout, device {args.device}, dtype {args.dtype}, {torch.get_num_threads()} threads, "
             f"prompt {args.prompt}, {args.new_tokens} new tokens, greedy; median (min-max) of {args.repeats} "
             f"rounds after {args.warmup} warm-up, the two timed in turns"]
    print(lines[0], flush=True)
    rows = []
    for batch in args.batches:
        rows.append(run_batch(model, hf, batch, args.prompt, args.new_tokens, args.warmup, args.repeats))
        lines.append(report(rows[-1], args.threads))
        print(lines[-1], flush=True)
    if args.out is None:
        return 0
    return write_outputs(args.out, {"hf_decode.csv": lambda path: write_csv(rows, args, path),
                                    "hf_decode.md": lambda path: path.write_text("\n".join(lines) + "\n")})


if __name__ == "__main__":
    raise SystemExit(main())
