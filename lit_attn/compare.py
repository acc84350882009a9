"""Compare runs from their TensorBoard event files: `python -m lit_attn.compare RUN_DIR [RUN_DIR ...] [--out DIR]`.

Writes the Sparse Query Attention paper's style of table as Markdown (also printed) and CSV, and PNG plots of
validation loss vs step and vs wall time, one line per run. A metric a run did not log
is left blank.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .toolcli import ToolParser

# (column, CSV header, TensorBoard tags tried in order, Markdown format)
COLUMNS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("parameters", "parameters", ("params/total",), "{:,.0f}"),
    ("val loss", "val_loss", ("val/loss",), "{:.4f}"),
    ("val acc", "val_acc", ("val/acc",), "{:.4f}"),
    ("perplexity", "val_ppl", ("val/ppl",), "{:.2f}"),
    ("time/batch (s)", "time_per_batch_s", ("timing/time_per_batch", "train/time_per_batch"), "{:.4f}"),
    ("train time (s)", "train_time_s", ("timing/train_time",), "{:.2f}"),
    ("tokens/s", "tokens_per_sec", ("timing/tokens_per_sec", "train/tokens_per_sec"), "{:,.0f}"),
]
CURVE_TAG = "val/loss"


def _attention(run_dir: Path) -> str:
    """The run's attention name from hparams.yaml (top level) or config.yaml (model section); '' if neither has it."""
    for name, section in (("hparams.yaml", ()), ("config.yaml", ("model",)), ("config.yaml", ("model", "init_args"))):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            node: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            print(f"warning: {path} is not valid YAML ({type(e).__name__}); its attention is left blank",
                  file=sys.stderr)
            continue
        for key in section:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get("attention") if isinstance(node, dict) else None
        if isinstance(value, str) and value:
            return value
    return ""


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """One run's table row (final value of each metric, None if not logged) and its val-loss curve.

    Returns {"run", "attention", <CSV header>: float | None, ..., "curve": [(step, seconds since the
    run's first event, value), ...]}. When a tag was logged more than once at the same step (a
    resumed run), the latest write wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory not found: {run_dir}")
    row: dict[str, Any] = {"run": run_dir.name, "attention": _attention(run_dir), "curve": []}
    if not any(run_dir.glob("events.out.tfevents.*")):
        print(f"warning: {run_dir} has no TensorBoard event files; its row is blank", file=sys.stderr)
        row.update({header: None for _, header, _, _ in COLUMNS})
        return row
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))
    series = {tag: _by_step(acc.Scalars(tag)) for tag in tags}
    t0 = min((e.wall_time for tag in tags for e in acc.Scalars(tag)), default=0.0)
    for _, header, candidates, _ in COLUMNS:
        found = [series[t] for t in candidates if t in series and series[t]]
        row[header] = found[0][-1].value if found else None
    if row["parameters"] is not None:
        row["parameters"] = int(row["parameters"])
    row["curve"] = [(e.step, e.wall_time - t0, e.value) for e in series.get(CURVE_TAG, [])]
    return row


def _by_step(events: list[Any]) -> list[Any]:
    latest: dict[int, Any] = {}
    for e in sorted(events, key=lambda e: e.wall_time):
        latest[e.step] = e
    return [latest[s] for s in sorted(latest)]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown; missing values are blank."""
    head = ["run", "attention"] + [c[0] for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for r in rows:
        cells = [r["run"], r["attention"]]
        cells += ["" if r[header] is None else fmt.format(r[header]) for _, header, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The table as CSV with full-precision numbers; missing values are empty fields."""
    headers = ["run", "attention"] + [c[1] for c in COLUMNS]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(headers)
        for r in rows:
            writer.writerow(["" if r[h] is None else r[h] for h in headers])


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """val_loss_vs_step.png and val_loss_vs_time.png in `out`, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, x_index, xlabel in (("step", 0, "step"), ("time", 1, "wall time since the run's first event (s)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in rows:
            if r["curve"]:
                ax.plot([p[x_index] for p in r["curve"]], [p[2] for p in r["curve"]], marker=".", label=r["run"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss")
        ax.set_title(f"validation loss vs {name}")
        ax.grid(alpha=0.3)
        if any(r["curve"] for r in rows):
            ax.legend()
        path = out / f"val_loss_vs_{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def compare(run_dirs: list[str | Path], out: str | Path) -> tuple[list[dict[str, Any]], str]:
    """Read the runs, write compare.md, compare.csv and the plots into `out`; return (rows, Markdown)."""
    rows = [read_run(d) for d in run_dirs]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    (out / "compare.md").write_text(table, encoding="utf-8")
    write_csv(rows, out / "compare.csv")
    plot(rows, out)
    return rows, table


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options of `python -m lit_attn.compare` (a jsonargparse Namespace)."""
    p = ToolParser(prog="python -m lit_attn.compare", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (RUNS_DIR/RUN) holding event files")
    p.add_argument("--out", type=str, default="comparison",
                   help="output directory for compare.md/.csv and the PNGs")
    return p.parse_args(list(sys.argv[1:] if argv is None else argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the Markdown table and write the files; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    try:
        _, table = compare(args.run_dirs, args.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"wrote {Path(args.out) / 'compare.md'}, compare.csv, val_loss_vs_step.png, val_loss_vs_time.png",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
