"""lit-attn sweep --grid: grid points as runs (names, cross product, the values each run must train with), the
refusals, and a grid run again (finished points skipped, interrupted ones resumed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY_FIT
from test_sweep import fake_fit

from lit_attn.tools import sweep
from lit_attn.tools.sweep_grid import Grid, check_grids, read_grids

LR = Grid("model.lr", "model.lr", ("1e-4", "4.6e-4"), (1e-4, 4.6e-4), "lr")
DROPOUT = Grid("model.dropout", "model.dropout", ("0", "0.1"), (0.0, 0.1), "dropout")


def test_grid_points_are_runs_named_by_their_values():
    jobs = sweep.grid(["mha", "sqa"], [1], "p", "r", [], ["--trainer.max_steps=5"], [LR, DROPOUT])
    assert [j.run for j in jobs] == [f"p-{a}-lr{lr}-dropout{d}-s1" for a in ("mha", "sqa") for lr in ("1e-4", "4.6e-4")
                                     for d in ("0", "0.1")]
    job = jobs[3]  # mha, lr 4.6e-4, dropout 0.1
    assert job.cmd[4:] == ("--trainer.max_steps=5", "--model.lr=4.6e-4", "--model.dropout=0.1",
                           "--model.attention=mha", "--run=p-mha-lr4.6e-4-dropout0.1-s1", "--runs_dir=r",
                           "--ckpt_path=auto", "--seed_everything=1")
    assert job.expected == {"model.attention": "mha", "run": "p-mha-lr4.6e-4-dropout0.1-s1", "seed_everything": 1,
                            "model.lr": 4.6e-4, "model.dropout": 0.1}
    assert [j.run for j in sweep.grid(["mha"], None, "p", "r", [], [], [LR])] == ["p-mha-lr1e-4", "p-mha-lr4.6e-4"]


@pytest.mark.slow  # builds the fit's parser (imports Lightning)
def test_grid_values_are_read_as_the_fit_reads_them():
    (lr, pairs) = read_grids(check_grids(["model.lr=1e-4,4.6e-4", "data.num_kv_pairs=4,8"], []),
                             ["--config", "configs/mqar.yaml"])
    assert (lr.values, lr.short, lr.config_key) == ((1e-4, 4.6e-4), "lr", "model.lr")
    assert (pairs.values, pairs.short, pairs.config_key) == ((4, 8), "num_kv_pairs", "data.init_args.num_kv_pairs")


@pytest.mark.parametrize("grids, extra, message", [
    (["model.lr="], [], "--grid model.lr has an empty value list"),
    (["model.lr=1e-3,,1e-2"], [], "--grid model.lr has an empty value list or an empty value"),
    (["model.lr"], [], "--grid 'model.lr' is not KEY=VALUE,VALUE,..."),
    (["model.lr=1e-3,1e-2,1e-3"], [], "--grid model.lr lists 1e-3 twice"),
    (["model.lr=1e-3", "model.lr=1e-2"], [], "--grid model.lr is given twice"),
    (["model.lr=1e-3,1e-2"], ["--model.lr=1e-4"], "--grid model.lr and --model.lr=1e-4 after `--` both set model.lr"),
    (["data.power_a=0.1,1"], ["--data.init_args.power_a", "1"], "--grid data.power_a and --data.init_args.power_a"),
    (["model.attention=mha,sqa"], [], "--grid model.attention is set by the sweep for every run; use --attention"),
    (["seed_everything=1,2"], [], "use --seeds instead"),
    (["model.betas=[0.9,0.95]"], [], "--grid model.betas=[0.9 cannot name a run"),  # the comma splits the list
    (["model.lr=1e-3,1/2"], [], "--grid model.lr=1/2 cannot name a run"),
])
def test_grid_refusals(grids, extra, message, tmp_path, capsys):
    args = [a for g in grids for a in ("--grid", g)]
    assert sweep.main(["--attention", "mha", "--runs_dir", str(tmp_path / "runs"), *args, "--", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # builds the fit's parser (imports Lightning)
@pytest.mark.parametrize("grid, message", [
    ("model.nope=1,2", "--grid model.nope=1: unrecognized arguments: --model.nope=1"),
    ("model.lr=1e-3,abc", "--grid model.lr=abc: --model.lr must be a number > 0 (AdamW's learning rate, e.g. 1e-3), "
                          "got 'abc'"),
    ("model.lr=1e-3,-1", "--grid model.lr=-1: --model.lr must be a number > 0"),
])
def test_a_grid_the_fit_would_refuse_is_refused_before_any_run(grid, message, tmp_path, capsys):
    assert sweep.main(["--attention", "mha", "--runs_dir", str(tmp_path / "runs"), "--grid", grid]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_grid_run_again_skips_finished_points_and_resumes_interrupted_ones(tmp_path, monkeypatch, capsys):
    calls: list = []
    compared: list = []
    # The fit's parser (tested above) reads each value as a float
    monkeypatch.setattr(sweep, "read_grids", lambda grids, args: [Grid(k, k, tuple(v), tuple(map(float, v)), "lr")
                                                                  for k, v in grids])
    monkeypatch.setattr(sweep, "compare", lambda runs, out, **kw: (compared.append(([p.name for p in runs], kw)),
                                                                   "table\n"))
    args = ["--attention", "mha", "--seeds", "1", "--grid", "model.lr=1e-4,4.6e-4", "--runs_dir",
            str(tmp_path / "runs"), "--prefix", "g"]
    monkeypatch.setattr(sweep, "run_variant", fake_fit(calls, step=2))  # every fit stopped at step 2 of 5
    assert sweep.main(args) == 1
    assert "0 succeeded, 0 failed, 2 interrupted" in capsys.readouterr().err
    monkeypatch.setattr(sweep, "run_variant", fake_fit(calls))
    assert sweep.main([*args[:5], "model.lr=1e-4", *args[6:]]) == 0  # one point: its run resumed to the end
    assert sweep.main(args) == 0  # the whole grid: that point skipped, the other resumed
    err = capsys.readouterr().err
    assert err.count("finished by an earlier sweep, skipped") == 1 and "g-mha-lr1e-4-s1: finished by an earlier" in err
    assert [c[-4] for c in calls] == ["--run=g-mha-lr1e-4-s1", "--run=g-mha-lr4.6e-4-s1", "--run=g-mha-lr1e-4-s1",
                                      "--run=g-mha-lr4.6e-4-s1"]
    done = json.loads((tmp_path / "runs" / "g-mha-lr4.6e-4-s1" / sweep.DONE_FILE).read_text())
    assert done["expected"]["model.lr"] == 4.6e-4
    assert compared[-1] == (["g-mha-lr1e-4-s1", "g-mha-lr4.6e-4-s1"], {"best_of": ["model.lr"]})
    assert sweep.main(args) == 0  # again: nothing to train
    assert len(calls) == 4 and capsys.readouterr().err.count("finished by an earlier sweep, skipped") == 2


@pytest.mark.slow  # two tiny fits, each in its own process
def test_a_tiny_grid_end_to_end(tmp_path, corpus, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--attention", "mha", "--grid", "model.lr=1e-3,2e-3", "--runs_dir", "runs", "--prefix", "t", "--",
            f"--data.path={corpus}", *TINY_FIT]
    assert sweep.main(args) == 0
    out, err = capfd.readouterr()
    assert "[sweep] 2 succeeded, 0 failed" in err
    for lr in ("1e-3", "2e-3"):
        assert f"lr: {float(lr)}" in (tmp_path / "runs" / f"t-mha-lr{lr}" / "config.yaml").read_text()
    best = (tmp_path / "runs" / "t-compare" / "best_of.md").read_text()
    assert best in out and "| mha | 0.001 | " in best and "| mha | 0.002 | " in best
    assert best.count("(1) | chosen |") == 1
    assert sweep.main(args) == 0
    assert capfd.readouterr().err.count("finished by an earlier sweep, skipped") == 2


def test_best_of_is_given_to_the_comparison_only_with_a_grid(tmp_path, monkeypatch, capsys):
    compared: list = []
    monkeypatch.setattr(sweep, "run_variant", fake_fit([]))
    monkeypatch.setattr(sweep, "compare", lambda runs, out, **kw: (compared.append(kw), "table\n"))
    assert sweep.main(["--attention", "mha", "--runs_dir", str(tmp_path / "runs")]) == 0
    assert compared == [{}]
    assert Path(tmp_path / "runs" / "sweep-mha").is_dir()


def test_checking_a_grid_point_prints_no_lightning_warning_about_the_sweeps_own_argv(monkeypatch):
    """The sweep reads each point's fit command while its own argv is `lit-attn sweep ...`: Lightning's warning
    about an argv beside `args` is about that, and would be noise in every sweep's output."""
    import warnings

    from lit_attn.cli.fit_parse import parse_fit

    monkeypatch.setattr("sys.argv", ["lit-attn", "sweep", "--attention", "mha", "--grid", "model.lr=1e-3,2e-3"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert parse_fit(["--model.lr=2e-3"]).model.lr == 2e-3
    assert not [w for w in caught if "args parameter is intended" in str(w.message)]
