"""Runs as users resume them: one latest checkpoint, settings that change on resume, refused
commands that leave no trace, failed runs that keep their history, configs of their own."""

import random
import shutil
from pathlib import Path

import pytest
from helpers import RUN_STEPS, assert_same_weights, last_checkpoint, run_args, scalars, snapshot

from lit_attn import GPT
from lit_attn.cli.lightning_cli import cli
from lit_attn.training.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def straight(run_text, tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("straight")
    assert cli(run_args(run_text, runs, "s", RUN_STEPS)) == 0
    return runs / "s"


@pytest.fixture(scope="module")
def halfway(run_text, tmp_path_factory) -> Path:
    """A run stopped at step 10 (last.ckpt at 10), to copy and resume."""
    runs = tmp_path_factory.mktemp("halfway")
    assert cli(run_args(run_text, runs, "h", 10)) == 0
    return runs / "h"


def copy_run(run_dir: Path, runs: Path, name: str | None = None) -> Path:
    target = runs / (name or run_dir.name)
    shutil.copytree(run_dir, target)
    return target


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_one_latest_checkpoint_whatever_the_frequency_or_runs_dir(run_text, straight, halfway, tmp_path, capsys):
    run = copy_run(halfway, tmp_path / "a")
    capsys.readouterr()
    # A new save frequency: Lightning would have written last-v1.ckpt and kept loading last.ckpt.
    every_3 = "--checkpoint.every_n_train_steps=3"
    assert cli(run_args(run_text, tmp_path / "a", "h", 14, "--ckpt_path=last", every_3)) == 0
    assert "resuming from last.ckpt (step 10)" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    assert last_checkpoint(run)["global_step"] == 14

    # The run directory moved to another runs directory, resumed twice in a row.
    moved = tmp_path / "b" / "h"
    shutil.move(str(run), str(moved))
    every_4 = "--checkpoint.every_n_train_steps=4"
    assert cli(run_args(run_text, tmp_path / "b", "h", 17, "--ckpt_path=last", every_4)) == 0
    assert "resuming from last.ckpt (step 14)" in capsys.readouterr().err
    assert cli(run_args(run_text, tmp_path / "b", "h", RUN_STEPS, "--ckpt_path=last")) == 0
    assert "resuming from last.ckpt (step 17)" in capsys.readouterr().err
    assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == ["last.ckpt"]
    final = last_checkpoint(moved)
    assert final["global_step"] == RUN_STEPS
    assert_same_weights(final, last_checkpoint(straight), RUN_STEPS)  # four pieces, one run


def test_ckpt_path_auto_starts_then_resumes_with_one_command(run_text, straight, tmp_path, capsys):
    # What a requeued SLURM job or a torchrun restart does: the very same command again.
    assert cli(run_args(run_text, tmp_path, "job", 8, "--ckpt_path=auto")) == 0
    assert "run 'job' in" in capsys.readouterr().err and last_checkpoint(tmp_path / "job")
    assert cli(run_args(run_text, tmp_path, "job", RUN_STEPS, "--ckpt_path=auto")) == 0
    assert "resuming from last.ckpt (step 8)" in capsys.readouterr().err
    assert_same_weights(last_checkpoint(tmp_path / "job"), last_checkpoint(straight), RUN_STEPS)
    unnamed = [a for a in run_args(run_text, tmp_path, "x", 4, "--ckpt_path=auto") if not a.startswith("--run=")]
    assert cli(unnamed) == 2
    assert "--ckpt_path auto is for fit with --run NAME" in capsys.readouterr().err


def test_new_optimizer_settings_apply_from_the_resumed_step(run_text, straight, halfway, tmp_path, capsys):
    run = copy_run(halfway, tmp_path)
    capsys.readouterr()
    assert cli(run_args(run_text, tmp_path, "h", RUN_STEPS, "--ckpt_path=last", "--model.lr=5e-4",
                    "--model.weight_decay=0.01")) == 0
    err = capsys.readouterr().err
    assert "resume: model.lr 0.001 -> 0.0005 applies from step 10" in err
    assert "resume: model.weight_decay 0.1 -> 0.01 applies from step 10" in err
    before, after = dict(scalars(straight, "train/lr")), dict(scalars(run, "train/lr"))
    assert sorted(after) == sorted(before)
    for step in before:  # the schedule's shape is kept; its peak halves from the resumed step on
        expected = before[step] if step < 10 else before[step] / 2
        assert after[step] == pytest.approx(expected, rel=1e-6), step
    groups = last_checkpoint(run)["optimizer_states"][0]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_a_schedule_that_follows_max_steps_says_when_its_length_changes(run_text, tmp_path, caplog):
    unset = "--model.total_steps=null"
    assert cli(run_args(run_text, tmp_path, "r", 10, unset)) == 0
    with caplog.at_level("INFO"):
        assert cli(run_args(run_text, tmp_path, "r", 12, unset, "--ckpt_path=last")) == 0
    assert ("resume: the LR schedule's length changes from 10 to 12 steps from step 10 on (it follows "
            "trainer.max_steps); pass --model.total_steps 10 to keep it") in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):  # the schedule kept, as the message says: no notice
        assert cli(run_args(run_text, tmp_path, "r", 14, "--model.total_steps=12", "--ckpt_path=last")) == 0
    assert "schedule's length changes" not in caplog.text


@pytest.mark.parametrize("change,message", [
    (["--data.batch_size=4"], "data.batch_size=4 differs from the checkpoint's 8"),
    (["--data.stride=8"], "data.stride=8 differs from the checkpoint's 16"),
    (["--data.seed=7"], "data.seed=7 differs from the checkpoint's 1337"),
    (["--data.val_fraction=0.2"], "the data differs from the checkpoint's (token fingerprint"),
    (["--data.test_fraction=0.1"], "the data differs from the checkpoint's (token fingerprint"),
    ("shuffled", "the data differs from the checkpoint's (token fingerprint"),
    ("older", "the checkpoint was written by an older lit-attn (the epoch position in the datamodule's state"),
])
def test_other_data_on_resume_is_refused_and_writes_nothing(change, message, run_text, halfway, tmp_path, capsys):
    run = copy_run(halfway, tmp_path)
    corpus = run_text
    if change == "shuffled":  # the same characters in another order: the vocabulary check alone misses it
        chars = list(run_text.read_text())
        random.Random(0).shuffle(chars)
        corpus = tmp_path / "shuffled.txt"
        corpus.write_text("".join(chars))
        change = []
    if change == "older":  # the epoch position where lit-attn kept it before Lightning restored the train loader's
        ckpt = last_checkpoint(run)
        del ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        ckpt["CharDataModule"]["sampler"] = {"epoch": 0, "index": 80, "seed": 1337, "num_replicas": 1}
        save_checkpoint(ckpt, run / "checkpoints" / "last.ckpt")
        change = []
    before = snapshot(run)
    assert cli(run_args(corpus, tmp_path, "h", RUN_STEPS, "--ckpt_path=last", *change)) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, last
    assert snapshot(run) == before  # no config.fit.yaml, no events file, nothing touched


def test_nan_before_the_first_checkpoint_keeps_the_runs_history(run_text, tmp_path, capsys, monkeypatch):
    real_loss = GPT._loss
    monkeypatch.setattr(GPT, "_loss", lambda self, logits, targets: real_loss(self, logits, targets) * (
        float("nan") if self.trainer.global_step >= 3 else 1.0))
    assert cli(run_args(run_text, tmp_path, "nan", RUN_STEPS)) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    run = tmp_path / "nan"
    assert last.startswith("error: training loss is nan at step 3; stopped without saving; no checkpoint had been "
                           f"written yet; the run's TensorBoard events and config are kept in {run}")
    assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
    assert sorted(dict(scalars(run, "train/loss"))) == [0, 1, 2]  # the curve up to the bad step, for diagnosis
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").glob("*.ckpt"))


def test_nan_after_a_checkpoint_names_it(run_text, halfway, tmp_path, capsys, monkeypatch):
    run = copy_run(halfway, tmp_path)
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    real_loss = GPT._loss
    monkeypatch.setattr(GPT, "_loss", lambda self, logits, targets: real_loss(self, logits, targets) * (
        float("nan") if self.trainer.global_step >= 12 else 1.0))
    every_20 = "--checkpoint.every_n_train_steps=20"
    assert cli(run_args(run_text, tmp_path, "h", RUN_STEPS, "--ckpt_path=last", every_20)) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"error: training loss is nan at step 12; stopped without saving; "
                    f"the last good checkpoint is kept: "
                    f"{run / 'checkpoints' / 'last.ckpt'} (step 10); lower --model.lr and resume with --run h "
                    f"--ckpt_path last")
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == before
    assert sorted(dict(scalars(run, "train/loss")))[-1] == 11  # this attempt's curve is kept up to the bad step


EARLY_STOPPING_ONLY = """
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.EarlyStopping
      init_args: {monitor: val/loss, patience: 100}
"""


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_a_config_of_ones_own_keeps_last_ckpt_exact_resume_and_the_nan_guard(run_text, straight, tmp_path, capsys,
                                                                            monkeypatch):
    config = tmp_path / "mine.yaml"
    config.write_text(EARLY_STOPPING_ONLY)
    mine = [f"--config={config}"]
    assert cli(run_args(run_text, tmp_path, "mine", 10, *mine)) == 0
    assert last_checkpoint(tmp_path / "mine")["global_step"] == 10
    assert cli(run_args(run_text, tmp_path, "mine", RUN_STEPS, *mine, "--ckpt_path=last")) == 0
    final = last_checkpoint(tmp_path / "mine")
    assert_same_weights(final, last_checkpoint(straight), RUN_STEPS)  # bit-exact with the default list
    assert any("EarlyStopping" in key for key in final["callbacks"])

    real_loss = GPT._loss
    monkeypatch.setattr(GPT, "_loss", lambda self, logits, targets: real_loss(self, logits, targets) * (
        float("nan") if self.trainer.global_step >= 2 else 1.0))
    capsys.readouterr()
    assert cli(run_args(run_text, tmp_path, "mine-nan", RUN_STEPS, *mine)) == 2
    assert "training loss is nan at step 2" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.tmpfs
def test_full_scratch_filesystem_keeps_the_previous_checkpoint(run_text, straight, tmpfs, tmp_path, capsys,
                                                                monkeypatch):
    import os
    import tempfile

    from lit_attn.load import verify_checkpoint

    own_tmp = tmp_path / "tmpdir"
    own_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(own_tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    scratch = tmpfs("2m")  # a runs directory on another filesystem than $TMPDIR, that can fill up
    runs = scratch / "runs"
    assert cli(run_args(run_text, runs, "r", 10)) == 0
    last = runs / "r" / "checkpoints" / "last.ckpt"
    assert verify_checkpoint(last) is True
    before = last.read_bytes()

    free = os.statvfs(scratch).f_bavail * os.statvfs(scratch).f_frsize
    filler = scratch / "filler"
    filler.write_bytes(b"\0" * (free - len(before) // 2))  # the next save runs out of space halfway
    capsys.readouterr()
    assert cli(run_args(run_text, runs, "r", RUN_STEPS, "--ckpt_path=last")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: cannot write {last}: No space left on device; every checkpoint already on disk "
                          f"is intact"), err
    assert last.read_bytes() == before and verify_checkpoint(last) is True
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]  # no temporary file left behind
    assert list(own_tmp.iterdir()) == []  # and nothing written to $TMPDIR

    filler.unlink()
    assert cli(run_args(run_text, runs, "r", RUN_STEPS, "--ckpt_path=last")) == 0
    assert_same_weights(last_checkpoint(runs / "r"), last_checkpoint(straight), RUN_STEPS)
