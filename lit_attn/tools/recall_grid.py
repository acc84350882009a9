"""MQAR accuracy by attention, width and setting, in Zoology's Figure 2 layout: `lit-attn recall-grid RUN_DIR ...`.

Reads runs trained on MQAR data (configs/mqar.yaml, e.g. from one `lit-attn sweep` per width), groups them by
(setting, attention, width) and writes recall_grid.md (also printed: one table per (sequence length, pairs)
setting, one row per attention, one column per width, mean ± standard deviation over the runs and their
count), recall_grid.csv (one row per group, with the seeds and decode state bytes), recall_grid.png (accuracy vs
width, one panel per setting, one line per attention) and recall_grid_state.png (accuracy vs decode state bytes per
sequence, Zoology's Figure 3 view: recall_state); under a table, a line for attentions that build one model
there (gqa and mqa at 4 heads). The accuracy is each run's last val/mqar_acc. Runs without one, unfinished ones
(their last accuracy is a half-trained model's) and runs trained on other data are left out, each named on a line
under the tables with the reason; runs of one cell that ended at different steps (other than by an early stop),
and a grid with no run left, are errors. A table gives each cell's decode state bytes, and a last one lists every
run: the step it ended at, whether an early stop ended it, and its training time.

Like with like: within a setting, runs whose settings (run_record.run_setting: model, data, optimizer, trainer)
differ in more than the attention, the width and the --best-of keys are never in one table: each group of alike
runs gets its own table, labelled by the settings that set it apart (e.g. model.pos=learned), and a line says so.
With --best-of KEY (e.g. model.lr, a sweep's --grid), each cell is the grid point with the highest accuracy
averaged over seeds, its value shown in the cell and every point kept in a second table; `--mean` says how a run's
accuracy across several test settings is averaged (recall_means).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from lit_attn.cli.toolcli import ToolParser, check_outputs, write_outputs
from lit_attn.tools import best_of as best
from lit_attn.tools import stats
from lit_attn.tools.cost_card_layout import ATTENTION_FIELDS, run_config, shared_architecture
from lit_attn.tools.recall_means import MEANS, accuracy
from lit_attn.tools.recall_state import State, cell_state, decode_state, state_notes, state_table, write_state_plot
from lit_attn.tools.run_record import NO_RECORD, read_run, read_yaml, run_setting, setting

OUTPUTS = ("recall_grid.md", "recall_grid.csv", "recall_grid.png", "recall_grid_state.png")


class Cell(NamedTuple):
    setting: tuple[int, int]  # (input_seq_len, num_kv_pairs)
    attention: str
    width: int
    accuracies: list[float]
    seeds: list[int | None]
    steps: int  # the step of the runs' last val/mqar_acc (a cell's runs trained alike)
    model: Any = None  # what the attention builds here (same_model's key), None if its runs do not record it
    group: tuple = ()  # the settings its runs share beyond the attention, width and grid (like_settings)
    point: tuple = ()  # its values of the --best-of keys
    runs: tuple = ()  # RunEnd of each run, in the order of `accuracies`
    state: State = State(None, why="not read")  # its runs' decode state per sequence (recall_state.cell_state)


class RunEnd(NamedTuple):
    """How one run of a cell ended: its name, last step, the step an early stop ended it at, training seconds; and
    its model's decode state after the setting's sequence length."""

    run: str
    step: int
    stopped_at_step: int | None
    train_time_s: float | None
    state: State = State(None, why="not read")


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


# The model settings every table and CSV row names, so that no table hides which model its runs trained.
RECORDED = ("model.pos", "model.n_head", "model.ffn")
# What may differ between the runs of one table: the attention (and the fields it sets itself), the width (the
# columns), the setting (one table each) and the data seed.
TABLE_KEYS = {f"model.{k}" for k in ATTENTION_FIELDS} | {"model.n_embd", "data.input_seq_len", "data.num_kv_pairs"}


def like_settings(run_dir: Path, best_of: Sequence[str] = ()) -> tuple:
    """The run's settings that runs in one table share: run_setting without TABLE_KEYS and the `best_of` keys."""
    return tuple(sorted((k, repr(v)) for k, v in run_setting(run_dir).items() if k not in TABLE_KEYS | set(best_of)))


def read_grid(run_dirs: Sequence[str | Path], best_of: Sequence[str] = (), mean: str = "per-query") -> list[Cell]:
    """The runs' accuracies (`mean`: recall_means.accuracy) and decode states after the setting's sequence length
    (recall_state.decode_state) grouped by (setting, like_settings, attention, width, --best-of point), in order of
    setting, of the groups' and attentions' first runs, of width and of point; ValueError naming a run that is not a
    finished MQAR run with an accuracy (see sort_runs), or the runs of one cell when they ended at different steps (a
    run its early stop ended may end anywhere)."""
    groups: dict[tuple, list[tuple[float, int | None, int, Path, RunEnd]]] = {}
    for d in map(Path, run_dirs):
        if why := left_out(d):
            raise ValueError(f"run {d}: {why}; leave it out")
        row, where = read_run(d), mqar_setting(d)
        value, step = accuracy(d, mean)
        point = best.grid_point(d, best_of) if best_of else ()
        key = (where, like_settings(d, best_of), row["attention"] or "?", int(setting(d, "n_embd") or 0), point)
        end = RunEnd(d.name, step, row["stopped_at_step"], row["train_time_s"], decode_state(d, where[0]))
        groups.setdefault(key, []).append((value, row["seed"], step, d, end))
    for (_, _, attention, width, point), runs in groups.items():
        ran_out = [r for r in runs if r[4].stopped_at_step is None]
        if len({step for _, _, step, _, _ in ran_out}) > 1:  # a mean over unlike runs would pass for one setting's
            lengths = ", ".join(f"{d.name}: step {step}" for _, _, step, d, _ in ran_out)
            at = "".join(f", {k}={best.show(v)}" for k, v in zip(best_of, point))
            raise ValueError(f"the {attention} runs at width {width}{at} ended at different steps ({lengths}); "
                             "pass runs trained alike")
    first = {k: i for i, k in enumerate(dict.fromkeys((k[1], k[2]) for k in groups))}  # as the runs come
    order = sorted(groups.items(), key=lambda kv: (kv[0][0], first[kv[0][1], kv[0][2]], kv[0][3],
                                                    best.sort_key(kv[0][4])))
    return [Cell(s, a, w, [r[0] for r in runs], [r[1] for r in runs], max(r[2] for r in runs),
                 same_model(runs[0][3]), g, p, tuple(r[4] for r in runs), cell_state([r[4].state for r in runs]))
            for (s, g, a, w, p), runs in order]


def recorded(group: tuple) -> dict[str, str]:
    """The RECORDED settings of a group of alike runs (like_settings), as its runs' config.yaml writes them."""
    settings = dict(group)
    return {k: _unquoted(settings.get(k, "not recorded")) for k in RECORDED}


def _unquoted(text: str) -> str:  # a repr: a string without its quotes
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] == "'" else text


def group_labels(cells: Sequence[Cell]) -> dict[tuple, str]:
    """like_settings -> what sets its runs apart from the other groups of one setting ('model.pos=learned'); ''
    when there is one group."""
    groups = list(dict.fromkeys(c.group for c in cells))
    if len(groups) < 2:
        return {g: "" for g in groups}
    as_dicts = [dict(g) for g in groups]
    keys = sorted({k for d in as_dicts for k in d if len({d.get(k) for d in as_dicts}) > 1})
    return {g: ", ".join(f"{k}={_unquoted(d.get(k, 'not recorded'))}" for k in keys) for g, d in zip(groups, as_dicts)}


def same_model(run_dir: Path) -> tuple | None:
    """What the run builds: the rest of its model, the heads its attention uses, and the attention layer itself (its
    parameters' names and shapes, and its output on a fixed input from a fixed initialization). Two attentions with
    one key (e.g. gqa and mqa at 4 heads) train one model, so their runs are one training seed for seed; None if
    the run does not record its model."""
    import torch

    config = run_config(run_dir)
    if isinstance(config, str):
        return None
    rest = shared_architecture(config)  # the attention's own fields: the layers below show what they build
    layers = config.layers
    built: dict[int, tuple] = {}  # per kind of layer (a layer pattern has several)
    for layer in layers:
        if id(layer) in built:
            continue
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            try:
                module = layer.spec.build(**layer.attention_args())
                output = module.eval()(torch.randn(1, min(config.block_size, 8), config.n_embd))
            except Exception:  # a layer that cannot be built or run here: no claim about it, rather than no grid
                return None
        shapes = tuple((k, tuple(v.shape)) for k, v in module.state_dict().items())
        built[id(layer)] = (layer.heads, shapes, output.numpy().tobytes())
    if config.layer_pattern is None:
        return repr(sorted(rest.items())), *built[id(layers[0])]
    return repr(sorted(rest.items())), tuple(built[id(layer)] for layer in layers)


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


def chosen_cells(cells: Sequence[Cell], best_of: Sequence[str]) -> tuple[list[Cell], dict[tuple, best.Choice | None],
                                                                             list[best.Point]]:
    """(each (setting, group, attention, width)'s cell at its best point, the choices, every point): with no
    `best_of`, the cells as they are."""
    if not best_of:
        return list(cells), {}, []
    points = [best.Point((c.setting, c.group, c.attention, c.width), c.point, c.seeds, c.accuracies) for c in cells]
    chosen = best.choose_all(points, best_of, maximize=True)
    return [c for c in cells if chosen[(c.setting, c.group, c.attention, c.width)].point == c.point], chosen, points


def _chosen_text(cell: Cell | None, best_of: Sequence[str], chosen: dict) -> str:
    if cell is None or not best_of:
        return _cell_text(cell)
    shorts = best.short_names(best_of)
    at = ", ".join(f"{shorts[k]} {best.show(v)}" for k, v in zip(best_of, cell.point))
    edge = chosen[(cell.setting, cell.group, cell.attention, cell.width)].edge
    return f"{_cell_text(cell)} at {at}" + (" (edge)" if edge else "")


def markdown(cells: list[Cell], best_of: Sequence[str] = (), mean: str = "per-query") -> str:
    """One table per setting and group of alike runs: attention rows, width columns, 'mean ± std (runs)'; with
    `best_of`, each cell's best point and its value, and every point in a second table; then each shown cell's
    decode state (recall_state.state_table, notes where it is unknown) and every run (runs_table)."""
    shown, chosen, points = chosen_cells(cells, best_of)
    parts = []
    for where in sorted({c.setting for c in cells}):
        labels = group_labels([c for c in cells if c.setting == where])
        for group, label in labels.items():
            here = [c for c in shown if c.setting == where and c.group == group]
            parts.append(_table(where, here, label, len(labels), best_of, chosen, mean))
            if best_of:
                mine = [p for p in points if p.group[:2] == (where, group)]
                short = [best.Point(p.group[2:], p.point, p.seeds, p.values) for p in mine]
                picks = {k[2:]: v for k, v in chosen.items() if k[:2] == (where, group)}
                parts.append(best.every_point_table(short, ["attention", "width"], best_of, "accuracy", picks))
    parts.append(state_table(shown, _labels(cells)))
    if notes := state_notes(shown):
        parts.append("\n".join(notes) + "\n")
    if table := runs_table(cells, best_of):
        parts.append(table)
    return "\n".join(parts)


def runs_table(cells: Sequence[Cell], best_of: Sequence[str] = ()) -> str:
    """Every run: its cell (its group's label beside the attention, as in the state table), seed and accuracy, the
    step it ended at (and whether its early stop ended it there) and its training time; empty when no run records
    one (runs of an older format or hand-made records)."""
    if not any(r.stopped_at_step is not None or r.train_time_s is not None for c in cells for r in c.runs):
        return ""
    lines = ["Every run: where it ended (an early stop, or the last step it trained) and its training time", "",
             "| sequence length, pairs | attention | width | " + "".join(f"{k} | " for k in best_of)
             + "seed | accuracy | ended | training time |",
             "|---|---|---:|" + "---:|" * len(best_of) + "---|---:|---|---:|"]
    labels = _labels(cells)
    for c in cells:
        label = labels.get((c.setting, c.group), "")
        for end, value, seed in zip(c.runs, c.accuracies, c.seeds):
            ended = (f"stopped early at step {end.stopped_at_step:,}" if end.stopped_at_step is not None
                     else f"step {end.step:,}")
            took = "?" if end.train_time_s is None else f"{end.train_time_s / 60:.1f} min"
            lines.append(f"| {c.setting[0]}, {c.setting[1]} | {c.attention}{f' ({label})' if label else ''} | "
                         f"{c.width} | " + "".join(f"{best.show(v)} | " for v in c.point)
                         + f"{'?' if seed is None else seed} | {value:.3f} | {ended} | {took} |")
    return "\n".join(lines) + "\n"


def _table(where: tuple[int, int], here: list[Cell], label: str, n_groups: int, best_of: Sequence[str],
           chosen: dict, mean: str) -> str:
    widths = sorted({c.width for c in here})
    attentions = list(dict.fromkeys(c.attention for c in here))
    lookup = {(c.attention, c.width): c for c in here}
    steps = sorted({c.steps for c in here})
    after = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]} to {steps[-1]}"
    lines = [f"MQAR accuracy, sequence length {where[0]}, {where[1]} key-value pairs, at step {after} "
             "(mean ± std over runs (n))", "", f"accuracy: {MEANS[mean]}"]
    alike = ", ".join(["the attention", "the width", *best_of][:-1]) + f" and {([*best_of] or ['the width'])[-1]}"
    model = ", ".join(f"{k}={v}" for k, v in recorded(here[0].group).items())
    lines.append(f"model: {model}")
    if n_groups > 1:
        lines.append(f"group: the runs with {label} (runs that differ in more than {alike} are in separate tables)")
    else:
        lines.append(f"like with like: the runs differ only in {alike}")
    if best_of:
        lines.append(best.rule(best_of, "accuracy", maximize=True) + "; (edge): the best is at the grid's edge, "
                     "widen the grid")
    lines += ["", "| attention | " + " | ".join(f"width {w}" for w in widths) + " |", "|---|" + "---:|" * len(widths)]
    lines += [f"| {a} | " + " | ".join(_chosen_text(lookup.get((a, w)), best_of, chosen) for w in widths) + " |"
              for a in attentions]
    if notes := one_model_notes(here):
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _labels(cells: Sequence[Cell]) -> dict[tuple, str]:
    """(setting, like_settings) -> its group's label (group_labels)."""
    return {(where, g): label for where in {c.setting for c in cells}
            for g, label in group_labels([c for c in cells if c.setting == where]).items()}


def write_csv(cells: list[Cell], path: Path, best_of: Sequence[str] = (), mean: str = "per-query") -> None:
    """One row per cell (with `best_of`, per grid point, the chosen one marked); `group` is its table's label;
    `state_bytes` its decode state per sequence after the setting's length (recall_state: float32), '' if unknown."""
    _, chosen, _ = chosen_cells(cells, best_of)
    labels = _labels(cells)
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["input_seq_len", "num_kv_pairs", "attention", "width", "runs", "mqar_acc_mean", "mqar_acc_std",
                      "mqar_acc_min", "mqar_acc_max", "seeds", "steps", "mean", "group",
                      *(k.removeprefix("model.") for k in RECORDED), "state_bytes", "decoding", *best_of,
                      *(["chosen", "edge"] if best_of else [])])
        for c in cells:
            s = stats.summarize(c.accuracies)
            pick = chosen.get((c.setting, c.group, c.attention, c.width))
            mine = [pick is not None and pick.point == c.point, pick.edge or ""] if best_of and pick else []
            out.writerow([*c.setting, c.attention, c.width, s.n, s.mean, s.std, min(c.accuracies), max(c.accuracies),
                          " ".join("?" if seed is None else str(seed) for seed in c.seeds), c.steps, mean,
                          labels[c.setting, c.group], *recorded(c.group).values(),
                          "" if c.state.bytes is None else c.state.bytes, c.state.kind or "", *map(best.show, c.point),
                          *mine])


def write_plot(cells: list[Cell], path: Path, best_of: Sequence[str] = ()) -> None:
    """Accuracy vs width (log2 axis), one panel per setting, one line per attention (and group of alike runs) with
    its min-max bars; with `best_of`, each cell's best point."""
    from matplotlib.figure import Figure

    labels = _labels(cells)
    cells = chosen_cells(cells, best_of)[0]
    settings = sorted({c.setting for c in cells})
    fig = Figure(figsize=(4.2 * len(settings), 3.6), layout="constrained")
    axes = fig.subplots(1, len(settings), squeeze=False, sharey=True)[0]
    for ax, where in zip(axes, settings):
        here = [c for c in cells if c.setting == where]
        for attention, group in dict.fromkeys((c.attention, c.group) for c in here):
            line = [c for c in here if (c.attention, c.group) == (attention, group)]
            label = labels[where, group]
            means = [sum(c.accuracies) / len(c.accuracies) for c in line]
            low = [m - min(c.accuracies) for m, c in zip(means, line)]
            high = [max(c.accuracies) - m for m, c in zip(means, line)]
            ax.errorbar([c.width for c in line], means, yerr=[low, high], marker="o", capsize=3,
                        label=f"{attention} ({label})" if label else attention)
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
    p.add_argument("--best-of", "--best_of", dest="best_of", type=str, default=None, metavar="KEY[,KEY]",
                   help="an option of a grid, e.g. model.lr: each cell is its best value, chosen on the highest "
                        "accuracy averaged over seeds; a second table lists every value")
    p.add_argument("--mean", type=str, default="per-query", choices=list(MEANS),
                   help="a run's accuracy across several test settings: per-query (val/mqar_acc, every query counts "
                        "once) or per-example (Zoology's: each example's accuracy, averaged over examples)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out)
    try:
        best_of = best.parse_keys(args.best_of)
        check_outputs(out, OUTPUTS, args.overwrite, runs=args.run_dirs)
        usable, left = sort_runs(args.run_dirs)
        cells = read_grid(usable, best_of, args.mean)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = markdown(cells, best_of, args.mean) + ("\n" + "\n".join(left) + "\n" if left else "")
    print(text, end="")
    return write_outputs(out, {"recall_grid.md": lambda f: f.write_text(text, encoding="utf-8"),
                               "recall_grid.csv": lambda f: write_csv(cells, f, best_of, args.mean),
                               "recall_grid.png": lambda f: write_plot(cells, f, best_of),
                               "recall_grid_state.png": lambda f: write_state_plot(chosen_cells(cells, best_of)[0],
                                                                                   _labels(cells), f)})


if __name__ == "__main__":
    sys.exit(main())
