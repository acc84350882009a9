"""Compare runs from their TensorBoard event files: `python -m lit_attn.compare RUN_DIR [RUN_DIR ...] [--out DIR]`.

Writes the Sparse Query Attention paper's style of table as Markdown (also printed) and CSV, and PNG plots of
validation loss vs step and vs time, one line per run. A metric a run did not log
is left blank.
"""

from __future__ import annotations

import bisect
import csv
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import yaml

from .toolcli import ToolParser

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (column, CSV header, TensorBoard tags tried in order, Markdown format). The whole_run/* scalars of the run's
# HParams record come first; older runs logged hp/*, or params/total and timing/*, instead.
COLUMNS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("parameters", "parameters", ("whole_run/n_params", "hp/n_params", "params/total"), "{:,.0f}"),
    ("val loss", "val_loss", ("val/loss", "whole_run/val_loss", "hp/val_loss"), "{:.4f}"),
    ("val acc", "val_acc", ("val/acc", "whole_run/val_acc", "hp/val_acc"), "{:.4f}"),
    ("perplexity", "val_ppl", ("val/ppl",), "{:.2f}"),
    ("time/batch (s)", "time_per_batch_s",
     ("whole_run/time_per_batch", "hp/time_per_batch", "timing/time_per_batch", "train/time_per_batch"), "{:.4f}"),
    ("train time (s)", "train_time_s", ("whole_run/train_time", "hp/train_time", "timing/train_time"), "{:.2f}"),
    ("tokens/s", "tokens_per_sec",
     ("whole_run/tokens_per_sec", "hp/tokens_per_sec", "timing/tokens_per_sec", "train/tokens_per_sec"), "{:,.0f}"),
]
CURVE_TAG = "val/loss"
# Seconds of training (validations and what follows them excluded): logged beside every val/loss
# point, or (older runs) Lightning's training clock logged with the step metrics.
TRAIN_CLOCK_TAGS = ("val/train_time", "train/time")
LOSS_LABEL = "val loss (nats/token)"  # the model's loss is cross-entropy with the natural log, per target token
# time axis -> (axis label, title's name for it)
TIME_LABELS = {
    "train": ("training time, excl. validation (s)", "training time"),
    "wall": ("wall time since the run's first event, incl. validation (s)", "wall time"),
}


class CurvePoint(NamedTuple):
    """One validation: its step, the run's training time and wall time then (s), and the loss (nats/token)."""

    step: int
    train_time: float | None  # None when the run has no training clock (TRAIN_CLOCK_TAGS)
    wall_time: float
    loss: float


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

    Returns {"run", "attention", <CSV header>: float | None, ..., "curve": [CurvePoint, ...]}. Event
    files anywhere under `run_dir` are read (the whole_run/* scalars are in a subdirectory). When a tag
    was logged more than once at the same step (a resumed run), the latest write wins.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory not found: {run_dir}")
    row: dict[str, Any] = {"run": run_dir.name, "attention": _attention(run_dir), "curve": []}
    series = _scalars(run_dir)
    if not series:
        print(f"warning: {run_dir} has no TensorBoard scalars; its row is blank", file=sys.stderr)
        row.update({header: None for _, header, _, _ in COLUMNS})
        return row
    for _, header, candidates, _ in COLUMNS:
        found = [series[t] for t in candidates if series.get(t)]
        row[header] = found[0][-1].value if found else None
    if row["parameters"] is not None:
        row["parameters"] = int(row["parameters"])
    t0 = min(e.wall_time for events in series.values() for e in events)
    clock = _training_clock(series)
    row["curve"] = [CurvePoint(e.step, None if clock is None else clock(e.step), e.wall_time - t0, e.value)
                    for e in series.get(CURVE_TAG, [])]
    return row


def _scalars(run_dir: Path) -> dict[str, list[Any]]:
    """Every scalar tag of the event files under `run_dir` (all directories merged), by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    merged: dict[str, list[Any]] = defaultdict(list)
    for directory in sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            merged[tag] += acc.Scalars(tag)
    return {tag: _by_step(events) for tag, events in merged.items()}


def _by_step(events: list[Any]) -> list[Any]:
    latest: dict[int, Any] = {}
    for e in sorted(events, key=lambda e: e.wall_time):
        latest[e.step] = e
    return [latest[s] for s in sorted(latest)]


def _training_clock(series: dict[str, list[Any]]) -> Callable[[int], float] | None:
    """step -> seconds of training up to the end of that step's batch, or None if the run has no clock.

    Read from the first of TRAIN_CLOCK_TAGS the run has: exact at its logged steps (every validation),
    linear in steps in between. Its anchors: 0 s
    before the first batch (step -1, as batch n is logged at step n - 1) and the total training time
    (whole_run/train_time, or hp/ or timing/train_time), which the HParams record logs at the number of batches.
    """
    logged = next((series[tag] for tag in TRAIN_CLOCK_TAGS if series.get(tag)), None)
    if not logged:
        return None
    points = {-1: 0.0} | {e.step: e.value for e in logged}
    totals = ("whole_run/train_time", "hp/train_time", "timing/train_time")
    total = next((series[t][-1] for t in totals if series.get(t)), None)
    if total is not None and total.step - 1 > max(points):
        points[total.step - 1] = total.value
    steps = sorted(points)

    def at(step: int) -> float:
        if step in points:
            return points[step]
        # The interval around `step`; past the last reading, the last interval's pace.
        i = min(max(bisect.bisect_left(steps, step), 1), len(steps) - 1)
        a, b = steps[i - 1], steps[i]
        return points[a] + (points[b] - points[a]) * (step - a) / (b - a)

    return at


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


def time_axis(rows: list[dict[str, Any]]) -> Literal["train", "wall"]:
    """The time axis every curve can be drawn on: training time if each run has a training clock, else wall time."""
    curves = [r["curve"] for r in rows if r["curve"]]
    return "train" if all(p.train_time is not None for c in curves for p in c) else "wall"


def figure(rows: list[dict[str, Any]], x: Literal["step", "time"]) -> Figure:
    """Validation loss vs step, or vs time (on `time_axis`), one line per run."""
    from matplotlib.figure import Figure

    clock = time_axis(rows)
    xlabel, name = ("step", "step") if x == "step" else TIME_LABELS[clock]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for r in rows:
        if r["curve"]:
            xs = [p.step if x == "step" else p.train_time if clock == "train" else p.wall_time for p in r["curve"]]
            ax.plot(xs, [p.loss for p in r["curve"]], marker=".", label=r["run"])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(LOSS_LABEL)
    ax.set_title(f"validation loss vs {name}")
    ax.grid(alpha=0.3)
    if any(r["curve"] for r in rows):
        ax.legend()
    fig.tight_layout()
    return fig


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """val_loss_vs_step.png and val_loss_vs_time.png in `out`, one line per run.

    The time plot is on training time (validation excluded) when every run logged its training
    clock; otherwise on wall time, said on its axis and on stderr, naming the runs without one.
    """
    if time_axis(rows) == "wall":
        missing = [r["run"] for r in rows if r["curve"] and r["curve"][0].train_time is None]
        print(f"note: {', '.join(missing)} logged no {TRAIN_CLOCK_TAGS[0]}, so val_loss_vs_time.png is on wall time "
              f"(validation included)", file=sys.stderr)
    paths = []
    for name in ("step", "time"):
        path = out / f"val_loss_vs_{name}.png"
        figure(rows, name).savefig(path, dpi=100)
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
