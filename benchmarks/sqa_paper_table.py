"""The Sparse Query Attention write-up's published results beside a seeded comparison of the same variants.

The paper trained each variant once on Wikipedia on one L40S GPU; a seeded sweep here is typically a
scaled-down layout on a CPU. Absolute losses and times cannot be compared across those setups, so the
table puts side by side what can be: each variant's time per batch relative to MHA and its validation
loss minus MHA's.

    lit-attn sweep --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa --seeds 1,2,3 --prefix shake -- ...
    python -m benchmarks.sqa_paper_table runs/shake-compare/stats.csv
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import NamedTuple

from lit_attn.cli.toolcli import ToolParser, check_output_file


class PaperResult(NamedTuple):
    val_loss: float
    val_acc: float
    s_per_batch: float  # 1x L40S, batch 128, context 1024, bf16


# The write-up's table (accuracies are given there as "~77.35%"-style approximations).
PAPER = {
    "mha": PaperResult(1.1976, 0.7735, 0.7173),
    "gqa": PaperResult(1.2177, 0.7712, 0.6877),
    "mqa": PaperResult(1.2497, 0.7664, 0.6947),
    "sqa": PaperResult(1.2272, 0.7697, 0.6417),
    "ssqa": PaperResult(1.2201, 0.7705, 0.6468),
    "xsqa": PaperResult(1.2428, 0.7674, 0.6251),
    "xsmqa": PaperResult(1.2815, 0.7622, 0.6250),
}
REFERENCE = "mha"


def read_stats(path: Path) -> dict[str, dict[str, str]]:
    """The rows of a `compare` stats.csv by attention; ValueError if it is not one grouped by attention with mha."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or "attention" not in rows[0]:
        raise ValueError(f"{path} is not a stats.csv grouped by attention; write one with "
                         "lit-attn compare RUN_DIRS (several seeds per attention)")
    by_name = {r["attention"]: r for r in rows}
    if REFERENCE not in by_name:
        raise ValueError(f"{path} has no {REFERENCE} runs; the ratios are relative to {REFERENCE}: sweep it too")
    if by_name[REFERENCE]["reference"] != REFERENCE:
        raise ValueError(f"{path} was paired against {by_name[REFERENCE]['reference']}, not {REFERENCE}; "
                         f"rerun compare with --reference {REFERENCE}")
    return by_name


def _f(cell: str, fmt: str) -> str:
    return fmt.format(float(cell)) if cell not in ("", None) else ""


def table(stats: dict[str, dict[str, str]]) -> str:
    """Markdown: per variant in the paper, its published figures and ratios beside the measured ones."""
    ref = PAPER[REFERENCE]
    ours_ref_time = float(stats[REFERENCE]["time_per_batch_median_s"] or "nan")
    lines = ["| attention | paper val loss | paper val acc | paper s/batch | paper time vs MHA | paper Δ loss vs MHA "
             "| runs | val loss (mean ± std) | val acc | time/batch (s, median) | time vs MHA | Δ loss vs MHA [95% CI] "
             "| verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, paper in PAPER.items():
        row = stats.get(name)
        published = (f"| {name} | {paper.val_loss:.4f} | {paper.val_acc:.2%} | {paper.s_per_batch:.4f} | "
                     f"{paper.s_per_batch / ref.s_per_batch:.3f} | {paper.val_loss - ref.val_loss:+.4f} |")
        if row is None:
            lines.append(published + " 0 |  |  |  |  |  | not run |")
            continue
        time = row["time_per_batch_median_s"]
        ratio = f"{float(time) / ours_ref_time:.3f}" if time else ""
        diff = ("" if name == REFERENCE or not row["val_loss_diff_mean"] else
                f"{float(row['val_loss_diff_mean']):+.4f}" + (
                    f" [{float(row['val_loss_diff_ci_low']):+.4f}, {float(row['val_loss_diff_ci_high']):+.4f}]"
                    if row["val_loss_diff_ci_low"] else ""))
        lines.append(published + f" {row['n_runs']} | {_f(row['val_loss_mean'], '{:.4f}')}"
                     f"{_f(row['val_loss_std'], ' ± {:.4f}')} | {_f(row['val_acc_mean'], '{:.2%}')} | "
                     f"{_f(time, '{:.4f}')} | {ratio} | {diff} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print (and with --out write) the table; return 0, or 2 after a one-line error."""
    parser = ToolParser(prog="python -m benchmarks.sqa_paper_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("stats", type=str, help="stats.csv written by lit-attn compare")
    parser.add_argument("--out", type=str | None, default=None,
                        help="also write the table to this Markdown file (default: print only)")
    parser.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    args = parser.parse_args(argv)
    path = Path(args.stats)
    try:
        if not path.is_file():
            raise ValueError(f"{path} is not a file; give the stats.csv that lit-attn compare wrote")
        if args.out:
            check_output_file(Path(args.out), args.overwrite)
        stats = read_stats(path)
    except (UnicodeDecodeError, csv.Error) as e:
        return _error(f"{path} is not a readable CSV ({e}); give the stats.csv that lit-attn compare wrote")
    except ValueError as e:
        return _error(str(e))
    try:
        text = table(stats)
    except KeyError as e:
        return _error(f"{path} lacks the column {e}; write it again with this version of lit-attn compare")
    except ValueError as e:
        return _error(f"{path} has a cell that is not a number ({e}); write it again with lit-attn compare")
    print(text, end="")
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as e:
            return _error(f"cannot write --out {args.out}: {e.strerror or e}")
    return 0


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
