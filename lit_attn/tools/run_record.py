"""One run's record for `lit_attn.tools.compare` and `lit_attn.tools.cost_card`: its settings and seeds (hparams.yaml,
config.yaml), the final value of each table column and the val-loss curve (its training event files), and a
note for every value it lacks saying why."""

from __future__ import annotations

import bisect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from lit_attn.tools.events import EVAL_DIR, PROBE_DIR, hparams_record, run_scalars

# (column, CSV header, TensorBoard tags tried in order, Markdown format): the whole_run/* scalars of the run's
# HParams record, and for the speeds of a run without a record, the rolling window's last value.
COLUMNS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("parameters", "parameters", ("whole_run/n_params",), "{:,.0f}"),
    ("val loss", "val_loss", ("val/loss", "whole_run/val_loss"), "{:.4f}"),
    ("val acc", "val_acc", ("val/acc", "whole_run/val_acc"), "{:.4f}"),
    ("perplexity", "val_ppl", ("val/ppl",), "{:.2f}"),
    ("time/batch (s)", "time_per_batch_s", ("whole_run/time_per_batch", "train/time_per_batch"), "{:.4f}"),
    ("train time (s)", "train_time_s", ("whole_run/train_time",), "{:.2f}"),
    ("tokens/s", "tokens_per_sec", ("whole_run/tokens_per_sec", "train/tokens_per_sec"), "{:,.0f}"),
]
# The held-out test split's, scored once at the end of fit (a datamodule with a test split, e.g.
# --data.test_fraction): columns of the table only when a run has them, so that a table of runs without one stays
# as it was.
TEST_COLUMNS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("test loss", "test_loss", ("test/loss",), "{:.4f}"),
    ("test acc", "test_acc", ("test/acc",), "{:.4f}"),
    ("test perplexity", "test_ppl", ("test/ppl",), "{:.2f}"),
]
# Recall accuracy of a run trained on MQAR data: a column of the table only when a run has it, so that a
# language-modelling comparison's table stays as it was.
MQAR_COLUMN = ("mqar acc", "mqar_acc", ("val/mqar_acc",), "{:.4f}")
# `lit-attn probe` results (RUN/probe/PROBE/PROBE.json), read beside the training record, never from its events.
PROBE_HEADERS = ("passkey_acc", "loss_ratio_2x", "loss_ratio_4x")
# `lit-attn evaluate` results (RUN/eval/lm-eval-N/results.json): a column "lm_eval/TASK/METRIC" per metric a run has.
LM_EVAL_DIR = "lm-eval"
LM_EVAL_KEY = "lm_eval/"
CURVE_TAG = "val/loss"
# Seconds of training (validations and what follows them excluded), logged beside every val/loss point.
TRAIN_CLOCK_TAG = "val/train_time"
TRAIN_TIME_TAG = "whole_run/train_time"
RECORD_PREFIX = "whole_run/"  # the end-of-fit record
# Scalars only a lit-attn before 2026-11-23 logged: its end-of-fit record (hp/*, params/*, timing/*) and its
# training clock (train/time). Such a run is refused in one line.
OLDER_PREFIXES, OLDER_TAGS = ("hp/", "params/", "timing/"), ("train/time",)
WINDOW_TAGS = ("train/time_per_batch", "train/tokens_per_sec")
# An early stop (callbacks.hparams: an EarlyStopping callback ended the fit): its step and Lightning's reason.
STOPPED_TAG = "whole_run/stopped_early_at_step"
STOPPED_COLUMN = "Stopped early"
SPEED = ("time_per_batch_s", "tokens_per_sec")

NO_MQAR = "no mqar acc: not trained on MQAR data (no val/mqar_acc logged)"
NO_TEST = "no test loss: its data holds out no test split, or the fit did not reach its end (no test/loss logged)"
NOT_EVALUATED = "not evaluated: no lit-attn evaluate results (eval/lm-eval-N/results.json)"
NO_DATA = "its data is not recorded (hparams.yaml has no data: a run of an older version)"
NO_VALIDATION = "no validation was logged (run shorter than val_check_interval?)"
NO_RECORD = "no HParams record: the run did not finish (interrupted or still running)"


class CurvePoint(NamedTuple):
    """One validation: its step, the run's training time and wall time then (s), and the loss (nats/token)."""

    step: int
    train_time: float | None  # None when the run has no training clock (TRAIN_CLOCK_TAG)
    wall_time: float
    loss: float


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it: much faster
    """yaml's SafeLoader that reads tags it does not know (hparams.yaml's !!python/tuple) as plain YAML."""


_Loader.add_multi_constructor("", lambda loader, _, node: (
    loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode)
    else loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
    else loader.construct_scalar(node)))


def table_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, tuple[str, ...], str]]:
    """COLUMNS, then TEST_COLUMNS when any of `rows` has a test loss, MQAR_COLUMN when any has an MQAR accuracy,
    then one per lm-eval metric a row has."""
    lm_eval = sorted({k for r in rows for k in r if k.startswith(LM_EVAL_KEY)})
    return (COLUMNS + (TEST_COLUMNS if any(r.get("test_loss") is not None for r in rows) else [])
            + ([MQAR_COLUMN] if any(r.get("mqar_acc") is not None for r in rows) else [])
            + [(k.removeprefix(LM_EVAL_KEY), k, (), "{:.4g}") for k in lm_eval])


def read_yaml(path: Path) -> Any:
    """The parsed file, or None if it is missing or not valid YAML (then with a warning)."""
    if not path.is_file():
        return None
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # a SafeLoader: it runs nothing
    except yaml.YAMLError as e:
        print(f"warning: {path} is not valid YAML ({type(e).__name__}); its settings are left blank", file=sys.stderr)
        return None
    except UnicodeDecodeError:
        print(f"warning: {path} is not UTF-8 text; its settings are left blank", file=sys.stderr)
        return None


def _node(data: Any, *path: str) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _model_sections(run_dir: Path) -> list[dict]:
    """Where the model's settings are: hparams.yaml's top level, config.yaml's model (or model.init_args)."""
    config = read_yaml(run_dir / "config.yaml")
    nodes = [read_yaml(run_dir / "hparams.yaml"), _node(config, "model"), _node(config, "model", "init_args")]
    return [n for n in nodes if isinstance(n, dict)]


def setting(run_dir: Path, key: str) -> str:
    """The run's model setting `key` as text, from hparams.yaml (top level) or config.yaml (model section);
    '' if neither has it."""
    for node in _model_sections(run_dir):
        if key in node and node[key] != "":
            value = node[key]
            # YAML's spelling (null, true), as the setting is written in the run's files and on the command line
            return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return ""


def run_attention(run_dir: Path) -> str:
    """The run's attention as the tables name it: with its options if it has any (e.g. mha(window=64), see
    lit_attn.pattern.layer_label), or its layer pattern (e.g. mha/SSSL/w64, pattern_label); '' if no file names
    one. Runs of one attention with other options are other models: they never share a row."""
    attention = setting(run_dir, "attention")
    settings = model_settings(run_dir)
    pattern, options = settings.get("layer_pattern"), settings.get("attention_options")
    if not attention or (pattern in (None, "") and not options):
        return attention
    from lit_attn.pattern import layer_label, pattern_label  # the attention registry, torch: only when needed

    if pattern in (None, ""):
        return layer_label(attention, options if isinstance(options, dict) else {"options": options})
    return pattern_label(attention, pattern, settings.get("local_window"))


def model_settings(run_dir: Path) -> dict[str, Any]:
    """The run's model settings, hparams.yaml's (which also holds the data's vocab_size) over config.yaml's."""
    merged: dict[str, Any] = {}
    for node in reversed(_model_sections(run_dir)):
        merged |= {k: v for k, v in node.items() if isinstance(k, str) and k != "init_args"}
    return merged


def setting_keys(run_dir: Path) -> set[str]:
    """The model settings `setting` can read for the run."""
    return set(model_settings(run_dir))


# What a run learns from, in its config.yaml: the model, the data, the optimizer and schedule, and these of the
# trainer. Runs that differ only elsewhere (seeds, workers, logging, devices) are runs of one setting.
SETTING_SECTIONS = ("model", "data", "optimizer", "lr_scheduler")
SETTING_TRAINER_KEYS = ("max_steps", "max_epochs", "limit_train_batches", "accumulate_grad_batches", "precision",
                        "gradient_clip_val", "gradient_clip_algorithm")
NOT_SETTING = {"data.seed", "data.num_workers", "model.compile"}


def _leaves(data: Any, prefix: str) -> dict[str, Any]:
    """Dotted key -> value of every leaf under `data` (init_args folded into its section, as on the command line)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= _leaves(value, prefix if key == "init_args" else f"{prefix}.{key}")
    return out


def run_setting(run_dir: Path) -> dict[str, Any]:
    """What the run learns from (SETTING_SECTIONS and SETTING_TRAINER_KEYS of its config.yaml) as dotted keys,
    seeds and NOT_SETTING left out; {} if it has no config.yaml."""
    config = read_yaml(run_dir / "config.yaml")
    if not isinstance(config, dict):
        return {}
    out = {k: v for section in SETTING_SECTIONS if section in config
           for k, v in _leaves(config[section], section).items()}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    out |= {f"trainer.{k}": trainer[k] for k in SETTING_TRAINER_KEYS if k in trainer}
    return {k: v for k, v in out.items() if k not in NOT_SETTING}


def mixed_setting(run_dirs: Sequence[Path]) -> str | None:
    """None when the runs share one setting (run_setting, compared on the keys both runs have, so runs of older
    versions still match); else the first difference, as 'model.n_embd (64 in RUN_A, 128 in RUN_B)'."""
    if not run_dirs:
        return None
    first, base = run_dirs[0], run_setting(run_dirs[0])
    for other in run_dirs[1:]:
        theirs = run_setting(other)
        for key in sorted(base.keys() & theirs.keys()):
            if base[key] != theirs[key]:
                return f"{key} ({base[key]!r} in {first}, {theirs[key]!r} in {other})"
    return None


def _integer(value: Any) -> int | None:
    # true/false mean "draw one"/"none"; LightningCLI writes the drawn seed back, so a bool here is no seed
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def seeds(run_dir: Path) -> tuple[int | None, int | None]:
    """(seed_everything, the data order's seed) of the run's config.yaml; None where it is not an integer."""
    config = read_yaml(run_dir / "config.yaml")
    data = _node(config, "data", "init_args") if isinstance(_node(config, "data", "init_args"), dict) else \
        _node(config, "data")
    return _integer(_node(config, "seed_everything")), _integer(_node(data, "seed"))


def warmup_batches(run_dir: Path) -> int | None:
    """config.yaml's timing.warmup_batches: the batches the run's whole-run means leave out; None if it has none
    (a run from before warm-up batches were left out: its means include them)."""
    timing = _node(read_yaml(run_dir / "config.yaml"), "timing")
    timing = _node(timing, "init_args") if isinstance(_node(timing, "init_args"), dict) else timing
    return _integer(_node(timing, "warmup_batches"))


def check_format(run_dir: Path, series: dict[str, list[Any]]) -> None:
    """ValueError (one line) for a run whose event files are in the format of an older lit-attn (OLDER_PREFIXES,
    OLDER_TAGS)."""
    old = sorted(tag for tag in series if tag.startswith(OLDER_PREFIXES) or tag in OLDER_TAGS)
    if old:
        raise ValueError(f"{run_dir} is a run in the format of lit-attn before 2026-11-23 (it logged {old[0]}, not "
                         f"{RECORD_PREFIX}* scalars); retrain it, or read it with an older lit-attn")


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """One run's table row (final value of each metric, None if not logged), its val-loss curve and notes.

    Returns {"run", "attention", "data" (what it trained on: hparams.yaml's data, None if not recorded), "seed",
    "data_seed", <CSV header>: float | None, ..., "test_loss", "test_acc", "test_ppl" (the held-out test split's,
    None for a run without one), "mqar_acc", <PROBE_HEADERS>,
    "lm_eval/TASK/METRIC" (see lm_eval_results), "machine" (its HPARAMS record's, or None), "stopped" (why an
    EarlyStopping callback ended the run, as Lightning words it, e.g. "Stopping threshold reached: val/mqar_acc =
    0.995 > 0.99. ...", or None), "stopped_at_step" (the step it stopped at, or None), "curve": [CurvePoint,
    ...], "notes": [str, ...], "probe_notes": {header: str}}: a note for each missing value of the table, for speeds
    that are not whole-run means after the warm-up or mix machines, and for lm-eval tasks run on a --limit;
    probe_notes say why each missing probe result (see probe_results) is missing. ValueError if `run_dir` is not
    one run directory whose training event files are all whole (see lit_attn.tools.events); the event files under
    eval/ and probe/ are not read.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory not found: {run_dir}")
    nested = sorted(d.name for d in run_dir.iterdir() if (d / "config.yaml").is_file())
    if nested and not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir} holds runs ({', '.join(nested[:3])}{', ...' if len(nested) > 3 else ''}), "
                         f"not one run: pass the run directories themselves, e.g. {run_dir / '*'}")
    series = run_scalars(run_dir)
    check_format(run_dir, series)
    seed, data_seed = seeds(run_dir)
    row: dict[str, Any] = {"run": run_dir.name, "attention": run_attention(run_dir),
                           "data": setting(run_dir, "data") or None, "seed": seed, "data_seed": data_seed}
    sources = {}
    for _, header, candidates, _ in (*COLUMNS, *TEST_COLUMNS, MQAR_COLUMN):
        tag = next((t for t in candidates if series.get(t)), None)
        row[header], sources[header] = (series[tag][-1].value if tag else None), tag
    if row["parameters"] is not None:
        row["parameters"] = int(row["parameters"])
    t0 = min(e.wall_time for events in series.values() for e in events) if series else 0.0
    clock = training_clock(series)
    row["curve"] = [CurvePoint(e.step, None if clock is None else clock(e.step), e.wall_time - t0, e.value)
                    for e in series.get(CURVE_TAG, [])]
    row["notes"] = notes(row, sources, series, warmup_batches(run_dir))
    record = hparams_record(run_dir)
    machine = record.get("Machine")
    row["machine"] = machine if isinstance(machine, str) and machine else None
    # Both from the latest fit's record: a run resumed past an early stop has a newer record without one.
    stopped, reason = series.get(STOPPED_TAG), record.get(STOPPED_COLUMN)
    early = bool(stopped) and isinstance(reason, str) and bool(reason)
    row["stopped"] = reason if early else None
    row["stopped_at_step"] = int(stopped[-1].value) if early else None
    if row["machine"] and MACHINES_JOIN in row["machine"] and row["time_per_batch_s"] is not None:
        row["notes"].append(f"trained on several machines ({row['machine']}): its speeds mix them")
    shared = record.get("CPU shared")  # callbacks.cpu_share: "no", "not measured (...)" or "1.9 of 2 cores"
    if isinstance(shared, str) and shared.endswith(" cores") and row["time_per_batch_s"] is not None:
        row["notes"].append(f"other processes kept {shared} busy while it trained: its speeds are not the machine's")
    if not row["attention"]:
        row["notes"].insert(0, "no attention setting: neither hparams.yaml nor config.yaml names one")
    lm_eval, lm_eval_notes = lm_eval_results(run_dir)
    row["notes"] += lm_eval_notes
    return row | probe_results(run_dir) | lm_eval


MACHINES_JOIN = " + "  # how the HPARAMS record's "Machine" lists the machines of a run resumed elsewhere


def note_machines(rows: Sequence[dict[str, Any]]) -> None:
    """When the runs with a time per batch trained on different machines, a note on each naming its own (in place):
    their speeds do not compare as numbers of one machine would."""
    timed = [r for r in rows if r.get("time_per_batch_s") is not None]
    if len({r.get("machine") for r in timed}) > 1:
        for r in timed:
            r["notes"].append(f"trained on {r['machine']}" if r.get("machine") else
                              "its machine is not recorded (no end-of-fit record, or a run of an older version)")


def note_unevaluated(rows: Sequence[dict[str, Any]]) -> None:
    """When some of the runs have lit-attn evaluate's metrics, a note on each run lacking one of them (in place)."""
    metrics = sorted({k for r in rows for k in r if k.startswith(LM_EVAL_KEY)})
    for r in rows:
        lacking = [k.removeprefix(LM_EVAL_KEY) for k in metrics if r.get(k) is None]
        if not lacking:
            continue
        evaluated = any(k.startswith(LM_EVAL_KEY) and r[k] is not None for k in r)
        note = (f"lm-eval {', '.join(lacking)} not among its evaluations (lit-attn evaluate --tasks)" if evaluated
                else NOT_EVALUATED)
        if note not in r["notes"]:  # compare.csv's rows carry it already
            r["notes"].append(note)


def note_data(rows: Sequence[dict[str, Any]]) -> None:
    """When some of the runs record their data and others do not, a note on each that does not (in place)."""
    if any(r.get("data") for r in rows):
        for r in rows:
            if not r.get("data") and NO_DATA not in r["notes"]:
                r["notes"].append(NO_DATA)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _probe_json(run_dir: Path, name: str) -> tuple[dict[str, Any] | None, str]:
    """RUN/probe/NAME/NAME.json as written by `lit-attn probe`, or (None, why not)."""
    path = run_dir / PROBE_DIR / name / f"{name}.json"
    if not path.is_file():
        return None, f"no {name} probe ({PROBE_DIR}/{name}/{name}.json absent)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"warning: {path} is not readable JSON ({type(e).__name__}); its results are left blank", file=sys.stderr)
        data = None
    return (data, "") if isinstance(data, dict) else (None, f"{PROBE_DIR}/{name}/{name}.json is not a probe result")


def probe_results(run_dir: Path) -> dict[str, Any]:
    """The run's passkey mean accuracy and extrapolation loss ratios loss(2x)/loss(1x), loss(4x)/loss(1x) from its
    RUN/probe/ JSON files (None where absent), and "probe_notes": {PROBE_HEADERS entry: why it is absent}."""
    out: dict[str, Any] = dict.fromkeys(PROBE_HEADERS)
    notes: dict[str, str] = {}
    passkey, why = _probe_json(run_dir, "passkey")
    if passkey is not None:
        out["passkey_acc"] = _number(passkey.get("mean"))
        why = "the passkey probe has no mean accuracy (no prompt fit a length)"
    if out["passkey_acc"] is None:
        notes["passkey_acc"] = why
    extrapolation, why = _probe_json(run_dir, "extrapolation")
    contexts = [c for c in (extrapolation or {}).get("contexts") or [] if isinstance(c, dict)]
    ratios = {c.get("multiple"): _number(c.get("ratio")) for c in contexts}
    for multiple in (2, 4):
        header = f"loss_ratio_{multiple}x"
        out[header] = ratios.get(multiple)
        if out[header] is None:
            notes[header] = why or f"the extrapolation probe has no {multiple}x context (lit-attn probe --contexts)"
    return out | {"probe_notes": notes}


def lm_eval_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The numbers of an lm-eval results dict as {"TASK/METRIC": value} ("TASK/METRIC/FILTER" for a filter other
    than none); standard errors are left out."""
    out = {}
    for task, values in (results.get("results") or {}).items():
        for key, value in (values if isinstance(values, dict) else {}).items():
            metric, _, kind = str(key).partition(",")
            if kind and not metric.endswith("_stderr") and _number(value) is not None:
                out[f"{task}/{metric}" + ("" if kind == "none" else f"/{kind}")] = float(value)
    return out


def lm_eval_results(run_dir: Path) -> tuple[dict[str, float], list[str]]:
    """({"lm_eval/TASK/METRIC": value}, notes): each metric from the newest of the run's `lit-attn evaluate` results
    (RUN/eval/lm-eval-N/results.json) that has it, and a note for each task evaluated on fewer than all its
    examples (--limit)."""
    def number(path: Path) -> int:
        return int(path.parent.name.rpartition("-")[2]) if path.parent.name.rpartition("-")[2].isdigit() else 0

    found = sorted((run_dir / EVAL_DIR).glob(f"{LM_EVAL_DIR}-*/results.json"), key=number)
    values: dict[str, float] = {}
    counts: dict[str, tuple[Any, Any]] = {}
    for path in found:  # oldest first: a newer evaluation's values replace an older one's
        try:
            results = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"warning: {path} is not readable JSON ({type(e).__name__}); it is left out", file=sys.stderr)
            continue
        if not isinstance(results, dict):
            continue
        values |= {LM_EVAL_KEY + k: v for k, v in lm_eval_metrics(results).items()}
        for task, n in (results.get("n-samples") or {}).items():
            counts[task] = (n.get("effective"), n.get("original")) if isinstance(n, dict) else (None, None)
    notes = [f"lm-eval {task}: {used} of its {total} examples (--limit)" for task, (used, total) in counts.items()
             if isinstance(used, int) and isinstance(total, int) and used < total]
    return values, notes


def notes(row: dict[str, Any], sources: dict[str, str | None], series: dict[str, list[Any]],
          warmup: int | None) -> list[str]:
    """Why each missing value is missing, and what the speeds are when they are not whole-run means after warm-up."""
    out = []
    if row["val_loss"] is None:
        out.append(NO_VALIDATION)
    elif row["val_acc"] is None or row["val_ppl"] is None:
        lacking = [name for name, h in (("val acc", "val_acc"), ("perplexity", "val_ppl")) if row[h] is None]
        out.append(f"{' and '.join(lacking)} not logged (an older run)")
    record = any(tag.startswith(RECORD_PREFIX) for tag in series)
    if not record:
        out.append(NO_RECORD)
    speed_from = {sources[h] for h in SPEED} - {None}
    if speed_from and speed_from <= set(WINDOW_TAGS):
        out.append("time/batch and tokens/s are the last logged window's, not whole-run means")
    elif speed_from and warmup is None:
        out.append("time/batch and tokens/s include the first batches' warm-up (config.yaml sets no "
                   "timing.warmup_batches: an older run)")
    elif speed_from and warmup == 0:
        out.append("time/batch and tokens/s include the first batches' warm-up (timing.warmup_batches: 0)")
    elif record and not speed_from:
        out.append("no time/batch or tokens/s: no batch ran after the warm-up"
                   + ("" if warmup is None else f" (timing.warmup_batches: {warmup})"))
    named = (("parameters", "parameters"), ("train time", "train_time_s"), ("time/batch", "time_per_batch_s"),
             ("tokens/s", "tokens_per_sec"))
    lacking = [name for name, h in named if row[h] is None and (h not in SPEED or speed_from)]
    if record and lacking:
        out.append(f"{' and '.join(lacking)} not in the run's HParams record")
    if row["seed"] is None:
        out.append("no seed: config.yaml has no integer seed_everything")
    if row["data_seed"] is None:
        out.append("no data seed: config.yaml's data seed is null or absent (an older run)")
    return out


def training_clock(series: dict[str, list[Any]]) -> Callable[[int], float] | None:
    """step -> seconds of training up to the end of that step's batch, or None if the run has no clock.

    Read from TRAIN_CLOCK_TAG: exact at its logged steps (every validation),
    linear in steps in between. Its anchors: 0 s
    before the first batch (step -1, as batch n is logged at step n - 1) and the total training time
    (whole_run/train_time), which the HParams record logs at the number of batches.
    """
    logged = series.get(TRAIN_CLOCK_TAG)
    if not logged:
        return None
    points = {-1: 0.0} | {e.step: e.value for e in logged}
    total = series[TRAIN_TIME_TAG][-1] if series.get(TRAIN_TIME_TAG) else None
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
