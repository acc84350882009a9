"""The plots of `lit_attn.tools.compare`: validation loss vs step and vs time, one line per run; and over groups
of runs (seeds), each group's mean curve with the min-max band of its runs, and the final validation loss with
95% intervals. Matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lit_attn.tools.run_record import TRAIN_CLOCK_TAG, CurvePoint

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LOSS_LABEL = "val loss (nats/token)"  # the model's loss is cross-entropy with the natural log, per target token
# time axis -> (axis label, title's name for it)
TIME_LABELS = {
    "train": ("training time, excl. validation (s)", "training time"),
    "wall": ("wall time since the run's first event, incl. validation (s)", "wall time"),
}

# Written for every comparison (see plot)
RUN_PLOTS = ("val_loss_vs_step.png", "val_loss_vs_time.png")
# Written with stats.md and stats.csv (see plot_groups)
GROUP_PLOTS = ("val_loss_bands_vs_step.png", "val_loss_bands_vs_time.png", "final_val_loss.png")


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
    """The RUN_PLOTS in `out`: val_loss_vs_step.png and val_loss_vs_time.png, one line per run.

    The time plot is on training time (validation excluded) when every run logged its training
    clock; otherwise on wall time, said on its axis and on stderr, naming the runs without one.
    """
    if time_axis(rows) == "wall":
        missing = [r["run"] for r in rows if r["curve"] and r["curve"][0].train_time is None]
        print(f"note: {', '.join(missing)} logged no {TRAIN_CLOCK_TAG}, so val_loss_vs_time.png is on wall time "
              f"(validation included)", file=sys.stderr)
    paths = [out / name for name in RUN_PLOTS]
    for x, path in zip(("step", "time"), paths):
        figure(rows, x).savefig(path, dpi=100)
    return paths


def band(runs: list[dict[str, Any]], x: Literal["step", "time"], clock: Literal["train", "wall"]
         ) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, mean loss, min loss, max loss) at the steps every run of the group validated at.

    Runs are aligned by step; on the time axis a step's x is the mean of the runs' times there.
    """
    curves = [{p.step: p for p in r["curve"]} for r in runs if r["curve"]]
    if not curves:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    xs, mean, low, high = [], [], [], []
    for s in steps:
        points: list[CurvePoint] = [c[s] for c in curves]
        losses = [p.loss for p in points]
        times = [p.train_time if clock == "train" else p.wall_time for p in points]
        xs.append(float(s) if x == "step" else sum(times) / len(times))
        mean.append(sum(losses) / len(losses))
        low.append(min(losses))
        high.append(max(losses))
    return xs, mean, low, high


def band_figure(rows: list[dict[str, Any]], groups: dict[str, list[dict[str, Any]]], key: str,
                x: Literal["step", "time"]) -> Figure:
    """Validation loss vs step, or vs time (on `time_axis` of all the runs): per group, the mean curve
    over its runs and the band from their lowest to their highest loss."""
    from matplotlib.figure import Figure

    clock = time_axis(rows)
    xlabel, name = ("step", "step") if x == "step" else TIME_LABELS[clock]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for group, runs in groups.items():
        xs, mean, low, high = band(runs, x, clock)
        if xs:
            (line,) = ax.plot(xs, mean, marker=".", label=f"{group} (mean of {sum(bool(r['curve']) for r in runs)})")
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(LOSS_LABEL)
    ax.set_title(f"validation loss vs {name} by {key}: mean, min-max band")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    return fig


def final_loss_figure(groups: dict[str, list[dict[str, Any]]], table: list[dict[str, Any]], key: str) -> Figure:
    """Final loss per group on the split its statistics report (validation, or test): each run as a dot, the mean
    with its 95% t interval as an error bar (none for a single run)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5.5, 1.2 * len(table) + 2), 4.5))
    ax = fig.subplots()
    split = table[0].get("split", "val") if table else "val"  # the split the statistics report (compare --best-of)
    for i, g in enumerate(table):
        losses = [r[f"{split}_loss"] for r in groups[g["group"]] if r.get(f"{split}_loss") is not None]
        ax.plot([i] * len(losses), losses, "o", color="0.6", markersize=4, zorder=1)
        s = g["loss"]
        if s.mean is not None:
            err = None if s.ci is None else [[s.mean - s.ci[0]], [s.ci[1] - s.mean]]
            ax.errorbar([i], [s.mean], yerr=err, fmt="s", color="C0", capsize=6, zorder=2)
    ax.set_xticks(range(len(table)), [g["group"] for g in table])
    ax.set_xlim(-0.5, len(table) - 0.5)
    ax.set_xlabel(key)
    ax.set_ylabel(f"final {LOSS_LABEL.replace('val', split, 1)}")
    ax.set_title(f"final {'validation' if split == 'val' else 'test'} loss: runs (dots), mean, 95% CI (t)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def plot_groups(rows: list[dict[str, Any]], groups: dict[str, list[dict[str, Any]]], table: list[dict[str, Any]],
                key: str, out: Path) -> list[Path]:
    """The GROUP_PLOTS in `out`: the bands vs step and vs time, and the final losses."""
    figures = [band_figure(rows, groups, key, "step"), band_figure(rows, groups, key, "time"),
               final_loss_figure(groups, table, key)]
    paths = [out / name for name in GROUP_PLOTS]
    for fig, path in zip(figures, paths):
        fig.savefig(path, dpi=100)
    return paths
