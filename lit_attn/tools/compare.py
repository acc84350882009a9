"""Compare runs from their TensorBoard event files: `lit-attn compare RUN_DIR [RUN_DIR ...] [--out DIR]`.

Writes the Sparse Query Attention paper's style of table as Markdown (also printed) and CSV, and PNG plots of
validation loss vs step and vs time, one line per run, with each run's seeds. A metric a run did not log is left
blank and the run's notes say why. When runs share an attention (or --group-by setting), e.g. seeds, stats.md
(also printed) and stats.csv summarize each group. Runs trained on different data (the data column) are never
grouped together, and a group is paired only with a reference on its own data. With --best-of KEY (e.g. model.lr,
the option of a sweep's --grid), each group's statistics are those of its best grid point, chosen on the lowest
val loss averaged over the seeds every point has and reported on the held-out test split when every chosen run has
one (--data.test_fraction); best_of.md (also printed) shows the chosen values and every point, and says which split
chose and which reports.
With --target-loss X and --at-time SECONDS, each run's training time to val loss X and its val loss after SECONDS of
training (time_to_loss) are columns too, and stats.md and stats.csv summarize and pair them as the final loss.
A run's training record is read
(see run_record), never its evaluations under RUN/eval/; an event file that is not whole, a directory without
event files and a --group-by setting a run lacks are errors, and nothing is written then.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lit_attn.cli.toolcli import ToolParser, check_outputs, new_outputs
from lit_attn.tools import best_of as best
from lit_attn.tools import stats
from lit_attn.tools import time_to_loss as timed
from lit_attn.tools.compare_plots import GROUP_PLOTS, RUN_PLOTS, plot, plot_groups
from lit_attn.tools.run_record import COLUMNS as COLUMNS  # compare.csv's columns, for its readers
from lit_attn.tools.run_record import (
    NO_MQAR,
    NO_TEST,
    note_data,
    note_machines,
    note_unevaluated,
    read_run,
    setting,
    setting_keys,
    table_columns,
)

# Every file a comparison may write: a --out that holds any of them is replaced only with --overwrite.
OUTPUTS = ("compare.md", "compare.csv", *RUN_PLOTS, "stats.md", "stats.csv", *GROUP_PLOTS, "best_of.md")
# (Markdown header, CSV header) of the run's seeds, after its attention
SEED_COLUMNS = (("seed", "seed"), ("data seed", "data_seed"))
UNKNOWN_DATA = "?"  # the data cell of a run that does not record its data (its notes say so)
OTHER_DATA = stats.Paired(0, None, None, "n/a (trained on other data than the reference)")


def _seed_cell(value: int | None) -> str:
    return "" if value is None else str(value)


def _columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, tuple[str, ...], str]]:
    """The table's value columns: MQAR accuracy only when a run has it, the times of --target-loss/--at-time."""
    return table_columns(rows) + timed.columns(rows)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown; missing values are blank, and the run's notes say why."""
    columns = _columns(rows)
    head = ["run", "attention", "data", *(md for md, _ in SEED_COLUMNS), *(c[0] for c in columns), "notes"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---:|---:|" + "---:|" * len(columns) + "---|"]
    for r in rows:
        cells = [r["run"], r["attention"], (r["data"] or UNKNOWN_DATA).replace("|", "/"),
                 *(_seed_cell(r[h]) for _, h in SEED_COLUMNS)]
        cells += ["" if r.get(header) is None else fmt.format(r[header]) for _, header, _, fmt in columns]
        cells.append("; ".join(r["notes"]).replace("|", "/"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The table as CSV with full-precision numbers; missing values are empty fields, explained in `notes`."""
    headers = ["run", "attention", "data", *(h for _, h in SEED_COLUMNS), *timed.settings(rows),
               *(c[1] for c in _columns(rows))]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*headers, "notes"])
        for r in rows:
            writer.writerow(["" if r.get(h) is None else r[h] for h in headers] + ["; ".join(r["notes"])])


def _present(runs: list[dict[str, Any]], header: str) -> list[float]:
    return [r[header] for r in runs if r[header] is not None]


def by_seed(runs: Sequence[dict[str, Any]], key: str, group: str) -> dict[int, float]:
    """seed -> the runs' final `key` (val_loss, mqar_acc, ...); runs without a seed or a value, and seeds the group
    has twice, are not paired (said on stderr)."""
    usable = [r for r in runs if r.get("seed") is not None and r.get(key) is not None]
    seeds = [r["seed"] for r in usable]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        print(f"warning: group {group} has seed(s) {', '.join(map(str, twice))} in more than one run; "
              f"those are left out of its paired {key} difference", file=sys.stderr)
    return {r["seed"]: r[key] for r in usable if r["seed"] not in twice}


def group_stats(groups: dict[str, list[dict[str, Any]]], reference: str, split: str = "val") -> list[dict[str, Any]]:
    """Per group: the summaries of the final loss and acc on `split` ("val", or "test": the held-out split), the
    speed, and the loss paired against `reference` (OTHER_DATA for a group trained on other data than the
    reference's: its losses do not compare); and the same of the runs' --target-loss/--at-time measures
    (time_to_loss.group_stats)."""
    loss_key, acc_key = f"{split}_loss", f"{split}_acc"
    ref = by_seed(groups[reference], loss_key, reference)
    ref_data = groups[reference][0]["data"]
    measures = timed.from_rows(groups[reference])
    out = []
    for name, runs in groups.items():
        other = runs[0]["data"] != ref_data
        times = _present(runs, "time_per_batch_s")
        tokens = stats.summarize(_present(runs, "tokens_per_sec"))
        paired = None if name == reference else OTHER_DATA if other else \
            stats.paired_difference(by_seed(runs, loss_key, name), ref)
        out.append({"group": name, "split": split, "n_runs": len(runs), "seeds": _seed_list(runs, "seed"),
                    "data_seeds": _seed_list(runs, "data_seed"), "loss": stats.summarize(_present(runs, loss_key)),
                    "acc": stats.summarize(_present(runs, acc_key)), "time_median": stats.median(times),
                    "time_min": min(times, default=None), "time_max": max(times, default=None),
                    "tokens_mean": tokens.mean, "paired": paired})
        for m in measures:  # paired over the seeds where both have a value, as the final loss
            out[-1] |= timed.group_stats(m, runs, None if name == reference else groups[reference],
                                         OTHER_DATA if other else None)
    return out


def _seed_list(runs: list[dict[str, Any]], key: str) -> str:
    """The runs' seeds in run order, '?' for a run without one: '1, 2, ?'."""
    return ", ".join("?" if r[key] is None else str(r[key]) for r in runs)


def _num(value: float | None, fmt: str = "{:.4f}") -> str:
    return "" if value is None else fmt.format(value)


def _interval(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def stats_markdown(table: list[dict[str, Any]], key: str, reference: str,
                   measures: Sequence[timed.Measure] = (), basis: str | None = None) -> str:
    """The statistics as two Markdown tables, per group and paired against the reference, on the groups' split
    (`basis`, the sentence that says which split chose a grid point and which reports, heads them); then one per
    measure of --target-loss/--at-time."""
    split = table[0]["split"] if table else "val"
    lines = [*([f"{basis[0].upper()}{basis[1:]}.", ""] if basis else []),
             f"Final values over the runs of each {key}: mean ± sample std, 95% CI of the mean (Student's t).", "",
             f"| {key} | runs | seed | data seed | {split} loss | {split} loss 95% CI | {split} acc | "
             f"time/batch (s), median [min, max] | tokens/s |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for g in table:
        loss, acc = g["loss"], g["acc"]
        spread = "" if g["time_median"] is None else (
            f"{g['time_median']:.4f} [{g['time_min']:.4f}, {g['time_max']:.4f}]")
        lines.append(f"| {g['group']} | {g['n_runs']} | {g['seeds']} | {g['data_seeds']} | "
                     f"{_num(loss.mean)}{_num(loss.std, ' ± {:.4f}')} | "
                     f"{_interval(loss.ci)} | {_num(acc.mean)}{_num(acc.std, ' ± {:.4f}')} | {spread} | "
                     f"{_num(g['tokens_mean'], '{:,.0f}')} |")
    lines += ["", f"Final {split} loss minus {reference}'s over matching seeds (negative: lower loss than "
                  f"{reference}).", "", f"| {key} | pairs | Δ {split} loss | Δ 95% CI | verdict |",
              "|---|---:|---:|---:|---|"]
    for g in table:
        d = g["paired"]
        lines.append(f"| {g['group']} |  |  |  | reference |" if d is None else
                     f"| {g['group']} | {d.n} | {_num(d.mean, '{:+.4f}')} | {_interval(d.ci)} | {d.verdict} |")
    for m in measures:
        lines += ["", timed.markdown(m, [(g["group"], g) for g in table], key, reference).rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_stats_csv(table: list[dict[str, Any]], key: str, reference: str, path: Path,
                    measures: Sequence[timed.Measure] = (), split: str = "val") -> None:
    """The statistics as CSV, full precision, one row per group (and the measures of --target-loss/--at-time);
    what cannot be computed is an empty field. The loss and acc columns name their `split` (val_loss_mean,
    test_loss_mean)."""
    head = [key, "n_runs", "seed", "data_seed", *(f"{split}_{name}" for name in (
            "loss_mean", "loss_std", "loss_ci_low", "loss_ci_high", "acc_mean", "acc_std")),
            "time_per_batch_median_s", "time_per_batch_min_s", "time_per_batch_max_s",
            "tokens_per_sec_mean", "reference", "n_pairs", *(f"{split}_{name}" for name in (
                "loss_diff_mean", "loss_diff_ci_low", "loss_diff_ci_high")), "verdict", *timed.csv_headers(measures)]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        for g in table:
            loss, acc, d = g["loss"], g["acc"], g["paired"]
            paired = ["", "", "", "", "reference"] if d is None else [d.n, d.mean, *(d.ci or ("", "")), d.verdict]
            cells = [g["group"], g["n_runs"], g["seeds"], g["data_seeds"], loss.mean, loss.std,
                     *(loss.ci or ("", "")), acc.mean, acc.std,
                     g["time_median"], g["time_min"], g["time_max"], g["tokens_mean"], reference, *paired,
                     *timed.csv_cells(measures, g)]
            writer.writerow(["" if c is None else c for c in cells])


def _group_of(row: dict[str, Any], run_dir: Path, key: str) -> str:
    """The run's `key` setting; ValueError naming the settings it has if it has no such setting.

    A run without an attention setting (no hparams.yaml or config.yaml) is in group '?' (its notes say so).
    """
    if key == "attention":
        return row["attention"] or "?"
    value = setting(run_dir, key)
    if not value:
        keys = sorted(setting_keys(run_dir))
        raise ValueError(f"--group-by {key!r} is not a setting of run {run_dir}; choose one of its settings: "
                         f"{', '.join(keys) if keys else 'none (it has no hparams.yaml or config.yaml)'}")
    return value


def _reference(groups: dict[str, list[dict[str, Any]]], reference: str | None, group_by: str) -> str:
    """The group named `reference` (default: the first); by its setting alone when the runs' data split the groups
    ("mha" names the first group "mha on DATA"). ValueError if no group has that name or setting."""
    if reference is None or reference in groups:
        return next(iter(groups), "") if reference is None else reference
    named = [g for g, runs in groups.items() if runs[0]["group_value"] == reference]
    if not named:
        raise ValueError(f"--reference {reference!r} is none of the groups by {group_by}: {', '.join(groups)}")
    return named[0]


def reported_on(chosen: Sequence[dict[str, Any]]) -> str:
    """The split a grid's chosen runs are reported on: "test" when every one of them has a test loss (the held-out
    split no choice looked at), else "val"."""
    return "test" if chosen and all(r.get("test_loss") is not None for r in chosen) else "val"


def split_line(split: str, chosen: Sequence[dict[str, Any]]) -> str:
    """What chose the grid point and what the statistics report, as the tables say it."""
    if split == "test":
        return "chosen on: val; reported on: test"
    why = "no test split" if not any(r.get("test_loss") is not None for r in chosen) else \
        "not every chosen run has a test split"
    return f"chosen on: val; reported on: validation ({why})"


CHOSEN_ON = {"val_loss": ("val loss", False), "mqar_acc": ("MQAR accuracy", True)}  # row key -> (label, maximize)


def chosen_on(rows: Sequence[dict[str, Any]]) -> str:
    """The row key a grid's points are chosen on: the final MQAR accuracy when every run that validated logged one
    (as `lit-attn recall-grid --best-of` chooses: recall is what an MQAR grid is tuned for), else the final val
    loss. A run that never validated has neither, and chooses nothing."""
    validated = [r for r in rows if r.get("val_loss") is not None]
    return "mqar_acc" if validated and all(r.get("mqar_acc") is not None for r in validated) else "val_loss"


def best_points(groups: dict[str, list[dict[str, Any]]], keys: Sequence[str],
                group_by: str) -> tuple[dict[str, list[dict[str, Any]]], str, str]:
    """(each group's runs at its best grid point, best_of.md's text, the split its statistics report: reported_on):
    the point of the best seed mean (best_of.choose) of the final value chosen_on names (the lowest val loss, or the
    highest MQAR accuracy); a group none of whose runs has that value keeps all its runs. The test loss, where the
    chosen runs have one, is shown beside it."""
    metric = chosen_on([r for runs in groups.values() for r in runs])
    label, maximize = CHOSEN_ON[metric]
    points: dict[tuple, best.Point] = {}
    tests: dict[tuple, list[float]] = {}
    for name, runs in groups.items():
        for r in runs:
            p = points.setdefault((name, r["grid_point"]), best.Point((name,), r["grid_point"], [], []))
            if r[metric] is not None:
                p.seeds.append(r["seed"])
                p.values.append(r[metric])
                if r.get("test_loss") is not None:
                    tests.setdefault(((name,), r["grid_point"]), []).append(r["test_loss"])
    chosen = best.choose_all(list(points.values()), keys, maximize=maximize)
    kept = {name: [r for r in runs if chosen.get((name,)) is None or r["grid_point"] == chosen[(name,)].point]
            for name, runs in groups.items()}
    chosen_runs = [r for name, runs in kept.items() if chosen.get((name,)) is not None for r in runs
                   if r[metric] is not None]
    split = reported_on(chosen_runs)
    test = ["test loss"] if tests else []
    lines = [f"Best {', '.join(keys)} per {group_by} ({best.rule(keys, label, maximize=maximize)})",
             f"{split_line(split, chosen_runs)[0].upper()}{split_line(split, chosen_runs)[1:]}.", "",
             "| " + " | ".join([group_by, *keys, label, *test, "note"]) + " |",
             "|---|" + "---:|" * (len(keys) + 1 + len(test)) + "---|"]
    for name in groups:
        choice = chosen.get((name,))
        if choice is None:
            lines.append(f"| {name} | " + " | " * (len(keys) + len(test)) + f" | no {label} at any point |")
            continue
        values = points[(name, choice.point)].values
        reported = [best.spread(tests.get(((name,), choice.point), []), "{:.4f}")] if tests else []
        lines.append("| " + " | ".join([name, *map(best.show, choice.point), best.spread(values, "{:.4f}"),
                                        *reported, choice.edge or ""]) + " |")
    table = best.every_point_table(list(points.values()), [group_by], keys, label, chosen, "{:.4f}",
                                   ("test loss", tests) if tests else None)
    return kept, "\n".join(lines) + "\n\n" + table, split


def compare(run_dirs: list[str | Path], out: str | Path, *, group_by: str = "attention",
            reference: str | None = None, best_of: Sequence[str] = (), target_loss: float | None = None,
            at_time: float | None = None) -> tuple[list[dict[str, Any]], str]:
    """Read the runs, write compare.md, compare.csv and the plots into `out`; return (rows, Markdown printed).

    When a group (the runs with the same `group_by` setting) has more than one run, also write stats.md,
    stats.csv and the plots over groups, against the group `reference` (default: the first); the Markdown
    returned is then compare.md's and stats.md's. When the runs were trained on different data, a group is the
    runs of one setting on one data ("mha on DATA"). With `best_of` (setting keys, e.g. ["model.lr"]), each
    group's statistics are its best grid point's (best_points), and best_of.md is written and returned too.
    `target_loss` and `at_time` (seconds): each run's training time to that val loss and its val loss after that
    training time (time_to_loss), in both tables.
    Everything is read before `out` is made; a failure while writing removes an `out` made here.
    """
    rows = [read_run(d) for d in run_dirs]
    measures = timed.annotate(rows, target_loss, at_time)
    note_machines(rows)
    note_unevaluated(rows)
    note_data(rows)
    if any(c[1] == "mqar_acc" for c in table_columns(rows)):
        for r in rows:
            if r["mqar_acc"] is None:
                r["notes"].append(NO_MQAR)
    if any(r["test_loss"] is not None for r in rows):
        for r in rows:
            if r["test_loss"] is None:
                r["notes"].append(NO_TEST)
    mixed = group_by != "data" and len({r["data"] for r in rows}) > 1
    groups: dict[str, list[dict[str, Any]]] = {}  # in the order of their first runs
    for r, d in zip(rows, run_dirs):
        r["group_value"] = _group_of(r, Path(d), group_by)
        name = f"{r['group_value']} on {r['data'] or 'unknown data'}" if mixed else r["group_value"]
        groups.setdefault(name, []).append(r)
        if best_of:
            r["grid_point"] = best.grid_point(Path(d), best_of)
    best_text, split, basis = None, "val", None
    if best_of:
        groups, best_text, split = best_points(groups, best_of, group_by)
        basis = split_line(split, [r for runs in groups.values() for r in runs if r["val_loss"] is not None])
    reference = _reference(groups, reference, group_by)  # before anything is written
    table = group_stats(groups, reference, split) if any(len(runs) > 1 for runs in groups.values()) else None
    text = markdown(rows)
    summary = None if table is None else stats_markdown(table, group_by, reference, measures, basis)
    out = Path(out)
    with new_outputs(out):
        (out / "compare.md").write_text(text, encoding="utf-8")
        write_csv(rows, out / "compare.csv")
        plot(rows, out)
        if best_text is not None:
            (out / "best_of.md").write_text(best_text, encoding="utf-8")
        else:
            (out / "best_of.md").unlink(missing_ok=True)  # an earlier comparison's choice would pass for these runs'
        if table is not None:
            (out / "stats.md").write_text(summary, encoding="utf-8")
            write_stats_csv(table, group_by, reference, out / "stats.csv", measures, split)
            chosen = rows if best_text is None else [r for runs in groups.values() for r in runs]
            plot_groups(chosen, groups, table, group_by, out)
        else:
            # An earlier comparison's statistics in `out` would pass for these runs'
            for name in ("stats.md", "stats.csv", *GROUP_PLOTS):
                (out / name).unlink(missing_ok=True)
    return rows, "\n".join(part for part in (text, best_text, summary) if part is not None)


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options of `lit-attn compare` (a jsonargparse Namespace)."""
    p = ToolParser(prog="lit-attn compare", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (RUNS_DIR/RUN) holding event files")
    p.add_argument("--out", type=str, default="comparison",
                   help="output directory for compare.md/.csv, stats.md/.csv and the PNGs")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison's files in --out")
    p.add_argument("--group-by", "--group_by", dest="group_by", type=str, default="attention", metavar="SETTING",
                   help="model setting (a key of the run's hparams.yaml) whose runs are summarized together; "
                        "stats.md/.csv are written when a group has more than one run")
    p.add_argument("--best-of", "--best_of", dest="best_of", type=str, default=None, metavar="KEY[,KEY]",
                   help="an option of a grid, e.g. model.lr: each group's statistics are those of its best value, "
                        "chosen on the lowest val loss averaged over seeds and reported on the test split when "
                        "every chosen run has one; best_of.md lists every value")
    p.add_argument("--reference", type=str, default=None, metavar="NAME",
                   help="the group the others are compared with, seed by seed (default: the first run's)")
    timed.add_flags(p)
    return timed.read_flags(p, p.parse_args(list(sys.argv[1:] if argv is None else argv)))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the Markdown table and write the files; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    try:
        check_outputs(Path(args.out), OUTPUTS, args.overwrite, runs=args.run_dirs)
        _, text = compare(args.run_dirs, args.out, group_by=args.group_by, reference=args.reference,
                          best_of=best.parse_keys(args.best_of), target_loss=args.target_loss,
                          at_time=args.at_time)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    written = ["compare.csv", *RUN_PLOTS, *(["best_of.md"] if args.best_of else [])]
    if (Path(args.out) / "stats.md").is_file():
        written += ["stats.md", "stats.csv", *GROUP_PLOTS]
    print(f"wrote {Path(args.out) / 'compare.md'}, {', '.join(written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
