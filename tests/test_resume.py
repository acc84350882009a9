"""Exact resume: a run stopped after N steps and resumed equals the run that never stopped,
in its weights and in its TensorBoard history."""

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    ROOT,
    FakeClock,
    assert_same_history,
    assert_same_weights,
    history,
    last_checkpoint,
    main_env,
    resumable_fit,
    same_steps,
    scalars,
    snapshot,
    wall_clock,
)

from callbacks.resume import ExactResume
from lit_attn.cli.lightning_cli import cli

STEPS = 30  # 2N: small_corpus has 13 batches per epoch, so a run crosses two epoch boundaries


def fit_args(corpus, runs_dir, run, max_steps, *extra):
    return resumable_fit(corpus, runs_dir, run, max_steps, *extra, total_steps=STEPS)


@pytest.fixture(scope="module")
def straight_run(small_corpus, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert cli(fit_args(small_corpus, runs, "straight", STEPS)) == 0
    return runs / "straight"


def test_straight_run_history_is_what_the_comparisons_rely_on(straight_run):
    h = history(straight_run)
    assert [s for s, _ in h["train/loss"]] == list(range(STEPS))
    # After steps 7, 14, 21, 28 and the last one, at the step before.
    assert [s for s, _ in h["val/loss"]] == [6, 13, 20, 27, STEPS - 1]
    assert [s for s, _ in h["train/lr"]] == list(range(STEPS))  # logged every step (log_every_n_steps=1)
    assert [s for s, _ in h["samples/text_summary"]] == [6, 13, 20, 27, STEPS - 1]  # with val/loss
    assert [s for s, _ in h["params/text_summary"]] == [0] and [s for s, _ in h["timing/text_summary"]] == [STEPS]
    # A full window of 20 batch ends, the first at the end of the 10 warm-up batches (step 9): from step 28
    assert [s for s, _ in h["train/time_per_batch"]] == list(range(28, STEPS))
    # Constants are text, not scalars; Lightning's epoch and running counts are not logged.
    assert not [t for t in h if t.startswith(("params/", "flops/", "timing/", "validate/")) and "text" not in t]
    assert not {"epoch", "train/time", "train/batches", "train/samples", "train/lengths"} & set(h)


# 13 batches per epoch: stopping at 15 saves at a batch end (every 5 steps), at 17 at the end
# of fit; both are in the middle of the second epoch.
@pytest.mark.parametrize("stop", [15, 17])
def test_stop_and_resume_is_bit_identical(stop, straight_run, small_corpus, tmp_path):
    assert cli(fit_args(small_corpus, tmp_path, "halves", stop)) == 0
    assert last_checkpoint(tmp_path / "halves")["global_step"] == stop
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(fit_args(small_corpus, tmp_path, "halves", STEPS, "--ckpt_path=last")) == 0
    # Lightning's "your dataloader is not resumable" is wrong for WindowDataModule's sampler.
    assert not [w for w in caught if "not resumable" in str(w.message)]

    assert_same_weights(last_checkpoint(straight_run), last_checkpoint(tmp_path / "halves"), STEPS)
    straight, halves = scalars(straight_run, "train/loss"), scalars(tmp_path / "halves", "train/loss")
    assert [s for s, _ in halves] == list(range(STEPS))  # one continuous, non-repeating curve
    assert halves == straight  # the same loss at every step
    # Every curve: the parameter table once at step 0, the timing window continued, text samples, val points.
    assert_same_history(straight_run, tmp_path / "halves")


# Muon for the blocks' matrices, AdamW for the rest, under the trapezoidal schedule (its cool-down from step 24).
MUON = ("--model.optimizer=muon", "--model.schedule=trapezoidal")


def test_muon_stop_and_resume_is_bit_identical(small_corpus, tmp_path, capsys):
    assert cli(fit_args(small_corpus, tmp_path, "straight", STEPS, *MUON)) == 0
    assert cli(fit_args(small_corpus, tmp_path, "halves", 17, *MUON)) == 0
    assert cli(fit_args(small_corpus, tmp_path, "halves", STEPS, "--ckpt_path=last", *MUON)) == 0
    straight = last_checkpoint(tmp_path / "straight")
    assert [g["name"] for g in straight["optimizer_states"][0]["param_groups"]] == ["muon", "adamw", "adamw_no_decay"]
    assert_same_weights(straight, last_checkpoint(tmp_path / "halves"), STEPS)
    assert_same_history(tmp_path / "straight", tmp_path / "halves")
    assert {"train/lr/muon", "train/lr/adamw"} <= set(history(tmp_path / "straight"))
    # Another optimizer cannot continue Muon's state: refused in one line, the run left as it was.
    before = snapshot(tmp_path)
    capsys.readouterr()
    other = fit_args(small_corpus, tmp_path, "halves", STEPS + 2, "--ckpt_path=last", "--model.optimizer=adamw")
    assert cli(other) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1:] == ["error: --model.optimizer adamw: the checkpoint was trained with muon, "
                                            "whose state adamw cannot continue; resume with --model.optimizer muon, "
                                            "or start a new run"]
    assert snapshot(tmp_path) == before
    # Muon's own settings may change: they apply from the resumed step (past total_steps: at the floor, 0.1).
    changed = ("--model.muon_lr=0.01", "--model.muon_momentum=0.9")
    assert cli(fit_args(small_corpus, tmp_path, "halves", STEPS + 2, "--ckpt_path=last", *MUON, *changed)) == 0
    assert "resume: model.muon_lr 0.02 -> 0.01 applies from step 30" in capsys.readouterr().err
    (step, rate), (last, last_rate) = scalars(tmp_path / "halves", "train/lr/muon")[-2:]
    assert (step, last) == (30, 31) and rate == last_rate == pytest.approx(1e-3)
    muon_group = last_checkpoint(tmp_path / "halves")["optimizer_states"][0]["param_groups"][0]
    assert (muon_group["name"], muon_group["initial_lr"], muon_group["momentum"]) == ("muon", 0.01, 0.9)


# Logging every 4 steps: the first step, epoch ends (12, 25) and the last step are logged off that cadence.
SPARSE = ("--trainer.log_every_n_steps=4",)


@pytest.fixture(scope="module")
def sparse_straight_run(small_corpus, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert cli(fit_args(small_corpus, runs, "straight", STEPS, *SPARSE)) == 0
    return runs / "straight"


def assert_every_tag_equal(expected_run: Path, run: Path) -> None:
    """The same tags; for each, the same steps and the same values (exactly; clock readings aside)."""
    expected, got = history(expected_run), history(run)
    assert sorted(got) == sorted(expected)
    for tag, points in expected.items():
        got[tag], points = same_steps(tag, got[tag], points)
        assert [s for s, _ in got[tag]] == [s for s, _ in points], f"{tag}: other steps"
        if not wall_clock(tag):
            assert got[tag] == points, f"{tag}: other values"


SLOW = pytest.mark.slow


# Stops at k of 30 steps (13 batches per epoch, validations after 7, 14, 21, 28): an ordinary step, the
# end of an epoch, a step with a scheduled validation, and (max_steps) a step where only the end of fit validates.
# The quick loop keeps the epoch end and the end-of-fit-only validation.
@pytest.mark.parametrize("stop", [pytest.param(12, marks=SLOW), 13, pytest.param(14, marks=SLOW), 17])
def test_a_run_ended_by_max_steps_and_continued_has_every_curve_of_one_run(stop, sparse_straight_run, small_corpus,
                                                                           tmp_path):
    assert cli(fit_args(small_corpus, tmp_path, "r", stop, *SPARSE)) == 0
    h = history(tmp_path / "r")
    assert h["val/loss"][-1][0] == stop - 1 and h["train/loss"][-1][0] == stop - 1  # the end of that fit
    assert cli(fit_args(small_corpus, tmp_path, "r", STEPS, "--ckpt_path=last", *SPARSE)) == 0
    assert_same_weights(last_checkpoint(sparse_straight_run), last_checkpoint(tmp_path / "r"), STEPS)
    assert_every_tag_equal(sparse_straight_run, tmp_path / "r")


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_a_run_ended_by_max_epochs_and_continued_has_every_curve_of_one_run(small_corpus, tmp_path):
    def args(run, epochs, *extra):  # 13 steps an epoch; validations every 7 steps and at the end
        return resumable_fit(small_corpus, tmp_path, run, -1, f"--trainer.max_epochs={epochs}", *SPARSE, *extra,
                             total_steps=39)

    assert cli(args("straight", 3)) == 0
    assert cli(args("r", 2)) == 0
    assert [s for s, _ in history(tmp_path / "r")["val/loss"]] == [6, 13, 20, 25]
    assert cli(args("r", 3, "--ckpt_path=last")) == 0
    assert_same_weights(last_checkpoint(tmp_path / "straight"), last_checkpoint(tmp_path / "r"), 39)
    assert [s for s, _ in history(tmp_path / "r")["val/loss"]] == [6, 13, 20, 27, 34, 38]
    assert_every_tag_equal(tmp_path / "straight", tmp_path / "r")


def test_a_run_stopped_by_max_time_mid_epoch_resumes_where_it_stopped(sparse_straight_run, small_corpus, tmp_path,
                                                                      monkeypatch):
    """max_time ends the fit at step 17, in the middle of the second epoch (13 batches each): the resumed run
    finishes that epoch, taking the 13 steps left, not the epoch again from its start."""
    clock, trained = FakeClock(), []
    real_start = ExactResume.on_train_batch_start

    def tick(self, trainer, *args):  # a minute of training per step, on the clock Lightning's Timer reads
        clock.advance(60)
        trained.append(trainer.global_step)
        real_start(self, trainer, *args)

    monkeypatch.setattr("lightning.pytorch.callbacks.timer.time", SimpleNamespace(monotonic=clock))
    monkeypatch.setattr(ExactResume, "on_train_batch_start", tick)
    assert cli(fit_args(small_corpus, tmp_path, "t", STEPS, "--trainer.max_time=00:00:17:00", *SPARSE)) == 0
    assert trained == list(range(17)) and last_checkpoint(tmp_path / "t")["global_step"] == 17
    trained.clear()
    assert cli(fit_args(small_corpus, tmp_path, "t", STEPS, "--trainer.max_time=00:01:00:00", "--ckpt_path=last",
                        *SPARSE)) == 0
    assert trained == list(range(17, STEPS))
    assert_same_weights(last_checkpoint(sparse_straight_run), last_checkpoint(tmp_path / "t"), STEPS)
    assert_every_tag_equal(sparse_straight_run, tmp_path / "t")


def test_a_run_stopped_early_mid_epoch_resumes_where_it_stopped(straight_run, small_corpus, tmp_path):
    """An early stop after the validation of step 7 (13 batches per epoch): resumed without it, the run
    finishes that epoch as the run that never stopped did."""
    early = '--trainer.callbacks=[{"class_path": "helpers.StopAfterValidation", "init_args": {"step": 7}}]'
    assert cli(fit_args(small_corpus, tmp_path, "e", STEPS, early)) == 0
    assert last_checkpoint(tmp_path / "e")["global_step"] == 7
    assert cli(fit_args(small_corpus, tmp_path, "e", STEPS, "--trainer.callbacks=[]", "--ckpt_path=last")) == 0
    assert_same_weights(last_checkpoint(straight_run), last_checkpoint(tmp_path / "e"), STEPS)
    assert_same_history(straight_run, tmp_path / "e")


def test_resuming_a_finished_run_keeps_its_end(small_corpus, tmp_path):
    assert cli(fit_args(small_corpus, tmp_path, "r", 17, *SPARSE)) == 0
    before = history(tmp_path / "r")
    assert cli(fit_args(small_corpus, tmp_path, "r", 17, "--ckpt_path=last", *SPARSE)) == 0  # nothing to train
    after = history(tmp_path / "r")
    for tag in ("train/loss", "train/lr", "val/loss", "samples/text_summary"):
        assert after[tag] == before[tag], tag


@pytest.mark.slow
@pytest.mark.parametrize("stop", [12, 13, 14, 17])
def test_sigterm_then_resume_has_every_curve_of_one_run(stop, sparse_straight_run, small_corpus, tmp_path,
                                                        monkeypatch):
    _sigterm_at(monkeypatch, "on_train_batch_end", lambda t, *a: t.global_step == stop)
    with pytest.raises(SystemExit):
        cli(fit_args(small_corpus, tmp_path, "t", STEPS, *SPARSE))
    assert last_checkpoint(tmp_path / "t")["global_step"] == stop
    monkeypatch.undo()
    assert cli(fit_args(small_corpus, tmp_path, "t", STEPS, "--ckpt_path=last", *SPARSE)) == 0
    assert_same_weights(last_checkpoint(sparse_straight_run), last_checkpoint(tmp_path / "t"), STEPS)
    assert_every_tag_equal(sparse_straight_run, tmp_path / "t")


def test_the_train_loaders_position_is_in_the_checkpoint(small_corpus, tmp_path):
    assert cli(fit_args(small_corpus, tmp_path, "r", 17)) == 0
    # Saved by Lightning's fit loop, as for any stateful loader (datamodules.windows.WindowLoader).
    [state] = last_checkpoint(tmp_path / "r")["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert state["epoch"] == 1 and state["index"] == (17 - 13) * 8  # 13 batches per epoch


def _sigterm_at(monkeypatch, hook: str, when, sig=signal.SIGTERM) -> None:
    """Send `sig` to this process from ExactResume's `hook` (it runs before LastCheckpoint's)
    when `when(trainer, *hook args)` holds, as a scheduler's signal arriving at that moment."""

    def send(self, trainer, pl_module, *args, **kwargs):
        if not trainer.sanity_checking and when(trainer, *args):
            os.kill(os.getpid(), sig)

    monkeypatch.setattr(ExactResume, hook, send, raising=False)


# Validations follow steps 7, 14, 21 and 28; checkpoints every 5 steps (7 where given).
STOPS = {
    # SIGTERM during the last batch of the validation after step 14: Lightning finished that
    # validation, then saved a state whose resume shifted every later step by one.
    "last val batch": ("on_validation_batch_end", lambda t, out, batch, i, *a: t.global_step == 14 and i == 1, 14, ()),
    # SIGTERM in the first batch of the validation right after the checkpoint at step 7: the
    # checkpoint came before the validation, and the resumed run never ran it.
    "val after ckpt": ("on_validation_batch_end", lambda t, out, batch, i, *a: t.global_step == 7 and i == 0, 7,
                       ("--checkpoint.every_n_train_steps=7",)),
    # At the end of step 14, which has a validation: the stop waits for the end of it.
    "val step": ("on_train_batch_end", lambda t, *a: t.global_step == 14, 14, ()),
    "plain step": ("on_train_batch_end", lambda t, *a: t.global_step == 12, 12, ()),
}


@pytest.mark.slow
@pytest.mark.parametrize("where", list(STOPS))
def test_sigterm_at_any_point_resumes_with_the_same_history(where, straight_run, small_corpus, tmp_path, monkeypatch):
    hook, when, stopped_at, extra = STOPS[where]
    _sigterm_at(monkeypatch, hook, when)
    with pytest.raises(SystemExit) as stop:
        cli(fit_args(small_corpus, tmp_path, "t", STEPS, *extra))
    assert stop.value.code in (None, 0)  # a clean exit, as for a scheduler
    assert last_checkpoint(tmp_path / "t")["global_step"] == stopped_at
    monkeypatch.undo()

    assert cli(fit_args(small_corpus, tmp_path, "t", STEPS, "--ckpt_path=last", *extra)) == 0
    assert_same_weights(last_checkpoint(straight_run), last_checkpoint(tmp_path / "t"), STEPS)
    assert_same_history(straight_run, tmp_path / "t")


@pytest.mark.slow
def test_ctrl_c_during_a_validation_stops_after_it(straight_run, small_corpus, tmp_path, monkeypatch):
    _sigterm_at(monkeypatch, "on_validation_batch_end", lambda t, out, b, i, *a: t.global_step == 21 and i == 0,
                sig=signal.SIGINT)
    with pytest.raises(SystemExit) as stop:
        cli(fit_args(small_corpus, tmp_path, "c", STEPS))
    assert stop.value.code == 1  # Lightning's exit status for an interrupt
    assert last_checkpoint(tmp_path / "c")["global_step"] == 21
    monkeypatch.undo()
    assert cli(fit_args(small_corpus, tmp_path, "c", STEPS, "--ckpt_path=last")) == 0
    assert_same_weights(last_checkpoint(straight_run), last_checkpoint(tmp_path / "c"), STEPS)
    assert_same_history(straight_run, tmp_path / "c")


def _start(args, cwd, script=None, **env):
    return subprocess.Popen([sys.executable, str(script or ROOT / "main.py"), *args], cwd=cwd, env=main_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"training ended before {path.name} appeared:\n{proc.stdout.read()[-2000:]}"
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.02)


# main.py with a test-only kill: SIGKILL right after last.ckpt of step KILL_AFTER_SAVE is on disk,
# or at the end of step KILL_AT_STEP, so the kill lands at the same point on every machine.
KILL_DRIVER = """
import os, signal, sys
sys.path.insert(0, {root!r})
from lightning.pytorch import Trainer
from callbacks.resume import ExactResume
import lit_attn.cli.lightning_cli as main

after_save, at_step = int(os.environ.get("KILL_AFTER_SAVE", -1)), int(os.environ.get("KILL_AT_STEP", -1))
real_save = Trainer.save_checkpoint
def save_checkpoint(self, filepath, *args, **kwargs):
    real_save(self, filepath, *args, **kwargs)
    if self.global_step == after_save and os.path.basename(str(filepath)) == "last.ckpt":
        os.kill(os.getpid(), signal.SIGKILL)
Trainer.save_checkpoint = save_checkpoint

def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
    if trainer.global_step == at_step:
        os.kill(os.getpid(), signal.SIGKILL)
ExactResume.on_train_batch_end = on_train_batch_end
sys.exit(main.cli())
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill,killed_at", [
    # Right after the checkpoint at step 10: step 9's train/loss reached the logger only after
    # the checkpoint hook and was never flushed, and the resume purges from step 10 on.
    ({"KILL_AFTER_SAVE": 10}, 10),
    # At step 24, after the validation of step 21 that followed the checkpoint at 20: what the
    # killed process logged from step 20 on is hidden, the resumed run logs it again, once.
    ({"KILL_AT_STEP": 24}, 20),
])
def test_sigkill_after_a_checkpoint_then_resume(kill, killed_at, straight_run, small_corpus, tmp_path):
    driver = tmp_path / "kill_driver.py"
    driver.write_text(KILL_DRIVER.format(root=str(ROOT)))
    proc = _start(fit_args(small_corpus, tmp_path, "killed", STEPS), tmp_path, script=driver, **kill)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL, out[-2000:]
    assert last_checkpoint(tmp_path / "killed")["global_step"] == killed_at

    assert cli(fit_args(small_corpus, tmp_path, "killed", STEPS, "--ckpt_path=last")) == 0
    assert_same_weights(last_checkpoint(straight_run), last_checkpoint(tmp_path / "killed"), STEPS)
    steps = [s for s, _ in scalars(tmp_path / "killed", "train/loss")]
    assert steps == list(range(STEPS))  # events past the checkpoint from the killed process are purged
    assert_same_history(straight_run, tmp_path / "killed")


# main.py with a test-only pause: at the end of step PAUSE_AT it creates the file PAUSED and waits until it has
# the signal, so the signal lands mid-run however fast or loaded the machine (the wait is a hang guard).
PAUSE_DRIVER = """
import os, pathlib, sys, time
sys.path.insert(0, {root!r})
from callbacks.checkpointing import StopSignals
from callbacks.resume import ExactResume
import lit_attn.cli.lightning_cli as main

signalled = []
for name in ("_on_sigterm", "_on_sigint"):
    def noted(self, signum, frame, real=getattr(StopSignals, name)):
        signalled.append(signum)
        real(self, signum, frame)
    setattr(StopSignals, name, noted)

def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
    if trainer.global_step == int(os.environ["PAUSE_AT"]):
        pathlib.Path(os.environ["PAUSED"]).touch()
        deadline = time.monotonic() + 600
        while not signalled and time.monotonic() < deadline:
            time.sleep(0.01)
ExactResume.on_train_batch_end = on_train_batch_end
sys.exit(main.cli())
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 0), (signal.SIGINT, 1)])
def test_sigterm_or_ctrl_c_checkpoints_then_resumes(sig, code, straight_run, small_corpus, tmp_path):
    driver, paused = tmp_path / "pause_driver.py", tmp_path / "paused"
    driver.write_text(PAUSE_DRIVER.format(root=str(ROOT)))
    proc = _start(fit_args(small_corpus, tmp_path, "term", STEPS), tmp_path, script=driver, PAUSE_AT=8,
                  PAUSED=paused)
    _wait_for(paused, proc)  # after the checkpoint of step 5, mid-run
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == code, out[-2000:]  # SIGTERM: clean exit; Ctrl-C: Lightning's exit 1
    stopped_at = last_checkpoint(tmp_path / "term")["global_step"]
    assert 8 <= stopped_at < STEPS  # at the end of the step it was signalled in (or the next), not at the end

    assert cli(fit_args(small_corpus, tmp_path, "term", STEPS, "--ckpt_path=last")) == 0
    assert_same_weights(last_checkpoint(straight_run), last_checkpoint(tmp_path / "term"), STEPS)
    assert_same_history(straight_run, tmp_path / "term")


def test_time_interval_checkpoints(small_corpus, tmp_path, monkeypatch):
    from callbacks.checkpointing import LastCheckpoint

    saved = []
    real = LastCheckpoint._save_now
    monkeypatch.setattr(LastCheckpoint, "_save_now",
                        lambda self, trainer: (saved.append(trainer.global_step), real(self, trainer)))
    args = fit_args(small_corpus, tmp_path, "t", 4, "--checkpoint.every_n_train_steps=1000",
                    "--checkpoint.every_minutes=1.0e-9")
    assert cli(args) == 0
    assert saved[:4] == [1, 2, 3, 4]  # every step is past a (tiny) time interval


def test_interrupted_checkpoint_write_keeps_previous(small_corpus, tmp_path, monkeypatch, capsys):
    assert cli(fit_args(small_corpus, tmp_path, "w", 5)) == 0
    last = tmp_path / "w" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    real_write = os.write

    def half_then_disk_full(fd, data):  # the checkpoint writer's os.write (lit_attn.training.checkpoint)
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(last.parent)):
            return real_write(fd, data)
        real_write(fd, memoryview(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    def break_checkpoint_writes(self, trainer, pl_module):
        monkeypatch.setattr(os, "write", half_then_disk_full)

    monkeypatch.setattr(ExactResume, "on_train_start", break_checkpoint_writes, raising=False)
    # The next save, at step 10, fails midway: one line, exit status 2 (main.py).
    assert cli(fit_args(small_corpus, tmp_path, "w", 12, "--ckpt_path=last")) == 2
    monkeypatch.undo()
    assert "No space left on device" in capsys.readouterr().err
    assert last.read_bytes() == before  # the previous checkpoint is untouched and loads
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 5
