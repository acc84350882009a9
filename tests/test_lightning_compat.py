"""lit_attn.training.lightning_compat against a real (tiny) Trainer.

Every function there leans on a Lightning internal; each test here checks the assumption it
makes, so that a Lightning upgrade that breaks one fails here first, with a message naming it.
"""

import inspect
import os
import signal
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import tiny_gpt, tiny_trainer
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.trainer.states import RunningStage

from lit_attn.training import lightning_compat as compat


class Recorder(Logger):
    """Keeps every (step, metrics) it is sent."""

    def __init__(self):
        super().__init__()
        self.records: list[tuple[int | None, dict]] = []

    @property
    def name(self):
        return "recorder"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.records.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def steps_of(self, key: str) -> list:
        return [step for step, metrics in self.records if key in metrics]


class Probe(L.Callback):
    """Calls `hooks[name](trainer, pl_module, *args)` from the Lightning hook `name`."""

    def __init__(self, **hooks):
        self.hooks = hooks
        for name, fn in hooks.items():
            setattr(self, name, self._caller(fn))

    @staticmethod
    def _caller(fn):
        def hook(trainer, pl_module, *args, **kwargs):
            fn(trainer, pl_module, *args, *kwargs.values())

        return hook


def tiny_fit(corpus, tmp_path, callbacks=(), logger=None, **trainer_kwargs):
    kwargs = dict(max_steps=6, limit_val_batches=2, val_check_interval=3, log_every_n_steps=1, devices=1,
                  num_sanity_val_steps=0, default_root_dir=str(tmp_path), callbacks=list(callbacks),
                  logger=logger if logger is not None else False)
    model, trainer, data = tiny_trainer(corpus, **(kwargs | trainer_kwargs))
    trainer.fit(model, data)
    return trainer, model


def test_pinned_lightning_is_the_tested_one():
    major, minor = (int(v) for v in L.__version__.split(".")[:2])
    assert (major, minor) == compat.TESTED_LIGHTNING, (
        f"Lightning {L.__version__}: lit_attn/training/lightning_compat.py was checked against "
        f"{compat.TESTED_LIGHTNING}; review each item there, then update TESTED_LIGHTNING and pyproject.toml"
    )


def test_is_last_step_and_attached_trainer(corpus, tmp_path):
    seen = []

    def batch_start(trainer, pl_module, batch, batch_idx):
        assert compat.attached_trainer(pl_module) is trainer, "LightningModule._trainer is not the running trainer"
        seen.append(("start", trainer.global_step, compat.is_last_step(trainer, trainer.global_step + 1)))

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        seen.append(("end", trainer.global_step, compat.is_last_step(trainer)))

    tiny_fit(corpus, tmp_path, [Probe(on_train_batch_start=batch_start, on_train_batch_end=batch_end)], max_steps=5)
    assert [last for kind, _, last in seen if kind == "start"] == [False] * 4 + [True]
    assert [(step, last) for kind, step, last in seen if kind == "end"] == [(s, s == 5) for s in range(1, 6)]
    assert compat.attached_trainer(tiny_gpt(10)) is None


def test_is_last_step_at_the_end_of_an_epoch(corpus, tmp_path):
    ends = []
    probe = Probe(on_train_batch_end=lambda t, m, o, b, i: ends.append(compat.is_last_step(t, epoch_end=True)))
    tiny_fit(corpus, tmp_path, [probe], max_steps=-1, max_epochs=1, limit_train_batches=3, val_check_interval=None)
    assert ends == [False, False, True], (
        "fit_loop.epoch_loop.batch_progress.is_last_batch no longer marks the last batch")


def test_should_log_now_follows_log_every_n_steps(corpus, tmp_path):
    logger = Recorder()
    asked = {}
    probe = Probe(on_train_batch_start=lambda t, m, b, i: asked.__setitem__(t.global_step, compat.should_log_now(t)))
    tiny_fit(corpus, tmp_path, [probe], logger=logger, max_steps=6, log_every_n_steps=2, val_check_interval=None)
    # (batches that stepped + 1) % log_every_n_steps == 0: the 2nd, 4th and 6th batch.
    assert [step for step, yes in asked.items() if yes] == [1, 3, 5], asked
    # The loggers get train/loss only then, at the number of batches that stepped before it.
    assert logger.steps_of("train/loss") == [0, 1, 3, 5]  # step 0: the model sends its first loss itself


def test_log_metrics_and_logging_step(corpus, tmp_path):
    logger = Recorder()
    at = []

    def validation_end(trainer, pl_module):
        at.append(compat.logging_step(trainer))
        compat.log_metrics(trainer, {"probe/x": 1.0}, step=compat.logging_step(trainer))

    tiny_fit(corpus, tmp_path, [Probe(on_validation_end=validation_end)], logger=logger)
    # Validations after the 3rd and 6th batch; the epoch loop counts that batch after the validation.
    assert at == [2, 5], "_TrainingEpochLoop._batches_that_stepped"
    assert logger.steps_of("probe/x") == at
    assert logger.steps_of("val/loss") == at, "val/loss is not logged at _batches_that_stepped"


def test_drop_epoch_metric_keeps_the_steps(corpus, tmp_path):
    plain, dropped = Recorder(), Recorder()
    tiny_fit(corpus, tmp_path, logger=plain)
    twice = [Probe(setup=lambda t, m, stage: compat.drop_epoch_metric(t)) for _ in range(2)]  # the second does nothing
    tiny_fit(corpus, tmp_path, twice, logger=dropped)
    assert any("epoch" in metrics for _, metrics in plain.records), "Lightning no longer adds epoch: remove the item"
    assert not any("epoch" in metrics for _, metrics in dropped.records), (
        "_LoggerConnector.log_metrics adds epoch even when given the step")
    # The same keys at the same steps, but for epoch: the step passed is the one Lightning would use.
    for key in ("train/loss", "val/loss", "val/acc"):
        assert dropped.steps_of(key) == plain.steps_of(key), key


def test_log_step_metrics_early_logs_once(corpus, tmp_path):
    logger = Recorder()
    before_hook_returned = []
    key = "probe/metric"  # logged through Lightning (the model sends train/loss itself)

    def batch_start(trainer, pl_module, batch, batch_idx):
        pl_module.log(key, float(trainer.global_step), on_step=True, on_epoch=False)

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step in (2, 4):
            n = len(logger.steps_of(key))
            compat.log_step_metrics_early(trainer)
            compat.log_step_metrics_early(trainer)  # a second call in the same step does nothing
            before_hook_returned.append(len(logger.steps_of(key)) - n)
        if trainer.global_step == 4:
            compat.undo_log_step_metrics_early(trainer)  # Lightning logs the step again

    probe = Probe(on_train_batch_start=batch_start, on_train_batch_end=batch_end)
    tiny_fit(corpus, tmp_path, [probe], logger=logger, val_check_interval=None)
    assert before_hook_returned == [1, 1], "update_train_step_metrics did not send the step's metrics"
    # Batch-end hooks run before the epoch loop counts the batch: global step 2 logs at 1.
    steps = logger.steps_of(key)
    assert steps.count(1) == 1, f"Lightning's own update_train_step_metrics was not skipped: {steps}"
    assert steps.count(3) == 2, f"undo_log_step_metrics_early did not restore Lightning's call: {steps}"
    assert sorted(set(steps)) == list(range(6))


def test_evaluation_batches_done_counts_validation_batches(corpus, tmp_path):
    counts = []
    probe = Probe(on_validation_batch_end=lambda t, m, o, b, i: counts.append(compat.evaluation_batches_done(t)))
    tiny_fit(corpus, tmp_path, [probe])
    assert counts == [1, 2, 3, 4], "trainer._evaluation_loop.batch_progress.total.ready"


def test_validation_follows_predicts_lightnings_validations(corpus, tmp_path):
    predicted, validated = [], []

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if compat.validation_follows(trainer):
            predicted.append(trainer.global_step)

    def validation_start(trainer, pl_module):
        if not trainer.sanity_checking:
            validated.append(trainer.global_step)

    probe = Probe(on_train_batch_end=batch_end, on_validation_start=validation_start)
    tiny_fit(corpus, tmp_path, [probe], max_steps=8)
    assert validated == [3, 6]
    assert predicted == validated, "_TrainingEpochLoop._should_check_val_fx / _skip_next_val changed"


@pytest.mark.parametrize("settings,expected", [
    (dict(max_steps=7), [3, 6, 7]),  # after the schedule's last validation
    (dict(max_steps=6), [3, 6]),  # on it: once
    (dict(max_steps=-1, max_epochs=2, limit_train_batches=4, val_check_interval=None), [4, 8]),
    (dict(max_steps=-1, max_epochs=3, limit_train_batches=2, val_check_interval=None, check_val_every_n_epoch=2),
     [4, 6]),
])
def test_also_validate_when_adds_fits_last_step(settings, expected, corpus, tmp_path):
    predicted, validated = [], []

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if compat.validation_follows(trainer):
            predicted.append(trainer.global_step)

    def validation_start(trainer, pl_module):
        validated.append(trainer.global_step)

    def setup(trainer, pl_module, stage):
        assert compat.also_validate_when(trainer, lambda: compat.is_last_batch_of_fit(trainer))

    probe = Probe(setup=setup, on_train_batch_end=batch_end, on_validation_start=validation_start)
    tiny_fit(corpus, tmp_path, [probe], **settings)
    assert validated == expected, "_TrainingEpochLoop._should_check_val_fx is no longer what decides validations"
    assert predicted == validated


@pytest.mark.slow
def test_redirected_sigterm_reaches_the_callback_only(corpus, tmp_path):
    received = []

    def setup(trainer, pl_module, stage):
        compat.redirect_lightning_sigterm(trainer, lambda signum, frame: received.append(signum))

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer, _ = tiny_fit(corpus, tmp_path, [Probe(setup=setup, on_train_batch_end=batch_end)], val_check_interval=None)
    assert received == [signal.SIGTERM], (
        "Lightning's SIGTERM handler is no longer _SignalConnector._sigterm_notifier_fn")
    assert not trainer.received_sigterm and trainer.global_step == 6


@pytest.mark.slow
def test_take_lightning_sigterm_clears_lightnings_flag(corpus, tmp_path):
    taken = []

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            taken.append(compat.take_lightning_sigterm(trainer))
            taken.append(compat.take_lightning_sigterm(trainer))

    trainer, _ = tiny_fit(corpus, tmp_path, [Probe(on_train_batch_end=batch_end)], val_check_interval=None)
    assert taken == [True, False]
    assert trainer.global_step == 6, "Lightning stopped on a SIGTERM whose flag was cleared"


def test_disable_sigterm_broadcast(corpus, tmp_path, monkeypatch):
    trainer, _ = tiny_fit(corpus, tmp_path, max_steps=1, val_check_interval=None)
    epoch_loop = trainer.fit_loop.epoch_loop
    assert hasattr(type(epoch_loop), "_broadcast_sigterm_tensor"), (
        "_TrainingEpochLoop._broadcast_sigterm_tensor is gone")
    assert "_broadcast_sigterm_tensor" in inspect.getsource(type(epoch_loop)), "the training loop no longer calls it"
    compat.disable_sigterm_broadcast(trainer)  # one process: nothing to disable
    assert "_broadcast_sigterm_tensor" not in vars(epoch_loop)
    monkeypatch.setattr(L.Trainer, "world_size", property(lambda self: 2))
    compat.disable_sigterm_broadcast(trainer)
    assert epoch_loop._broadcast_sigterm_tensor() is None and "_broadcast_sigterm_tensor" in vars(epoch_loop)


def test_save_last_checkpoint_and_last_saved_step(corpus, tmp_path):
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=0)
    steps = []

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 3:
            steps.append(compat.last_saved_step(checkpoint))
            compat.save_last_checkpoint(checkpoint, trainer)
            steps.append(compat.last_saved_step(checkpoint))
            steps.append(torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"])

    tiny_fit(corpus, tmp_path, [checkpoint, Probe(on_train_batch_end=batch_end)], enable_checkpointing=True,
             max_steps=4, val_check_interval=None, limit_val_batches=0)
    assert steps == [0, 3, 3], "ModelCheckpoint._save_last_checkpoint / _last_global_step_saved"


class HookedMonitor(compat.ThroughputMonitorHooks):
    def __init__(self):
        super().__init__(batch_size_fn=lambda b: b[0].size(0), length_fn=lambda b: b[0].numel(), window_size=10)
        self.batches_seen: list[tuple[str, int]] = []
        self.computes: list = []

    def record_batch(self, trainer, pl_module, batch, iter_num):
        self.batches_seen.append((trainer.state.stage.value, iter_num))
        super().record_batch(trainer, pl_module, batch, iter_num)

    def compute_and_log(self, trainer, iter_num=None):
        self.computes.append(trainer.state.stage.value)
        super().compute_and_log(trainer, iter_num)


def test_throughput_monitor_hooks_and_window(corpus, tmp_path):
    monitor = HookedMonitor()
    logger = Recorder()
    tiny_fit(corpus, tmp_path, [monitor], logger=logger, max_steps=4, val_check_interval=None, limit_val_batches=0)
    assert monitor.batches_seen == [("train", i) for i in range(1, 5)], (
        "ThroughputMonitor._update is not called per batch")
    assert monitor.computes == ["train"] * 4, "ThroughputMonitor._compute is not called per batch"
    train = RunningStage.TRAINING
    batches, samples, lengths = monitor.counts
    assert (batches[train], samples[train], lengths[train]) == (4, 16, 128)
    assert train in monitor.start_times
    window = compat.throughput_window(monitor.throughputs[train])
    assert window["batches"] == [1, 2, 3, 4] and window["samples"] == [4, 8, 12, 16]
    assert window["lengths"] == [32, 64, 96, 128] and len(window["time"]) == 4 and window["flops"] == []
    assert window["time"] == sorted(window["time"])
    assert logger.steps_of("train/batches"), "ThroughputMonitor._compute no longer logs"
    assert compat.throughput_window(type(monitor.throughputs[train])()) == {}


def test_tensorboard_purge_step_and_event_file(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="run", version="", purge_step=3)
    assert compat.tensorboard_purge_step(logger) == 3, "TensorBoardLogger._kwargs no longer holds purge_step"
    assert compat.tensorboard_purge_step(TensorBoardLogger(str(tmp_path), name="other")) is None
    logger.log_metrics({"x": 1.0}, step=5)
    logger.save()
    own = compat.tensorboard_event_file(logger)
    assert own is not None, "the SummaryWriter's file_writer.event_writer._file_name is gone"
    files = list((tmp_path / "run").glob("events.out.tfevents.*"))
    assert [str(p) for p in files] == [own]
    assert compat.tensorboard_event_file(SimpleNamespace(experiment=object())) is None


class ProbeBar(compat.RichProgressBarWithDescription):
    described: list

    def train_description(self, current_epoch):
        self.described.append(current_epoch)
        return "probe " + super().train_description(current_epoch)


def test_progress_bar_description_and_replacement(corpus, tmp_path):
    assert "_get_train_description" in inspect.getsource(RichProgressBar), "RichProgressBar's description hook changed"
    trainer = L.Trainer(logger=False, enable_checkpointing=False, max_steps=3)
    default = trainer.progress_bar_callback
    assert type(default) is RichProgressBar, (
        "Lightning's default bar (with rich installed) is no longer RichProgressBar")
    assert compat.replace_default_progress_bar(trainer, ProbeBar)
    assert (type(trainer.progress_bar_callback) is ProbeBar
            and trainer.progress_bar_callback.refresh_rate == default.refresh_rate)
    assert not compat.replace_default_progress_bar(trainer, ProbeBar)  # nothing left to replace

    bar = ProbeBar(refresh_rate=5)
    bar.described = []
    tiny_fit(corpus, tmp_path, [bar], enable_progress_bar=True, max_steps=2, val_check_interval=None)
    assert bar.described == [0], "RichProgressBar no longer asks _get_train_description"
    bar._trainer = SimpleNamespace(max_epochs=3, max_steps=-1)
    assert bar._get_train_description(1).strip() == "probe Epoch 1/2"


def test_cli_checkpoint_hparams_hook():
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.__init__), (
        "LightningCLI.__init__ no longer calls _parse_ckpt_path: NoCheckpointHparamsMerge has nothing to override"
    )

    class CLI(compat.NoCheckpointHparamsMerge, LightningCLI):
        pass

    assert CLI._parse_ckpt_path is compat.NoCheckpointHparamsMerge._parse_ckpt_path
