"""lit_attn.tools.sweep: one subprocess fit per attention; a failing variant does not stop the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import ROOT, TINY_FIT, main_env, scalars
from jsonargparse import Namespace

from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.required_settings import ENV, check_expected
from lit_attn.tools import sweep


@pytest.mark.slow
def test_sweep_continues_past_failure(tmp_path, corpus, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIT_ATTN_DEBUG", raising=False)
    # An attention that passes the sweep's checks (it builds on the meta device, and the conformance check is
    # skipped) but whose real build fails: its run fails.
    (tmp_path / "broken_attn.py").write_text("from torch import nn\n\n\nclass Broken(nn.Module):\n"
                                              "    def __init__(self, n_embd, **_):\n"
                                              "        super().__init__()\n"
                                              "        self.proj = nn.Linear(n_embd, n_embd)\n"
                                              "        if self.proj.weight.device.type != 'meta':\n"
                                              "            raise ValueError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    rc = sweep.main(["--attention", "broken_attn.Broken,mqa", "--runs_dir", "runs", "--prefix", "t", "--",
                     f"--data.path={corpus}", *TINY_FIT, "--skip_attention_check=true"])
    out, err = capfd.readouterr()
    assert rc == 1
    assert "[sweep] t-broken_attn.Broken FAILED (exit code" in err and "[sweep] 1 succeeded, 1 failed" in err
    assert (tmp_path / "runs" / "t-mqa" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "runs" / "t-broken_attn.Broken").exists()
    table = (tmp_path / "runs" / "t-compare" / "compare.md").read_text()
    assert "| t-mqa | mqa |" in table and "broken_attn.Broken" not in table and table in out
    assert (tmp_path / "runs" / "t-compare" / "val_loss_vs_step.png").is_file()


def test_sweep_usage_errors(tmp_path, capsys):
    assert sweep.main(["--attention", ","]) == 2
    assert "error: --attention needs at least one name" in capsys.readouterr().err
    assert sweep.main(["--attention", "mha,no_such_attention"]) == 2
    assert "error: unknown attention 'no_such_attention'; choose one of: " in capsys.readouterr().err
    assert sweep.main(["--attention", "mha", "--config", str(tmp_path / "x.yaml")]) == 2
    assert "error: config file not found" in capsys.readouterr().err


def test_fit_command():
    cmd = sweep.fit_command("gqa", "p-gqa", "r", ["a.yaml"], ["--trainer.max_steps=5"], seed=7)
    assert cmd[:3] == [sys.executable, "-m", "lit_attn"]
    assert cmd[1:] == ["-m", "lit_attn", "fit", "--config", "a.yaml", "--trainer.max_steps=5",
                       "--model.attention=gqa", "--run=p-gqa", "--runs_dir=r", "--ckpt_path=auto",
                       "--seed_everything=7"]
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
    args = ["--attention", "sqa", "--seeds", "1,2", "--parallel", "2", "--runs_dir", "runs", "--prefix", "g",
            "--", f"--data.path={corpus}", *TINY_FIT]
    # An interrupted run: g-sqa-s2 trained 2 of its 4 steps, then stopped (trained in this process: the sweep's
    # own fits below are the child processes under test)
    (job,) = sweep.grid(["sqa"], [2], "g", "runs", [], [f"--data.path={corpus}", *TINY_FIT, "--trainer.max_steps=2"])
    assert tuple(job.cmd[:len(sweep.LAUNCH)]) == sweep.LAUNCH and cli(job.cmd[len(sweep.LAUNCH):]) == 0
    assert sweep.main(args) == 0
    err = capfd.readouterr().err
    assert "[sweep] 2 succeeded, 0 failed" in err
    assert "run 'g-sqa-s2' in runs/g-sqa-s2: resuming from last.ckpt (step 2)" in err
    # the resumed run's curve has the steps of an uninterrupted one: nothing twice, nothing lost
    steps = [s for s, _ in scalars(tmp_path / "runs" / "g-sqa-s2", "train/loss")]
    assert steps == [s for s, _ in scalars(tmp_path / "runs" / "g-sqa-s1", "train/loss")] and steps[-1] == 3
    assert all((tmp_path / "runs" / f"g-sqa-s{s}" / sweep.DONE_FILE).is_file() for s in (1, 2))
    table = (tmp_path / "runs" / "g-compare" / "compare.md").read_text()
    assert all(f"| g-sqa-s{s} | sqa |" in table for s in (1, 2))
    events = sorted(str(p) for p in (tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert sweep.main(args) == 0  # the same command again: nothing to train
    err = capfd.readouterr().err
    assert err.count("finished by an earlier sweep, skipped") == 2 and "[sweep 1/" not in err
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
    monkeypatch.setattr(sweep, "run_variant", fake_fit(calls))
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


# ---- every run trains what its name says ----

def nested(dotted: dict) -> dict:
    """{"model.attention": "gqa"} -> {"model": {"attention": "gqa"}}."""
    out: dict = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def test_a_sweep_in_pieces_compares_the_whole_experiment_so_far(tmp_path, monkeypatch, capsys):
    """Each piece (other --attention or --seeds, same prefix and settings) rewrites PREFIX-compare: with the
    finished runs of the earlier pieces, not in place of them. Runs of other settings, unfinished runs and
    runs of another prefix stay out."""
    compared: list = []
    monkeypatch.setattr(sweep, "run_variant", fake_fit([]))
    monkeypatch.setattr(sweep, "compare", lambda runs, out: (compared.append([p.name for p in runs]), "table\n"))
    runs = str(tmp_path / "runs")

    def piece(attentions: str, seeds: str, prefix: str = "e", *extra: str) -> str:
        assert sweep.main(["--attention", attentions, "--seeds", seeds, "--runs_dir", runs, "--prefix", prefix,
                           "--", "--trainer.max_steps=5", *extra]) == 0
        return capsys.readouterr().err

    piece("mha", "1,2")
    piece("mha", "3", "e", "--model.n_layer=2")  # other settings: e-mha-s3 is another experiment's run
    piece("gqa", "1", "ex")  # another prefix that starts like this one
    (tmp_path / "runs" / "e-sqa-s9" / "checkpoints").mkdir(parents=True)  # a run of no finished sweep
    err = piece("sqa", "1")
    assert compared[-1] == ["e-sqa-s1", "e-mha-s1", "e-mha-s2"]
    assert "(with 2 finished by earlier sweeps with these settings: e-mha-s1, e-mha-s2)" in err
    (tmp_path / "runs" / "e-mha-s2" / "checkpoints" / "last.ckpt").unlink()  # no longer finished
    piece("sqa", "1")
    assert compared[-1] == ["e-sqa-s1", "e-mha-s1"]
    piece("mha", "1,2")  # the whole grid again: its own runs, none twice
    assert compared[-1] == ["e-mha-s1", "e-mha-s2", "e-sqa-s1"]


def fake_fit(calls: list, configs: dict | None = None, step: int | None = None, rc: int = 0):
    """A run_variant that trains nothing and exits `rc`; it saves the run's configs as main.py would, with
    what LIT_ATTN_EXPECT asks for and trainer.max_steps=5 changed by `configs` ({file name: {dotted key:
    value}}), and a last.ckpt at `step` (default: max_steps, the end); below it, it prints the stop line
    of a fit stopped by SIGTERM."""
    def run_variant(cmd, env=None, tag="", ctrl_c=None):
        if ctrl_c is not None and ctrl_c.pressed:
            return None, "not started"
        flags = dict(arg[2:].split("=", 1) for arg in cmd if arg.startswith("--") and "=" in arg)
        run_dir = Path(flags["runs_dir"]) / flags["run"]
        run_dir.mkdir(parents=True, exist_ok=True)
        expected = json.loads(env[ENV]) | {"trainer.max_steps": 5}
        for name, changes in ({"config.yaml": {}} if configs is None else configs).items():
            (run_dir / name).write_text(yaml.safe_dump(nested(expected | changes)))
        write_checkpoint(run_dir, 5 if step is None else step)
        calls.append(cmd)
        stopped = step is not None and step < 5
        return rc, f"SIGTERM: stopped after step {step}, last.ckpt is saved; resume with --ckpt_path last" * stopped
    return run_variant


def write_checkpoint(run_dir: Path, step: int, end: dict | None = None, epoch: int = 0) -> None:
    """A last.ckpt as a fit leaves it, with FinalValidation's record of the end of fit when `end` is given."""
    callbacks = {} if end is None else {"FinalValidation": {"end": {"tags": [], "since": None, **end}}}
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "epoch": epoch, "state_dict": {}, "callbacks": callbacks},
               run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize("extra", [
    [], ["--trainer.max_steps=5"], ["--config", "c.yaml", "--model.n_layer=2"],
    ["--model.n_layer=2", "--config=c.yaml"],
])
@pytest.mark.parametrize("seed", [None, 3])
def test_the_sweeps_own_flags_come_last(extra, seed):
    """jsonargparse applies arguments in order: configs and extra arguments first, so none overrides the sweep."""
    cmd = sweep.fit_command("gqa", "p-gqa", "r", ["a.yaml", "b.yaml"], extra, seed)
    own = ["--model.attention=gqa", "--run=p-gqa", "--runs_dir=r", "--ckpt_path=auto"]
    own += [] if seed is None else [f"--seed_everything={seed}"]
    assert cmd[3:] == ["fit", "--config", "a.yaml", "--config", "b.yaml", *extra, *own]


@pytest.mark.parametrize("flag, instead", [
    ("--model.attention", "--attention"), ("--seed_everything", "--seeds"), ("--run", "--prefix"),
    ("--runs_dir", "--runs_dir"), ("--ckpt_path", "--ckpt_path=auto"),
])
@pytest.mark.parametrize("joined", [True, False])
def test_extra_arguments_that_set_the_sweeps_own_settings_are_refused(flag, instead, joined, tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr(sweep, "run_variant", lambda *a, **k: pytest.fail("a run was started"))
    given = [f"{flag}=x"] if joined else [flag, "x"]
    assert sweep.main(["--attention", "mha", "--runs_dir", str(tmp_path / "runs"), "--", "--trainer.max_steps=5",
                       *given]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {given[0]} after `--` sets what the sweep sets for every run;")
    assert instead in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("expect, config, message", [
    (None, {"model": {"attention": "mha"}}, None),
    ("", {"model": {"attention": "mha"}}, None),
    ({"model.attention": "gqa"}, {"model": {"attention": "gqa"}}, None),
    ({"model.attention": "gqa", "seed_everything": 1}, {"model": {"attention": "gqa"}, "seed_everything": 1}, None),
    ({"model.attention": "gqa"}, {"model": {"attention": "mha"}},
     "the resolved config trains model.attention='mha', but the sweep asked for 'gqa'; a --config or flag "
     "overrides the sweep's setting: remove it"),
    ({"seed_everything": 1}, {"seed_everything": 2}, "trains seed_everything=2, but the sweep asked for 1"),
    ({"seed_everything": 1}, {"seed_everything": True}, "trains seed_everything=True, but the sweep asked for 1"),
    ({"model.attention": "gqa"}, {"seed_everything": 1}, "the resolved config has no model.attention"),
    ("not json", {}, "LIT_ATTN_EXPECT must be a JSON object"),
    (["model.attention"], {}, "LIT_ATTN_EXPECT must be a JSON object"),
])
def test_check_expected(expect, config, message, monkeypatch):
    if expect is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, expect if isinstance(expect, str) else json.dumps(expect))
    namespace = Namespace(**{k: Namespace(**v) if isinstance(v, dict) else v for k, v in config.items()})
    if message is None:
        check_expected(namespace)
        return
    with pytest.raises(ValueError) as e:
        check_expected(namespace)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("expect, args, message", [
    ({"model.attention": "gqa"}, ["--model.attention=mha"],
     "trains model.attention='mha', but the sweep asked for 'gqa'"),
    ({"model.attention": "gqa"}, ["--config=CONFIG"], "trains model.attention='mqa', but the sweep asked for 'gqa'"),
    ({"model.attention": "gqa", "seed_everything": 3}, ["--model.attention=gqa", "--seed_everything=4"],
     "trains seed_everything=4, but the sweep asked for 3"),
    ({"run": "t-gqa"}, ["--run=other"], "trains run='other', but the sweep asked for 't-gqa'"),
])
def test_main_refuses_a_run_that_differs_from_what_the_sweep_asked_before_anything_is_written(
        expect, args, message, tmp_path, corpus, monkeypatch, capsys):
    from lit_attn.cli.lightning_cli import cli

    config = tmp_path / "mqa.yaml"
    config.write_text("model:\n  attention: mqa\n")
    monkeypatch.setenv(ENV, json.dumps(expect))
    args = [arg.replace("CONFIG", str(config)) for arg in args]
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", *TINY_FIT, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the resolved config ") and message in err[-1]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("configs, wrong", [
    ({"config.yaml": {}}, None),
    ({"config.yaml": {}, "config.fit.yaml": {}}, None),
    ({"config.yaml": {"model.attention": "mha"}},
     "config.yaml says model.attention='mha', but the sweep asked for 'sqa'"),
    ({"config.yaml": {"seed_everything": 1}}, "config.yaml says seed_everything=1, but the sweep asked for 2"),
    ({"config.yaml": {}, "config.fit.yaml": {"model.attention": "mha"}},
     "config.fit.yaml says model.attention='mha', but the sweep asked for 'sqa'"),
    ({}, "it saved no"),
])
def test_a_run_whose_saved_config_differs_from_what_the_sweep_asked_fails(configs, wrong, tmp_path, monkeypatch,
                                                                           capsys):
    calls: list = []
    monkeypatch.setattr(sweep, "run_variant", fake_fit(calls, configs))
    args = ["--attention", "mha,sqa", "--seeds", "1,2", "--task", "3", "--runs_dir", str(tmp_path / "runs"),
            "--prefix", "g"]
    run_dir = tmp_path / "runs" / "g-sqa-s2"
    assert sweep.main(args) == (0 if wrong is None else 1)
    err = capsys.readouterr().err
    assert len(calls) == 1
    if wrong is None:
        done = json.loads((run_dir / sweep.DONE_FILE).read_text())
        assert done["expected"] == {"model.attention": "sqa", "run": "g-sqa-s2", "seed_everything": 2}
        assert sweep.main(args) == 0 and len(calls) == 1  # finished: skipped
    else:
        assert "[sweep] g-sqa-s2 FAILED (" in err and wrong in err and "[sweep] 0 succeeded, 1 failed" in err
        assert not (run_dir / sweep.DONE_FILE).exists()
        assert sweep.main(args) == 1 and len(calls) == 2  # not finished: tried again


def assert_trained(run_dir: Path, attention: str, seed: int) -> None:
    """The run trained `attention` with `seed`, by its saved config and its logged hyperparameters."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (config["model"]["attention"], config["seed_everything"]) == (attention, seed)
    assert yaml.load((run_dir / "hparams.yaml").read_text(), yaml.FullLoader)["attention"] == attention
    assert (run_dir / sweep.DONE_FILE).is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_the_slurm_script_trains_what_each_task_is_named(tmp_path, corpus):
    """scripts/slurm_sweep.sh as sbatch runs it (srun stubbed), with a config whose own attention is mha, and two
    more configs after the `--` that name other attentions and another seed: none of them changes the run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    config = tmp_path / "char.yaml"
    config.write_text("model:\n  attention: mha\nseed_everything: 7\n")
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    # Task 2 of gqa,sqa x seeds 3,4 (gqa-s3, gqa-s4, sqa-s3, sqa-s4): neither the config's attention nor the first.
    env = main_env(PATH=path, SLURM_ARRAY_TASK_ID=2, ATTENTIONS="gqa,sqa", SEEDS="3,4", PREFIX="arr", CONFIG=config)
    (tmp_path / "mha.yaml").write_text("model:\n  attention: mha\n")
    (tmp_path / "mqa.yaml").write_text("model:\n  attention: mqa\nseed_everything: 9\n")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "slurm_sweep.sh"), "--config", "mha.yaml",
                           "--config=mqa.yaml", f"--data.path={corpus}", *TINY_FIT],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_trained(tmp_path / "runs" / "arr-sqa-s3", "sqa", 3)  # not mha or mqa, nor seed 7 or 9
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["arr-sqa-s3"]
