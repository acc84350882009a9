"""lit_attn.tools.compare: two real short runs (table, CSV, plots, values from the event files); synthetic event
files in the current layout (whole_run/* scalars, maybe in a subdirectory; a run of an older one refused); the
plots' axes; statistics over seeds (stats.csv, the paired verdicts, the band plots)."""

from __future__ import annotations

import csv
import hashlib
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import TINY_FIT, scalars
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_attn.cli.lightning_cli import cli
from lit_attn.tools import compare, compare_plots, run_record


def test_compare_two_runs(tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    for attention in ("mha", "mqa"):
        assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", f"--run=r-{attention}",
                    f"--model.attention={attention}", *TINY_FIT]) == 0
    capsys.readouterr()  # the fits' own console tables
    out = tmp_path / "cmp"
    assert compare.main([str(runs / "r-mha"), str(runs / "r-mqa"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == (out / "compare.md").read_text()
    lines = printed.splitlines()
    assert lines[0].startswith("| run | attention | data | seed | data seed | parameters | val loss |")
    assert lines[0].endswith("| tokens/s | notes |") and len(lines) == 4
    seed = run_record.seeds(runs / "r-mha")[0]
    assert isinstance(seed, int)  # the drawn seed, written back into config.yaml
    # The data as the fit recorded it: the file's name, its content's hash and the validation split
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()[:12]
    data = f"CharDataModule(corpus.txt, sha256 {digest}, val_fraction=0.1)"
    assert lines[2].startswith(f"| r-mha | mha | {data} | {seed} |")
    assert lines[3].startswith(f"| r-mqa | mqa | {data} |")
    assert lines[2].endswith(" |  |")  # a whole record: no notes
    for png in ("val_loss_vs_step.png", "val_loss_vs_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with (out / "compare.csv").open() as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    assert float(rows["r-mqa"]["val_loss"]) == scalars(runs / "r-mqa", "val/loss")[-1][1]
    assert int(rows["r-mqa"]["parameters"]) == _logged_parameters(runs / "r-mqa")
    assert float(rows["r-mha"]["tokens_per_sec"]) > 0 and float(rows["r-mha"]["train_time_s"]) > 0
    # MQA shares one K/V head: fewer parameters than MHA at the same width.
    assert int(rows["r-mqa"]["parameters"]) < int(rows["r-mha"]["parameters"])
    assert rows["r-mha"]["notes"] == "" and rows["r-mha"]["data_seed"] != ""
    curve = compare.read_run(runs / "r-mha")["curve"]
    assert [p.step for p in curve] == [1, 3]
    assert all(0 < p.train_time <= float(rows["r-mha"]["train_time_s"]) + 1e-9 for p in curve if p.train_time)


def _logged_parameters(run_dir: Path) -> int:
    """The run's parameter count: whole_run/n_params."""
    for directory in sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(directory))
        acc.Reload()
        if "whole_run/n_params" in acc.Tags()["scalars"]:
            return int(acc.Scalars("whole_run/n_params")[-1].value)
    raise AssertionError(f"no parameter count in {run_dir}")


# ---- synthetic runs ----

T0 = 1_700_000_000.0
VAL_STEPS = (9, 19)  # a validation every 10 batches (batch n is logged at step n - 1)
PAUSE = 100.0  # seconds each validation takes, in wall time


def _write(directory: Path, scalars_by_tag: dict[str, list[tuple[int, float, float]]]) -> None:
    """(step, value, seconds after T0) per tag, into one event file in `directory`."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(directory))
    for tag, points in scalars_by_tag.items():
        for step, value, seconds in points:
            writer.add_scalar(tag, value, step, walltime=T0 + seconds)
    writer.close()


def _wall(step: int) -> float:
    """Wall seconds at the end of batch step + 1: 2 s per batch, plus every validation before it."""
    return 2 * (step + 1) + PAUSE * sum(v < step for v in VAL_STEPS)


def _run(root: Path, name: str, *, clock: bool = False, old: bool = False, hp_subdir: bool = True) -> Path:
    """A 20-batch run, 2 s per batch of training, with its HParams record (whole_run/* scalars); with `clock`, the
    training clock logged at each validation (val/train_time); with `old`, also scalars only an older lit-attn
    logged. Training metrics are logged every 5 batches."""
    run = root / name
    logged = (4, 9, 14, 19)
    tags: dict[str, list[tuple[int, float, float]]] = {
        "train/loss": [(s, 3.0 - s / 10, _wall(s)) for s in logged],
        "val/loss": [(s, 2.5 - s / 20, _wall(s) + PAUSE) for s in VAL_STEPS],
        "val/acc": [(s, 0.3 + s / 100, _wall(s) + PAUSE) for s in VAL_STEPS],
        "val/ppl": [(s, 10.0 - s / 10, _wall(s) + PAUSE) for s in VAL_STEPS],
        "train/time_per_batch": [(s, 2.0, _wall(s)) for s in logged],
        "train/tokens_per_sec": [(s, 500.0, _wall(s)) for s in logged],
    }
    if clock:
        tags["val/train_time"] = [(s, 2.0 * (s + 1), _wall(s) + PAUSE) for s in VAL_STEPS]
    if old:
        tags["timing/train_time"] = [(20, 40.0, _wall(20))]
    hp = {tag: [(20, value, _wall(20) + 1)] for tag, value in (
        ("whole_run/n_params", 2000.0), ("whole_run/val_loss", 2.0), ("whole_run/val_acc", 0.5),
        ("whole_run/time_per_batch", 2.0), ("whole_run/train_time", 41.0), ("whole_run/tokens_per_sec", 500.0))}
    if hp_subdir:
        _write(run / "hparams", hp)
    else:
        tags |= hp
    _write(run, tags)
    return run


def test_current_layout_reads_hp_scalars_from_a_subdirectory(tmp_path):
    row = compare.read_run(_run(tmp_path, "new"))
    assert row["parameters"] == 2000 and isinstance(row["parameters"], int)
    assert (row["time_per_batch_s"], row["train_time_s"], row["tokens_per_sec"]) == (2.0, 41.0, 500.0)
    assert row["val_loss"] == pytest.approx(2.5 - 19 / 20) and row["val_ppl"] == pytest.approx(10 - 1.9)
    # No training clock in these events: the curve has wall times only (from the first event, the
    # train/loss at step 4), validation included.
    assert [p.step for p in row["curve"]] == list(VAL_STEPS)
    assert [p.train_time for p in row["curve"]] == [None, None]
    assert [p.wall_time for p in row["curve"]] == pytest.approx([_wall(s) + PAUSE - _wall(4) for s in VAL_STEPS])
    same_dir = compare.read_run(_run(tmp_path, "flat", hp_subdir=False))
    assert same_dir["parameters"] == 2000 and same_dir["train_time_s"] == 41.0


def test_the_curve_is_on_the_training_clock(tmp_path):
    row = compare.read_run(_run(tmp_path, "clocked", clock=True))
    assert [p.train_time for p in row["curve"]] == [20.0, 40.0]  # val/train_time at each validation
    assert row["curve"][-1].wall_time > 2 * PAUSE  # the wall clock has both validations in it


def test_a_run_of_an_older_format_is_refused_in_one_line(tmp_path, capsys):
    run = _run(tmp_path, "old", old=True)
    line = (f"error: {run} is a run in the format of lit-attn before 2026-11-23 (it logged timing/train_time, not "
            f"whole_run/* scalars); retrain it, or read it with an older lit-attn\n")
    assert compare.main([str(_run(tmp_path, "new")), str(run), "--out", str(tmp_path / "cmp")]) == 2
    assert capsys.readouterr().err == line and not (tmp_path / "cmp").exists()


def test_training_clock_between_readings_is_linear_in_steps():
    readings = [SimpleNamespace(step=s, value=v, wall_time=0.0) for s, v in ((4, 10.0), (9, 20.0))]
    clock = run_record.training_clock({"val/train_time": readings})
    # 0 s before the first batch (step -1); past the last reading, that interval's pace.
    assert [clock(s) for s in (-1, 1, 4, 6, 9, 14)] == [0.0, 4.0, 10.0, 14.0, 20.0, 30.0]
    assert run_record.training_clock({"val/loss": []}) is None


def test_axes_are_labelled_with_units_and_the_clock(tmp_path):
    old, new = (compare.read_run(_run(tmp_path, n, clock=n == "old")) for n in ("old", "new"))
    for rows, clock in (([old], "training time, excl. validation (s)"),
                        ([new], "wall time since the run's first event, incl. validation (s)"),
                        ([old, new], "wall time since the run's first event, incl. validation (s)")):
        fig = compare_plots.figure(rows, "time")
        (ax,) = fig.axes
        assert ax.get_xlabel() == clock and ax.get_ylabel() == "val loss (nats/token)"
        x = [p.train_time if "training" in clock else p.wall_time for p in rows[0]["curve"]]
        assert list(ax.lines[0].get_xdata()) == x
    (ax,) = compare_plots.figure([old, new], "step").axes
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "val loss (nats/token)"
    assert [line.get_label() for line in ax.lines] == ["old", "new"]


def test_wall_time_plot_is_announced(tmp_path, capsys):
    runs = [_run(tmp_path, "old", clock=True), _run(tmp_path, "new")]
    assert compare.main([*map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    err = capsys.readouterr().err
    assert "note: new logged no val/train_time, so val_loss_vs_time.png is on wall time" in err
    assert (tmp_path / "cmp" / "val_loss_vs_time.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_missing_dir(tmp_path, capsys):
    assert compare.main([str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"error: run directory not found: {tmp_path / 'nope'}"


def test_settings_are_read_from_yaml(tmp_path, capsys):
    """hparams.yaml (top level) wins over config.yaml (model section); quoting, comments and nesting are YAML's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("data:\n  attention: wrong\nmodel:\n  n_head: 4\n  attention: 'gqa'  # comment\n")
    assert run_record.setting(run, "attention") == "gqa"
    (run / "hparams.yaml").write_text("attention_options: null\nattention: \"sqa\"\n")
    assert run_record.setting(run, "attention") == "sqa"
    (run / "hparams.yaml").write_text("attention: [unclosed\n")
    assert run_record.setting(run, "attention") == "gqa" and "is not valid YAML" in capsys.readouterr().err
    (run / "hparams.yaml").write_bytes(bytes(range(128, 256)))
    assert run_record.setting(run, "attention") == "gqa"
    err = capsys.readouterr().err
    assert err == f"warning: {run / 'hparams.yaml'} is not UTF-8 text; its settings are left blank\n"
    assert run_record.setting(tmp_path, "attention") == ""
    # Lightning writes tuples with a Python tag; other settings read as they are spelled in YAML.
    (run / "hparams.yaml").write_text("betas: !!python/tuple\n- 0.9\n- 0.95\nn_kv_heads: 2\nbias: true\n"
                                      "qkv_bias: null\nattention: sqa\n")
    settings = [run_record.setting(run, k) for k in ("attention", "n_kv_heads", "bias", "qkv_bias", "betas", "nope")]
    assert settings == ["sqa", "2", "true", "null", "[0.9, 0.95]", ""] and capsys.readouterr().err == ""


def test_compare_parse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        compare.main(["--out", "x"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "error: the following arguments are required: run_dirs (--help lists the flags)\n"


# ---- statistics over seeds ----

T2 = 4.302653  # t(0.975, 2 degrees of freedom): the 95% interval of a mean of 3
EPS = 1e-5  # event files hold float32
# Final val loss by seed. sqa is about 0.10 lower than mha at every seed; gqa is within noise of mha.
LOSSES = {"mha": {1: 2.00, 2: 2.10, 3: 1.95}, "sqa": {3: 1.84, 1: 1.91, 2: 2.00}, "gqa": {1: 2.05, 2: 2.00, 3: 1.98}}
TIME_PER_BATCH = {1: 0.010, 2: 0.012, 3: 0.011}


def _seeded(root: Path, attention: str, seed: int, loss: float, *, n_kv_heads: int | None = None) -> Path:
    """A run as a seeded sweep writes it: config.yaml with the seeds (the data order's is seed + 100), the model's
    settings and the timing's warm-up, val/loss
    (final: `loss`) with its training clock, and the whole_run/* speed, parameters and time in hparams/."""
    run = root / f"{attention}-{n_kv_heads}-s{seed}"
    run.mkdir(parents=True)
    kv = "" if n_kv_heads is None else f"  n_kv_heads: {n_kv_heads}\n"
    (run / "config.yaml").write_text(f"seed_everything: {seed}\nmodel:\n  attention: {attention}\n{kv}"
                                     f"data:\n  init_args:\n    seed: {seed + 100}\ntiming:\n  warmup_batches: 10\n")
    tpb = TIME_PER_BATCH[seed]
    _write(run, {"val/loss": [(9, loss + 0.5, _wall(9) + PAUSE), (19, loss, _wall(19) + PAUSE)],
                 "val/acc": [(19, 1 - loss / 4, _wall(19) + PAUSE)],
                 "val/train_time": [(9, 10 * tpb, _wall(9) + PAUSE), (19, 20 * tpb, _wall(19) + PAUSE)]})
    _write(run / "hparams", {"whole_run/time_per_batch": [(20, tpb, _wall(20))],
                             "whole_run/tokens_per_sec": [(20, 64 / tpb, _wall(20))],
                             "whole_run/n_params": [(20, 5000, _wall(20))],
                             "whole_run/train_time": [(20, 20 * tpb, _wall(20))]})
    return run


def _stats_csv(out: Path) -> dict[str, dict[str, str]]:
    with (out / "stats.csv").open() as f:
        return {r["attention"]: r for r in csv.DictReader(f)}


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_stats_over_seeds(tmp_path, capsys):
    runs = [_seeded(tmp_path / "runs", a, s, loss) for a, by_seed in LOSSES.items() for s, loss in by_seed.items()]
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == (out / "compare.md").read_text() + "\n" + (out / "stats.md").read_text()
    assert len((out / "compare.md").read_text().splitlines()) == 2 + 9  # the per-run table as before
    rows = _stats_csv(out)
    assert list(rows) == ["mha", "sqa", "gqa"] and {r["reference"] for r in rows.values()} == {"mha"}
    mha = rows["mha"]
    # mha: mean 6.05 / 3; deviations -1/60, 5/60, -4/60: variance (1 + 25 + 16) / 3600 / 2, std 0.076376
    mean, std = 6.05 / 3, math.sqrt(42 / 7200)
    assert mha["n_runs"] == "3" and float(mha["val_loss_mean"]) == pytest.approx(mean, abs=EPS)
    assert (mha["seed"], mha["data_seed"], rows["sqa"]["seed"]) == ("1, 2, 3", "101, 102, 103", "3, 1, 2")
    assert float(mha["val_loss_std"]) == pytest.approx(std, abs=EPS)
    ci = (float(mha["val_loss_ci_low"]), float(mha["val_loss_ci_high"]))
    assert ci == pytest.approx((mean - T2 * std / math.sqrt(3), mean + T2 * std / math.sqrt(3)), abs=EPS)
    acc = [1 - v / 4 for v in LOSSES["mha"].values()]
    assert float(mha["val_acc_mean"]) == pytest.approx(statistics.mean(acc), abs=EPS)
    assert float(mha["val_acc_std"]) == pytest.approx(statistics.stdev(acc), abs=EPS)
    spread = [float(mha[f"time_per_batch_{k}_s"]) for k in ("median", "min", "max")]
    assert spread == pytest.approx([0.011, 0.010, 0.012], rel=1e-6)
    assert float(mha["tokens_per_sec_mean"]) == pytest.approx((6400 + 64 / 0.012 + 64 / 0.011) / 3, rel=1e-6)
    assert (mha["n_pairs"], mha["val_loss_diff_mean"], mha["verdict"]) == ("", "", "reference")

    sqa = rows["sqa"]  # paired by seed: -0.09, -0.10, -0.11 (listed in another seed order than mha's)
    assert sqa["n_pairs"] == "3" and float(sqa["val_loss_diff_mean"]) == pytest.approx(-0.10, abs=EPS)
    half = T2 * 0.01 / math.sqrt(3)
    assert (float(sqa["val_loss_diff_ci_low"]), float(sqa["val_loss_diff_ci_high"])) == pytest.approx(
        (-0.10 - half, -0.10 + half), abs=EPS)
    assert sqa["verdict"] == "better"
    gqa = rows["gqa"]  # +0.05, -0.10, +0.03: mean -0.02 / 3, the interval spans 0
    assert float(gqa["val_loss_diff_mean"]) == pytest.approx(-0.02 / 3, abs=EPS)
    assert float(gqa["val_loss_diff_ci_low"]) < 0 < float(gqa["val_loss_diff_ci_high"])
    assert gqa["verdict"] == "indistinguishable at this budget"
    assert "| sqa | 3 | -0.1000 | [-0.1248, -0.0752] | better |" in printed
    for png in compare.GROUP_PLOTS:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Against sqa, mha is the worse one.
    assert compare.main([*map(str, runs), "--out", str(out), "--overwrite", "--reference", "sqa"]) == 0
    assert _stats_csv(out)["mha"]["verdict"] == "worse" and _stats_csv(out)["sqa"]["verdict"] == "reference"


def test_a_group_of_one_run_has_no_interval_and_no_verdict(tmp_path, capsys):
    root = tmp_path / "runs"
    mha = [_seeded(root, "mha", s, loss) for s, loss in LOSSES["mha"].items()]
    sqa = _seeded(root, "sqa", 2, 1.9)
    out = tmp_path / "cmp"
    assert compare.main([*map(str, mha), str(sqa), "--out", str(out)]) == 0
    row = _stats_csv(out)["sqa"]
    assert row["n_runs"] == "1" and float(row["val_loss_mean"]) == pytest.approx(1.9, abs=EPS)
    assert row["val_loss_std"] == row["val_loss_ci_low"] == row["val_loss_diff_ci_low"] == ""
    assert row["n_pairs"] == "1" and float(row["val_loss_diff_mean"]) == pytest.approx(1.9 - 2.10, abs=EPS)
    assert row["verdict"] == "n/a (fewer than 2 paired seeds)"
    assert "| sqa | 1 | 2 | 102 | 1.9000 |  |" in capsys.readouterr().out
    # One run in every group: the per-run table only, and an earlier comparison's statistics are gone.
    assert compare.main([str(mha[0]), str(sqa), "--out", str(out), "--overwrite"]) == 0
    assert capsys.readouterr().out == (out / "compare.md").read_text()
    assert not any((out / name).exists() for name in ("stats.md", "stats.csv", *compare.GROUP_PLOTS))


def test_group_by_another_setting(tmp_path, capsys):
    root = tmp_path / "runs"
    runs = [_seeded(root, "gqa", s, loss + (0.2 if kv == 1 else 0), n_kv_heads=kv)
            for kv in (2, 1) for s, loss in LOSSES["mha"].items()]
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--group-by", "n_kv_heads", "--reference", "1"]) == 0
    with (out / "stats.csv").open() as f:
        rows = {r["n_kv_heads"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["2", "1"] and rows["2"]["verdict"] == "better" and rows["1"]["verdict"] == "reference"
    assert float(rows["2"]["val_loss_diff_mean"]) == pytest.approx(-0.2, abs=EPS)
    assert "| n_kv_heads | runs |" in capsys.readouterr().out
    by_kv = ["--group-by", "n_kv_heads", "--reference", "4"]
    assert compare.main([*map(str, runs), "--out", str(out), "--overwrite", *by_kv]) == 2
    assert capsys.readouterr().err.startswith("error: --reference '4' is none of the groups by n_kv_heads: 2, 1")


def test_seed_is_read_from_config_yaml(tmp_path):
    run = _seeded(tmp_path, "mha", 3, 2.0)
    assert compare.read_run(run)["seed"] == 3
    (run / "config.yaml").write_text("seed_everything: true\n")  # drawn at fit time and not written back: unknown
    assert run_record.seeds(run) == (None, None) and run_record.seeds(tmp_path) == (None, None)


def test_bands_align_steps_across_seeds():
    def row(points):
        return {"curve": [run_record.CurvePoint(s, t, 100.0 + t, v) for s, t, v in points]}

    a = row([(9, 10.0, 2.0), (19, 20.0, 1.5)])
    b = row([(9, 12.0, 2.2), (19, 24.0, 1.7), (29, 36.0, 1.6)])  # validated once more: not in every run
    xs, mean, low, high = compare_plots.band([a, b], "step", "train")
    assert (xs, low, high) == ([9, 19], [2.0, 1.5], [2.2, 1.7]) and mean == pytest.approx([2.1, 1.6])
    assert compare_plots.band([a, b], "time", "train")[0] == pytest.approx([11.0, 22.0])
    assert compare_plots.band([a, b], "time", "wall")[0] == pytest.approx([111.0, 122.0])
    (ax,) = compare_plots.band_figure([a, b], {"mha": [a, b]}, "attention", "time").axes
    assert ax.get_xlabel() == "training time, excl. validation (s)" and ax.get_ylabel() == "val loss (nats/token)"
    assert [line.get_label() for line in ax.lines] == ["mha (mean of 2)"]


def test_mqar_accuracy_is_a_column_only_when_a_run_has_it(tmp_path, capsys):
    lm = _seeded(tmp_path, "mha", 1, 2.0)
    recall = _seeded(tmp_path, "sqa", 1, 2.1)
    _write(recall, {"val/mqar_acc": [(9, 0.5, _wall(9) + PAUSE), (19, 0.875, _wall(19) + PAUSE)],
                    "val/mqar_acc/T64_kv4": [(19, 0.75, _wall(19) + PAUSE)]})
    assert compare.main([str(lm), "--out", str(tmp_path / "lm")]) == 0
    assert "mqar" not in capsys.readouterr().out and "mqar" not in (tmp_path / "lm" / "compare.csv").read_text()
    assert compare.main([str(lm), str(recall), "--out", str(tmp_path / "both")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| tokens/s | mqar acc | notes |") and lines[1].count("---:") == 10
    # blank, and why: a language model
    assert lines[2].endswith(f"| 6,400 |  | perplexity not logged (an older run); {run_record.NO_MQAR} |")
    assert " | 6,400 | 0.8750 | perplexity" in lines[3]
    with (tmp_path / "both" / "compare.csv").open() as f:
        rows = {r["attention"]: r for r in csv.DictReader(f)}
    assert rows["mha"]["mqar_acc"] == "" and float(rows["sqa"]["mqar_acc"]) == 0.875
