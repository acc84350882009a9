"""Every fit ends with one validation at its last step, whatever its length and validation schedule."""

from pathlib import Path

import pytest
from helpers import TINY_FIT, newest_events, scalars, tiny_trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks.final_validation import FinalValidation
from lit_attn.cli.lightning_cli import cli

# (trainer settings, the steps val/loss is logged at: the index of the step each validation follows).
# limit_train_batches=5 makes every epoch 5 batches long.
SCHEDULES = {
    "max_steps < interval": (dict(max_steps=4, val_check_interval=250, check_val_every_n_epoch=None), [3]),
    "max_steps == interval": (dict(max_steps=6, val_check_interval=6, check_val_every_n_epoch=None), [5]),
    "max_steps a multiple": (dict(max_steps=6, val_check_interval=3, check_val_every_n_epoch=None), [2, 5]),
    "max_steps not a multiple": (dict(max_steps=7, val_check_interval=3, check_val_every_n_epoch=None), [2, 5, 6]),
    "max_epochs, float interval": (dict(max_epochs=2, val_check_interval=0.5), [1, 3, 6, 8, 9]),
    "max_epochs, every epoch": (dict(max_epochs=2, val_check_interval=1.0), [4, 9]),
    "max_epochs, every 2nd epoch": (dict(max_epochs=3, check_val_every_n_epoch=2), [9, 14]),
    "max_epochs, steps across epochs": (dict(max_epochs=2, val_check_interval=3, check_val_every_n_epoch=None),
                                        [2, 5, 8, 9]),
    "max_steps inside an epoch": (dict(max_steps=8, max_epochs=-1, val_check_interval=1.0), [4, 7]),
    # The fit ends at max_steps/max_epochs whatever min_steps/min_epochs ask for: its last step is validated
    "min_steps > max_steps": (dict(max_steps=4, min_steps=50, val_check_interval=250, check_val_every_n_epoch=None),
                              [3]),
    "min_steps < max_steps": (dict(max_steps=4, min_steps=2, val_check_interval=250, check_val_every_n_epoch=None),
                              [3]),
    "min_steps past max_epochs": (dict(max_epochs=1, min_steps=50, check_val_every_n_epoch=2), [4]),
    "min_epochs > max_epochs": (dict(max_epochs=2, min_epochs=3, check_val_every_n_epoch=3), [9]),
    "min_epochs past max_steps": (dict(max_steps=4, min_epochs=2, val_check_interval=250,
                                       check_val_every_n_epoch=None), [3]),
    "min_epochs, interval in steps": (dict(max_steps=7, min_epochs=5, val_check_interval=3,
                                           check_val_every_n_epoch=None), [2, 5, 6]),
    "limit_train_batches an int": (dict(max_epochs=2, limit_train_batches=3, check_val_every_n_epoch=3), [5]),
    "limit_train_batches a share": (dict(max_steps=5, limit_train_batches=0.5, val_check_interval=250,
                                         check_val_every_n_epoch=None), [4]),
    "accumulated gradients": (dict(max_steps=3, accumulate_grad_batches=2, val_check_interval=250,
                                   check_val_every_n_epoch=None), [2]),
}


def fit(corpus, tmp_path, with_val_data=True, extra_callbacks=(), **trainer_kwargs):
    best = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", filename="best-{step}",
                           auto_insert_metric_name=False)
    kwargs = dict(limit_train_batches=5, limit_val_batches=2, num_sanity_val_steps=0, log_every_n_steps=1,
                  logger=TensorBoardLogger(str(tmp_path), name="tb", version=""), enable_checkpointing=True,
                  callbacks=[*extra_callbacks, FinalValidation(), best])
    model, trainer, data = tiny_trainer(corpus, **(kwargs | trainer_kwargs))
    if with_val_data:
        trainer.fit(model, data)
    else:
        data.setup("fit")
        trainer.fit(model, train_dataloaders=data.train_dataloader())
    return trainer, best


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_fit_ends_with_one_validation_at_its_last_step(schedule, corpus, tmp_path):
    settings, expected = SCHEDULES[schedule]
    trainer, best = fit(corpus, tmp_path, **settings)
    assert [step for step, _ in scalars(tmp_path / "tb", "val/loss")] == expected
    # The best checkpoint saw the final validation: it is the last one when it has the lowest loss.
    losses = scalars(tmp_path / "tb", "val/loss")
    lowest = min(range(len(losses)), key=lambda i: losses[i][1])
    assert best.best_model_path.endswith(f"best-{losses[lowest][0] + 1}.ckpt")


class Tick(Callback):
    """A fake clock for Lightning's Timer (max_time): one second passes per training batch."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def on_train_batch_end(self, *args) -> None:
        self.now += 1.0


@pytest.mark.parametrize("settings,expected", [
    (dict(max_time={"seconds": 7}, val_check_interval=250, check_val_every_n_epoch=None), [6]),
    (dict(max_time={"seconds": 7}, val_check_interval=3, check_val_every_n_epoch=None), [2, 5, 6]),
    (dict(max_time={"seconds": 6}, val_check_interval=3, check_val_every_n_epoch=None), [2, 5]),
    (dict(max_time={"seconds": 7}, min_steps=9, val_check_interval=250, check_val_every_n_epoch=None), [8]),
    (dict(max_time={"seconds": 12}, check_val_every_n_epoch=5), [11]),
])
def test_a_fit_stopped_by_max_time_ends_with_a_validation(settings, expected, corpus, tmp_path, monkeypatch):
    clock = Tick()
    monkeypatch.setattr("lightning.pytorch.callbacks.timer.time", clock)
    trainer, best = fit(corpus, tmp_path, max_steps=100, **settings, extra_callbacks=[clock])
    losses = scalars(tmp_path / "tb", "val/loss")
    assert [step for step, _ in losses] == expected and trainer.global_step == expected[-1] + 1
    assert best.best_model_path and Path(best.best_model_path).is_file()


@pytest.mark.parametrize("off", [dict(limit_val_batches=0), dict(with_val_data=False)])
def test_no_final_validation_when_validation_is_off(off, corpus, tmp_path):
    fit(corpus, tmp_path, max_steps=4, val_check_interval=None, **off)
    assert "val/loss" not in newest_events(tmp_path / "tb").Tags()["scalars"]


@pytest.mark.parametrize("settings,expected", [
    (["--trainer.max_steps=3", "--trainer.val_check_interval=250"], [2]),
    (["--trainer.max_steps=4", "--trainer.val_check_interval=2"], [1, 3]),
    # Lightning sets min_epochs=1 for a min_steps: a fit inside one epoch was not validated at its end
    (["--trainer.max_steps=3", "--trainer.val_check_interval=250", "--trainer.min_steps=50"], [2]),
    (["--trainer.max_steps=3", "--trainer.val_check_interval=250", "--trainer.min_steps=2"], [2]),
    (["--trainer.max_steps=3", "--trainer.val_check_interval=250", "--trainer.min_epochs=2"], [2]),
])
def test_every_cli_run_ends_with_a_validation_and_last_ckpt_after_it(settings, expected, corpus, tmp_path):
    import torch

    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=r", *TINY_FIT, *settings]) == 0
    losses = scalars(tmp_path / "r", "val/loss")
    assert [step for step, _ in losses] == expected
    last = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    # last.ckpt was written after the final validation, and the best checkpoint had seen it.
    assert last["global_step"] == expected[-1] + 1
    best = next(state for key, state in last["callbacks"].items() if "val/loss" in key)
    assert float(best["current_score"]) == pytest.approx(losses[-1][1], rel=1e-6)
    assert Path(best["best_model_path"]).is_file()
