"""MQAR accuracy by attention, width and setting, in Zoology's Figure 2 layout: `lit-attn recall-grid RUN_DIR ...`.

Reads runs trained on MQAR data (configs/mqar.yaml, e.g. from one `lit-attn sweep` per width), groups them by
(setting, attention, width) and writes recall_grid.md (also printed: one table per (sequence length, pairs)
setting, one row per attention, one column per width, mean ± standard deviation over the runs and their
count), recall_grid.csv (one row per group, with the seeds) and recall_grid.png (accuracy vs width, one panel
per setting, one line per attention); under a table, a line for attentions that build one model there (gqa and
mqa at 4 heads). The accuracy is each run's last val/mqar_acc. Runs without one, unfinished ones (their last
accuracy is a half-trained model's) and runs trained on other data are left out, each named on a line under the
tables with the reason; runs of one cell that were not trained alike (run_record.mixed_setting), and a grid with no
run left, are errors.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from lit_attn.toolcli import ToolParser, check_outputs, write_outputs
from lit_attn.tools import stats
from lit_attn.tools.cost_card_layout import run_config, shared_architecture
from lit_attn.tools.events import run_scalars
from lit_attn.tools.run_record import NO_RECORD, mixed_setting, read_run, read_yaml, setting

OUTPUTS = ("recall_grid.md", "recall_grid.csv", "recall_grid.png")


class Cell(NamedTuple):
    setting: tuple[int, int]  # (input_seq_len, num_kv_pairs)
    attention: str
    width: int
    accuracies: list[float]
    seeds: list[int | None]
    steps: int  # the step of the runs' last val/mqar_acc (a cell's runs trained alike)
    model: Any = None  # what the attention builds here (same_model's key), None if its runs do not record it


def mqar_setting(run_dir: Path) -> tuple[int, int] | None:
    """(input_seq_len, num_kv_pairs) of a run trained on MQAR data, from its config.yaml; None otherwise."""
    data = (read_yaml(run_dir / "config.yaml") or {}).get("data")
    if not isinstance(data, dict) or "MQAR" not in str(data.get("class_path", "")):
        return None
    args = data.get("init_args") or {}
    length, pairs = args.get("input_seq_len"), args.get("num_kv_pairs")
    return (length, pairs) if isinstance(length, int) and isinstance(pairs, int) else None


def left_out(run_dir: Path) -> str | None:
    """Why the run has no place in the grid (not an MQAR run, no accuracy, not finished), or None."""
    if mqar_setting(run_dir) is None:
        config = run_dir / "config.yaml"
        if not config.is_file():
            return f"no {config} (not a run, or one that never started)"
        if read_yaml(config) is None:
            return f"{config} cannot be read (not UTF-8 YAML): its data is unknown"
        return "not trained on MQAR data (its config.yaml's data is not MQARDataModule)"
    row = read_run(run_dir)
    if row["mqar_acc"] is None:
        return "no val/mqar_acc logged (it did not reach a validation)"
    if NO_RECORD in row["notes"]:  # its last accuracy would pass for a trained model's
        return ("did not finish (no end-of-fit record: interrupted or still running; resume it with lit-attn fit "
                "--run NAME --ckpt_path last)")
    return None


def sort_runs(run_dirs: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """(the runs the grid takes, a line per run left out: '- left out: RUN: why'); ValueError naming each run's
    reason when none is left."""
    usable, lines = [], []
    for d in map(Path, run_dirs):
        why = left_out(d)
        if why is None:
            usable.append(d)
        else:
            lines.append(f"- left out: {d}: {why}")
    if not usable:
        raise ValueError("no run has a place in the grid: " + "; ".join(line.removeprefix("- left out: ")
                                                                        for line in lines))
    return usable, lines


def read_grid(run_dirs: Sequence[str | Path]) -> list[Cell]:
    """The runs' accuracies grouped by (setting, attention, width), in order of setting, of the attentions' first
    runs and of width; ValueError naming a run that is not a finished MQAR run with an accuracy (see sort_runs)."""
    groups: dict[tuple[tuple[int, int], str, int], list[tuple[float, int | None]]] = {}
    for d in map(Path, run_dirs):
        if why := left_out(d):
            raise ValueError(f"run {d}: {why}; leave it out")
        row, where = read_run(d), mqar_setting(d)
        width, step = setting(d, "n_embd"), run_scalars(d)["val/mqar_acc"][-1].step
        groups.setdefault((where, row["attention"] or "?", int(width or 0)), []).append((row["mqar_acc"], row["seed"],
                                                                                          step, d))
    for (_, attention, width), runs in groups.items():
        if len({step for _, _, step, _ in runs}) > 1:  # a mean over unlike runs would pass for one setting's
            lengths = ", ".join(f"{d.name}: step {step}" for _, _, step, d in runs)
            raise ValueError(f"the {attention} runs at width {width} ended at different steps ({lengths}); "
                             "pass runs trained alike")
        if diff := mixed_setting([d for *_, d in runs]):
            raise ValueError(f"the {attention} runs at width {width} differ in {diff}: their cell would average "
                             "them; pass runs trained alike (one sweep's)")
    order = {a: i for i, a in enumerate(dict.fromkeys(a for _, a, _ in groups))}  # attentions as the runs name them
    return [Cell(s, a, w, [r[0] for r in runs], [r[1] for r in runs], runs[0][2], same_model(runs[0][3]))
            for (s, a, w), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2]))]


def same_model(run_dir: Path) -> tuple | None:
    """What the run builds: the rest of its model, the heads its attention uses, and the attention layer itself (its
    parameters' names and shapes, and its output on a fixed input from a fixed initialization). Two attentions with
    one key (e.g. gqa and mqa at 4 heads) train one model, so their runs are one training seed for seed; None if
    the run does not record its model."""
    import torch

    config = run_config(run_dir)
    if isinstance(config, str):
        return None
    rest = shared_architecture(config)  # the attention's own fields: the layer below shows what they build
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        try:
            layer = config.spec.build(**config.attention_args())
            output = layer.eval()(torch.randn(1, min(config.block_size, 8), config.n_embd))
        except Exception:  # a layer that cannot be built or run here: no claim about it, rather than no grid
            return None
    shapes = tuple((k, tuple(v.shape)) for k, v in layer.state_dict().items())
    return repr(sorted(rest.items())), config.heads, shapes, output.numpy().tobytes()


def one_model_notes(cells: Sequence[Cell]) -> list[str]:
    """A line per group of attentions that build one model at one width (same_model), in one setting's table."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.model is not None:
            groups.setdefault((c.width, c.model), []).append(c)
    return [f"- {' and '.join(c.attention for c in group)} are one model at width {width} ({model[1][0]} query and "
            f"{model[1][1]} key/value heads): seed for seed, their runs train the same network"
            for (width, model), group in groups.items() if len(group) > 1]


def _cell_text(cell: Cell | None) -> str:
    if cell is None:
        return ""
    summary = stats.summarize(cell.accuracies)
    spread = f" ± {summary.std:.3f}" if summary.std is not None else ""
    return f"{summary.mean:.3f}{spread} ({summary.n})"


def markdown(cells: list[Cell]) -> str:
    """One table per setting: attention rows, width columns, 'mean ± std (runs)'."""
    parts = []
    for where in sorted({c.setting for c in cells}):
        here = [c for c in cells if c.setting == where]
        widths = sorted({c.width for c in here})
        attentions = list(dict.fromkeys(c.attention for c in here))
        lookup = {(c.attention, c.width): c for c in here}
        steps = sorted({c.steps for c in here})
        after = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]} to {steps[-1]}"
        lines = [f"MQAR accuracy, sequence length {where[0]}, {where[1]} key-value pairs, at step {after} "
                 "(mean ± std over runs (n))",
                 "", "| attention | " + " | ".join(f"width {w}" for w in widths) + " |",
                 "|---|" + "---:|" * len(widths)]
        lines += [f"| {a} | " + " | ".join(_cell_text(lookup.get((a, w))) for w in widths) + " |" for a in attentions]
        if notes := one_model_notes(here):
            lines += ["", *notes]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def write_csv(cells: list[Cell], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["input_seq_len", "num_kv_pairs", "attention", "width", "runs", "mqar_acc_mean", "mqar_acc_std",
                      "mqar_acc_min", "mqar_acc_max", "seeds", "steps"])
        for c in cells:
            s = stats.summarize(c.accuracies)
            out.writerow([*c.setting, c.attention, c.width, s.n, s.mean, s.std, min(c.accuracies), max(c.accuracies),
                          " ".join("?" if seed is None else str(seed) for seed in c.seeds), c.steps])


def write_plot(cells: list[Cell], path: Path) -> None:
    """Accuracy vs width (log2 axis), one panel per setting, one line per attention with its min-max bars."""
    from matplotlib.figure import Figure

    settings = sorted({c.setting for c in cells})
    fig = Figure(figsize=(4.2 * len(settings), 3.6), layout="constrained")
    axes = fig.subplots(1, len(settings), squeeze=False, sharey=True)[0]
    for ax, where in zip(axes, settings):
        here = [c for c in cells if c.setting == where]
        for attention in dict.fromkeys(c.attention for c in here):
            line = [c for c in here if c.attention == attention]
            means = [sum(c.accuracies) / len(c.accuracies) for c in line]
            low = [m - min(c.accuracies) for m, c in zip(means, line)]
            high = [max(c.accuracies) - m for m, c in zip(means, line)]
            ax.errorbar([c.width for c in line], means, yerr=[low, high], marker="o", capsize=3, label=attention)
        ax.set_xscale("log", base=2)
        ax.set_title(f"sequence length {where[0]}, {where[1]} pairs")
        ax.set_xlabel("model width (n_embd)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("MQAR accuracy (last val/mqar_acc)")
    axes[-1].legend(fontsize="small")
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the tables and write the files; 0, or 2 after a one-line error."""
    p = ToolParser(prog="lit-attn recall-grid", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs trained on MQAR data (RUNS_DIR/RUN)")
    p.add_argument("--out", type=str, default="recall_grid", help="output directory")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier grid's files in --out")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out)
    try:
        check_outputs(out, OUTPUTS, args.overwrite, runs=args.run_dirs)
        usable, left = sort_runs(args.run_dirs)
        cells = read_grid(usable)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = markdown(cells) + ("\n" + "\n".join(left) + "\n" if left else "")
    print(text, end="")
    return write_outputs(out, {"recall_grid.md": lambda f: f.write_text(text, encoding="utf-8"),
                               "recall_grid.csv": lambda f: write_csv(cells, f),
                               "recall_grid.png": lambda f: write_plot(cells, f)})


if __name__ == "__main__":
    sys.exit(main())
