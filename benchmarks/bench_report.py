"""Output of the attention benchmark: its row type, and a Markdown table, a CSV and a log-log PNG plot of rows.

Imports go one way: `benchmarks.bench` measures and imports this module; this module imports nothing of it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path


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
    fwd_s_min: float = float("nan")  # spread of the timed repetitions (fwd_s, fwd_bwd_s are their medians)
    fwd_s_max: float = float("nan")
    fwd_bwd_s_min: float = float("nan")
    fwd_bwd_s_max: float = float("nan")


TABLE_HEADER = (
    "part", "attention", "T", "batch", "Hq", "Hkv", "fwd s", "fwd+bwd s",
    "speed-up fwd", "speed-up fwd+bwd", "ideal H/Hq", "ideal FLOPs", "eff fwd", "eff fwd+bwd", "peak MiB",
)


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits}f}"


def markdown_table(rows: Sequence[Row]) -> str:
    """Rows as a Markdown table; speed-ups are vs MHA at the same part and T, efficiency = speed-up / (H/Hq)."""
    lines = [
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(TABLE_HEADER))) + "|",
    ]
    for r in rows:
        cells = [
            r.part, r.attention, str(r.seq_len), str(r.batch), str(r.n_query_heads), str(r.n_kv_heads),
            f"{r.fwd_s:.4g}", f"{r.fwd_bwd_s:.4g}", _num(r.speedup_fwd), _num(r.speedup_fwd_bwd),
            _num(r.ideal_score), _num(r.ideal_flops), _num(r.eff_fwd), _num(r.eff_fwd_bwd), _num(r.peak_mem_mib, 4),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """One CSV line per row, columns named as the Row fields; missing peak memory is left empty."""
    names = [f.name for f in fields(Row)]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in asdict(r).items()})


def write_plot(rows: Sequence[Row], path: Path) -> None:
    """Log-log PNG of time vs sequence length, one line per attention; a panel per part and per fwd / fwd+bwd."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers and in tests
    import matplotlib.pyplot as plt

    parts = list(dict.fromkeys(r.part for r in rows))
    fig, axes = plt.subplots(len(parts), 2, figsize=(11, 4 * len(parts)), squeeze=False)
    for i, part in enumerate(parts):
        for j, (attr, label) in enumerate((("fwd_s", "forward"), ("fwd_bwd_s", "forward+backward"))):
            ax = axes[i][j]
            for name in dict.fromkeys(r.attention for r in rows if r.part == part):
                pts = sorted((r.seq_len, getattr(r, attr)) for r in rows if r.part == part and r.attention == name)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T (tokens per step constant)")
            ax.set_ylabel("seconds per step (median)")
            ax.set_title(f"{part}: {label}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
