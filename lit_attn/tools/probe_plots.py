"""The figures of `lit-attn probe`: loss by position at each context, and passkey accuracy as a length x depth
heat map. Matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def extrapolation_figure(result: dict[str, Any], run: str) -> Figure:
    """Mean loss of each position bucket vs position, one line per context; a dashed line at block_size."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for c in result["contexts"]:
        centres = [(b["start"] + b["end"] - 1) / 2 for b in c["buckets"]]
        ax.plot(centres, [b["loss"] for b in c["buckets"]], marker="o",
                label=f"{c['multiple']}x ({c['context']} tokens): {c['loss']:.3f}, x{c['ratio']:.2f}")
    ax.axvline(result["block_size"] - 1, color="grey", linestyle="--", linewidth=1, label="training context")
    ax.set_xlabel("position in the window (tokens)")
    ax.set_ylabel("val loss (nats/token)")
    ax.set_title(f"{run}: loss by position past the training context")
    ax.legend(fontsize="small")
    return fig


def passkey_figure(result: dict[str, Any], run: str) -> Figure:
    """Accuracy per (length, depth) cell, annotated; cells whose prompt does not fit their length are blank."""
    import numpy as np
    from matplotlib.figure import Figure

    grid = np.array([[np.nan if a is None else a for a in row] for row in result["accuracy"]], dtype=float)
    fig = Figure(figsize=(1.2 * len(result["depths"]) + 2.5, 0.8 * len(result["lengths"]) + 2), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i, row in enumerate(result["accuracy"]):
        for j, value in enumerate(row):
            text = "n/a" if value is None else f"{value:.2f}"
            ax.text(j, i, text, ha="center", va="center", color="white" if value is None or value < 0.6 else "black")
    ax.set_xticks(range(len(result["depths"])), [f"{d:g}" for d in result["depths"]])
    ax.set_yticks(range(len(result["lengths"])), [str(n) for n in result["lengths"]])
    ax.set_xlabel("depth of the key (0 = start, 1 = just before the question)")
    ax.set_ylabel("length (tokens)")
    mean = "n/a" if result["mean"] is None else f"{result['mean']:.2f}"
    ax.set_title(f"{run}: passkey retrieval, {result['trials']} trials per cell (mean {mean})")
    fig.colorbar(image, ax=ax, label="accuracy")
    return fig
