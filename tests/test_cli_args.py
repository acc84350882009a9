"""Evaluations of a run (its own config, its own log directory), --config files, and the data-order seed."""

from __future__ import annotations

import hashlib

import pytest
import torch
from helpers import TINY_FIT, history, scalars

from datamodules import CharDataModule
from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.run_config import flag_values, with_run_config


def _digests(run_dir):
    """{relative path: digest} of every file the training wrote (not under eval/)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and "eval" not in p.relative_to(run_dir).parts}


# A layout other than the default config's: validate/test must rebuild this model, not the default one.
OWN_LAYOUT = ["--model.n_layer=2", "--model.n_embd=48", "--model.n_head=8", "--model.attention=gqa",
              "--model.pos=rope", "--model.norm=rmsnorm"]


@pytest.mark.parametrize("stage, tag", [("validate", "val/loss"),
                                        pytest.param("test", "test/loss", marks=pytest.mark.slow)])
@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_evaluating_a_run_uses_its_own_config_and_leaves_its_history_alone(stage, tag, tmp_path, corpus,
                                                                           monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["fit", f"--data.path={corpus}", "--run=r", *TINY_FIT, *OWN_LAYOUT]) == 0
    run = tmp_path / "runs" / "r"
    before = _digests(run)
    trained = history(run)
    # only --run: the model, the data and the checkpoint (last) all come from the run
    assert cli([stage, "--run=r"]) == 0, capsys.readouterr().err
    assert _digests(run) == before, "an evaluation changed the run's training files"
    assert history(run) == trained, "an evaluation changed the run's training curves"
    (where,) = (run / "eval").iterdir()
    assert where.name == f"{stage}-1" and (where / "config.yaml").is_file()
    assert [step for step, _ in scalars(where, tag)] == [4], "the evaluation is logged at the checkpoint's step"
    assert cli([stage, "--run=r"]) == 0
    assert {p.name for p in (run / "eval").iterdir()} == {f"{stage}-1", f"{stage}-2"}


def test_flags_after_the_run_config_still_win(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed_everything: 1\nrun: elsewhere\nruns_dir: /elsewhere\nmodel: {n_layer: 2}\n")
    args = ["validate", "--run", "r", "--runs_dir", str(tmp_path / "runs"), "--model.n_layer=3"]
    out = with_run_config(args)
    # the run's config, then what says where the run is (never taken from the config), then the user's flags
    assert out[:7] == ["validate", "--config", str(run / "config.yaml"), f"--runs_dir={tmp_path / 'runs'}",
                       "--trainer.default_root_dir=null", "--trainer.logger=null", "--ckpt_path=last"]
    assert out[7:] == args[1:]
    assert "--ckpt_path=last" not in with_run_config([*args, "--ckpt_path", "x.ckpt"])  # a named checkpoint is kept
    assert with_run_config(["fit", "--run", "r"]) == ["fit", "--run", "r"]  # a new run is not rewritten
    resume = ["fit", "--run", "r", "--runs_dir", str(tmp_path / "runs"), "--ckpt_path=last"]
    assert with_run_config(resume) == resume  # nor a run without a checkpoint
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / "config.fit.yaml").write_text("model: {n_layer: 2}\n")
    assert with_run_config(resume)[:3] == ["fit", "--config", str(run / "config.fit.yaml")]  # the latest fit's
    assert flag_values(["--a", "1", "--a=2", "--b", "3"], "--a") == ["1", "2"]


@pytest.mark.parametrize("stage", ["fit", "validate", "test"])
def test_a_missing_config_file_is_named(stage, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli([stage, "--config", "no/such.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: config file not found: no/such.yaml; check --config"]
    assert not (tmp_path / "runs").exists()


def test_the_seed_varies_the_data_order_and_is_recorded(tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    orders = {}
    for seed in (1, 2):
        assert cli(["fit", f"--data.path={corpus}", f"--run=s{seed}", f"--seed_everything={seed}", *TINY_FIT]) == 0
        config = (tmp_path / "runs" / f"s{seed}" / "config.yaml").read_text()
        assert f"seed_everything: {seed}" in config and f"    seed: {seed}\n" in config
        data = CharDataModule(path=str(corpus), block_size=16, batch_size=4, seed=seed)
        data.setup("fit")
        orders[seed] = next(iter(data.train_dataloader()))[0]
    assert not torch.equal(orders[1], orders[2])
    # a fixed data order, whatever the seed: --data.seed
    assert cli(["fit", f"--data.path={corpus}", "--run=fixed", "--seed_everything=5", "--data.seed=1", *TINY_FIT]) == 0
    assert "    seed: 1\n" in (tmp_path / "runs" / "fixed" / "config.yaml").read_text()


def test_without_a_data_seed_the_datamodule_follows_seed_everything(corpus, monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    assert CharDataModule(path=str(corpus), block_size=16, batch_size=4).seed == 7
    assert CharDataModule(path=str(corpus), block_size=16, batch_size=4, seed=3).seed == 3


@pytest.mark.parametrize("message, named", [
    ("GPUAccelerator can not run on your system since the accelerator is not available.", True),
    ("`Trainer(devices=3)` asks for 3 CUDA devices", True),
    ("`Trainer(strategy='fsdp')` is not compatible with `precision='16-true'`", False),
    ("You set `val_check_interval` larger than the number of training batches", False),
])
def test_the_machine_is_named_only_where_devices_are_the_cause(message, named):
    from lit_attn.cli.parsed_config import trainer_error_message

    out = trainer_error_message(message, has_gpu=False)
    assert ("this machine has no GPU" in out) is named and out.startswith(message)


@pytest.mark.parametrize("args, message", [
    (["validate", "--run=nope"], "error: there is no run 'nope'"),
    (["test", "--run=nope"], "error: there is no run 'nope'"),
    (["validate", "--run=nope", "--ckpt_path=auto"], "error: --ckpt_path auto is for fit"),
    (["fit", "--optimizer=Adam"], "error: --optimizer would replace the model's AdamW"),
    (["fit", "--lr_scheduler=ConstantLR"], "error: --lr_scheduler would replace the model's AdamW"),
])
def test_evaluations_and_optimizers_that_would_give_a_meaningless_number_are_refused(args, message, tmp_path,
                                                                                     monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
