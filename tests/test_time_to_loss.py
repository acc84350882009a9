"""Time to a target val loss and val loss at a training-time budget (`--target-loss`, `--at-time` of compare and
the cost card): read off validation curves against hand-computed values, their statistics over seeds and paired
differences, and the flags' one-line errors; from run records written here (config.yaml and event files)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml

from lit_attn.tools import compare, cost_card
from lit_attn.tools import time_to_loss as timed
from lit_attn.tools.run_record import CurvePoint

EPS = 1e-5  # event files hold float32; every loss and time below is exact in float32
T1 = 12.706205  # Student's t(0.975) with 1 degree of freedom: 2 paired seeds
T2 = 4.302653  # with 2: 3 seeds

# (train_time s, val loss) at each evaluation (steps 9, 19, 29), by attention and seed.
CURVES = {
    ("mha", 1): [(10.0, 3.0), (20.0, 2.5), (30.0, 2.0)],  # 2.25 between evaluations: 25 s; at 15 s: 2.75
    ("mha", 2): [(12.0, 3.0), (24.0, 2.25), (36.0, 2.0)],  # 2.25 at an evaluation: 24 s; at 15 s: 2.8125
    ("mha", 3): [(8.0, 2.75), (16.0, 2.5), (24.0, 2.5)],  # 2.25 never; at 15 s: 2.75 - 7/8 * 0.25 = 2.53125
    ("sqa", 1): [(5.0, 2.5), (10.0, 2.0), (15.0, 1.75)],  # 7.5 s; at 15 s, its last evaluation: 1.75
    ("sqa", 2): [(6.0, 2.25), (12.0, 2.0), (18.0, 1.75)],  # at its first evaluation: 6 s (a bound); 1.875
    ("sqa", 3): [(4.0, 3.0), (8.0, 2.0), (12.0, 1.5)],  # 4 + 3/4 * 4 = 7 s; ended at 12 s: no loss at 15 s
}
TARGET, BUDGET = "2.25", "15"
STEPS = (9, 19, 29)


def _points(times_losses, steps=STEPS) -> list[CurvePoint]:
    return [CurvePoint(s, t, 100.0 + t, loss) for s, (t, loss) in zip(steps, times_losses)]


# ---- one curve ----

CURVE = [(10.0, 3.0), (20.0, 2.5), (30.0, 2.0)]


@pytest.mark.parametrize("curve, target, value, why", [
    (CURVE, 2.25, 25.0, None),  # between evaluations: 20 + (2.5 - 2.25) / (2.5 - 2.0) * 10
    (CURVE, 2.7, 16.0, None),  # 10 + 0.3 / 0.5 * 10
    (CURVE, 2.5, 20.0, None),  # exactly at an evaluation
    (CURVE, 2.0, 30.0, None),  # exactly at the last one
    (CURVE, 3.0, 10.0, "reached by the first evaluation (step 9): the time is an upper bound"),
    (CURVE, 3.5, 10.0, "reached by the first evaluation (step 9): the time is an upper bound"),
    (CURVE, 1.5, None, "not reached in 30.00 s of training; lowest 2.0000 at step 29, 30.00 s"),
    ([(10.0, 3.0), (20.0, 2.0), (30.0, 2.5)], 2.25, 17.5, None),  # the first crossing counts, not a later rise
    ([(10.0, math.nan), (20.0, 2.0)], 2.25, 20.0,
     "reached by an evaluation after a non-finite loss (step 19): the time is an upper bound"),
    ([(10.0, math.nan)], 2.25, None, "not reached in 10.00 s of training"),
    ([], 2.25, None, "no validation was logged"),
])
def test_time_to_target(curve, target, value, why):
    got = timed.time_to_target(_points(curve), target)
    assert got == (pytest.approx(value) if value is not None else None, why)


@pytest.mark.parametrize("budget, value, why", [
    (15.0, 2.75, None),  # between evaluations: 3.0 + (15 - 10) / 10 * (2.5 - 3.0)
    (27.5, 2.125, None),
    (20.0, 2.5, None),  # exactly at an evaluation
    (10.0, 3.0, None),  # at the first
    (30.0, 2.0, None),  # at the last
    (30.5, None, "the run's last evaluation is at 30.00 s of training, before the budget: not extrapolated"),
    (5.0, None, "its first evaluation is at 10.00 s of training, after the budget"),
])
def test_loss_at_time(budget, value, why):
    got = timed.loss_at_time(_points(CURVE), budget)
    assert got == (pytest.approx(value) if value is not None else None, why)


def test_a_curve_without_training_clock_has_no_times():
    # A run that logged no val/train_time: its wall clock would count the evaluations, so it is not used.
    curve = [CurvePoint(9, None, 110.0, 3.0), CurvePoint(19, None, 220.0, 2.0)]
    why = "no training clock (val/train_time not logged: a run of an older version)"
    assert timed.time_to_target(curve, 2.5) == (None, why) and timed.loss_at_time(curve, 15.0) == (None, why)


def test_the_curve_is_read_in_step_order():
    shuffled = list(reversed(_points(CURVE)))
    assert timed.time_to_target(shuffled, 2.25).value == pytest.approx(25.0)
    assert timed.loss_at_time(shuffled, 15.0).value == pytest.approx(2.75)


# ---- runs ----

def _run(root: Path, attention: str, seed: int, curve, lr: float = 1e-3) -> Path:
    """A finished run as a seeded sweep writes it: config.yaml, val/loss with its training clock (val/train_time)
    at each evaluation, and the whole_run/* record in hparams/."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / f"{attention}-lr{lr:g}-s{seed}"
    run.mkdir(parents=True)
    config = {"seed_everything": seed, "model": {"attention": attention, "lr": lr}, "data": {"init_args": {"seed": 7}},
              "timing": {"warmup_batches": 2}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    writer = SummaryWriter(str(run))
    for step, (t, loss) in zip(STEPS, curve):
        writer.add_scalar("val/loss", loss, step, walltime=1000.0 + 3 * t)
        writer.add_scalar("val/train_time", t, step, walltime=1000.0 + 3 * t)
    writer.close()
    writer = SummaryWriter(str(run / "hparams"))
    for tag, value in (("whole_run/n_params", 5000.0), ("whole_run/time_per_batch", 0.5),
                       ("whole_run/train_time", curve[-1][0]), ("whole_run/tokens_per_sec", 100.0)):
        writer.add_scalar(tag, value, 30, walltime=2000.0)
    writer.close()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    return [_run(root, a, s, curve) for (a, s), curve in CURVES.items()]


def _csv(path: Path, key: str) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {r[key]: r for r in csv.DictReader(f)}


def _floats(row: dict[str, str], *keys: str) -> list[float | None]:
    return [float(row[k]) if row[k] else None for k in keys]


def test_compare_per_run_values_and_notes(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--target-loss", TARGET, "--at-time", BUDGET]) == 0
    printed = capsys.readouterr().out
    assert "| time to 2.25 (s) | val loss at 15 s | notes |" in printed.splitlines()[0]
    rows = _csv(out / "compare.csv", "run")
    got = {name: _floats(r, "target_loss", "time_budget_s", "time_to_target_s", "loss_at_time")
           for name, r in rows.items()}
    assert got == {  # exact: every value here is a sum of binary fractions
        "mha-lr0.001-s1": [2.25, 15.0, 25.0, 2.75], "mha-lr0.001-s2": [2.25, 15.0, 24.0, 2.8125],
        "mha-lr0.001-s3": [2.25, 15.0, None, 2.53125], "sqa-lr0.001-s1": [2.25, 15.0, 7.5, 1.75],
        "sqa-lr0.001-s2": [2.25, 15.0, 6.0, 1.875], "sqa-lr0.001-s3": [2.25, 15.0, 7.0, None]}
    assert ("training time to val loss 2.25: not reached in 24.00 s of training; lowest 2.5000 at step 19, 16.00 s"
            in rows["mha-lr0.001-s3"]["notes"])
    assert "| 2.5312 | " in printed and "| 25.00 | 2.7500 |" in printed
    assert ("val loss at 15 s of training: the run's last evaluation is at 12.00 s of training, before the budget: "
            "not extrapolated") in rows["sqa-lr0.001-s3"]["notes"]
    assert "reached by the first evaluation (step 9): the time is an upper bound" in rows["sqa-lr0.001-s2"]["notes"]


def test_compare_statistics_and_paired_differences(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--target-loss", TARGET, "--at-time", BUDGET]) == 0
    printed = capsys.readouterr().out
    stats = _csv(out / "stats.csv", "attention")
    mha, sqa = stats["mha"], stats["sqa"]
    # Time to 2.25: mha 25, 24 (seed 3 never reaches it), sqa 7.5, 6, 7.
    assert (mha["target_loss"], mha["time_to_target_s_runs"], sqa["time_to_target_s_runs"]) == ("2.25", "2", "3")
    assert _floats(mha, "time_to_target_s_mean", "time_to_target_s_std") == pytest.approx([24.5, math.sqrt(0.5)])
    half = T1 * math.sqrt(0.5) / math.sqrt(2)
    assert _floats(mha, "time_to_target_s_ci_low", "time_to_target_s_ci_high") == pytest.approx(
        [24.5 - half, 24.5 + half], abs=EPS)
    assert mha["time_to_target_s_verdict"] == "reference" and mha["time_to_target_s_pairs"] == ""
    sqa_std = math.sqrt(((7.5 - 41 / 6) ** 2 + (6 - 41 / 6) ** 2 + (7 - 41 / 6) ** 2) / 2)
    assert _floats(sqa, "time_to_target_s_mean", "time_to_target_s_std") == pytest.approx([41 / 6, sqa_std])
    # Paired over the seeds both reached it by: 1 (7.5 - 25) and 2 (6 - 24).
    half = T1 * math.sqrt(0.125) / math.sqrt(2)
    assert sqa["time_to_target_s_pairs"] == "2" and sqa["time_to_target_s_verdict"] == "better"
    assert _floats(sqa, "time_to_target_s_diff", "time_to_target_s_diff_ci_low",
                   "time_to_target_s_diff_ci_high") == pytest.approx([-17.75, -17.75 - half, -17.75 + half], abs=EPS)
    # Loss at 15 s: mha 2.75, 2.8125, 2.53125; sqa 1.75, 1.875 (seed 3 ended at 12 s).
    mean = (2.75 + 2.8125 + 2.53125) / 3
    assert (mha["time_budget_s"], mha["loss_at_time_runs"], sqa["loss_at_time_runs"]) == ("15.0", "3", "2")
    assert float(mha["loss_at_time_mean"]) == pytest.approx(mean, abs=EPS)
    assert _floats(sqa, "loss_at_time_pairs", "loss_at_time_diff") == pytest.approx([2, -0.96875], abs=EPS)
    half = T1 * (0.0625 / math.sqrt(2)) / math.sqrt(2)  # differences -1.0 and -0.9375
    assert _floats(sqa, "loss_at_time_diff_ci_low", "loss_at_time_diff_ci_high") == pytest.approx(
        [-0.96875 - half, -0.96875 + half], abs=EPS)
    assert "| mha | 24.50 ± 0.71 (2 of 3 reached) | [18.15, 30.85] |  |  |  | reference |" in printed
    assert "| sqa | 1.8125 ± 0.0884 (2 of 3 ran that long) | [1.0184, 2.6066] | 2 | -0.9688 |" in printed
    assert "warm-up included, evaluation excluded" in printed


def test_a_target_no_run_reaches(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--target-loss", "1"]) == 0
    printed = capsys.readouterr().out
    stats = _csv(out / "stats.csv", "attention")
    assert [stats[a]["time_to_target_s_runs"] for a in ("mha", "sqa")] == ["0", "0"]
    assert stats["sqa"]["time_to_target_s_mean"] == "" and stats["sqa"]["time_to_target_s_pairs"] == "0"
    assert stats["sqa"]["time_to_target_s_verdict"] == "n/a (fewer than 2 paired seeds)"
    assert "| mha | (0 of 3 reached) |" in printed and "loss_at_time" not in (out / "stats.csv").read_text()


def test_without_the_flags_the_tables_are_as_before(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out)]) == 0
    text = (out / "compare.csv").read_text() + (out / "stats.csv").read_text() + capsys.readouterr().out
    assert "time_to_target" not in text and "loss_at_time" not in text and "time to" not in text


def test_best_of_pairs_the_chosen_points_times(tmp_path, capsys):
    """With --best-of, the times are those of each group's chosen point: mha at lr 0.01 (final loss 1.75 on both
    seeds, below lr 0.001's 2.0), whose times to 2.25 are 5 and 6 s, not lr 0.001's 25 and 24."""
    root = tmp_path / "runs"
    fast = {1: [(4.0, 2.5), (6.0, 2.0), (8.0, 1.75)], 2: [(5.0, 2.5), (7.0, 2.0), (9.0, 1.75)]}
    runs = [_run(root, "mha", s, CURVES[("mha", s)], lr=1e-3) for s in (1, 2)]
    runs += [_run(root, "mha", s, curve, lr=1e-2) for s, curve in fast.items()]
    runs += [_run(root, "sqa", s, CURVES[("sqa", s)], lr=1e-3) for s in (1, 2)]
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--best-of", "model.lr", "--target-loss", TARGET]) == 0
    capsys.readouterr()
    stats = _csv(out / "stats.csv", "attention")
    assert float(stats["mha"]["time_to_target_s_mean"]) == pytest.approx(5.5)  # 4 + 1/2 * 2, 5 + 1/2 * 2
    assert float(stats["sqa"]["time_to_target_s_diff"]) == pytest.approx((7.5 - 5) / 2 + (6 - 6) / 2)


def test_cost_card_shows_both_with_paired_intervals(runs, tmp_path, capsys):
    out = tmp_path / "card"
    argv = ["--runs", *map(str, runs), "--out", str(out), "--target-loss", TARGET, "--at-time", BUDGET]
    assert cost_card.main([*argv, "--reference", "sqa"]) == 0
    md = capsys.readouterr().out
    card = _csv(out / "cost_card.csv", "attention")
    mha = card["mha"]
    assert (mha["target_loss"], mha["time_budget_s"], mha["time_to_target_s_runs"]) == ("2.25", "15.0", "2")
    assert _floats(mha, "time_to_target_s_mean", "loss_at_time_mean") == pytest.approx(
        [24.5, (2.75 + 2.8125 + 2.53125) / 3], abs=EPS)
    half = T1 * math.sqrt(0.125) / math.sqrt(2)  # mha - sqa over seeds 1 and 2: +17.5, +18
    assert _floats(mha, "time_to_target_s_diff", "time_to_target_s_diff_ci_low", "time_to_target_s_diff_ci_high") \
        == pytest.approx([17.75, 17.75 - half, 17.75 + half], abs=EPS)
    assert mha["time_to_target_s_verdict"] == "worse" and card["sqa"]["time_to_target_s_verdict"] == "reference"
    assert mha["loss_at_time_verdict"] == "worse" and mha["loss_at_time_pairs"] == "2"
    assert "| time to 2.25 (s) | val loss at 15 s |" in md
    assert "| 3 | 24.50 ± 0.71 (2 of 3 reached) | 2.6979 ± 0.1477 (3 of 3 ran that long) |" in md
    assert "| mha | 24.50 ± 0.71 (2 of 3 reached) | [18.15, 30.85] | 2 | +17.75 | [+14.57, +20.93] | worse |" in md
    assert "- run mha-lr0.001-s3: training time to val loss 2.25: not reached in 24.00 s of training" in md
    # Without the flags the card has none of these columns.
    assert cost_card.main(["--runs", *map(str, runs), "--out", str(tmp_path / "plain")]) == 0
    assert "time_to_target" not in (tmp_path / "plain" / "cost_card.csv").read_text()


BAD_VALUES = [("--target-loss", "-1"), ("--target-loss", "0"), ("--target-loss", "abc"), ("--target-loss", "nan"),
              ("--at-time", "-5"), ("--at-time", "0"), ("--at-time", "ten"), ("--at-time", "inf")]


@pytest.mark.parametrize("tool", ["compare", "cost-card"])
@pytest.mark.parametrize("flag, value", BAD_VALUES)
def test_bad_values_are_one_line_errors(tool, flag, value, runs, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(runs[0]), "--out", str(out)] if tool == "compare" else ["--runs", str(runs[0]), "--out", str(out)]
    main = compare.main if tool == "compare" else cost_card.main
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"{flag}={value}"])
    err = capsys.readouterr().err
    what = "a val loss in nats/token, e.g. 1.9" if flag == "--target-loss" else "seconds of training, e.g. 600"
    assert exc.value.code == 2 and not out.exists()
    assert err == f"error: {flag} takes a finite number > 0 ({what}), got {value!r} (--help lists the flags)\n"


def test_a_negative_value_as_its_own_argument_is_read(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        compare.main([str(runs[0]), "--out", str(tmp_path / "out"), "--target-loss", "-1"])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: --target-loss takes a finite number")


def test_cost_card_time_flags_need_run_directories(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cost_card.main(["--target-loss", "2", "--out", str(tmp_path / "card")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: --target-loss and --at-time read each run's validation curve: give the run "
                          "directories with --runs")
