"""The cost card's Pareto plots: one labelled point per attention that has both values, and the front that no
other point dominates. Quality (MQAR accuracy, else val loss) against the decode state, val loss against
training time and decode speed, or, without any val loss, decode speed against training time."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pareto_front(points: Sequence[tuple[str, float, float]], maximize_x: bool = False,
                 maximize_y: bool = False) -> list[tuple[str, float, float]]:
    """The (label, x, y) points no other point dominates (as good on both axes, better on one), sorted by x."""
    sx, sy = (-1 if maximize_x else 1), (-1 if maximize_y else 1)

    def dominates(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
        ax, ay, bx, by = sx * a[1], sy * a[2], sx * b[1], sy * b[2]
        return ax <= bx and ay <= by and (ax < bx or ay < by)

    return sorted((p for p in points if not any(dominates(q, p) for q in points)), key=lambda p: (p[1], p[2]))


def pareto_plot(rows: Sequence[dict[str, Any]], x: tuple[str, str, bool], y: tuple[str, str, bool],
                title: str, path: Path) -> bool:
    """A labelled point per attention with both values and the Pareto front as a step line; False if none has both.

    x and y are (CSV header, axis label, larger is better).
    """
    from matplotlib.figure import Figure

    points = [(r["attention"], r[x[0]], r[y[0]]) for r in rows if r[x[0]] is not None and r[y[0]] is not None]
    if not points:
        return False
    front = pareto_front(points, maximize_x=x[2], maximize_y=y[2])
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.scatter([p[1] for p in points], [p[2] for p in points], color="tab:blue")
    for label, px, py in points:
        ax.annotate(label, (px, py), textcoords="offset points", xytext=(4, 4), fontsize=8)
    # A front point covers the worse side of x at its own y: the step runs that way from it.
    ax.step([p[1] for p in front], [p[2] for p in front], where="pre" if x[2] else "post",
            color="tab:red", marker="o", markersize=11, markerfacecolor="none", label="Pareto front")
    ax.set_xlabel(x[1] + (" (higher is better)" if x[2] else " (lower is better)"))
    ax.set_ylabel(y[1] + (" (higher is better)" if y[2] else " (lower is better)"))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


PLOTS = ("pareto_loss_vs_train_time.png", "pareto_loss_vs_decode.png", "pareto_decode_vs_train_time.png",
         "pareto_quality_vs_cache.png")
TRAIN = ("train_time_per_batch_s", "training time per batch (s)", False)
DECODE = ("decode_tokens_per_sec", "decode tokens/s", True)
LOSS = ("val_loss", "val loss (nats/token)", False)
MQAR = ("mqar_acc", "MQAR accuracy (mean over runs)", True)
CACHE = ("state_bytes_t", "decode state bytes per sequence at T", False)


def plot_all(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """The Pareto PNGs in `out`: val loss vs training time and vs decode tokens/s, or, without any val loss,
    decode tokens/s vs training time; and quality (MQAR accuracy, else val loss) vs the decode state's bytes per
    sequence at T when any attention has one. Plots with no complete point are skipped with a note."""
    if any(r["val_loss"] is not None for r in rows):
        plots = [("pareto_loss_vs_train_time.png", TRAIN, LOSS, "val loss vs training time per batch"),
                 ("pareto_loss_vs_decode.png", DECODE, LOSS, "val loss vs decode tokens/s")]
    else:
        plots = [("pareto_decode_vs_train_time.png", TRAIN, DECODE,
                  "no val loss given: decode tokens/s vs training time per batch")]
    quality = MQAR if any(r.get("mqar_acc") is not None for r in rows) else LOSS
    if any(r.get(quality[0]) is not None for r in rows):
        plots.append(("pareto_quality_vs_cache.png", CACHE, quality,
                      f"{'MQAR accuracy' if quality is MQAR else 'val loss'} vs decode state per sequence"))
    written = []
    for name, x, y, title in plots:
        if pareto_plot(rows, x, y, title, out / name):
            written.append(out / name)
        else:
            print(f"note: no attention has both {x[0]} and {y[0]}; {name} is not drawn", file=sys.stderr)
    return written
