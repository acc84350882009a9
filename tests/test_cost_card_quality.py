"""The cost card's quality metrics over seeds: MQAR accuracy, passkey accuracy and the extrapolation loss ratios each
get mean ± sample std (runs), a 95% t interval and a table paired with a reference attention over matching seeds,
whose verdict reads lower ratios and higher accuracies as better."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml
from helpers import extrapolation_result, passkey_result, quality_run

from lit_attn.tools import cost_card

T2 = 4.302653  # Student's t(0.975) with 2 degrees of freedom: 3 seeds
# attention -> seed -> (final val/mqar_acc, loss ratio 2x/1x, loss ratio 4x/1x, passkey accuracy)
RUNS = {
    "mha": {1: (0.90, 1.50, 2.00, 0.6), 2: (0.80, 1.60, 2.20, 0.8), 3: (0.85, 1.70, 2.40, 1.0)},
    # 2x: 0.30, 0.32, 0.28 below mha's (clearly better); 4x: +0.1, -0.1, +0.3 (can't tell)
    "sqa": {1: (0.70, 1.20, 2.10, 0.4), 2: (0.62, 1.28, 2.10, 0.4), 3: (0.66, 1.42, 2.70, 0.6)},
    # 4x: 0.5, 0.6, 0.5 above mha's (clearly worse); never probed for passkeys
    "gqa": {1: (0.95, 1.55, 2.50, None), 2: (0.85, 1.68, 2.80, None), 3: (0.90, 1.72, 2.90, None)},
}
METRICS = ("mqar_acc", "passkey_acc", "loss_ratio_2x", "loss_ratio_4x", "test_loss")
# The MQAR table as the card printed it when MQAR accuracy was its only paired metric.
MQAR_TABLE = """\
MQAR accuracy over each attention's runs (mean ± sample std, 95% CI of the mean, Student's t), and minus mha's over \
matching seeds (positive: more accurate than mha).

| attention | runs | MQAR acc | 95% CI | pairs | Δ MQAR acc | Δ 95% CI | verdict |
|---|---:|---:|---:|---:|---:|---:|---|
| mha | 3 | 0.8500 ± 0.0500 (3) | [0.7258, 0.9742] | – | – | – | reference |
| sqa | 3 | 0.6600 ± 0.0400 (3) | [0.5606, 0.7594] | 3 | -0.1900 | [-0.2148, -0.1652] | worse |
| gqa | 3 | 0.9000 ± 0.0500 (3) | [0.7758, 1.0242] | 3 | +0.0500 | [+0.0500, +0.0500] | better |
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Three seeds each of mha, sqa and gqa with MQAR events and probe results, and an unprobed xsqa LM run."""
    root = tmp_path_factory.mktemp("runs")
    out = []
    for name, seeds in RUNS.items():
        for seed, (acc, r2, r4, passkey) in seeds.items():
            probes = {"extrapolation": extrapolation_result({1: 2.0, 2: 2 * r2, 4: 2 * r4})}
            if passkey is not None:
                probes["passkey"] = passkey_result([[passkey, passkey]])
            out.append(quality_run(root, name, seed, acc, probes))
    return out + [quality_run(root, "xsqa", 1, None, {})]


def _card(out: Path, runs: list[Path], *extra: str) -> tuple[dict[str, dict[str, str]], list[str], str]:
    """(attention -> CSV row, the CSV header, the Markdown) of a card over `runs`."""
    assert cost_card.main(["--runs", *map(str, runs), "--out", str(out), *extra]) == 0
    with (out / "cost_card.csv").open() as f:
        reader = csv.DictReader(f)
        rows = {r["attention"]: r for r in reader}
    return rows, list(reader.fieldnames or []), (out / "cost_card.md").read_text()


@pytest.fixture(scope="module")
def card(runs, tmp_path_factory) -> tuple[dict[str, dict[str, str]], list[str], str]:
    return _card(tmp_path_factory.mktemp("card"), runs)


def test_every_metric_has_mean_std_runs_and_interval(card):
    rows, _, md = card
    mha, sqa, gqa = rows["mha"], rows["sqa"], rows["gqa"]
    # mha 2x: 1.5, 1.6, 1.7 -> mean 1.6, std 0.1, 1.6 ± t · 0.1 / √3; sqa 2x: 1.2, 1.28, 1.42 -> std √(0.0248 / 2)
    assert float(mha["loss_ratio_2x"]) == pytest.approx(1.6) and float(mha["loss_ratio_2x_std"]) == pytest.approx(0.1)
    assert mha["loss_ratio_2x_runs"] == "3"
    assert float(mha["loss_ratio_2x_ci_low"]) == pytest.approx(1.6 - T2 * 0.1 / math.sqrt(3), abs=1e-6)
    assert float(mha["loss_ratio_2x_ci_high"]) == pytest.approx(1.6 + T2 * 0.1 / math.sqrt(3), abs=1e-6)
    assert float(sqa["loss_ratio_2x"]) == pytest.approx(1.3)
    assert float(sqa["loss_ratio_2x_std"]) == pytest.approx(math.sqrt(0.0124))
    # gqa 4x: 2.5, 2.8, 2.9 -> mean 2.7333, std √(0.0866667 / 2); mha passkey: 0.6, 0.8, 1.0
    assert float(gqa["loss_ratio_4x"]) == pytest.approx(8.2 / 3)
    assert float(gqa["loss_ratio_4x_std"]) == pytest.approx(math.sqrt(0.26 / 3 / 2))
    assert float(mha["passkey_acc"]) == pytest.approx(0.8) and float(mha["passkey_acc_std"]) == pytest.approx(0.2)
    assert gqa["passkey_acc"] == gqa["passkey_acc_std"] == gqa["passkey_acc_runs"] == gqa["passkey_acc_ci_low"] == ""
    assert "| MQAR acc | passkey acc | loss 2x/1x | loss 4x/1x |" in md
    assert "| 0.8500 ± 0.0500 (3) | 0.800 ± 0.200 (3) | 1.600 ± 0.100 (3) | 2.200 ± 0.200 (3) |" in md
    assert "| 0.9000 ± 0.0500 (3) | – | 1.650 ± 0.089 (3) | 2.733 ± 0.208 (3) |" in md
    assert next(line for line in md.splitlines() if line.startswith("| xsqa |")).endswith("| 1 | – | – | – | – |")


def test_one_run_has_no_std(tmp_path, runs):
    rows, _, md = _card(tmp_path / "card", [runs[0]])  # mha-s1 alone: 1.5 and 2.0
    assert rows["mha"]["loss_ratio_2x_std"] == rows["mha"]["loss_ratio_2x_ci_low"] == ""
    assert "| 0.9000 (1) | 0.600 (1) | 1.500 (1) | 2.000 (1) |" in md


def test_loss_ratios_are_paired_lower_is_better(card):
    rows, _, md = card
    assert rows["mha"]["loss_ratio_2x_verdict"] == rows["mha"]["loss_ratio_4x_verdict"] == "reference"
    # sqa - mha at 2x by seed: -0.30, -0.32, -0.28 -> mean -0.30, std 0.02, half width t · 0.02 / √3
    sqa, half = rows["sqa"], T2 * 0.02 / math.sqrt(3)
    assert sqa["loss_ratio_2x_pairs"] == "3" and float(sqa["loss_ratio_2x_diff"]) == pytest.approx(-0.30)
    assert float(sqa["loss_ratio_2x_diff_ci_low"]) == pytest.approx(-0.30 - half, abs=1e-6)
    assert float(sqa["loss_ratio_2x_diff_ci_high"]) == pytest.approx(-0.30 + half, abs=1e-6)
    assert sqa["loss_ratio_2x_verdict"] == "better"  # degrades less past the training context on every seed
    # gqa - mha at 4x: 0.5, 0.6, 0.5 -> mean 0.5333, std 0.057735: clearly higher, so worse
    gqa, half = rows["gqa"], T2 * math.sqrt(1 / 300) / math.sqrt(3)
    assert float(gqa["loss_ratio_4x_diff"]) == pytest.approx(1.6 / 3)
    assert float(gqa["loss_ratio_4x_diff_ci_low"]) == pytest.approx(1.6 / 3 - half, abs=1e-6)
    assert gqa["loss_ratio_4x_verdict"] == "worse"
    assert sqa["loss_ratio_4x_verdict"] == gqa["loss_ratio_2x_verdict"] == "indistinguishable at this budget"
    # passkey, higher is better: sqa - mha = -0.2, -0.4, -0.4
    assert float(sqa["passkey_acc_diff"]) == pytest.approx(-1 / 3) and sqa["passkey_acc_verdict"] == "worse"
    assert gqa["passkey_acc_verdict"] == rows["xsqa"]["loss_ratio_2x_verdict"] == ""  # nothing to pair
    assert ("loss ratio 2x/1x over each attention's runs (mean ± sample std, 95% CI of the mean, Student's t), and "
            "minus mha's over matching seeds (negative: degrades less than mha past the training context).") in md
    assert "| attention | runs | loss 2x/1x | 95% CI | pairs | Δ loss 2x/1x | Δ 95% CI | verdict |" in md
    assert "| sqa | 3 | 1.300 ± 0.111 (3) | [1.023, 1.577] | 3 | -0.300 | [-0.350, -0.250] | better |" in md
    assert "| gqa | 3 | 2.733 ± 0.208 (3) | [2.216, 3.250] | 3 | +0.533 | [+0.390, +0.677] | worse |" in md
    assert "minus mha's over matching seeds (positive: more accurate than mha)." in md.split("passkey accuracy over")[1]


def test_csv_has_every_metrics_columns(card):
    _, header, _ = card
    summary = [m + s for m in METRICS for s in ("", "_std", "_runs", "_ci_low", "_ci_high")]
    paired = [m + s for m in METRICS for s in ("_pairs", "_diff", "_diff_ci_low", "_diff_ci_high", "_verdict")]
    start = header.index("mqar_acc")
    assert header[start:start + 50] == summary + paired


def test_mqar_output_is_unchanged(card):
    rows, _, md = card
    assert MQAR_TABLE + "\n" in md
    assert float(rows["sqa"]["mqar_acc_diff"]) == pytest.approx(-0.19) and rows["sqa"]["mqar_acc_verdict"] == "worse"
    assert float(rows["gqa"]["mqar_acc_diff"]) == pytest.approx(0.05) and rows["gqa"]["mqar_acc_pairs"] == "3"


def test_reference_applies_to_every_metric_and_says_what_it_lacks(tmp_path, runs):
    rows, _, md = _card(tmp_path / "card", runs, "--reference", "gqa")
    assert rows["gqa"]["mqar_acc_verdict"] == rows["gqa"]["loss_ratio_4x_verdict"] == "reference"
    assert float(rows["mha"]["loss_ratio_4x_diff"]) == pytest.approx(-1.6 / 3)
    assert rows["mha"]["loss_ratio_4x_verdict"] == "better"  # 0.5-0.6 lower than gqa's on every seed
    assert rows["mha"]["passkey_acc_verdict"] == rows["sqa"]["passkey_acc_diff"] == ""  # gqa has no passkey
    assert md.count("- passkey acc: no paired table") == 1
    assert ("- passkey acc: no paired table, --reference gqa has no passkey accuracy (attentions with one: mha, sqa)"
            in md)
    assert "passkey accuracy over each" not in md
    assert md.count("minus gqa's over matching seeds") == 3  # MQAR and both loss ratios


def test_reference_with_no_metric_is_a_one_line_error(tmp_path, runs, capsys):
    assert cost_card.main(["--runs", *map(str, runs), "--reference", "xsqa", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --reference 'xsqa' has no MQAR accuracy; attentions with one: mha, sqa, gqa; "
                   "no passkey accuracy; attentions with one: mha, sqa; no loss ratio 2x/1x; attentions with one: "
                   "mha, sqa, gqa; no loss ratio 4x/1x; attentions with one: mha, sqa, gqa\n")
    assert cost_card.main(["--runs", *map(str, runs), "--reference", "nope", "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == "error: --reference 'nope' is none of the runs' attentions: mha, sqa, gqa, xsqa\n"
    assert not (tmp_path / "c").exists()



@pytest.mark.parametrize("key, value, shown", [
    ("model.n_embd", 128, "model.n_embd (128 in "), ("trainer.max_steps", 9, "trainer.max_steps (9 in "),
    ("data.init_args.num_workers", 4, None), ("data.init_args.seed", 7, None),  # not what a run learns from
])
def test_runs_of_one_attention_in_unlike_settings_are_a_one_line_error(tmp_path, capsys, key, value, shown):
    """A row's mean over runs of two widths (or of two lengths of training) would pass for one setting's."""
    runs = [quality_run(tmp_path, "mha", seed, 0.9, {}) for seed in (1, 2)]
    for run, v in zip(runs, (value, 1)):
        config = yaml.safe_load((run / "config.yaml").read_text())
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = v
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    code = cost_card.main(["--runs", *map(str, runs), "--out", str(tmp_path / "card")])
    err = capsys.readouterr().err
    if shown is None:
        assert code == 0
        return
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "card").exists()
    assert err.startswith(f"error: the mha runs differ in {shown}{runs[0]}, 1 in {runs[1]}): the card's mha row "
                          "would average them")
