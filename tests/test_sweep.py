"""lit_attn.sweep: one subprocess fit per attention; a failing variant does not stop the others."""

from __future__ import annotations

import os
import sys

import pytest
from helpers import ROOT, TINY_FIT, scalars

from lit_attn import sweep


@pytest.mark.slow
def test_sweep_continues_past_failure(tmp_path, corpus, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIT_ATTN_DEBUG", raising=False)
    rc = sweep.main(["--attention", "no_such_attention,mqa", "--runs_dir", "runs", "--prefix", "t", "--",
                     f"--data.path={corpus}", *TINY_FIT])
    out, err = capfd.readouterr()
    assert rc == 1
    assert "[sweep] t-no_such_attention FAILED (exit code" in err and "[sweep] 1 succeeded, 1 failed" in err
    assert (tmp_path / "runs" / "t-mqa" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "runs" / "t-no_such_attention").exists()
    table = (tmp_path / "runs" / "t-compare" / "compare.md").read_text()
    assert "| t-mqa | mqa |" in table and "no_such_attention" not in table and table in out
    assert (tmp_path / "runs" / "t-compare" / "val_loss_vs_step.png").is_file()


def test_sweep_usage_errors(tmp_path, capsys):
    assert sweep.main(["--attention", ","]) == 2
    assert "error: --attention needs at least one name" in capsys.readouterr().err
    assert sweep.main(["--attention", "mha", "--config", str(tmp_path / "x.yaml")]) == 2
    assert "error: config file not found" in capsys.readouterr().err


def test_fit_command():
    cmd = sweep.fit_command("gqa", "p-gqa", "r", ["a.yaml"], ["--trainer.max_steps=5"], seed=7)
    assert cmd[0] == sys.executable and cmd[1] == str(ROOT / "main.py")
    assert cmd[1:] == [str(sweep.main_script()), "fit", "--config", "a.yaml", "--model.attention=gqa", "--run=p-gqa",
                       "--runs_dir=r", "--ckpt_path=auto", "--seed_everything=7", "--trainer.max_steps=5"]
    jobs = sweep.grid(["mha", "sqa"], [1, 2], "p", "r", [], [])
    assert [(j.attention, j.seed, j.run) for j in jobs] == [
        ("mha", 1, "p-mha-s1"), ("mha", 2, "p-mha-s2"), ("sqa", 1, "p-sqa-s1"), ("sqa", 2, "p-sqa-s2")]
    assert [j.run for j in sweep.grid(["mha"], None, "p", "r", [], [])] == ["p-mha"]


def test_parallel_runs_share_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    envs = sweep.run_environments(2)
    assert [e["OMP_NUM_THREADS"] for e in envs] == ["4", "4"]
    assert sweep.run_environments(1) == [dict(os.environ)]  # one run at a time: the environment as it is
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in sweep.run_environments(2)] == ["0", "1"]


@pytest.mark.slow
def test_a_seeded_sweep_run_again_skips_finished_runs_and_resumes_interrupted_ones(tmp_path, corpus, capfd,
                                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--attention", "mha,sqa", "--seeds", "1,2", "--parallel", "2", "--runs_dir", "runs", "--prefix", "g",
            "--", f"--data.path={corpus}", *TINY_FIT]
    # An interrupted run: g-sqa-s2 trained 2 of its 4 steps, then stopped.
    assert sweep.run_variant(sweep.grid(["sqa"], [2], "g", "runs", [], [f"--data.path={corpus}", *TINY_FIT,
                                                                          "--trainer.max_steps=2"])[0].cmd)[0] == 0
    assert sweep.main(args) == 0
    err = capfd.readouterr().err
    assert "[sweep] 4 succeeded, 0 failed" in err and "resum" in err.lower()
    # train/loss at the first and last step of each attempt (2 of 4 steps, then the rest): nothing twice.
    assert [s for s, _ in scalars(tmp_path / "runs" / "g-sqa-s2", "train/loss")] == [0, 1, 3]
    assert all((tmp_path / "runs" / f"g-{a}-s{s}" / sweep.DONE_FILE).is_file() for a in ("mha", "sqa") for s in (1, 2))
    table = (tmp_path / "runs" / "g-compare" / "compare.md").read_text()
    assert all(f"| g-{a}-s{s} | {a} |" in table for a in ("mha", "sqa") for s in (1, 2))
    events = sorted(str(p) for p in (tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert sweep.main(args) == 0  # the same command again: nothing to train
    err = capfd.readouterr().err
    assert err.count("finished by an earlier sweep, skipped") == 4 and "[sweep 1/" not in err
    assert sorted(str(p) for p in (tmp_path / "runs").rglob("events.out.tfevents.*")) == events


def test_seed_and_parallel_usage_errors(capsys):
    assert sweep.main(["--attention", "mha", "--seeds", "1,x"]) == 2
    assert "error: --seeds takes integers, e.g. --seeds 1,2,3; got 'x'" in capsys.readouterr().err
    assert sweep.main(["--attention", "mha", "--seeds", "1,1"]) == 2
    assert "error: --seeds needs distinct integers" in capsys.readouterr().err
    assert sweep.main(["--attention", "mha", "--parallel", "0"]) == 2
    assert "error: --parallel must be >= 1, got 0" in capsys.readouterr().err


def test_sweep_parse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--prefix", "p"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "error: the following arguments are required: attention (--help lists the flags)\n")
    args, extra = sweep.parse_args(["--attention", "mha", "--config", "a.yaml", "--config", "b.yaml", "--",
                                    "--trainer.max_steps=5", "--config", "c.yaml"])
    assert (args.attention, args.config, args.runs_dir, args.prefix, args.out) == ("mha", ["a.yaml", "b.yaml"], "runs",
                                                                                    "sweep", None)
    assert extra == ["--trainer.max_steps=5", "--config", "c.yaml"]


def test_a_job_array_task_runs_one_run_of_the_grid(tmp_path, monkeypatch, capsys):
    """`--task I` (scripts/slurm_sweep.sh passes SLURM_ARRAY_TASK_ID) trains the I-th run, named as the sweep does."""
    calls = []
    monkeypatch.setattr(sweep, "run_variant", lambda cmd, env=None, tag="": calls.append(cmd) or (0, ""))
    (tmp_path / "runs" / "g-sqa-s2").mkdir(parents=True)
    assert sweep.main(["--attention", "mha,sqa", "--seeds", "1,2", "--task", "3", "--runs_dir", str(tmp_path / "runs"),
                       "--prefix", "g"]) == 0
    assert len(calls) == 1 and "--run=g-sqa-s2" in calls[0] and "--seed_everything=2" in calls[0]
    assert (tmp_path / "runs" / "g-sqa-s2" / sweep.DONE_FILE).is_file()
    assert not (tmp_path / "runs" / "g-compare").exists()  # an array task compares nothing
    assert sweep.main(["--attention", "mha,sqa", "--seeds", "1,2", "--task", "4"]) == 2
    assert "error: --task 4 is outside the grid's 4 runs (0 to 3)" in capsys.readouterr().err
    script = (ROOT / "scripts" / "slurm_sweep.sh").read_text()
    assert "--task \"$TASK\"" in script and "SLURM_ARRAY_TASK_ID" in script
