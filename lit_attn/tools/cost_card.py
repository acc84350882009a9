"""Cost card: what each attention costs and gives, `lit-attn cost-card [--bench ...] [--decode ...] ...`.

One row per attention: Hq/Hkv, parameters, training FLOPs per token and the decode state (analytic, for the runs'
model or a chosen layout: bytes per token where it grows per token, bytes per sequence after T/8, T/2 and T tokens,
the prompt lengths of bench-decode's default --contexts, and how it grows: per token, window, fixed), training time
per batch (a bench.csv at --context, or the runs' time_per_batch_s), prefill time and decode tokens/s (a decode.csv
at --context and --batch), the measured state bytes per sequence, and what the sweep runs (--runs or --compare)
give: validation loss, MQAR accuracy, passkey accuracy and the extrapolation loss ratios of `lit-attn probe` (each
with its paired difference from a --reference attention over matching seeds), and with --target-loss and --at-time
the training time to a val loss and the val loss at a training time (time_to_loss, paired likewise), and the test
loss where the runs held out a test split. With --best-of KEY (e.g. model.lr, a sweep's --grid), each attention's
row is its runs at its best value, chosen as `lit-attn compare --best-of` chooses. Every input is
optional: what is missing stays blank, and the notes say why. A run directory is read as `lit_attn.tools.compare`
reads it (one that cannot be read is an error).
Writes cost_card.csv, cost_card.md (also printed) and Pareto plots into --out.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from lit_attn.analytic import decode_lengths
from lit_attn.attention.registry import attention_names, get_attention
from lit_attn.cli.toolcli import ToolParser, check_outputs, new_outputs, parse_attention, split_attentions
from lit_attn.config import GPTConfig
from lit_attn.tools import best_of as best
from lit_attn.tools import cost_card_quality as quality
from lit_attn.tools import time_to_loss as timed
from lit_attn.tools.compare import best_points, split_line
from lit_attn.tools.cost_card_layout import (
    DEFAULT_VOCAB,
    LAYOUTS,
    analytic,
    base_config,
    describe,
    runs_layout,
    swapped,
)
from lit_attn.tools.cost_card_layout import DEFAULT_YAML as DEFAULT_YAML  # the card's API, beside base_config
from lit_attn.tools.cost_card_plots import PLOTS, plot_all
from lit_attn.tools.cost_card_plots import pareto_front as pareto_front  # the card's API, beside plot_all
from lit_attn.tools.cost_card_quality import BLANK
from lit_attn.tools.run_record import (
    mixed_setting,
    note_data,
    note_machines,
    note_unevaluated,
    read_run,
    run_attention,
)

# (CSV header, Markdown header, Markdown format); Hq and Hkv are one Markdown column.
COLUMNS: list[tuple[str, str, str]] = [
    ("attention", "attention", "{}"),
    ("n_query_heads", "Hq/Hkv", "{}"),
    ("n_kv_heads", "", "{}"),
    ("parameters", "parameters", "{:,.0f}"),
    ("train_flops_per_token", "train FLOPs/token", "{:.4g}"),
    ("train_time_per_batch_s", "train s/batch", "{:.4g}"),
    ("prefill_s", "prefill s", "{:.4g}"),
    ("decode_tokens_per_sec", "decode tokens/s", "{:,.1f}"),
    ("cache_bytes_per_token_analytic", "state B/token", "{:,.0f}"),
    ("state_bytes_t8", "state B/seq T/8", "{:,.0f}"),
    ("state_bytes_t2", "state B/seq T/2", "{:,.0f}"),
    ("state_bytes_t", "state B/seq T", "{:,.0f}"),
    ("state_bytes_measured", "state B/seq T measured", "{:,.0f}"),
    ("decoding", "decode state", "{}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("runs", "runs", "{}"),
]
CSV_HEADERS = [h for h, _, _ in COLUMNS] + quality.QUALITY_COLUMNS + quality.PAIRED_COLUMNS
# Every file a card may write: a --out that holds any of them is replaced only with --overwrite.
OUTPUTS = ("cost_card.md", "cost_card.csv", *PLOTS)
DECODE_COLUMNS = ("attention", "batch", "context", "prefill_s", "decode_tokens_per_sec", "state_bytes_measured")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _float(cell: Any) -> float | None:
    """A CSV cell as a number; empty, unparsable or NaN cells are None (a blank, not a zero)."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_table(path: Path, required: Iterable[str]) -> list[dict[str, str]]:
    """The rows of a CSV file; ValueError naming the file if it is missing or lacks a required column."""
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"{path} has no column {', '.join(missing)}")
            return list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path} is not a CSV text file ({type(e).__name__}); give the CSV the benchmark wrote") \
            from None


def bench_times(path: Path, context: int) -> tuple[dict[str, float], str]:
    """attention -> forward+backward seconds per batch at seq_len `context`, and where they come from.

    The full GPT ("model" part) is the training step's cost; one layer stands in only when the file
    has no model rows at all, so every attention is timed on the same part.
    """
    rows = read_table(path, ("part", "attention", "seq_len", "batch", "fwd_bwd_s"))
    at = [r for r in rows if _float(r["seq_len"]) == context]
    part = "model" if any(r["part"] == "model" for r in rows) else "layer"
    chosen = [r for r in at if r["part"] == part]
    if not chosen:
        _warn(f"{path} has no {part} rows at seq_len {context}: training time is blank")
    times = {r["attention"]: t for r in chosen if (t := _float(r["fwd_bwd_s"])) is not None}
    batches = sorted({r["batch"] for r in chosen})
    return times, f"{path.name}, part {part}, T={context}, batch {'/'.join(batches) or '?'} (forward+backward)"


def decode_values(path: Path, context: int, batch: int | None) -> tuple[dict[str, dict[str, Any]], str]:
    """attention -> decode.csv's prefill, tokens/s and measured state bytes per sequence at `context` and `batch`, and
    the selection.

    `batch` None is the smallest batch the file has at `context`; of several matching rows, the last wins.
    """
    rows = [r for r in read_table(path, DECODE_COLUMNS) if _float(r["context"]) == context]
    if batch is None and rows:
        batch = int(min(b for r in rows if (b := _float(r["batch"])) is not None))
    chosen = [r for r in rows if _float(r["batch"]) == batch]
    if not chosen:
        _warn(f"{path} has no rows at context {context}, batch {batch}: decoding columns are blank")
    values = {r["attention"]: {k: _float(r[k]) for k in DECODE_COLUMNS[3:]} for r in chosen}
    return values, f"{path.name}, context {context}, batch {batch}"


TEXT_FIELDS = ("run", "attention", "data", "notes")


HF_DECODE_COLUMNS = ("layout", "dtype", "threads", "batch", "prompt", "new_tokens", "lit_tokens_per_sec",
                     "hf_tokens_per_sec", "ratio", "ratio_min", "ratio_max", "tokens_equal")


def hf_decode_notes(path: Path, batch: int | None) -> list[str]:
    """One note per row of benchmarks.bench_hf_decode's hf_decode.csv (at `batch` if given): lit-attn's cached
    generation against transformers' generate on the same weights, the reference for the decode column."""
    rows = [r for r in read_table(path, HF_DECODE_COLUMNS) if batch is None or _float(r["batch"]) == batch]
    if not rows:
        _warn(f"{path} has no row at batch {batch}: no decode reference")
    return [f"decode reference ({path.name}: {r['layout']} layout, {r['dtype']}, {r['threads']} threads, batch "
            f"{r['batch']}, prompt {r['prompt']}, {r['new_tokens']} new tokens): lit-attn generate "
            f"{r['lit_tokens_per_sec']} tokens/s, transformers generate {r['hf_tokens_per_sec']}, ratio {r['ratio']} "
            f"({r['ratio_min']}-{r['ratio_max']}), tokens "
            + ("equal" if r["tokens_equal"] == "True" else "DIFFER") for r in rows]


def run_results(compare_csv: Path | None, run_dirs: Sequence[str], target_loss: float | None = None,
                at_time: float | None = None) -> dict[str, dict[str, Any]]:
    """attention -> mean val_loss, time_per_batch_s and parameters over its runs (compare.csv rows, run dirs),
    their count, the quality columns (cost_card_quality.summarize), "notes": what its runs lack ("RUN: why",
    from compare's notes, then the quality notes), and "records": the runs' rows, each with its time to
    `target_loss` and loss at `at_time` (time_to_loss.annotate; a compare.csv row has no curve to read them from).

    A run directory is read as `lit_attn.tools.compare` reads it: one that cannot be read is a ValueError.
    """
    rows: list[dict[str, Any]] = []
    if compare_csv is not None:
        for r in read_table(compare_csv, ("run", "attention", "parameters", "val_loss", "time_per_batch_s")):
            row = {k: v if k in TEXT_FIELDS else _float(v) for k, v in r.items()}
            row["notes"] = [n for n in (row.get("notes") or "").split("; ") if n]
            row["seed"] = None if row.get("seed") is None else int(row["seed"])  # paired by seed, as compare does
            rows.append(row)
    own = [read_run(d) for d in run_dirs]
    rows += own
    timed.annotate(rows, target_loss, at_time)
    check_one_data(rows)
    note_machines(rows)
    note_unevaluated(rows)
    note_data(rows)
    dirs: dict[str, list[Path]] = {}
    for r, d in zip(own, run_dirs):
        dirs.setdefault(r["attention"], []).append(Path(d))
    for name, group in dirs.items():
        if name and (diff := mixed_setting(group)):
            raise ValueError(f"the {name} runs differ in {diff}: the card's {name} row would average them; give "
                             "it runs of one setting (a card per width or data setting)")
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not r["attention"]:
            _warn(f"run {r['run']} names no attention; it is left out")
            continue
        grouped.setdefault(r["attention"], []).append(r)
    missing, _ = quality.absent([r for runs in grouped.values() for r in runs])  # noted once, for the card
    out = {}
    for name, runs in grouped.items():
        q = quality.summarize(runs, quiet=missing)
        out[name] = q | {"val_loss": _mean(r["val_loss"] for r in runs),
                         "time_per_batch_s": _mean(r["time_per_batch_s"] for r in runs),
                         "parameters": _mean(r["parameters"] for r in runs), "runs": len(runs), "records": runs,
                         "notes": [f"run {r['run']}: {note}" for r in runs for note in r["notes"]]
                         + [f"{name}: {note}" for note in q["quality_notes"]]}
    return out


def choose_runs(run_dirs: Sequence[str], keys: Sequence[str]) -> tuple[list[str], str, str]:
    """(the runs at each attention's best grid point, best_of.md's text, the split the card reports: "test" or
    "val"), chosen as `lit-attn compare --best-of` chooses (compare.best_points)."""
    rows = [read_run(d) for d in run_dirs]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r, d in zip(rows, run_dirs):
        r["grid_point"], r["dir"] = best.grid_point(Path(d), keys), d
        groups.setdefault(r["attention"], []).append(r)
    kept, text, split = best_points(groups, keys, "attention")
    return [r["dir"] for runs in kept.values() for r in runs], text, split


def check_one_data(rows: Sequence[dict[str, Any]]) -> None:
    """ValueError naming two runs trained on different data (their data recorded): the card's rows side by side
    would compare losses and accuracies that do not compare."""
    known = [r for r in rows if r.get("data")]
    other = next((r for r in known if r["data"] != known[0]["data"]), None)
    if other is not None:
        first = known[0]
        raise ValueError(f"the runs were trained on different data ({first['data']} in {first['run']}, {other['data']} "
                         f"in {other['run']}): give the card runs of one data (a card per data)")


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def build_card(base: GPTConfig, context: int, bytes_per_value: int, attentions: Sequence[str] | None = None,
               bench: dict[str, float] | None = None, decode: dict[str, dict[str, Any]] | None = None,
               runs: dict[str, dict[str, Any]] | None = None,
               configs: dict[str, GPTConfig] | None = None,
               measures: Sequence[timed.Measure] = ()) -> list[dict[str, Any]]:
    """The card's rows (CSV header -> value or None), one per attention.

    Default attentions: those the inputs name, in order of appearance (every registered one if none).
    The analytic columns count `configs[name]` (the model of that attention's runs) or else `base` with the
    attention swapped in (with learned positions if it takes no RoPE). Training time comes from `bench` when given,
    else from the runs. `measures`: the --target-loss/--at-time columns the runs carry (time_to_loss.row_values).
    """
    if not attentions:
        named = [*(bench or {}), *(decode or {}), *(runs or {})]
        attentions = list(dict.fromkeys(named)) or attention_names()
    rows = []
    for name in attentions:
        row: dict[str, Any] = dict.fromkeys(CSV_HEADERS) | {"attention": name}
        try:
            config = (configs or {}).get(name) or swapped(base, name)
            row |= analytic(config, context, bytes_per_value)
        except (KeyError, ValueError) as e:  # an attention this layout cannot build: its analytic side stays blank
            _warn(f"{name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        run = (runs or {}).get(name, {})
        times = bench if bench is not None else {k: v["time_per_batch_s"] for k, v in (runs or {}).items()}
        row["train_time_per_batch_s"] = times.get(name)
        row |= (decode or {}).get(name, {})
        row["val_loss"], row["runs"] = run.get("val_loss"), run.get("runs")
        row |= {h: run.get(h) for h in CSV_HEADERS[len(COLUMNS):]}  # quality, MQAR paired with the reference
        row |= {k: v for k, v in run.items() if k.startswith(quality.LM_EVAL_KEY)}  # lit-attn evaluate's metrics
        row |= timed.row_values(run, measures)
        if None not in (run.get("parameters"), row["parameters"]) and run["parameters"] != row["parameters"]:
            # Runs of another layout than the analytic one: their loss would sit beside the wrong counts.
            _warn(f"{name}: the runs have {run['parameters']:,.0f} parameters, the card's layout "
                  f"{row['parameters']:,} (see --layout, --vocab-size)")
        rows.append(row)
    return rows


def choose_layout(layout: str | None, run_dirs: Sequence[str], vocab_size: int, measured: bool = False
                  ) -> tuple[GPTConfig, dict[str, GPTConfig] | None, str]:
    """(base model, attention -> its runs' model or None, the layout in words) for --layout `layout`. None: the
    runs' model when every run records it, else sqa-paper, which is also the model that `measured` inputs
    (bench.csv, decode.csv) timed. ValueError when the runs' models differ beyond their attention, or when `runs`
    is asked for and the runs do not record their model."""
    if layout in ("sqa-paper", "small") or (layout is None and (measured or not run_dirs)):
        return base_config(layout or "sqa-paper", vocab_size), None, layout or "sqa-paper"
    dirs = [Path(d) for d in run_dirs]
    found = runs_layout(dirs, [run_attention(d) for d in dirs])
    if isinstance(found, str):
        if layout == "runs":
            raise ValueError(f"--layout runs: {found}; give run directories that record their model, or --layout "
                             "sqa-paper or small")
        return base_config("sqa-paper"), None, f"sqa-paper ({found})"
    base, configs = found
    return base, configs, f"of the runs ({describe(base)})"


def markdown(rows: Sequence[dict[str, Any]], notes: Sequence[str] = (), with_quality: bool = False,
             measures: Sequence[timed.Measure] = ()) -> str:
    """The card as Markdown: notes on the sources, then the table (with the columns of `measures`, then the quality
    columns if `with_quality`); a missing value is '–'."""
    def cell(value: Any, fmt: str) -> str:
        return BLANK if value is None else fmt.format(value)

    lm_eval = quality.lm_eval_keys(rows)
    metrics = quality.shown(rows)
    heads = [md for _, md, _ in COLUMNS if md] + [m.label for m in measures]
    heads += quality.quality_heads(metrics, lm_eval) if with_quality else []
    lines = [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += ["| " + " | ".join(heads) + " |", "|---|---|" + "---:|" * (len(heads) - 2)]
    for r in rows:
        hq_hkv = BLANK if r["n_query_heads"] is None else f"{r['n_query_heads']}/{r['n_kv_heads']}"
        cells = [r["attention"], hq_hkv] + [cell(r[h], fmt) for h, _, fmt in COLUMNS[3:]]
        cells += [BLANK if r.get(m.key + "_of") is None else timed.cell(m, r) for m in measures]
        cells += quality.quality_cells(r, metrics, lm_eval) if with_quality else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict[str, Any]], path: Path, measures: Sequence[timed.Measure] = ()) -> None:
    """The card as CSV with full-precision numbers (and the columns of `measures`: the flags' values, then each
    measure's statistics); a missing value is an empty field."""
    headers = CSV_HEADERS + quality.lm_eval_keys(rows)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(headers + timed.csv_headers(measures))
        writer.writerows(["" if r.get(h) is None else r[h] for h in headers]
                         + ["" if c is None else c for c in timed.csv_cells(measures, r)] for r in rows)


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options of `lit-attn cost-card` (a jsonargparse Namespace)."""
    p = ToolParser(prog="lit-attn cost-card", description=__doc__.splitlines()[0])
    p.add_argument("--bench", type=str | None, default=None, help="bench.csv of lit-attn bench")
    p.add_argument("--decode", type=str | None, default=None, help="decode.csv of lit-attn bench-decode")
    p.add_argument("--hf-decode", type=str | None, default=None,
                   help="hf_decode.csv of benchmarks.bench_hf_decode: lit-attn vs transformers generate, as the "
                        "decode column's reference")
    p.add_argument("--compare", type=str | None, default=None, help="compare.csv of lit-attn compare")
    p.add_argument("--runs", nargs="+", type=str, default=[], metavar="RUN_DIR", help="run directories")
    p.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="analytic side: runs (the model the --runs trained), sqa-paper (the Sparse Query Attention "
                   "paper's GPT, the model of lit-attn bench and bench-decode) or small (configs/default.yaml's "
                   "model); default: runs when --runs are given without --bench or --decode and every run records "
                   "its model, else sqa-paper")
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB, help="vocabulary of the small layout")
    p.add_argument("--context", type=int | None, default=None,
                   help="tokens of context for FLOPs, bench.csv and decode.csv (default: the layout's block_size)")
    p.add_argument("--batch", type=int | None, default=None,
                   help="decode.csv batch (default: its smallest at --context)")
    p.add_argument("--attention", type=str | None, default=None,
                   help="comma-separated attentions, each optionally with its options as JSON, e.g. "
                        "mha,mha{\"window\": 256} (default: those the inputs name)")
    p.add_argument("--cache-bytes-per-value", type=int, default=4,
                   help="bytes per value of the decode state: 4 for float32 (the CPU default), 2 for bfloat16/float16")
    p.add_argument("--reference", type=str | None, default=None, metavar="NAME",
                   help="attention whose quality metrics the others are compared with, seed by seed "
                        "(default: per metric, the first with it)")
    p.add_argument("--best-of", "--best_of", dest="best_of", type=str, default=None, metavar="KEY[,KEY]",
                   help="an option of a grid, e.g. model.lr: each attention's row is its runs at the best value, "
                        "chosen as lit-attn compare --best-of chooses (val loss); the test loss column reports the "
                        "held-out split where the runs have one; the card ends with every value tried")
    timed.add_flags(p)
    p.add_argument("--out", type=str, default="cost_card", help="directory for cost_card.csv/.md and the PNGs")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier card's files in --out")
    args = timed.read_flags(p, p.parse_args(list(sys.argv[1:] if argv is None else argv)))
    if (args.target_loss or args.at_time) and not args.runs:
        p.error(f"{timed.TARGET_FLAG} and {timed.BUDGET_FLAG} read each run's validation curve: give the run "
                "directories with --runs (compare.csv holds no curves)")
    if args.best_of is not None and (args.compare or not args.runs):
        p.error("--best-of chooses among run directories: give them with --runs (compare.csv holds no grid points)")
    try:
        args.best_of = best.parse_keys(args.best_of)
    except ValueError as e:
        p.error(str(e))
    args.attention = split_attentions(args.attention) if args.attention else None
    for entry in args.attention or []:
        try:
            get_attention(parse_attention(entry)[0])
        except ValueError as e:
            p.error(str(e) if str(e).startswith("--attention") else f"--attention: {e}")
    if min(v for v in (args.vocab_size, args.cache_bytes_per_value, args.context, args.batch) if v is not None) < 1:
        p.error("--vocab-size, --cache-bytes-per-value, --context and --batch must be >= 1")
    return args


def cost_card(args: Any) -> tuple[list[dict[str, Any]], str, list[Path]]:
    """Read the inputs named by `args`, write the card and plots into args.out; return (rows, Markdown, PNGs)."""
    best_text = None
    if args.best_of:
        args.runs, best_text, split = choose_runs(args.runs, args.best_of)
    base, configs, layout = choose_layout(args.layout, args.runs, args.vocab_size, bool(args.bench or args.decode))
    context = args.context or base.block_size
    short, half, _ = decode_lengths(context)
    notes = [f"layout {layout}; parameters, FLOPs/token at T={context} and the decode state (x "
             f"{args.cache_bytes_per_value} B per value) are analytic",
             f"decode state: what decoding keeps, all layers: state B/token where it grows per token (K/V of every "
             f"past token; of the last W for a window), state B/seq after T/8, T/2, T = {short}, {half}, {context} "
             f"tokens (bench-decode's default --contexts at this T); per token grows with T, window stops at W, "
             f"fixed (a recurrent state) is flat"]
    bench = decode = None
    if args.bench:
        bench, where = bench_times(Path(args.bench), context)
        notes.append(f"train s/batch: {where}")
    if args.decode:
        decode, where = decode_values(Path(args.decode), context, args.batch)
        notes.append(f"prefill, decode tokens/s, measured state: {where}")
    if args.hf_decode:
        notes += hf_decode_notes(Path(args.hf_decode), args.batch)
    runs, references, measures, timed_ref = None, {}, [], None
    if args.compare or args.runs:
        runs = run_results(Path(args.compare) if args.compare else None, args.runs, args.target_loss, args.at_time)
        data = {r.get("data") for v in runs.values() for r in v["records"]} - {None, ""}
        notes += [f"data: {d}" for d in data]  # one at most (check_one_data)
        if best_text is not None:
            chosen = [r for v in runs.values() for r in v["records"]]
            notes.append(f"each attention at its best {', '.join(args.best_of)} (every value tried: the table at the "
                         f"end); {split_line(split, chosen)}" + ("" if split == "val" else
                                                                  " (the test loss column and its paired table)"))
        notes.append("val loss" + ("" if bench is not None else ", train s/batch") + ", lm-eval metrics (lit-attn "
                     "evaluate): means over the runs; MQAR acc, passkey acc, loss ratios (lit-attn probe): "
                     "mean ± sample std (runs)")
        notes += [note for name in runs for note in runs[name]["notes"]]
        notes += quality.absent([r for v in runs.values() for r in v["records"]])[1]
        references, pairs, pair_notes = quality.paired({k: v["records"] for k, v in runs.items()}, args.reference)
        notes += pair_notes
        for name in runs:
            runs[name] |= pairs.get(name, {})
        measures = timed.measures(args.target_loss, args.at_time)
        timed_ref, timed_stats = timed.by_group({k: v["records"] for k, v in runs.items()}, measures, args.reference)
        for name in runs:
            runs[name] |= timed_stats[name]
        if measures:
            notes.append(f"{' and '.join(m.label for m in measures)}: from each run's val loss curve on its training "
                         f"clock (warm-up included, evaluation excluded), interpolated between evaluations, never "
                         f"extrapolated; mean ± sample std (runs with a value of all runs), paired with {timed_ref}'s "
                         f"below")
    rows = build_card(base, context, args.cache_bytes_per_value, args.attention, bench, decode, runs, configs,
                      measures)
    notes += [f"{r['attention']}: no runs, so no val loss or quality" for r in rows if runs and r["runs"] is None]
    out = Path(args.out)
    table = markdown(rows, notes, with_quality=runs is not None, measures=measures)
    if references:
        table += "\n" + quality.paired_markdown(rows, references)
    for m in measures:
        table += "\n" + timed.markdown(m, [(r["attention"], r) for r in rows if r.get(m.key + "_of")], "attention",
                                       timed_ref)
    if best_text is not None:
        table += "\n" + best_text + "\n"
    with new_outputs(out):
        (out / "cost_card.md").write_text(table, encoding="utf-8")
        write_csv(rows, out / "cost_card.csv", measures)
        return rows, table, plot_all(rows, out)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the card and write its files; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    try:
        check_outputs(Path(args.out), OUTPUTS, args.overwrite, runs=args.runs)
        _, table, pngs = cost_card(args)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"wrote {Path(args.out) / 'cost_card.md'}, {', '.join(['cost_card.csv'] + [p.name for p in pngs])}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
