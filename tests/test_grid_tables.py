"""The best point of a grid (compare and recall-grid --best-of), like-with-like tables, and recall-grid's two
means across test settings; from run records written here (config.yaml and event files), nothing trained."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml

from lit_attn.tools import best_of, compare, recall_grid
from lit_attn.tools.recall_means import accuracy

EPS = 1e-6  # event files hold float32


def _write_run(run: Path, config: dict, scalars: dict[str, list[tuple[int, float]]], finished: bool = True) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    writer = SummaryWriter(str(run))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    if finished:
        writer.add_scalar("whole_run/train_time", 10.0, 4)  # the end-of-fit record
    writer.close()
    return run


def _mqar(root: Path, attention: str, lr: float, seed: int, acc: float, *, width: int = 64, pos: str = "rope",
          settings: list[list[int]] | None = None, slices: dict[str, float] | None = None,
          limit_val: float | None = None) -> Path:
    config = {"seed_everything": seed,
              "model": {"attention": attention, "n_embd": width, "n_head": 4, "pos": pos, "lr": lr},
              "data": {"class_path": "datamodules.MQARDataModule",
                       "init_args": {"input_seq_len": 64, "num_kv_pairs": 4, "num_test_examples": 100,
                                     "test_settings": settings, "seed": seed}},
              "trainer": {"max_steps": 3, "limit_val_batches": limit_val}}
    scalars = {"val/loss": [(3, 1.0)], "val/mqar_acc": [(3, acc)]}
    scalars |= {f"val/mqar_acc/{name}": [(3, value)] for name, value in (slices or {}).items()}
    return _write_run(root / f"{attention}-{pos}-w{width}-lr{lr}-s{seed}", config, scalars)


# ---- choosing a point ----

@pytest.mark.parametrize("means, maximize, point, edge", [
    ({(1e-4,): 0.5, (1e-3,): 0.9, (1e-2,): 0.7}, True, (1e-3,), None),  # inside the grid
    ({(1e-4,): 0.5, (1e-3,): 0.6, (1e-2,): 0.7}, True, (1e-2,), "model.lr at the highest value tried"),
    ({(1e-4,): 1.5, (1e-3,): 1.6, (1e-2,): 1.7}, False, (1e-4,), "model.lr at the lowest value tried"),
    ({(1e-3,): 0.8, (1e-4,): 0.8}, True, (1e-4,), "model.lr at the lowest value tried"),  # a tie: grid order
    ({(1e-3,): 0.8}, True, (1e-3,), None),  # one value tried: no edge to speak of
    ({(1e-3,): math.nan}, True, None, None),  # no value at any point: no choice
])
def test_choose(means, maximize, point, edge):
    choice = best_of.choose(means, ["model.lr"], maximize)
    assert (choice and choice.point) == point
    assert (choice.edge if choice else None) == (None if edge is None else f"edge: {edge}; widen the grid")


@pytest.mark.parametrize("text, keys", [("model.lr", ("model.lr",)), (" model.lr , data.init_args.power_a",
                                                                     ("model.lr", "data.power_a"))])
def test_best_of_keys(text, keys):
    assert best_of.parse_keys(text) == keys


@pytest.mark.parametrize("text", ["model.lr,model.lr", "model.lr,", ""])
def test_bad_best_of_keys_are_refused(text):
    with pytest.raises(ValueError, match="--best-of takes distinct setting keys"):
        best_of.parse_keys(text)


# ---- compare --best-of ----

# Final val loss by attention, lr and seed. mha: lr 1e-3 has the lowest mean (1.95) though 1e-2's seed 1 is the
# lowest single run (1.80): seeds are averaged before choosing. sqa: the lowest lr, at the edge.
LOSSES = {"mha": {1e-4: (2.10, 2.20), 1e-3: (1.90, 2.00), 1e-2: (1.80, 2.30)},
          "sqa": {1e-4: (1.70, 1.72), 1e-3: (1.90, 1.92), 1e-2: (2.50, 2.60)}}


# Final test loss (the held-out split, scored once at the end of fit) of the same runs: mha's lowest test mean is at
# lr 1e-2 (1.86), not at its val-chosen 1e-3 (2.02), which is what is reported.
TEST_LOSSES = {"mha": {1e-4: (2.15, 2.25), 1e-3: (2.00, 2.04), 1e-2: (1.85, 1.87)},
               "sqa": {1e-4: (1.75, 1.77), 1e-3: (1.95, 1.97), 1e-2: (2.55, 2.65)}}


def _lm(root: Path, attention: str, lr: float, seed: int, loss: float, test: float | None = None) -> Path:
    config = {"seed_everything": seed, "model": {"attention": attention, "lr": lr}, "data": {"init_args": {"seed": 1}}}
    scalars = {"val/loss": [(19, loss)]} | ({} if test is None else {"test/loss": [(20, test)]})
    return _write_run(root / f"g-{attention}-lr{lr:g}-s{seed}", config, scalars)


def _grid(root: Path, tested=lambda attention, lr, seed: True) -> list[Path]:
    """The runs of LOSSES, with TEST_LOSSES' test loss where `tested`."""
    return [_lm(root, a, lr, s, loss, TEST_LOSSES[a][lr][s - 1] if tested(a, lr, s) else None)
            for a, by_lr in LOSSES.items() for lr, losses in by_lr.items() for s, loss in zip((1, 2), losses)]


def _chosen(runs: list[Path]) -> tuple[dict, str, str]:
    rows = [compare.read_run(d) for d in runs]
    groups: dict = {}
    for r, d in zip(rows, runs):
        r["grid_point"] = best_of.grid_point(d, ["model.lr"])
        groups.setdefault(r["attention"], []).append(r)
    return compare.best_points(groups, ["model.lr"], "attention")


def test_compare_best_of_chooses_on_the_seed_mean_and_keeps_every_point(tmp_path):
    runs = [_lm(tmp_path, a, lr, s, loss) for a, by_lr in LOSSES.items() for lr, losses in by_lr.items()
            for s, loss in zip((1, 2), losses)]
    rows = [compare.read_run(d) for d in runs]
    groups: dict = {}
    for r, d in zip(rows, runs):
        r["grid_point"] = best_of.grid_point(d, ["model.lr"])
        groups.setdefault(r["attention"], []).append(r)
    kept, text, split = compare.best_points(groups, ["model.lr"], "attention")
    assert split == "val" and "Chosen on: val; reported on: validation (no test split)." in text
    assert {name: {r["grid_point"] for r in runs} for name, runs in kept.items()} == {"mha": {(1e-3,)},
                                                                                       "sqa": {(1e-4,)}}
    assert [r["seed"] for r in kept["mha"]] == [1, 2]
    assert "the point with the lowest val loss, averaged over the seeds every point of the group has" in text
    assert "| mha | 0.001 | 1.9500 ± 0.0707 (2) |  |" in text
    assert "| sqa | 0.0001 | 1.7100 ± 0.0141 (2) | edge: model.lr at the lowest value tried; widen the grid |" in text
    every = text[text.index("Every grid point"):]
    assert every.count("\n| mha |") == 3 and every.count("\n| sqa |") == 3  # every point kept
    assert "| mha | 0.01 | 1, 2 | 2.0500 ± 0.3536 (2) |  |" in every
    assert "| mha | 0.001 | 1, 2 | 1.9500 ± 0.0707 (2) | chosen |" in every


def test_compare_best_of_chooses_on_val_and_reports_the_test_split(tmp_path):
    kept, text, split = _chosen(_grid(tmp_path))
    assert split == "test" and "Chosen on: val; reported on: test." in text
    assert {name: {r["grid_point"] for r in runs} for name, runs in kept.items()} == {"mha": {(1e-3,)},
                                                                                       "sqa": {(1e-4,)}}
    # the val-chosen point's test loss, not the best test loss (1e-2's 1.8600)
    assert "| mha | 0.001 | 1.9500 ± 0.0707 (2) | 2.0200 ± 0.0283 (2) |  |" in text
    assert ("| sqa | 0.0001 | 1.7100 ± 0.0141 (2) | 1.7600 ± 0.0141 (2) | edge: model.lr at the lowest value tried; "
            "widen the grid |") in text
    every = text[text.index("Every grid point"):]
    assert every.count("\n| mha |") == 3 and every.count("\n| sqa |") == 3  # every point kept, with its test loss
    assert "| mha | 0.01 | 1, 2 | 2.0500 ± 0.3536 (2) | 1.8600 ± 0.0141 (2) |  |" in every
    assert "| mha | 0.001 | 1, 2 | 1.9500 ± 0.0707 (2) | 2.0200 ± 0.0283 (2) | chosen |" in every
    table = compare.group_stats(kept, "mha", split)
    assert [g["loss"].mean for g in table] == pytest.approx([2.02, 1.76], abs=1e-5)
    paired = table[1]["paired"]  # sqa - mha on the test split, seed by seed: 1.75 - 2.00, 1.77 - 2.04
    assert paired.n == 2 and paired.mean == pytest.approx(-0.26, abs=1e-5)
    stats_md = compare.stats_markdown(table, "attention", "mha", basis=compare.split_line(split, kept["mha"]))
    assert stats_md.startswith("Chosen on: val; reported on: test.\n")
    assert "| attention | runs | seed | data seed | test loss | test loss 95% CI | test acc |" in stats_md
    assert "| sqa | 2 | -0.2600 |" in stats_md
    compare.write_stats_csv(table, "attention", "mha", tmp_path / "stats.csv", split=split)
    with (tmp_path / "stats.csv").open() as f:
        stats = {r["attention"]: r for r in csv.DictReader(f)}
    assert float(stats["mha"]["test_loss_mean"]) == pytest.approx(2.02, abs=1e-5)
    assert float(stats["sqa"]["test_loss_diff_mean"]) == pytest.approx(-0.26, abs=1e-5)


@pytest.mark.parametrize("tested, why", [
    (lambda a, lr, s: False, "no test split"),
    (lambda a, lr, s: not (a == "sqa" and s == 2), "not every chosen run has a test split"),
])
def test_compare_best_of_reports_validation_unless_every_chosen_run_has_a_test_split(tested, why, tmp_path):
    kept, text, split = _chosen(_grid(tmp_path, tested))
    assert split == "val" and f"Chosen on: val; reported on: validation ({why})." in text
    assert [g["loss"].mean for g in compare.group_stats(kept, "mha", split)] == pytest.approx([1.95, 1.71], abs=1e-5)


@pytest.mark.slow  # draws the plots
def test_compare_main_best_of_reports_the_test_split(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main([*map(str, _grid(tmp_path / "runs")), "--out", str(out), "--best-of", "model.lr"]) == 0
    printed = capsys.readouterr().out
    assert (out / "best_of.md").read_text() in printed and (out / "stats.md").read_text() in printed
    assert "Chosen on: val; reported on: test." in (out / "stats.md").read_text()
    with (out / "stats.csv").open() as f:
        stats = {r["attention"]: r for r in csv.DictReader(f)}
    assert float(stats["sqa"]["test_loss_mean"]) == pytest.approx(1.76, abs=1e-5)
    with (out / "compare.csv").open() as f:  # every run's test loss, in the table of runs too
        assert sorted(float(r["test_loss"]) for r in csv.DictReader(f))[:2] == pytest.approx([1.75, 1.77], abs=1e-5)
    # a run without a test loss beside runs with one says why
    untested = [*_grid(tmp_path / "other", lambda a, lr, s: a == "mha")]
    rows, _ = compare.compare(untested, tmp_path / "cmp2", best_of=["model.lr"])
    assert [r["attention"] for r in rows if compare.NO_TEST in r["notes"]] == ["sqa"] * 6


@pytest.mark.slow  # draws the plots
def test_compare_main_best_of(tmp_path, capsys):
    runs = [_lm(tmp_path / "runs", a, lr, s, loss) for a, by_lr in LOSSES.items() for lr, losses in by_lr.items()
            for s, loss in zip((1, 2), losses)]
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--best-of", "model.lr"]) == 0
    printed = capsys.readouterr().out
    assert (out / "best_of.md").read_text() in printed
    with (out / "stats.csv").open() as f:
        stats = {r["attention"]: r for r in csv.DictReader(f)}
    assert float(stats["mha"]["val_loss_mean"]) == pytest.approx(1.95, abs=1e-5)  # the chosen point's runs only
    assert float(stats["sqa"]["val_loss_diff_mean"]) == pytest.approx(1.71 - 1.95, abs=1e-5)
    assert compare.main([*map(str, runs), "--out", str(tmp_path / "x"), "--best-of", "model.nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --best-of model.nope: run ") and len(err.splitlines()) == 1


# ---- recall-grid --best-of, like with like, --mean ----

ACCS = {"mha": {1e-4: (0.50, 0.60), 4.6e-4: (0.90, 0.80), 2.2e-3: (0.95, 0.60)},
        "sqa": {1e-4: (0.20, 0.30), 4.6e-4: (0.40, 0.50), 2.2e-3: (0.60, 0.70)}}


def test_recall_grid_best_of(tmp_path, capsys):
    runs = [_mqar(tmp_path / "runs", a, lr, s, acc) for a, by_lr in ACCS.items() for lr, accs in by_lr.items()
            for s, acc in zip((1, 2), accs)]
    cells = recall_grid.read_grid(runs, ["model.lr"])
    text = recall_grid.markdown(cells, ["model.lr"])
    # mha: 4.6e-4 (mean 0.85) over 2.2e-3 (0.775), whose seed 1 (0.95) is the best single run
    assert "| mha | 0.850 ± 0.071 (2) at lr 0.00046 |" in text
    assert "| sqa | 0.650 ± 0.071 (2) at lr 0.0022 (edge) |" in text
    assert "the point with the highest accuracy, averaged over the seeds every point of the group has" in text
    every = text[text.index("Every grid point"):]
    assert "| mha | 64 | 0.00046 | 1, 2 | 0.850 ± 0.071 (2) | chosen |" in every
    assert "| mha | 64 | 0.0022 | 1, 2 | 0.775 ± 0.247 (2) |  |" in every
    assert every.count("\n| sqa | 64 |") == 3
    assert recall_grid.main([*map(str, runs), "--out", str(tmp_path / "grid"), "--best-of", "model.lr"]) == 0
    with (tmp_path / "grid" / "recall_grid.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["chosen"] == "True"]
    assert [(r["attention"], r["model.lr"], r["edge"] != "") for r in rows] == [("mha", "0.00046", False),
                                                                                 ("sqa", "0.0022", True)]
    capsys.readouterr()
    # Without --best-of, runs at different learning rates are in one cell only if they are one setting: separated
    assert "model.lr=0.0001" in recall_grid.markdown(recall_grid.read_grid(runs))


def test_recall_grid_separates_runs_of_other_architectures(tmp_path, capsys):
    """Learned positions and RoPE are never in one table unlabelled: each group gets its own, named."""
    root = tmp_path / "runs"
    runs = [_mqar(root, "mha", 1e-3, s, 0.9) for s in (1, 2)] + [_mqar(root, "mha", 1e-3, 1, 0.3, pos="learned"),
                                                                 _mqar(root, "qsa", 1e-3, 1, 0.1, pos="learned")]
    assert recall_grid.main([*map(str, runs), "--out", str(tmp_path / "grid")]) == 0
    text = capsys.readouterr().out
    tables = text.split("MQAR accuracy, ")[1:]
    assert len(tables) == 2
    assert "group: the runs with model.pos=rope" in tables[0] and "| mha | 0.900 ± 0.000 (2) |" in tables[0]
    assert "qsa" not in tables[0]
    assert "group: the runs with model.pos=learned" in tables[1]
    assert "model: model.pos=learned, model.n_head=4, model.ffn=not recorded" in tables[1]
    with (tmp_path / "grid" / "recall_grid.csv").open() as f:
        assert {(r["attention"], r["pos"], r["n_head"]) for r in csv.DictReader(f)} == {
            ("mha", "rope", "4"), ("mha", "learned", "4"), ("qsa", "learned", "4")}
    assert "| mha | 0.300 (1) |" in tables[1] and "| qsa | 0.100 (1) |" in tables[1]
    # the table of every run labels each run's group, as the state table does: the two mha rows are told apart
    every = text[text.index("Every run:"):]
    assert "| 64, 4 | mha (model.pos=rope) | 64 | 2 | 0.900 | step 3 | 0.2 min |" in every
    assert "| 64, 4 | mha (model.pos=learned) | 64 | 1 | 0.300 | step 3 | 0.2 min |" in every
    # Alike runs: one table, and a line says so
    assert recall_grid.main([*map(str, runs[:2]), "--out", str(tmp_path / "one")]) == 0
    assert "like with like: the runs differ only in the attention and the width" in capsys.readouterr().out


# Two test settings: (64, 4) and (128, 16), 100 examples each. Per setting: 0.9 and 0.2 of the queries right.
# Per query: (100*4*0.9 + 100*16*0.2) / (100*4 + 100*16) = 680 / 2000 = 0.34; per example: (0.9 + 0.2) / 2 = 0.55.
MIXED = {"settings": [[64, 4], [128, 16]], "slices": {"T64_kv4": 0.9, "T128_kv16": 0.2}}


def test_per_example_and_per_query_means(tmp_path, capsys):
    runs = [_mqar(tmp_path / "runs", "mha", 1e-3, s, 0.34, **MIXED) for s in (1, 2)]
    assert accuracy(runs[0], "per-query")[0] == pytest.approx(0.34, abs=EPS)
    assert accuracy(runs[0], "per-example")[0] == pytest.approx(0.55, abs=EPS)
    for mean, cell, name in (("per-query", "0.340", "per-query mean"), ("per-example", "0.550", "per-example mean")):
        assert recall_grid.main([*map(str, runs), "--out", str(tmp_path / mean), "--mean", mean]) == 0
        text = capsys.readouterr().out
        assert f"| mha | {cell} ± 0.000 (2) |" in text and f"accuracy: {name} across test settings" in text
    # One test setting: the two means are one number
    single = _mqar(tmp_path / "one", "mha", 1e-3, 1, 0.7)
    assert accuracy(single, "per-example")[0] == accuracy(single, "per-query")[0]


@pytest.mark.parametrize("change, message", [
    ({"limit_val": 0.5}, "validated on part of its test examples (trainer.limit_val_batches 0.5)"),
    ({"limit_val": 1}, "validated on part of its test examples (trainer.limit_val_batches 1)"),  # one batch
    ({"slices": {"T64_kv4": 0.9}}, "logged no val/mqar_acc/T128_kv16 at step 3"),
    ({"slices": {"T64_kv4": 0.9, "T128_kv16": 0.3}}, "give a per-query mean of 0.420000, not the 0.340000"),
])
def test_per_example_mean_is_refused_where_the_records_cannot_give_it(change, message, tmp_path, capsys):
    run = _mqar(tmp_path / "runs", "mha", 1e-3, 1, 0.34, **(MIXED | change))
    assert recall_grid.main([str(run), "--out", str(tmp_path / "grid"), "--mean", "per-example"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1 and "use --mean per-query" in err
    assert not (tmp_path / "grid").exists()


def test_best_of_chooses_on_the_seeds_every_point_has(tmp_path):
    # A grid tried on seed 1, then seeds 2 and 3 added at its choice (lr 1e-3, 1.80 on seed 1). Over all seeds,
    # 1e-3's mean (2.0333) would lose to 1e-2's single 1.90; over the shared seed 1, 1e-3 stays chosen and its
    # three runs are reported.
    runs = [_lm(tmp_path, "mha", 1e-4, 1, 2.00), _lm(tmp_path, "mha", 1e-2, 1, 1.90)]
    runs += [_lm(tmp_path, "mha", 1e-3, s, loss) for s, loss in ((1, 1.80), (2, 2.10), (3, 2.20))]
    kept, text, _ = _chosen(runs)
    assert {r["grid_point"] for r in kept["mha"]} == {(1e-3,)} and sorted(r["seed"] for r in kept["mha"]) == [1, 2, 3]
    assert "| mha | 0.001 | 2.0333 ± 0.2082 (3) |  |" in text


@pytest.mark.parametrize("values, seeds, means", [
    ({(1,): [1.0, 3.0], (2,): [2.5]}, {(1,): [1, 2], (2,): [1]}, {(1,): 1.0, (2,): 2.5}),  # seed 1 is shared
    ({(1,): [1.0, 3.0], (2,): [2.5]}, {(1,): [1, 2], (2,): [3]}, {(1,): 2.0, (2,): 2.5}),  # none shared: own seeds
    ({(1,): [1.0, 3.0], (2,): [2.5]}, {(1,): [None, 2], (2,): [2]}, {(1,): 2.0, (2,): 2.5}),  # a seed unknown
])
def test_seed_means(values, seeds, means):
    assert best_of.seed_means(values, seeds) == pytest.approx(means)


@pytest.mark.slow  # draws the card's plot
def test_cost_card_best_of_reports_the_chosen_runs_test_loss(tmp_path, capsys):
    from lit_attn.tools import cost_card

    out = tmp_path / "card"
    argv = ["--runs", *map(str, _grid(tmp_path / "runs")), "--best-of", "model.lr", "--layout", "small",
            "--reference", "mha", "--out", str(out)]
    assert cost_card.main(argv) == 0
    card = (out / "cost_card.md").read_text()
    assert card in capsys.readouterr().out
    assert "each attention at its best model.lr (every value tried: the table at the end); chosen on: val; " \
           "reported on: test (the test loss column and its paired table)" in card
    with (out / "cost_card.csv").open() as f:
        rows = {r["attention"]: r for r in csv.DictReader(f)}
    # the val-chosen points (mha 1e-3, sqa 1e-4) and their runs only: val 1.95 and 1.71, test 2.02 and 1.76
    assert [float(rows[a]["val_loss"]) for a in ("mha", "sqa")] == pytest.approx([1.95, 1.71], abs=1e-5)
    assert [float(rows[a]["test_loss"]) for a in ("mha", "sqa")] == pytest.approx([2.02, 1.76], abs=1e-5)
    assert rows["sqa"]["runs"] == "2" and rows["sqa"]["test_loss_pairs"] == "2"
    # sqa - mha on the test split, seed by seed: (1.75 - 2.00, 1.77 - 2.04) -> -0.26, t(1) interval +-0.127
    assert float(rows["sqa"]["test_loss_diff"]) == pytest.approx(-0.26, abs=1e-5)
    assert float(rows["sqa"]["test_loss_diff_ci_low"]) == pytest.approx(-0.26 - 12.7062 * 0.01, abs=1e-4)
    assert "| sqa | 2 | 1.7600 ± 0.0141 (2) | [1.6329, 1.8871] | 2 | -0.2600 | [-0.3871, -0.1329] | better |" in card
    every = card[card.index("Every grid point"):]
    assert every.count("\n| mha |") == 3 and "| mha | 0.001 | 1, 2 | 1.9500 ± 0.0707 (2) | 2.0200 ± 0.0283 (2) | " \
                                              "chosen |" in every


def test_mqar_grids_are_chosen_on_accuracy_by_compare_and_the_cost_card_as_by_recall_grid(tmp_path, capsys):
    """Every run has the same val loss (1.0): chosen on it, the lowest lr would win each tie. MQAR runs are
    chosen on accuracy, as recall-grid chooses: mha 4.6e-4 (mean 0.85), sqa 2.2e-3 (0.65, at the edge)."""
    from lit_attn.tools import cost_card

    runs = [_mqar(tmp_path / "runs", a, lr, s, acc) for a, by_lr in ACCS.items() for lr, accs in by_lr.items()
            for s, acc in zip((1, 2), accs)]
    # a run that never validated (stopped before its first validation) has no value to choose on, and changes nothing
    config = {"seed_everything": 3, "model": {"attention": "mha", "n_embd": 64, "n_head": 4, "pos": "rope", "lr": 1e-4},
              "data": {"class_path": "datamodules.MQARDataModule", "init_args": {"input_seq_len": 64}}}
    unvalidated = _write_run(tmp_path / "runs" / "mha-unvalidated", config, {"train/loss": [(1, 5.0)]}, finished=False)
    kept, text, _ = _chosen([*runs, unvalidated])
    assert {name: {r["grid_point"] for r in group} for name, group in kept.items()} == {"mha": {(4.6e-4,)},
                                                                                         "sqa": {(2.2e-3,)}}
    assert "the point with the highest MQAR accuracy, averaged over the seeds every point of the group has" in text
    assert "| mha | 0.00046 | 0.8500 ± 0.0707 (2) |  |" in text
    grid = recall_grid.chosen_cells(recall_grid.read_grid(runs, ["model.lr"]), ["model.lr"])[0]
    assert {c.attention: c.point for c in grid} == {"mha": (4.6e-4,), "sqa": (2.2e-3,)}
    argv = ["--runs", *map(str, runs), "--best-of", "model.lr", "--layout", "small", "--reference", "mha",
            "--out", str(tmp_path / "card")]
    assert cost_card.main(argv) == 0
    card = capsys.readouterr().out
    # sqa - mha at the chosen points, seed by seed: (0.60 - 0.90, 0.70 - 0.80) -> -0.20
    assert "| sqa | 2 | 0.6500 ± 0.0707 (2) | " in card and "| 2 | -0.2000 | " in card


@pytest.mark.parametrize("argv", [["--compare", "compare.csv", "--best-of", "model.lr"],
                                  ["--runs", "r1", "--compare", "compare.csv", "--best-of", "model.lr"]])
def test_cost_card_best_of_needs_run_directories(argv, capsys):
    from lit_attn.tools import cost_card

    with pytest.raises(SystemExit) as e:
        cost_card.parse_args(argv)
    assert e.value.code == 2 and "--best-of chooses among run directories" in capsys.readouterr().err
