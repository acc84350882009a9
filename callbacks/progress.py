"""The progress of a fit: on a terminal, a Rich bar that counts a step-bounded run's steps (no "Epoch 0/-2", right
on a resumed run) and times training only; in a file or a pipe, a plain line per validation."""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
from rich import get_console
from rich.file_proxy import FileProxy
from rich.progress import Task
from rich.text import Text

from lit_attn.training.fit_state import is_last_step
from lit_attn.training.lightning_compat import RichProgressBarWithDescription

from .summary import replace_callback, use_counted_flops_summary


class TrainingSpeedColumn(ProcessingSpeedColumn):
    """Lightning's it/s column, showing a task's `rate` field (batches per second of training) where it has one."""

    def render(self, task: Task) -> Text:
        rate = task.fields.get("rate")
        if rate is None:
            return super().render(task)
        return Text(f"{rate:>.2f}it/s", style=self.style)


def counts_steps(trainer: L.Trainer) -> bool:
    """Whether `max_steps` alone bounds the run (no `max_epochs`): its bar then counts the run's steps."""
    epochs = trainer.max_epochs is not None and trainer.max_epochs >= 0
    return not epochs and trainer.max_steps is not None and trainer.max_steps > 0


def live_console() -> bool:
    """Whether Rich's console redraws a bar in place (a terminal or a notebook); not a file, a pipe or a dumb
    terminal, where Rich shows a bar only once, at its end."""
    console = get_console()
    return (console.is_terminal and not console.is_dumb_terminal) or console.is_jupyter


class _CurrentStderr:
    """A stream that writes to whatever `sys.stderr` is at the time (Rich's proxy while a bar is live)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class StepProgressBar(RichProgressBarWithDescription):
    """RichProgressBar whose training description reads "Epoch 0 · 2000 steps" when
    `max_steps` bounds the run; Lightning's would read "Epoch 0/-2" when max_epochs is unset.

    It also redraws the training bar at most every `min_redraw_seconds` (and at the last
    batch): Lightning's redraws every batch, Python work that a short step pays each time.

    Its training it/s is `train_rate`: batches trained in this fit over the training time,
    timed as TimingMonitor times it (from the start of training, without the time from each
    validation's start to the next training batch, so text samples and checkpoints written
    after a validation are excluded too). At the end it is 1 / the timing table's time per
    batch (for a resumed run: of this invocation's batches). Rich's own rate, which Lightning
    shows, is over the last 30 s of wall time, validations included.

    Where `max_steps` alone bounds the run, the bar counts the run's steps out of `max_steps`, across
    epochs, and a resumed run's bar starts at its step (Lightning's counts the batches of the epoch, so
    a run resumed mid-epoch reads "207/99" at once finished, with no elapsed time or ETA); the ETA is
    this fit's. While the bar is live, Lightning's log lines (its handler keeps the stderr it was made
    with, past Rich's redirection) go through Rich, so that they start on a line of their own.

    None of this is an option of Lightning 2.6's RichProgressBar (its refresh_rate is Rich's
    redraws per second; the per-batch update runs regardless), hence this class.
    """

    clock = staticmethod(time.perf_counter)  # seconds; every time it measures is read here (tests set a fake one)
    min_redraw_seconds = 0.1
    _last_redraw = 0.0
    train_rate: float | None = None  # batches per second of training time; None before the first batch
    _train_t0 = 0.0  # clock() at the start of training, moved later by each pause
    _train_batches = 0
    _paused_at: float | None = None  # when a validation interrupted training
    _rerouted: list[tuple[logging.StreamHandler, Any]] | None = None  # (Lightning's log handler, its own stream)

    def configure_columns(self, trainer: L.Trainer) -> list:
        return [TrainingSpeedColumn(style=c.style) if type(c) is ProcessingSpeedColumn else c
                for c in super().configure_columns(trainer)]

    @property
    def total_train_batches(self) -> int | float:
        """`max_steps` where they alone bound the run (the bar counts its steps); else Lightning's count of the
        epoch's batches."""
        if counts_steps(self.trainer):
            return self.trainer.max_steps
        return super().total_train_batches

    def _logs_through_rich(self) -> None:
        """Send Lightning's log lines through `sys.stderr` while Rich redirects it above a live bar."""
        if self._rerouted is not None or not isinstance(sys.stderr, FileProxy):
            return
        self._rerouted = []
        for handler in logging.getLogger("lightning.pytorch").handlers:
            if type(handler) is logging.StreamHandler and not isinstance(handler.stream, _CurrentStderr):
                self._rerouted.append((handler, handler.setStream(_CurrentStderr())))

    def _logs_as_before(self) -> None:
        for handler, stream in self._rerouted or ():
            handler.setStream(stream)
        self._rerouted = None

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_sanity_check_start(trainer, pl_module)
        self._logs_through_rich()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._logs_through_rich()
        self._train_t0, self._train_batches, self._paused_at, self.train_rate = self.clock(), 0, None, None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        task = self.train_progress_bar_id
        if not counts_steps(trainer) or self.progress is None or task is None:
            super().on_train_epoch_start(trainer, pl_module)  # a new bar (of max_steps, where they count)
            if counts_steps(trainer) and self.progress is not None and self.train_progress_bar_id is not None:
                # At the run's step, with no progress sample for the steps before: Rich's speed and ETA are this fit's.
                self.progress.reset(self.train_progress_bar_id, total=trainer.max_steps, completed=trainer.global_step)
            return
        # A new epoch of a run that counts steps: the same bar goes on, under the epoch's description.
        description = self.train_description(trainer.current_epoch)
        theme = self.theme.description
        self.progress.update(task, description=f"[{theme}]{description}" if theme else description)
        self.refresh()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._paused_at is None:
            self._paused_at = self.clock()
        super().on_validation_start(trainer, pl_module)
        self._logs_through_rich()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._paused_at is not None:
            self._train_t0 += self.clock() - self._paused_at
            self._paused_at = None
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = self.clock()
        self._train_batches += 1
        if now > self._train_t0:
            self.train_rate = self._train_batches / (now - self._train_t0)
        last = is_last_step(trainer, epoch_end=True)
        if now - self._last_redraw >= self.min_redraw_seconds or last:
            self._last_redraw = now
            if self.progress is not None and self.train_progress_bar_id is not None:
                self.progress.update(self.train_progress_bar_id, rate=self.train_rate)
            # Lightning's bar shows batch_idx + 1 done: where the bar counts steps, that is the step count.
            done = trainer.global_step - 1 if counts_steps(trainer) else batch_idx
            super().on_train_batch_end(trainer, pl_module, outputs, batch, done)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._logs_as_before()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self._logs_as_before()

    def train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            return super().train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        if trainer.max_steps is not None and trainer.max_steps > 0:
            description += f" · {trainer.max_steps} steps"
        # Padding as Lightning does, so the bar does not jump between training and validation.
        return f"{description:{len(self.validation_description)}}"


class ValidationLines(ProgressBar):
    """The progress of a fit as a plain line after each of its validations, for output that is not redrawn in place
    (a file, a pipe, a job's log), where a Rich bar shows nothing until the fit ends and then one bar:

        step 200/2000 · train/loss 2.1234 · val/loss 2.2345 · elapsed 0:01:23

    The step is the run's (a resumed run's too), the elapsed time this fit's, wall time, validations included.
    """

    clock = staticmethod(time.perf_counter)  # seconds; every time it measures is read here (tests set a fake one)
    shown_metrics = ("train/loss", "val/loss")

    def __init__(self) -> None:
        super().__init__()
        self.shown = True  # False on every rank but the first (Lightning disables the others)
        self._fit_t0 = 0.0

    def disable(self) -> None:
        self.shown = False

    def enable(self) -> None:
        self.shown = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_t0 = self.clock()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.shown or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step = f"step {trainer.global_step}" + (f"/{trainer.max_steps}" if trainer.max_steps > 0 else "")
        metrics = trainer.callback_metrics
        shown = [f"{key} {float(metrics[key]):.4f}" for key in self.shown_metrics if key in metrics]
        elapsed = f"elapsed {timedelta(seconds=int(self.clock() - self._fit_t0))}"
        print(" · ".join([step, *shown, elapsed]), flush=True)


class UseStepProgressBar(L.Callback):
    """Swaps the RichProgressBar that Lightning adds by default for a StepProgressBar where the console is redrawn
    in place (a terminal, a notebook), else for ValidationLines; and its RichModelSummary for a
    CountedFlopsModelSummary (no column of zero FLOPs).

    Listing StepProgressBar in the config's callbacks directly would make
    `--trainer.enable_progress_bar=false` an error (Lightning refuses a listed bar
    with the flag off); swapping at setup keeps that flag working and does nothing
    when the bar is disabled or is another class. The new bar keeps the refresh rate and
    theme (`leave` is not readable back: for it, list a StepProgressBar instead).
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        bar = next((cb for cb in trainer.callbacks if type(cb) is RichProgressBar), None)
        if bar is not None:
            live = live_console()
            replace_callback(trainer, bar, StepProgressBar(refresh_rate=bar.refresh_rate, theme=bar.theme) if live
                             else ValidationLines())
        use_counted_flops_summary(trainer)
