"""Every use of Lightning's private API in this project, in one place.

The callbacks, the model and the CLI reach into Lightning where it offers no public way to do
what they need. Each such reach is one item below, with why it is needed and what Lightning
does (file and function as of Lightning 2.6; `pyproject.toml` pins the tested range). After a
Lightning upgrade, `tests/test_lightning_compat.py` exercises each item against a real Trainer
and fails there first, naming the assumption that broke.

Nothing here is expensive to import: only Lightning itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger

TESTED_LIGHTNING = (2, 6)  # the minor version these assumptions were checked against (2.6.6)


# ---------------------------------------------------------------------------------------------
# Where the run is
# ---------------------------------------------------------------------------------------------

def is_last_step(trainer: Any, step: int | None = None, *, epoch_end: bool = False) -> bool:
    """Whether `step` (default: `trainer.global_step`, optimizer steps done) reaches `max_steps`;
    with epoch_end=True, also whether the current batch is the epoch's last one.

    Public attributes only; one definition for the checks the model, the progress bar, the
    timing and the checkpoint callbacks make. Pass `trainer.global_step + 1` from inside
    `training_step` (the step running now is not counted yet).
    """
    step = trainer.global_step if step is None else step
    if 0 < trainer.max_steps <= step:
        return True
    return bool(epoch_end and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def is_last_batch_of_fit(trainer: Any) -> bool:
    """Whether the batch that just ended is fit's last: `max_steps` reached, or the last batch of the last epoch."""
    last_epoch = 0 < (trainer.max_epochs or 0) <= trainer.current_epoch + 1
    return is_last_step(trainer) or bool(last_epoch and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The module's trainer, or None when it is not attached.

    `LightningModule.trainer` raises when no trainer is attached (core/module.py, the `trainer`
    property); the model also runs outside a Trainer (sampling, benchmarks, meta-device FLOP
    counts), so it reads the private attribute the property reads.
    """
    return module._trainer


# ---------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------

def should_log_now(trainer: L.Trainer) -> bool:
    """Whether Lightning logs the step metrics of the batch being trained now.

    trainer/connectors/logger_connector/logger_connector.py, `_LoggerConnector.should_update_logs`:
    every `log_every_n_steps` optimizer steps (counted by the epoch loop's private
    `_batches_that_stepped`) or when the trainer should stop. No public equivalent; the model
    logs train/loss only then, and TimingMonitor logs its derived rates with Lightning's.
    """
    return bool(trainer._logger_connector.should_update_logs)


def log_metrics(trainer: L.Trainer, metrics: dict[str, Any], step: int | None) -> None:
    """Send metrics to every logger at `step`, as Lightning sends its own.

    logger_connector.py, `_LoggerConnector.log_metrics`: converts tensors to scalars, updates
    `trainer.logged_metrics`, calls every logger's `agg_and_log_metrics` and `save`. Used by
    TimingMonitor for keys logged beside ThroughputMonitor's (which calls the same), at the
    same step, so their curves line up.
    """
    trainer._logger_connector.log_metrics(metrics, step=step)


def last_step_index(trainer: L.Trainer) -> int:
    """The 0-based index of the last completed training step (0 before any). Lightning logs a step's
    metrics, and the validation's after it, at this index; callbacks logging at a step of their own use it too.
    """
    return max(trainer.global_step - 1, 0)


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning logs metrics at during fit: optimizer steps taken, restored on resume.

    loops/training_epoch_loop.py, `_TrainingEpochLoop._batches_that_stepped` (what `_LoggerConnector.log_metrics`
    uses when no step is given). Public `global_step` counts the steps of every optimizer; TimingMonitor logs
    validation rates at the step val/loss is logged at, which is this one.
    """
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def drop_epoch_metric(trainer: L.Trainer) -> None:
    """Stop Lightning adding an `epoch` scalar to the metrics it logs without a step.

    logger_connector.py, `_LoggerConnector.log_metrics`: given no step (and no `step` key), it adds
    `epoch` (`trainer.current_epoch`) "for convenience" and logs at `_batches_that_stepped`; no
    option turns it off, and in TensorBoard it is a card of its own, a staircase that says nothing
    the step axis does not. Passing that same step explicitly skips the addition; the wrapper is an
    instance attribute shadowing the method (once per trainer), which the connector's own
    `update_*_metrics` calls pick up too. A metric a user logs as `epoch` is kept.
    """
    connector = trainer._logger_connector
    if "log_metrics" in vars(connector):
        return
    log = connector.log_metrics

    def log_metrics(metrics: dict[str, Any], step: int | None = None) -> None:
        if step is None and "step" not in metrics:
            step = logging_step(trainer)
        log(metrics, step=step)

    connector.log_metrics = log_metrics


def log_step_metrics_early(trainer: L.Trainer) -> None:
    """Send this training batch's logged metrics to the loggers now, and skip Lightning's
    call for this batch once.

    loops/training_epoch_loop.py, `_TrainingEpochLoop.advance` calls
    `_LoggerConnector.update_train_step_metrics` after the `on_train_batch_end` hooks; a
    checkpoint written in that hook would otherwise precede the metrics of its own step.
    The skip is an instance attribute shadowing the method; `undo_log_step_metrics_early`
    removes it (after an exception, when the skipped call never came).
    """
    connector = trainer._logger_connector
    if "update_train_step_metrics" in vars(connector):
        return
    connector.update_train_step_metrics()

    def skip_once() -> None:
        del connector.update_train_step_metrics

    connector.update_train_step_metrics = skip_once


def undo_log_step_metrics_early(trainer: L.Trainer) -> None:
    """Remove a pending skip set by `log_step_metrics_early` (nothing if none)."""
    vars(trainer._logger_connector).pop("update_train_step_metrics", None)


def evaluation_batches_done(trainer: L.Trainer) -> int:
    """Batches the running validation/test loop has fetched, over its whole life.

    trainer/trainer.py keeps the loop as the private `_evaluation_loop`; ThroughputMonitor (callbacks/
    throughput_monitor.py, `on_validation_batch_end`) passes `_evaluation_loop.batch_progress.total.ready`
    to its `_update`; TimingMonitor passes the same.
    """
    return trainer._evaluation_loop.batch_progress.total.ready


# ---------------------------------------------------------------------------------------------
# When validation runs
# ---------------------------------------------------------------------------------------------

def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the training batch that just ended (asked as
    Lightning will ask); False if the loop's internals are not as expected.

    loops/training_epoch_loop.py, `_TrainingEpochLoop.on_advance_end`: it validates when
    `_should_check_val_fx(data_fetcher)` is true, unless `_skip_next_val` (set on a resume from
    a batch-end checkpoint) is. The data fetcher is `_FitLoop._data_fetcher` (loops/fit_loop.py).
    """
    loop = trainer.fit_loop.epoch_loop
    try:
        return not loop._skip_next_val and bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    except Exception:  # another Lightning: callers fall back to not waiting for a validation
        return False


def also_validate_when(trainer: L.Trainer, when: Callable[[], bool]) -> bool:
    """Make Lightning validate after a training batch where `when()` holds, besides its schedule (asked
    where Lightning asks: at each batch end, and once on a restart); False, changing nothing, for another Lightning.

    `_TrainingEpochLoop.on_advance_end` validates when `_should_check_val_fx(data_fetcher)` is true (and
    `_skip_next_val` is not); on a restart, `advance` first asks it whether the restored batch had a
    validation, and if so replays that batch's end without it. No Trainer option validates at the end of
    fit. The wrapper is an instance attribute shadowing the method, which `validation_follows` asks too;
    it keeps Lightning's yes, so a step validates once.
    """
    loop = trainer.fit_loop.epoch_loop
    scheduled = getattr(loop, "_should_check_val_fx", None)
    if "_should_check_val_fx" in vars(loop) or not callable(scheduled):
        return callable(scheduled)
    loop._should_check_val_fx = lambda data_fetcher: bool(scheduled(data_fetcher)) or when()
    return True


# ---------------------------------------------------------------------------------------------
# SIGTERM
# ---------------------------------------------------------------------------------------------

def redirect_lightning_sigterm(trainer: L.Trainer, handler: Callable[[int, Any], None]) -> None:
    """Make Lightning's SIGTERM handler, when it gets installed, call `handler` instead.

    trainer/connectors/signal_connector.py, `_SignalConnector.register_signal_handlers` installs
    the bound method `_sigterm_notifier_fn`, which broadcasts, forwards SIGTERM to the other local
    ranks and sets `received_sigterm`: inside a signal handler that can hang DDP when every rank
    is signalled. An instance attribute of that name is what register_signal_handlers picks up.
    """
    connector = trainer._signal_connector
    if hasattr(type(connector), "_sigterm_notifier_fn"):
        connector._sigterm_notifier_fn = handler


def take_lightning_sigterm(trainer: L.Trainer) -> bool:
    """Whether Lightning's handler saw a SIGTERM; clears Lightning's flag, so its loop does not
    also raise SIGTERMException (the caller handles the stop).

    `trainer.received_sigterm` (public, read-only) reads `_SignalConnector.received_sigterm`,
    which the training epoch loop checks each step (training_epoch_loop.py, `advance`).
    """
    if not trainer.received_sigterm:
        return False
    trainer._signal_connector.received_sigterm = False
    return True


def disable_sigterm_broadcast(trainer: L.Trainer) -> None:
    """Stop the training loop broadcasting rank 0's SIGTERM flag every step (under DDP).

    loops/training_epoch_loop.py, `_TrainingEpochLoop._broadcast_sigterm_tensor`: a collective
    and a device-to-host read per step, for a flag that `redirect_lightning_sigterm` keeps unset.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    if trainer.world_size > 1 and hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
        epoch_loop._broadcast_sigterm_tensor = lambda: None  # the callback's own agreement replaces it


# ---------------------------------------------------------------------------------------------
# ModelCheckpoint
# ---------------------------------------------------------------------------------------------

def last_saved_step(callback: ModelCheckpoint) -> int:
    """The global step of the callback's latest save (0 before any).

    callbacks/model_checkpoint.py keeps it in `_last_global_step_saved` (in its state_dict); no public accessor.
    """
    return callback._last_global_step_saved


def save_last_checkpoint(callback: ModelCheckpoint, trainer: L.Trainer) -> None:
    """Write the callback's `last.ckpt` now, as its own triggers would.

    callbacks/model_checkpoint.py, `ModelCheckpoint._save_last_checkpoint(trainer, monitor_candidates)`
    with `_monitor_candidates(trainer)`: the public hooks only save on their own schedule
    (batch/epoch/validation ends), and LastCheckpoint decides when to save itself.
    """
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


# ---------------------------------------------------------------------------------------------
# ThroughputMonitor
# ---------------------------------------------------------------------------------------------

class ThroughputMonitorHooks(ThroughputMonitor):
    """ThroughputMonitor with its private per-batch and per-log steps and state under public names.

    callbacks/throughput_monitor.py: every `on_*_batch_end` calls `_update(trainer, pl_module, batch, iter_num)`
    (time the batch, add its counts, update the stage's `Throughput`) and then `_compute(trainer, iter_num)`
    (log the window's rates); the state is in `_throughputs`, `_t0s` (each stage's clock start, set in
    `_start`), `_batches`, `_samples` and `_lengths` (running counts), all dicts keyed by RunningStage.
    Subclasses override `record_batch` and `compute_and_log` and use the dicts through the properties below.
    """

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        self.record_batch(trainer, pl_module, batch, iter_num)

    def _compute(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        self.compute_and_log(trainer, iter_num)

    def record_batch(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        ThroughputMonitor._update(self, trainer, pl_module, batch, iter_num)

    def compute_and_log(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        ThroughputMonitor._compute(self, trainer, iter_num)

    @property
    def throughputs(self) -> dict:
        """RunningStage -> lightning.fabric.utilities.throughput.Throughput (the live dict)."""
        return self._throughputs

    @property
    def start_times(self) -> dict:
        """RunningStage -> time.perf_counter() at which the stage's clock starts (the live dict)."""
        return self._t0s

    @property
    def counts(self) -> tuple[dict, dict, dict]:
        """The live (batches, samples, lengths) dicts, RunningStage -> running total."""
        return self._batches, self._samples, self._lengths


def throughput_window(throughput: Any) -> dict[str, list]:
    """The values in a `Throughput`'s window: {"time", "batches", "samples", "lengths", "flops"}
    (flops as stored: summed over `world_size`); {} when it is empty.

    lightning/fabric/utilities/throughput.py, `Throughput.update` appends to the private windows
    `_time`, `_batches`, `_samples`, `_lengths` and `_flops`; only `compute()` (derived rates) is
    public. TimingMonitor checkpoints the window so a resumed run continues it.
    """
    if not throughput._time:
        return {}
    return {key: list(getattr(throughput, f"_{key}")) for key in ("time", "batches", "samples", "lengths", "flops")}


# ---------------------------------------------------------------------------------------------
# TensorBoardLogger
# ---------------------------------------------------------------------------------------------

def tensorboard_purge_step(logger: TensorBoardLogger) -> int | None:
    """The `purge_step` the logger was built with (None if none).

    loggers/tensorboard.py, `TensorBoardLogger.__init__` keeps SummaryWriter arguments in `_kwargs`; no accessor.
    """
    return getattr(logger, "_kwargs", {}).get("purge_step")


def tensorboard_event_file(logger: TensorBoardLogger) -> str | None:
    """The path of the event file the logger's writer writes (None for an unknown writer).

    The writer is torch.utils.tensorboard's (or tensorboardX's) SummaryWriter made in
    `TensorBoardLogger.experiment`; its file is `file_writer.event_writer._file_name`, with no
    public accessor (`get_logdir()` gives the directory only).
    """
    writer = getattr(getattr(logger.experiment, "file_writer", None), "event_writer", None)
    return getattr(writer, "_file_name", None)


# ---------------------------------------------------------------------------------------------
# Progress bar
# ---------------------------------------------------------------------------------------------

class RichProgressBarWithDescription(RichProgressBar):
    """RichProgressBar whose training description comes from the public `train_description`.

    callbacks/progress/rich_progress.py, `RichProgressBar._get_train_description(current_epoch)`
    makes "Epoch N/max_epochs-1", which reads "Epoch 0/-2" for a run bounded by max_steps only;
    its constructor options (refresh_rate, leave, theme, console_kwargs) cannot change it.
    """

    def _get_train_description(self, current_epoch: int) -> str:
        return self.train_description(current_epoch)

    def train_description(self, current_epoch: int) -> str:
        """Lightning's description; override to change it."""
        return RichProgressBar._get_train_description(self, current_epoch)


def replace_default_progress_bar(trainer: L.Trainer, bar_class: type[RichProgressBar]) -> bool:
    """Replace the plain RichProgressBar in `trainer.callbacks` by a `bar_class` that keeps its
    settings (refresh rate, theme, console); returns whether one was replaced.

    The object is copied attribute by attribute (`__dict__`: RichProgressBar's private state), since
    its options are not all readable back. Called from a callback's `setup`: trainer/call.py
    `_call_callback_hooks` walks the live list, so the new bar gets its own setup call too, and
    trainer.progress_bar_callback looks the bar up in the list.
    """
    for i, callback in enumerate(trainer.callbacks):
        if type(callback) is RichProgressBar:
            bar = bar_class.__new__(bar_class)
            bar.__dict__.update(callback.__dict__)
            trainer.callbacks[i] = bar
            return True
    return False


# ---------------------------------------------------------------------------------------------
# LightningCLI
# ---------------------------------------------------------------------------------------------

class NoCheckpointHparamsMerge:
    """Mixin for a LightningCLI subclass (list it first): `--ckpt_path` is not read by the CLI.

    cli.py, `LightningCLI.__init__` calls `_parse_ckpt_path`, which torch.loads the checkpoint
    given as --ckpt_path and merges its hyper_parameters into the config, whatever
    `load_from_checkpoint_support` says. This project reads the checkpoint once itself
    (main.py, before_instantiate_classes) with one-line errors and checks the given settings
    against it instead.
    """

    def _parse_ckpt_path(self) -> None:
        pass
