"""Output of the decoding benchmark: its row types, and Markdown tables, a CSV and PNG plots of rows.

Imports go one way: `benchmarks.bench_decode` measures and imports this module; this module imports nothing of it.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path


@dataclasses.dataclass
class DecodeRow:
    """One attention at one batch and context."""

    attention: str
    batch: int
    context: int
    n_query_heads: int
    n_kv_heads: int
    prefill_s: float
    prefill_s_min: float
    prefill_s_max: float
    decode_s_per_token: float
    decode_s_per_token_min: float
    decode_s_per_token_max: float
    decode_tokens_per_sec: float
    state_bytes_analytic: int  # one sequence's decoding state after `context` tokens, all layers (registry)
    state_bytes_measured: float  # the same from the buffers: their bytes / batch
    peak_mib: float | None  # None off CUDA
    decode_speedup: float = float("nan")  # vs MHA at the same batch and context
    # How the state grows (lit_attn.analytic.decode_state_kind): per token, window, fixed, mixed; "uncached": the
    # attention declares no state, each step recomputes the prefix.
    decoding: str = "per token"


@dataclasses.dataclass
class GenerateRow:
    """Greedy generation of one attention with and without the cache."""

    attention: str
    cached_s: float
    uncached_s: float
    speedup: float
    same_tokens: bool
    first_difference: int | None  # index of the first new token that differs


def _num(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def markdown_table(rows: Sequence[DecodeRow]) -> str:
    """Rows as a Markdown table; decode times are per token (median, and min-max over the rounds)."""
    header = ("attention", "batch", "T", "Hq", "Hkv", "prefill s", "decode ms/token", "min-max ms", "tokens/s",
              "decode speed-up vs mha", "decode state", "state B/seq analytic", "state B/seq measured", "peak MiB")
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for r in rows:
        cells = (r.attention, str(r.batch), str(r.context), str(r.n_query_heads), str(r.n_kv_heads),
                 _num(r.prefill_s), _num(r.decode_s_per_token * 1e3),
                 f"{_num(r.decode_s_per_token_min * 1e3, 3)}-{_num(r.decode_s_per_token_max * 1e3, 3)}",
                 f"{r.decode_tokens_per_sec:.1f}", _num(r.decode_speedup, 3), r.decoding,
                 f"{r.state_bytes_analytic:,}", f"{r.state_bytes_measured:,.0f}", _num(r.peak_mib))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[DecodeRow], path: Path) -> None:
    """One CSV line per row, columns named as the DecodeRow fields; missing peak memory is left empty."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[f.name for f in dataclasses.fields(DecodeRow)])
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in dataclasses.asdict(r).items()})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers and in tests
    import matplotlib.pyplot as plt

    return plt


def write_decode_plot(rows: Sequence[DecodeRow], decode_png: Path) -> None:
    """Decode tokens/s vs context, a line per attention and a panel per batch."""
    plt = _pyplot()

    batches = list(dict.fromkeys(r.batch for r in rows))
    names = list(dict.fromkeys(r.attention for r in rows))
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for name in names:
            pts = sorted((r.context, r.decode_tokens_per_sec) for r in rows if r.batch == batch and r.attention == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set(xlabel="context T (tokens in the cache)", ylabel="decode tokens/s (median)",
               title=f"batch {batch}")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(decode_png, dpi=100)
    plt.close(fig)


def write_cache_plot(rows: Sequence[DecodeRow], cache_png: Path) -> None:
    """One sequence's decode state bytes against the tokens it holds (T), a line per attention: rising for a K/V
    cache, flat past the window for a windowed one, flat for a recurrent state (0 for one without a state)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r.attention for r in rows):
        pts = sorted({(r.context, r.state_bytes_analytic) for r in rows if r.attention == name})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set(xlabel="tokens decoded so far, T (prompt + generated)",
           ylabel="decode state bytes per sequence (all layers)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(cache_png, dpi=100)
    plt.close(fig)


def generate_table(rows: Sequence[GenerateRow]) -> str:
    """Generate rows as a Markdown table."""
    lines = ["| attention | cached s | uncached s | speed-up | same tokens |", "|---|---:|---:|---:|---|"]
    for r in rows:
        same = "yes" if r.same_tokens else f"no (first differs at new token {r.first_difference})"
        lines.append(f"| {r.attention} | {r.cached_s:.4g} | {r.uncached_s:.4g} | {r.speedup:.2f} | {same} |")
    return "\n".join(lines)
