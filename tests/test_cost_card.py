"""lit_attn.tools.cost_card on synthetic bench.csv, decode.csv, compare.csv and runs: the rows it selects, the
analytic columns, blanks for missing inputs, the Pareto front, the plots and one-line errors."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
from helpers import extrapolation_result as _extrapolation
from helpers import passkey_result as _passkey
from helpers import quality_run

from benchmarks.bench_report import Row, write_csv
from lit_attn.analytic import cache_values_per_token, gpt_params, gpt_train_flops_per_token
from lit_attn.config import SPARSE_QUERY_LAYOUT
from lit_attn.tools import cost_card
from lit_attn.tools.compare import COLUMNS as COMPARE_COLUMNS

ATTENTIONS = ("mha", "sqa", "xsqa")
PNG = b"\x89PNG\r\n\x1a\n"
DECODE_HEADER = ["attention", "batch", "context", "prefill_s", "decode_s_per_token", "decode_tokens_per_sec",
                 "decode_tokens_per_sec_min", "decode_tokens_per_sec_max", "state_bytes_analytic",
                 "state_bytes_measured", "peak_mib"]


def _code(i: int, part: str, seq_len: int) -> float:
    """A time that says which row it came from: attention index, part and T."""
    return i + (0.5 if part == "model" else 0.25) + seq_len / 1e4


def _bench(path: Path, parts: tuple[str, ...] = ("layer", "model")) -> Path:
    rows = [Row(part, name, t, 4096 // t, 16, 16, fwd_s=_code(i, part, t) / 3, fwd_bwd_s=_code(i, part, t),
                peak_mem_mib=None)
            for part in parts for t in (256, 1024) for i, name in enumerate(ATTENTIONS)]
    write_csv(rows, path)
    return path


def _decode(path: Path) -> Path:
    """Per (attention i, batch b, context c): prefill i + b/100 + c/1e5 s, tokens/s 1000 i + 10 b + c/1000."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(DECODE_HEADER)
        for c in (256, 1024):
            for b in (8, 1):  # the smaller batch last: the default picks it by value, not by position
                for i, name in enumerate(ATTENTIONS):
                    tps = 1000 * i + 10 * b + c / 1000
                    w.writerow([name, b, c, i + b / 100 + c / 1e5, b / tps, tps, tps - 1, tps + 1, 1, 100 * i + b,
                                ""])
    return path


def _compare(path: Path, rows: list[tuple[str, str, float | None, float | None]]) -> Path:
    """compare.csv with (run, attention, val_loss, time_per_batch_s) filled in, the rest blank."""
    headers = ["run", "attention"] + [c[1] for c in COMPARE_COLUMNS]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=headers)
        w.writeheader()
        for run, attention, loss, tpb in rows:
            w.writerow({h: "" for h in headers} | {"run": run, "attention": attention,
                                                  "val_loss": "" if loss is None else loss,
                                                  "time_per_batch_s": "" if tpb is None else tpb})
    return path


def _card(out: Path) -> dict[str, dict[str, str]]:
    with (out / "cost_card.csv").open() as f:
        return {r["attention"]: r for r in csv.DictReader(f)}


def test_card_takes_each_value_from_the_selected_rows(tmp_path, capsys):
    bench, decode = _bench(tmp_path / "bench.csv"), _decode(tmp_path / "decode.csv")
    cmp = _compare(tmp_path / "compare.csv", [("a", "mha", 2.0, 9.0), ("b", "mha", 2.2, 9.0),
                                              ("c", "sqa", 2.3, 9.0), ("d", "", 1.0, 9.0)])
    out = tmp_path / "card"
    argv = ["--bench", str(bench), "--decode", str(decode), "--compare", str(cmp), "--context", "1024",
            "--batch", "8", "--out", str(out)]
    assert cost_card.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == (out / "cost_card.md").read_text()
    assert "run d names no attention" in captured.err
    card = _card(out)
    assert list(card) == list(ATTENTIONS)  # one row per attention, in the inputs' order
    for i, name in enumerate(ATTENTIONS):
        r, config = card[name], dataclasses.replace(SPARSE_QUERY_LAYOUT, attention=name)
        assert int(r["parameters"]) == gpt_params(config)["total"]
        assert int(r["train_flops_per_token"]) == gpt_train_flops_per_token(config, 1024)
        assert int(r["cache_bytes_per_token_analytic"]) == 4 * cache_values_per_token(config)  # float32 by default
        assert (int(r["n_query_heads"]), int(r["n_kv_heads"])) == config.heads
        assert float(r["train_time_per_batch_s"]) == pytest.approx(_code(i, "model", 1024))  # model part, T=1024
        assert float(r["prefill_s"]) == pytest.approx(i + 0.08 + 0.01024)
        assert float(r["decode_tokens_per_sec"]) == pytest.approx(1000 * i + 80 + 1.024)
        assert float(r["state_bytes_measured"]) == 100 * i + 8
    assert float(card["mha"]["val_loss"]) == pytest.approx(2.1) and card["mha"]["runs"] == "2"
    assert card["xsqa"]["val_loss"] == "" and card["xsqa"]["runs"] == ""
    assert "| sqa | 8/4 | 10,655,504 |" in captured.out  # Hq/Hkv beside the name
    for png in ("pareto_loss_vs_train_time.png", "pareto_loss_vs_decode.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG and len(data) > 1000


def test_defaults_pick_layer_part_and_smallest_batch(tmp_path):
    times, where = cost_card.bench_times(_bench(tmp_path / "bench.csv", parts=("layer",)), 256)
    assert times == pytest.approx({n: _code(i, "layer", 256) for i, n in enumerate(ATTENTIONS)})
    assert "part layer, T=256, batch 16" in where
    values, where = cost_card.decode_values(_decode(tmp_path / "decode.csv"), 256, None)
    assert values["sqa"]["decode_tokens_per_sec"] == pytest.approx(1000 + 10 + 0.256) and "batch 1" in where


def test_train_time_from_the_runs_without_bench(tmp_path):
    cmp = _compare(tmp_path / "compare.csv", [("a", "mha", 2.0, 0.5), ("b", "mha", 2.2, 0.7)])
    run = tmp_path / "runs" / "r-sqa"
    _tiny_run(run, "sqa", loss=1.5, time_per_batch=0.25)
    out = tmp_path / "card"
    assert cost_card.main(["--compare", str(cmp), "--runs", str(run), "--out", str(out)]) == 0
    card = _card(out)
    assert float(card["mha"]["train_time_per_batch_s"]) == pytest.approx(0.6)
    assert float(card["sqa"]["val_loss"]) == pytest.approx(1.5) and card["sqa"]["runs"] == "1"
    assert float(card["sqa"]["train_time_per_batch_s"]) == pytest.approx(0.25)
    assert card["sqa"]["prefill_s"] == ""
    assert (out / "pareto_loss_vs_train_time.png").read_bytes()[:8] == PNG
    assert not (out / "pareto_loss_vs_decode.png").exists()  # no decoding data: nothing to draw


def _tiny_run(run: Path, attention: str, loss: float, time_per_batch: float) -> None:
    from torch.utils.tensorboard import SummaryWriter

    run.mkdir(parents=True)
    (run / "hparams.yaml").write_text(f"attention: {attention}\n")
    writer = SummaryWriter(str(run))
    writer.add_scalar("val/loss", loss, 3)
    writer.add_scalar("whole_run/time_per_batch", time_per_batch, 4)
    writer.close()


def test_missing_inputs_leave_blanks(tmp_path, capsys):
    out = tmp_path / "card"
    assert cost_card.main(["--decode", str(_decode(tmp_path / "decode.csv")), "--attention", "mha,gqa",
                           "--out", str(out)]) == 0
    card = _card(out)
    assert list(card) == ["mha", "gqa"]
    assert card["gqa"]["prefill_s"] == "" and card["gqa"]["parameters"] != ""  # decode.csv has no gqa
    assert card["mha"]["train_time_per_batch_s"] == card["mha"]["val_loss"] == ""
    assert float(card["mha"]["decode_tokens_per_sec"]) == pytest.approx(10 + 1.024)  # T=1024, batch 1
    gqa_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| gqa |"))
    assert gqa_line.count(" – ") == 6  # train time, prefill, decode, measured cache, val loss, runs
    assert not list(out.glob("*.png"))  # no training time: no point to draw


def test_without_val_loss_decode_is_drawn_against_training_time(tmp_path):
    rows = cost_card.build_card(SPARSE_QUERY_LAYOUT, 1024, 2, ["mha", "sqa"], bench={"mha": 2.0, "sqa": 1.0},
                                decode={"mha": {"decode_tokens_per_sec": 10.0}, "sqa": {"decode_tokens_per_sec": 30.0}})
    paths = cost_card.plot_all(rows, tmp_path)
    assert [p.name for p in paths] == ["pareto_decode_vs_train_time.png"]
    assert paths[0].read_bytes()[:8] == PNG


def test_pareto_front():
    pts = [("a", 1.0, 5.0), ("b", 2.0, 3.0), ("c", 3.0, 4.0), ("d", 4.0, 1.0), ("e", 2.0, 3.0), ("f", 5.0, 1.0)]
    # Lower is better on both: c is beaten by b, f by d; the tie b/e both stay.
    assert [p[0] for p in cost_card.pareto_front(pts)] == ["a", "b", "e", "d"]
    # Higher x is better (tokens/s): f has the most x at the least y and beats every other point.
    assert [p[0] for p in cost_card.pareto_front(pts, maximize_x=True)] == ["f"]
    assert [p[0] for p in cost_card.pareto_front(pts, maximize_x=True, maximize_y=True)] == ["a", "c", "f"]
    assert cost_card.pareto_front([]) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--bench", "nowhere.csv"], "error: file not found: nowhere.csv"),
    (["--layout", "big"], "error: argument --layout: invalid choice"),
    (["--attention", "mha,nope"], "error: --attention: unknown attention 'nope'; choose one of: "),
    (["--attention", "mha{window}"], "error: --attention entry 'mha{window}': its options are not JSON"),
    (["--context", "0"], "error: --vocab-size, --cache-bytes-per-value, --context and --batch must be >= 1"),
])
def test_errors_are_one_line_with_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    try:
        code = cost_card.main([*argv, "--out", str(tmp_path / "card")])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_decode_csv_without_a_column_is_an_error(tmp_path, capsys):
    bad = tmp_path / "decode.csv"
    bad.write_text("attention,batch,context\nmha,1,1024\n")
    assert cost_card.main(["--decode", str(bad), "--out", str(tmp_path / "card")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad} has no column prefill_s") and err.count("\n") == 1


def test_small_layout_is_the_default_configs_model(tmp_path):
    import yaml

    from lit_attn.config import GPTConfig

    out = tmp_path / "card"
    assert cost_card.main(["--layout", "small", "--vocab-size", "65", "--attention", "mqa", "--out", str(out)]) == 0
    model = yaml.safe_load(cost_card.DEFAULT_YAML.read_text())["model"]
    config = GPTConfig.from_hparams(model, vocab_size=65, attention="mqa")
    card = _card(out)["mqa"]
    assert int(card["parameters"]) == gpt_params(config)["total"]
    assert int(card["train_flops_per_token"]) == gpt_train_flops_per_token(config, config.block_size)
    assert (card["n_query_heads"], card["n_kv_heads"]) == ("8", "1")


# ---- quality: MQAR accuracy over seeds, probe results, the paired statistics and the quality plot ----

# attention -> {seed: final val/mqar_acc}; xsqa is a language-modelling run (no MQAR accuracy).
MQAR = {"mha": {1: 0.90, 2: 0.80, 3: 0.85}, "sqa": {1: 0.70, 2: 0.62, 3: 0.66}, "gqa": {1: 0.95, 7: 0.50}}


# run -> the probe results written into it, with lit-attn probe's own writer
PROBES = {"mha-s1": {"extrapolation": _extrapolation({1: 2.0, 2: 3.0, 4: 5.0}), "passkey": _passkey([[0.4, 0.8]])},
          "mha-s2": {"extrapolation": _extrapolation({1: 2.0, 2: 2.4, 4: 4.0}), "passkey": _passkey([[0.6, 1.0]])},
          "sqa-s1": {"extrapolation": _extrapolation({1: 2.0, 4: 3.0})}}  # probed at 1x and 4x only


def _quality_run(root: Path, attention: str, seed: int, mqar: float | None) -> Path:
    return quality_run(root, attention, seed, mqar, PROBES.get(f"{attention}-s{seed}", {}))


@pytest.fixture(scope="module")
def quality_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    runs = [_quality_run(root, name, seed, acc) for name, by_seed in MQAR.items() for seed, acc in by_seed.items()]
    return runs + [_quality_run(root, "xsqa", 1, None)]


def _quality_card(tmp_path, runs, *extra) -> tuple[dict[str, dict[str, str]], str]:
    out = tmp_path / "card"
    assert cost_card.main(["--runs", *map(str, runs), "--out", str(out), *extra]) == 0
    return _card(out), (out / "cost_card.md").read_text()


def test_run_record_reads_mqar_and_the_probe_json(quality_runs):
    from lit_attn.tools.run_record import read_run

    row = read_run(quality_runs[0])  # mha-s1
    assert row["mqar_acc"] == pytest.approx(0.90) and row["passkey_acc"] == pytest.approx(0.6)
    assert row["loss_ratio_2x"] == pytest.approx(1.5) and row["loss_ratio_4x"] == pytest.approx(2.5)
    assert row["val_loss"] == pytest.approx(2.1)  # the probe's own event files are not the training record
    assert row["probe_notes"] == {}
    sqa = read_run(quality_runs[3])
    assert sqa["loss_ratio_2x"] is None and sqa["loss_ratio_4x"] == pytest.approx(1.5)
    assert sqa["probe_notes"] == {
        "passkey_acc": "no passkey probe (probe/passkey/passkey.json absent)",
        "loss_ratio_2x": "the extrapolation probe has no 2x context (lit-attn probe --contexts)"}
    assert read_run(quality_runs[-1])["mqar_acc"] is None


def test_quality_columns_mean_std_runs_and_blanks(tmp_path, quality_runs):
    card, md = _quality_card(tmp_path, quality_runs)
    mha, sqa, gqa, xsqa = card["mha"], card["sqa"], card["gqa"], card["xsqa"]
    # mha: 0.90, 0.80, 0.85 -> mean 0.85, sample std sqrt((0.05² + 0.05²) / 2) = 0.05
    assert float(mha["mqar_acc"]) == pytest.approx(0.85) and float(mha["mqar_acc_std"]) == pytest.approx(0.05)
    assert mha["mqar_acc_runs"] == "3" and mha["runs"] == "3"
    assert float(sqa["mqar_acc"]) == pytest.approx(0.66) and float(sqa["mqar_acc_std"]) == pytest.approx(0.04)
    # 95% CI of mha's mean: 0.85 ± t(0.975, 2) · 0.05 / √3 = 0.85 ± 4.302653 · 0.028868
    assert float(mha["mqar_acc_ci_low"]) == pytest.approx(0.85 - 0.124207, abs=1e-6)
    # passkey: means 0.6 and 0.8 over the two probed runs; ratios (3/2, 2.4/2) and (5/2, 4/2)
    assert float(mha["passkey_acc"]) == pytest.approx(0.7)
    assert float(mha["loss_ratio_2x"]) == pytest.approx(1.35) and float(mha["loss_ratio_4x"]) == pytest.approx(2.25)
    assert sqa["passkey_acc"] == sqa["loss_ratio_2x"] == "" and float(sqa["loss_ratio_4x"]) == pytest.approx(1.5)
    assert xsqa["mqar_acc"] == xsqa["mqar_acc_std"] == xsqa["mqar_acc_runs"] == xsqa["passkey_acc"] == ""
    assert gqa["mqar_acc_runs"] == "2" and float(gqa["mqar_acc"]) == pytest.approx(0.725)
    assert "| MQAR acc | passkey acc | loss 2x/1x | loss 4x/1x |" in md
    assert "| 0.8500 ± 0.0500 (3) | 0.700 ± 0.141 (2) | 1.350 ± 0.212 (2) | 2.250 ± 0.354 (2) |" in md
    xsqa_line = next(line for line in md.splitlines() if line.startswith("| xsqa |"))
    assert xsqa_line.endswith("| – | – | – | – |")  # blanks, never zeros
    # why each blank is blank, or over fewer runs than the attention has
    assert "- xsqa: MQAR acc blank: run xsqa-s1: no val/mqar_acc logged (not trained on MQAR data)" in md
    assert "- mha: passkey acc over 2 of 3 runs: run mha-s3: no passkey probe (probe/passkey/passkey.json absent)" in md
    assert ("- mha: loss 2x/1x and loss 4x/1x over 2 of 3 runs: run mha-s3: no extrapolation probe "
            "(probe/extrapolation/extrapolation.json absent)") in md
    assert ("- sqa: loss 2x/1x blank: run sqa-s1: the extrapolation probe has no 2x context (lit-attn probe "
            "--contexts); run sqa-s2: no extrapolation probe (probe/extrapolation/extrapolation.json absent); "
            "run sqa-s3: no extrapolation probe (probe/extrapolation/extrapolation.json absent)") in md


def test_mqar_paired_against_the_reference_over_matching_seeds(tmp_path, quality_runs):
    card, md = _quality_card(tmp_path, quality_runs)
    assert card["mha"]["mqar_acc_verdict"] == "reference" and card["mha"]["mqar_acc_diff"] == ""
    # sqa - mha by seed: -0.20, -0.18, -0.19 -> mean -0.19, std 0.01, half width 4.302653 · 0.01 / √3 = 0.024841
    sqa = card["sqa"]
    assert sqa["mqar_acc_pairs"] == "3" and float(sqa["mqar_acc_diff"]) == pytest.approx(-0.19)
    assert float(sqa["mqar_acc_diff_ci_low"]) == pytest.approx(-0.214841, abs=1e-6)
    assert float(sqa["mqar_acc_diff_ci_high"]) == pytest.approx(-0.165159, abs=1e-6)
    assert sqa["mqar_acc_verdict"] == "worse"  # less accurate than mha on every seed
    assert card["gqa"]["mqar_acc_pairs"] == "1" and card["gqa"]["mqar_acc_verdict"] == "n/a (fewer than 2 paired seeds)"
    assert float(card["gqa"]["mqar_acc_diff"]) == pytest.approx(0.05)  # seed 1 only: 0.95 - 0.90
    assert card["xsqa"]["mqar_acc_verdict"] == ""  # no MQAR accuracy: not in the comparison
    assert "minus mha's over matching seeds" in md
    assert "| sqa | 3 | 0.6600 ± 0.0400 (3) | [0.5606, 0.7594] | 3 | -0.1900 | [-0.2148, -0.1652] | worse |" in md
    assert "| xsqa | 1 |" not in md.split("minus mha's")[1]

    card, md = _quality_card(tmp_path, quality_runs, "--reference", "sqa", "--overwrite")
    assert card["sqa"]["mqar_acc_verdict"] == "reference" and card["mha"]["mqar_acc_verdict"] == "better"
    assert float(card["mha"]["mqar_acc_diff"]) == pytest.approx(0.19)


def test_reference_where_no_run_has_a_quality_metric_is_noted(tmp_path, quality_runs, capsys):
    """Language-modelling runs only: the reference is one of them, and there is nothing to pair."""
    assert cost_card.main(["--runs", str(quality_runs[-1]), "--reference", "xsqa", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "- --reference xsqa: no paired table, no run has MQAR accuracy, passkey accuracy or loss ratios" in out
    assert "has no MQAR accuracy" not in out


def test_quality_is_drawn_against_the_cache_per_token(tmp_path, quality_runs):
    out = tmp_path / "card"
    assert cost_card.main(["--runs", *map(str, quality_runs), "--out", str(out)]) == 0
    data = (out / "pareto_quality_vs_cache.png").read_bytes()
    assert data[:8] == PNG and len(data) > 1000
    # Without MQAR accuracy the quality axis is the val loss; without either there is no such plot.
    rows = cost_card.build_card(SPARSE_QUERY_LAYOUT, 1024, 2, ["mha", "mqa"],
                                runs={"mha": {"val_loss": 2.0, "time_per_batch_s": None},
                                      "mqa": {"val_loss": 2.1, "time_per_batch_s": None}})
    assert [p.name for p in cost_card.plot_all(rows, tmp_path)] == ["pareto_quality_vs_cache.png"]
    rows = cost_card.build_card(SPARSE_QUERY_LAYOUT, 1024, 2, ["mha", "mqa"])
    assert cost_card.plot_all(rows, tmp_path / "none") == []


def test_compare_csv_carries_mqar_accuracy_and_seeds_but_no_probe_results(tmp_path, quality_runs):
    from lit_attn.tools import compare

    assert compare.main([*map(str, quality_runs), "--out", str(tmp_path / "cmp")]) == 0
    out = tmp_path / "card"
    assert cost_card.main(["--compare", str(tmp_path / "cmp" / "compare.csv"), "--out", str(out)]) == 0
    card, md = _card(out), (out / "cost_card.md").read_text()
    assert float(card["mha"]["mqar_acc"]) == pytest.approx(0.85) and card["mha"]["mqar_acc_runs"] == "3"
    assert float(card["sqa"]["mqar_acc_diff"]) == pytest.approx(-0.19) and card["sqa"]["mqar_acc_verdict"] == "worse"
    assert card["mha"]["passkey_acc"] == card["mha"]["loss_ratio_4x"] == ""
    assert ("- passkey acc and loss 2x/1x and loss 4x/1x blank: compare.csv holds no probe results "
            "(give the run directories with --runs)") in md


def test_quality_no_run_has_is_noted_once_for_the_card(tmp_path):
    runs = [tmp_path / "runs" / f"r-{name}" for name in ("mha", "sqa")]
    for run, name in zip(runs, ("mha", "sqa")):
        _tiny_run(run, name, loss=2.0, time_per_batch=0.5)
    card, md = _quality_card(tmp_path, runs)
    assert card["mha"]["mqar_acc"] == card["sqa"]["loss_ratio_2x"] == card["sqa"]["mqar_acc_verdict"] == ""
    notes = [line for line in md.splitlines() if line.startswith("- ") and "blank" in line]
    assert notes == ["- MQAR acc blank: no run logged val/mqar_acc (none was trained on MQAR data)",
                     "- passkey acc and loss 2x/1x and loss 4x/1x blank: no run has these lit-attn probe results "
                     "(RUN/probe/PROBE/PROBE.json)"]
    assert "Δ MQAR acc" not in md  # no MQAR accuracy: no paired table
    assert next(line for line in md.splitlines() if line.startswith("| sqa |")).endswith("| 1 | – | – | – | – |")

