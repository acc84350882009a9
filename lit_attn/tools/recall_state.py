"""MQAR accuracy against decode state size (Zoology's Figure 3 view), for `lit-attn recall-grid`.

A run's decode state is what its model keeps per sequence while decoding, summed over its layers
(lit_attn.analytic.cache_values_per_sequence), after the MQAR setting's sequence length: K/V grows with it, a
window stops growing at its width, a recurrent state is the same at any length. It is counted in float32
(BYTES_PER_VALUE bytes per value) whatever precision the run trained in, so that every run is on one scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from lit_attn.analytic import cache_values_per_sequence, decode_state_kind
from lit_attn.tools.cost_card_layout import run_config

BYTES_PER_VALUE = 4  # float32
STATE_UNIT = f"float32, {BYTES_PER_VALUE} bytes per value"


class State(NamedTuple):
    """A run's decode state per sequence: its bytes and how it grows (decode_state_kind), or why it is unknown."""

    bytes: int | None
    kind: str | None = None  # per token, window, fixed, mixed
    why: str | None = None  # set when `bytes` is None


def decode_state(run_dir: Path, length: int) -> State:
    """The decode state per sequence of the model `run_dir` trained, after `length` tokens (its MQAR sequence
    length), in float32 bytes; with `why` when its model cannot be rebuilt from its files or keeps no state."""
    config = run_config(run_dir)
    if isinstance(config, str):
        return State(None, why=f"its model cannot be rebuilt: {config}")
    try:
        values = cache_values_per_sequence(config, length)
        kind = decode_state_kind(config, length)
    except (TypeError, ValueError) as e:  # a layer its attention cannot describe here
        return State(None, why=f"its decode state cannot be counted ({str(e).splitlines()[0] if str(e) else e!r})")
    if values is None:
        return State(None, why="its attention declares no decoding state (it decodes uncached)")
    return State(values * BYTES_PER_VALUE, kind)


def cell_state(states: Sequence[State]) -> State:
    """The state of a cell's runs: theirs when they agree, else unknown (with why)."""
    known = {(s.bytes, s.kind) for s in states if s.bytes is not None}
    if len(known) == 1 and all(s.bytes is not None for s in states):
        return states[0]
    if len(known) > 1:
        sizes = ", ".join(f"{b:,}" for b in sorted(b for b, _ in known))
        return State(None, why=f"its runs keep different decode states ({sizes} bytes): their models differ in "
                               "what the attention sets (options, heads, layer pattern)")
    return next(s for s in states if s.bytes is None)


def show_bytes(n: int) -> str:
    """Bytes as text: exact, with thousands separators (the value the CSV holds)."""
    return f"{n:,} B"


def state_table(cells: Sequence[Any], labels: dict[tuple, str]) -> str:
    """A row per cell (as shown: with --best-of, each cell at its chosen point): its decode state after the setting's
    sequence length (Cell.state), how it grows, and its mean accuracy; `labels`: (setting, group) -> the label of its
    group of alike runs, shown beside the attention."""
    chosen = " (each cell at its chosen --best-of point)" if any(c.point for c in cells) else ""
    lines = [f"Decode state per sequence after the setting's sequence length ({STATE_UNIT}), and accuracy{chosen}",
             "", "| sequence length, pairs | attention | width | decode state | grows | accuracy (mean) |",
             "|---|---|---:|---:|---|---:|"]
    for c in cells:
        label = labels.get((c.setting, c.group), "")
        size = "?" if c.state.bytes is None else show_bytes(c.state.bytes)
        mean = sum(c.accuracies) / len(c.accuracies)
        lines.append(f"| {c.setting[0]}, {c.setting[1]} | {c.attention}{f' ({label})' if label else ''} | {c.width} | "
                     f"{size} | {c.state.kind or '?'} | {mean:.3f} |")
    return "\n".join(lines) + "\n"


def state_notes(cells: Sequence[Any]) -> list[str]:
    """A line per cell whose decode state is unknown, saying why (one per reason and attention)."""
    notes = {f"- no decode state for {c.attention} at width {c.width}: {c.state.why}": None
             for c in cells if c.state.bytes is None}
    return list(notes)


MARKERS = "osD^v<>ph*"


def write_state_plot(cells: Sequence[Any], labels: dict[tuple, str], path: Path) -> None:
    """Accuracy vs decode state bytes (log axis), one panel per setting: a marker per run, and per attention (and
    group of alike runs) a line through its cells' means, labelled with how its state grows; cells whose state is
    unknown are left out (state_notes says why)."""
    from matplotlib.figure import Figure

    settings = sorted({c.setting for c in cells})
    fig = Figure(figsize=(4.2 * len(settings) + 3, 3.8), layout="constrained")
    axes = fig.subplots(1, len(settings), squeeze=False, sharey=True)[0]
    lines = list(dict.fromkeys((c.attention, c.group) for c in cells))  # one colour and marker each, in all panels
    legend: dict[str, Any] = {}  # label -> handle, over the panels
    for ax, where in zip(axes, settings):
        here = [c for c in cells if c.setting == where and c.state.bytes is not None]
        for i, (attention, group) in enumerate(lines):
            mine = sorted((c for c in here if (c.attention, c.group) == (attention, group)),
                          key=lambda c: c.state.bytes)
            if not mine:
                continue
            label = labels[where, group]
            kinds = "/".join(dict.fromkeys(c.state.kind or "?" for c in mine))
            name = f"{attention} ({label})" if label else attention
            color, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
            (handle,) = ax.plot([c.state.bytes for c in mine], [sum(c.accuracies) / len(c.accuracies) for c in mine],
                                color=color, marker=marker)
            legend.setdefault(f"{name}: {kinds}", handle)
            runs = [(c.state.bytes, a) for c in mine for a in c.accuracies]
            ax.scatter([x for x, _ in runs], [y for _, y in runs], color=color, marker=marker, alpha=0.35, s=18)
        if here:
            ax.set_xscale("log", base=2)
        else:
            ax.text(0.5, 0.5, "no run's decode state is known\n(see recall_grid.md)", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_title(f"sequence length {where[0]}, {where[1]} pairs")
        ax.set_xlabel("decode state per sequence (float32 bytes)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("MQAR accuracy (last val/mqar_acc)")
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside right upper", fontsize="small",
                   title="attention: its state grows")
    fig.savefig(path, dpi=120)
