"""Exact resume: a run stopped after N steps and resumed equals the run that never stopped."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from main import cli

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30  # 2N


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """~1.9 KB of text: with block 16, stride 16 and batch 8 an epoch is 13 batches, so
    30 steps cross two epoch boundaries."""
    rng = random.Random(1)
    text = "".join(rng.choice("abcdefgh ijklmnop\n") for _ in range(1900))
    path = tmp_path_factory.mktemp("data") / "small.txt"
    path.write_text(text)
    return path


def fit_args(corpus, runs_dir, run, max_steps, *extra):
    return [
        "fit", f"--data.path={corpus}", f"--runs_dir={runs_dir}", f"--run={run}", "--checkpoint.every_n_train_steps=5",
        "--trainer.callbacks=[]", "--samples.max_new_tokens=4", "--params.print_table=false",
        "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16",
        "--model.dropout=0.1", f"--model.total_steps={STEPS}", "--data.batch_size=8", "--data.stride=16",
        f"--trainer.max_steps={max_steps}", "--trainer.val_check_interval=7", "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", *extra,
    ]


def final_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] == STEPS
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key  # bit-identical
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


@pytest.fixture(scope="module")
def straight_run(small_corpus, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert cli(fit_args(small_corpus, runs, "straight", STEPS)) == 0
    return runs / "straight"


# 13 batches per epoch: stopping at 15 saves at a batch end (every 5 steps), at 17 at the end
# of fit; both are in the middle of the second epoch.
@pytest.mark.parametrize("stop", [15, 17])
def test_stop_and_resume_is_bit_identical(stop, straight_run, small_corpus, tmp_path):
    assert cli(fit_args(small_corpus, tmp_path, "halves", stop)) == 0
    assert final_state(tmp_path / "halves")["global_step"] == stop
    assert cli(fit_args(small_corpus, tmp_path, "halves", STEPS, "--ckpt_path=last")) == 0

    assert_same_weights(final_state(straight_run), final_state(tmp_path / "halves"))
    straight, halves = train_losses(straight_run), train_losses(tmp_path / "halves")
    assert [s for s, _ in halves] == list(range(STEPS))  # one continuous, non-repeating curve
    assert halves == straight  # the same loss at every step


def test_resumed_sampler_continues_the_epoch(small_corpus, tmp_path):
    assert cli(fit_args(small_corpus, tmp_path, "r", 17)) == 0
    state = final_state(tmp_path / "r")["CharDataModule"]["sampler"]
    assert state["epoch"] == 1 and state["index"] == (17 - 13) * 8  # 13 batches per epoch


def _start(args, cwd):
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"training ended before {path.name} appeared:\n{proc.stdout.read()[-2000:]}"
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def test_sigkill_after_a_checkpoint_then_resume(straight_run, small_corpus, tmp_path):
    proc = _start(fit_args(small_corpus, tmp_path, "killed", STEPS), tmp_path)
    _wait_for(tmp_path / "killed" / "checkpoints" / "last.ckpt", proc)
    time.sleep(random.uniform(0.0, 0.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed_at = final_state(tmp_path / "killed")["global_step"]
    assert 0 < killed_at < STEPS

    resumed = subprocess.run([sys.executable, str(ROOT / "main.py"),
                              *fit_args(small_corpus, tmp_path, "killed", STEPS, "--ckpt_path=last")],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_weights(final_state(straight_run), final_state(tmp_path / "killed"))
    steps = [s for s, _ in train_losses(tmp_path / "killed")]
    assert steps == list(range(STEPS))  # events past the checkpoint from the killed process are purged


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 0), (signal.SIGINT, 1)])
def test_sigterm_or_ctrl_c_checkpoints_then_resumes(sig, code, straight_run, small_corpus, tmp_path):
    proc = _start(fit_args(small_corpus, tmp_path, "term", STEPS), tmp_path)
    ckpt = tmp_path / "term" / "checkpoints" / "last.ckpt"
    _wait_for(ckpt, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out[-2000:]  # SIGTERM: clean exit; Ctrl-C: Lightning's exit 1
    stopped_at = final_state(tmp_path / "term")["global_step"]
    assert 0 < stopped_at <= STEPS

    assert cli(fit_args(small_corpus, tmp_path, "term", STEPS, "--ckpt_path=last")) == 0
    assert_same_weights(final_state(straight_run), final_state(tmp_path / "term"))


def test_time_interval_checkpoints(small_corpus, tmp_path, monkeypatch):
    from callbacks.checkpointing import LastCheckpoint

    saved = []
    real = LastCheckpoint._save_now
    monkeypatch.setattr(LastCheckpoint, "_save_now", lambda self, trainer: (saved.append(trainer.global_step), real(self, trainer)))
    args = fit_args(small_corpus, tmp_path, "t", 4, "--checkpoint.every_n_train_steps=1000",
                    "--checkpoint.every_minutes=1.0e-9")
    assert cli(args) == 0
    assert saved[:4] == [1, 2, 3, 4]  # every step is past a (tiny) time interval
    with pytest.raises(ValueError, match="every_minutes must be positive"):
        LastCheckpoint(every_minutes=0)


def test_interrupted_checkpoint_write_keeps_previous(small_corpus, tmp_path, monkeypatch):
    import fsspec.implementations.local as local

    from callbacks.resume import ExactResume

    assert cli(fit_args(small_corpus, tmp_path, "w", 5)) == 0
    last = tmp_path / "w" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    write = local.LocalFileOpener.write

    def half_then_disk_full(self, data):
        if not str(self.path).endswith(".ckpt"):
            return write(self, data)
        write(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    def break_checkpoint_writes(self, trainer, pl_module):
        monkeypatch.setattr(local.LocalFileOpener, "write", half_then_disk_full)

    monkeypatch.setattr(ExactResume, "on_train_start", break_checkpoint_writes, raising=False)
    with pytest.raises(OSError, match="No space left"):
        cli(fit_args(small_corpus, tmp_path, "w", 12, "--ckpt_path=last"))  # next save at step 10 fails midway
    monkeypatch.undo()
    assert last.read_bytes() == before  # the previous checkpoint is untouched and loads
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 5
