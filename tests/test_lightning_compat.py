"""lit_attn.training.lightning_compat against a real (tiny) Trainer, and no private Lightning name elsewhere.

Every item there leans on a Lightning internal; each test here checks the assumption it makes, so that
a Lightning upgrade that breaks one fails here first, with a message naming it. The public behaviours
the callbacks build on (a requested stop validates first, the logging cadence, the callback list being
live) are checked here too.
"""

import inspect
import os
import signal
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import tiny_gpt, tiny_trainer
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import LearningRateMonitor, RichModelSummary, RichProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from callbacks.summary import replace_callback
from datamodules import CharDataModule
from lit_attn.training import fit_state
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


def test_fit_state_and_logging_cadence_are_lightnings(corpus, tmp_path):
    seen = []

    def batch_start(trainer, pl_module, batch, batch_idx):
        assert fit_state.attached_trainer(pl_module) is trainer
        # Lightning's own cadence for step metrics, asked where the model and LearningRateLogger ask theirs.
        assert fit_state.logs_at(trainer, trainer.global_step) == trainer._logger_connector.should_update_logs, (
            "_LoggerConnector.should_update_logs is no longer every log_every_n_steps-th step")
        seen.append(("start", trainer.global_step, fit_state.is_last_step(trainer, trainer.global_step + 1)))

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        assert fit_state.logs_at(trainer, trainer.global_step - 1) == trainer._logger_connector.should_update_logs
        seen.append(("end", trainer.global_step, fit_state.is_last_step(trainer)))

    probe = Probe(on_train_batch_start=batch_start, on_train_batch_end=batch_end)
    tiny_fit(corpus, tmp_path, [probe], max_steps=5, log_every_n_steps=2)
    assert [last for kind, _, last in seen if kind == "start"] == [False] * 4 + [True]
    assert [(step, last) for kind, step, last in seen if kind == "end"] == [(s, s == 5) for s in range(1, 6)]
    assert fit_state.attached_trainer(tiny_gpt(10)) is None


def test_is_last_step_at_the_end_of_an_epoch(corpus, tmp_path):
    ends = []
    probe = Probe(on_train_batch_end=lambda t, m, o, b, i: ends.append(fit_state.is_last_step(t, epoch_end=True)))
    tiny_fit(corpus, tmp_path, [probe], max_steps=-1, max_epochs=1, limit_train_batches=3, val_check_interval=None)
    assert ends == [False, False, True], (
        "fit_loop.epoch_loop.batch_progress.is_last_batch no longer marks the last batch")


def test_validation_is_logged_at_the_last_step_index(corpus, tmp_path):
    logger = Recorder()
    at = []
    tiny_fit(corpus, tmp_path, [Probe(on_validation_end=lambda t, m: at.append(fit_state.last_step_index(t)))],
             logger=logger)
    assert at == [2, 5]
    assert logger.steps_of("val/loss") == at, "Lightning no longer logs a validation at global_step - 1"


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
    assert predicted == validated, "_TrainingEpochLoop._should_check_val_fx / _FitLoop._data_fetcher changed"


@pytest.mark.parametrize("settings,stop_at,expected", [
    (dict(max_steps=7), 7, [3, 6, 7]),
    (dict(max_steps=-1, max_epochs=3, limit_train_batches=2, val_check_interval=None, check_val_every_n_epoch=2),
     6, [4, 6]),
])
def test_a_requested_stop_validates_first(settings, stop_at, expected, corpus, tmp_path):
    """What FinalValidation relies on: `trainer.should_stop` at a batch end makes Lightning validate after that
    batch (in an epoch its schedule skips, once check_val_every_n_epoch is None), then stop."""
    validated, predicted = [], []

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == stop_at:
            trainer.should_stop = True
            trainer.check_val_every_n_epoch = None
        if compat.validation_follows(trainer):
            predicted.append(trainer.global_step)

    probe = Probe(on_train_batch_end=batch_end, on_validation_start=lambda t, m: validated.append(t.global_step))
    trainer, _ = tiny_fit(corpus, tmp_path, [probe], **settings)
    assert validated == expected, "a requested stop (trainer.should_stop) no longer validates before stopping"
    assert predicted == validated and trainer.global_step == stop_at


def test_a_checkpoint_at_a_validations_end_counts_its_batch_one_short(corpus, tmp_path):
    saved = {}

    def validation_end(trainer, pl_module):
        trainer.save_checkpoint(tmp_path / "v.ckpt")
        saved["step"] = trainer.global_step

    tiny_fit(corpus, tmp_path, [Probe(on_validation_end=validation_end)], max_steps=3)
    checkpoint = torch.load(tmp_path / "v.ckpt", weights_only=False)
    state = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]
    assert state.get("_batches_that_stepped") == saved["step"] - 1, (
        "the checkpoint's loops > fit_loop > epoch_loop.state_dict > _batches_that_stepped changed")
    assert compat.count_replayed_batch_end(checkpoint) and state["_batches_that_stepped"] == saved["step"]
    assert not compat.count_replayed_batch_end(checkpoint), "counted twice"
    assert not compat.count_replayed_batch_end({"global_step": 3})


@pytest.mark.slow
def test_lightnings_sigterm_flag_is_the_public_received_sigterm(corpus, tmp_path):
    """LastCheckpoint reads the SIGTERM that Lightning's handler caught before its own was installed."""
    seen = []

    def batch_end(trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler is the current one
            seen.append(trainer.received_sigterm)

    with pytest.raises(SIGTERMException):
        tiny_fit(corpus, tmp_path, [Probe(on_train_batch_end=batch_end)], val_check_interval=None)
    assert seen == [True], "Lightning's SIGTERM handler no longer sets trainer.received_sigterm"


def test_throughput_computes_what_timing_monitor_reads():
    throughput = Throughput(available_flops=100, world_size=2, window_size=2)
    throughput.update(time=1.0, batches=1, samples=4, lengths=32, flops=10)
    throughput.update(time=2.0, batches=2, samples=8, lengths=64, flops=10)
    rates = throughput.compute()
    assert {"time", "batches", "samples", "lengths", "device/batches_per_sec", "device/items_per_sec",
            "device/flops_per_sec", "device/mfu"} <= set(rates), f"Throughput.compute() returns {sorted(rates)}"
    assert (rates["device/batches_per_sec"], rates["device/items_per_sec"]) == (1.0, 32.0)
    assert rates["device/flops_per_sec"] == 10.0 and rates["device/mfu"] == 0.1


class ProbeBar(compat.RichProgressBarWithDescription):
    described: list

    def train_description(self, current_epoch):
        self.described.append(current_epoch)
        return "probe " + super().train_description(current_epoch)


def test_progress_bar_description(corpus, tmp_path):
    assert "_get_train_description" in inspect.getsource(RichProgressBar), "RichProgressBar's description hook changed"
    bar = ProbeBar(refresh_rate=5)
    bar.described = []
    tiny_fit(corpus, tmp_path, [bar], enable_progress_bar=True, max_steps=2, val_check_interval=None)
    assert bar.described == [0], "RichProgressBar no longer asks _get_train_description"
    bar._trainer = SimpleNamespace(max_epochs=3, max_steps=-1)
    assert bar._get_train_description(1).strip() == "probe Epoch 1/2"


def test_a_callback_replaced_in_setup_gets_the_rest_of_the_run(corpus, tmp_path):
    """What UseStepProgressBar relies on: Lightning's default bar and summary come after the configured
    callbacks, and a callback put in their place from an earlier setup gets setup and every later hook."""
    calls = []

    class NewBar(RichProgressBar):
        def setup(self, trainer, pl_module, stage):
            calls.append("setup")
            super().setup(trainer, pl_module, stage)

    def setup(trainer, pl_module, stage):
        default = trainer.progress_bar_callback
        assert type(default) is RichProgressBar, "Lightning's default bar is no longer a RichProgressBar"
        replace_callback(trainer, default, NewBar())
        summary = next(cb for cb in trainer.callbacks if type(cb) is RichModelSummary)
        replace_callback(trainer, summary, RichModelSummary(**compat.model_summary_settings(summary)))

    trainer, _ = tiny_fit(corpus, tmp_path, [Probe(setup=setup)], enable_progress_bar=True,
                          enable_model_summary=True, max_steps=2, val_check_interval=None)
    assert calls == ["setup"] and type(trainer.progress_bar_callback) is NewBar


@pytest.mark.parametrize("schedule,limits", [
    ("cosine", dict(max_steps=2)),  # a scheduler stepped every step, and one stepped every epoch
    ("cosine_epochs", dict(max_steps=-1, max_epochs=1, limit_train_batches=2)),
])
def test_learning_rate_monitor_names_and_reads_every_group(schedule, limits, corpus, tmp_path):
    seen = []

    class Monitor(LearningRateMonitor):  # on_train_start names the groups, as the monitor's own does
        def on_train_batch_start(self, trainer, *args):
            seen.append((compat.monitored_rates(self, trainer), [g["lr"] for g in trainer.optimizers[0].param_groups]))

    model = tiny_gpt(CharDataModule(path=str(corpus)).vocab_size, block_size=8, schedule=schedule)
    trainer = L.Trainer(accelerator="cpu", logger=Recorder(), callbacks=[Monitor()], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, **limits)
    trainer.fit(model, CharDataModule(path=str(corpus), block_size=8, batch_size=4))
    names = ["lr-AdamW/adamw", "lr-AdamW/adamw_no_decay"]  # GPT's group names
    assert len(seen) == 2 and all(list(named) == names and list(named.values()) == rates for named, rates in seen), (
        f"LearningRateMonitor._extract_stats no longer names and reads every group: {seen}")


def test_model_summary_settings():
    summary = RichModelSummary(max_depth=3, header_style="bold")
    assert compat.model_summary_settings(summary) == {"max_depth": 3, "header_style": "bold"}, (
        "ModelSummary no longer keeps its arguments in _max_depth / _summarize_kwargs")


def test_cli_checkpoint_hparams_hook():
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.__init__), (
        "LightningCLI.__init__ no longer calls _parse_ckpt_path: NoCheckpointHparamsMerge has nothing to override"
    )

    class CLI(compat.NoCheckpointHparamsMerge, LightningCLI):
        pass

    assert CLI._parse_ckpt_path is compat.NoCheckpointHparamsMerge._parse_ckpt_path
