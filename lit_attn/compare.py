"""Compare runs from their TensorBoard event files: `python -m lit_attn.compare RUN_DIR [RUN_DIR ...] [--out DIR]`.

Writes the Sparse Query Attention paper's style of table as Markdown (also printed) and CSV, and PNG plots of
validation loss vs step and vs time, one line per run. A metric a run did not log is left blank. When runs share
an attention (or --group-by setting), e.g. seeds, stats.md (also printed) and stats.csv summarize each group.
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

from . import stats
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

# Written with stats.md and stats.csv (see compare_plots.plot_groups)
GROUP_PLOTS = ("val_loss_bands_vs_step.png", "val_loss_bands_vs_time.png", "final_val_loss.png")


class CurvePoint(NamedTuple):
    """One validation: its step, the run's training time and wall time then (s), and the loss (nats/token)."""

    step: int
    train_time: float | None  # None when the run has no training clock (TRAIN_CLOCK_TAGS)
    wall_time: float
    loss: float


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that reads tags it does not know (hparams.yaml's !!python/tuple) as plain YAML."""


_Loader.add_multi_constructor("", lambda loader, _, node: (
    loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode)
    else loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
    else loader.construct_scalar(node)))


def _yaml(path: Path) -> Any:
    """The parsed file, or None if it is missing or not valid YAML (then with a warning)."""
    if not path.is_file():
        return None
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # a SafeLoader: it runs nothing
    except yaml.YAMLError as e:
        print(f"warning: {path} is not valid YAML ({type(e).__name__}); its settings are left blank", file=sys.stderr)
        return None


def _setting(run_dir: Path, key: str) -> str:
    """The run's model setting `key` as text, from hparams.yaml (top level) or config.yaml (model section);
    '' if neither has it."""
    for name, section in (("hparams.yaml", ()), ("config.yaml", ("model",)), ("config.yaml", ("model", "init_args"))):
        node = _yaml(run_dir / name)
        for part in section:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] != "":
            value = node[key]
            # YAML's spelling (null, true), as the setting is written in the run's files and on the command line
            return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return ""


def _seed(run_dir: Path) -> int | None:
    """The run's seed: `seed_everything` of its config.yaml, or None where that is not an integer."""
    config = _yaml(run_dir / "config.yaml")
    seed = config.get("seed_everything") if isinstance(config, dict) else None
    # true/false mean "draw one"/"none"; LightningCLI writes the drawn seed back, so a bool here is no seed
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """One run's table row (final value of each metric, None if not logged) and its val-loss curve.

    Returns {"run", "attention", "seed": int | None, <CSV header>: float | None, ..., "curve": [CurvePoint, ...]}. Event
    files anywhere under `run_dir` are read (the whole_run/* scalars are in a subdirectory). When a tag
    was logged more than once at the same step (a resumed run), the latest write wins.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory not found: {run_dir}")
    row: dict[str, Any] = {"run": run_dir.name, "attention": _setting(run_dir, "attention"), "seed": _seed(run_dir),
                           "curve": []}
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


def _present(runs: list[dict[str, Any]], header: str) -> list[float]:
    return [r[header] for r in runs if r[header] is not None]


def _losses_by_seed(runs: list[dict[str, Any]], group: str) -> dict[int, float]:
    """seed -> final val loss; runs without a seed or a loss, and seeds the group has twice, are not paired."""
    usable = [r for r in runs if r["seed"] is not None and r["val_loss"] is not None]
    seeds = [r["seed"] for r in usable]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        print(f"warning: group {group} has seed(s) {', '.join(map(str, twice))} in more than one run; "
              f"those are left out of its paired difference", file=sys.stderr)
    return {r["seed"]: r["val_loss"] for r in usable if r["seed"] not in twice}


def group_stats(groups: dict[str, list[dict[str, Any]]], reference: str) -> list[dict[str, Any]]:
    """Per group: the summaries of final val loss and acc, the speed, and the loss paired against `reference`."""
    ref = _losses_by_seed(groups[reference], reference)
    out = []
    for name, runs in groups.items():
        times = _present(runs, "time_per_batch_s")
        tokens = stats.summarize(_present(runs, "tokens_per_sec"))
        paired = None if name == reference else stats.paired_difference(_losses_by_seed(runs, name), ref)
        out.append({"group": name, "n_runs": len(runs), "loss": stats.summarize(_present(runs, "val_loss")),
                    "acc": stats.summarize(_present(runs, "val_acc")), "time_median": stats.median(times),
                    "time_min": min(times, default=None), "time_max": max(times, default=None),
                    "tokens_mean": tokens.mean, "paired": paired})
    return out


def _num(value: float | None, fmt: str = "{:.4f}") -> str:
    return "" if value is None else fmt.format(value)


def _interval(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def stats_markdown(table: list[dict[str, Any]], key: str, reference: str) -> str:
    """The statistics as two Markdown tables: per group, and paired against the reference."""
    lines = [f"Final values over the runs of each {key}: mean ± sample std, 95% CI of the mean (Student's t).", "",
             f"| {key} | runs | val loss | val loss 95% CI | val acc | time/batch (s), median [min, max] | tokens/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for g in table:
        loss, acc = g["loss"], g["acc"]
        spread = "" if g["time_median"] is None else (
            f"{g['time_median']:.4f} [{g['time_min']:.4f}, {g['time_max']:.4f}]")
        lines.append(f"| {g['group']} | {g['n_runs']} | {_num(loss.mean)}{_num(loss.std, ' ± {:.4f}')} | "
                     f"{_interval(loss.ci)} | {_num(acc.mean)}{_num(acc.std, ' ± {:.4f}')} | {spread} | "
                     f"{_num(g['tokens_mean'], '{:,.0f}')} |")
    lines += ["", f"Final val loss minus {reference}'s over matching seeds (negative: lower loss than {reference}).",
              "", f"| {key} | pairs | Δ val loss | Δ 95% CI | verdict |", "|---|---:|---:|---:|---|"]
    for g in table:
        d = g["paired"]
        lines.append(f"| {g['group']} |  |  |  | reference |" if d is None else
                     f"| {g['group']} | {d.n} | {_num(d.mean, '{:+.4f}')} | {_interval(d.ci)} | {d.verdict} |")
    return "\n".join(lines) + "\n"


def write_stats_csv(table: list[dict[str, Any]], key: str, reference: str, path: Path) -> None:
    """The statistics as CSV, full precision, one row per group; what cannot be computed is an empty field."""
    head = [key, "n_runs", "val_loss_mean", "val_loss_std", "val_loss_ci_low", "val_loss_ci_high", "val_acc_mean",
            "val_acc_std", "time_per_batch_median_s", "time_per_batch_min_s", "time_per_batch_max_s",
            "tokens_per_sec_mean", "reference", "n_pairs", "val_loss_diff_mean", "val_loss_diff_ci_low",
            "val_loss_diff_ci_high", "verdict"]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        for g in table:
            loss, acc, d = g["loss"], g["acc"], g["paired"]
            paired = ["", "", "", "", "reference"] if d is None else [d.n, d.mean, *(d.ci or ("", "")), d.verdict]
            cells = [g["group"], g["n_runs"], loss.mean, loss.std, *(loss.ci or ("", "")), acc.mean, acc.std,
                     g["time_median"], g["time_min"], g["time_max"], g["tokens_mean"], reference, *paired]
            writer.writerow(["" if c is None else c for c in cells])


def compare(run_dirs: list[str | Path], out: str | Path, *, group_by: str = "attention",
            reference: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """Read the runs, write compare.md, compare.csv and the plots into `out`; return (rows, Markdown printed).

    When a group (the runs with the same `group_by` setting) has more than one run, also write stats.md,
    stats.csv and the plots over groups, against the group `reference` (default: the first); the Markdown
    returned is then compare.md's and stats.md's.
    """
    rows = [read_run(d) for d in run_dirs]
    groups: dict[str, list[dict[str, Any]]] = {}  # in the order of their first runs
    for r, d in zip(rows, run_dirs):
        groups.setdefault((r["attention"] if group_by == "attention" else _setting(Path(d), group_by)) or "?",
                          []).append(r)
    reference = next(iter(groups), "") if reference is None else reference
    if reference not in groups:  # before anything is written
        raise ValueError(f"--reference {reference!r} is none of the groups by {group_by}: {', '.join(groups)}")
    table = group_stats(groups, reference) if any(len(runs) > 1 for runs in groups.values()) else None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows)
    (out / "compare.md").write_text(text, encoding="utf-8")
    write_csv(rows, out / "compare.csv")
    plot(rows, out)
    if table is not None:
        summary = stats_markdown(table, group_by, reference)
        (out / "stats.md").write_text(summary, encoding="utf-8")
        write_stats_csv(table, group_by, reference, out / "stats.csv")
        from .compare_plots import plot_groups  # it imports this module

        plot_groups(rows, groups, table, group_by, out)
        text += "\n" + summary
    else:
        # An earlier comparison's statistics in `out` would pass for these runs'
        for name in ("stats.md", "stats.csv", *GROUP_PLOTS):
            (out / name).unlink(missing_ok=True)
    return rows, text


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options of `python -m lit_attn.compare` (a jsonargparse Namespace)."""
    p = ToolParser(prog="python -m lit_attn.compare", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (RUNS_DIR/RUN) holding event files")
    p.add_argument("--out", type=str, default="comparison",
                   help="output directory for compare.md/.csv, stats.md/.csv and the PNGs")
    p.add_argument("--group-by", "--group_by", dest="group_by", type=str, default="attention", metavar="SETTING",
                   help="model setting (a key of the run's hparams.yaml) whose runs are summarized together; "
                        "stats.md/.csv are written when a group has more than one run")
    p.add_argument("--reference", type=str, default=None, metavar="NAME",
                   help="the group the others are compared with, seed by seed (default: the first run's)")
    return p.parse_args(list(sys.argv[1:] if argv is None else argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the Markdown table and write the files; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    try:
        _, text = compare(args.run_dirs, args.out, group_by=args.group_by, reference=args.reference)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    written = ["compare.csv", "val_loss_vs_step.png", "val_loss_vs_time.png"]
    if (Path(args.out) / "stats.md").is_file():
        written += ["stats.md", "stats.csv", *GROUP_PLOTS]
    print(f"wrote {Path(args.out) / 'compare.md'}, {', '.join(written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
