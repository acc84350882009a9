"""A Rich progress bar that describes step-bounded runs sensibly (no "Epoch 0/-2") and times training only."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
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


class StepProgressBar(RichProgressBarWithDescription):
    """RichProgressBar whose training description reads "Epoch 0 · 2000 steps" when
    `max_steps` bounds the run; Lightning's would read "Epoch 0/-2" when max_epochs is unset.

    It also redraws the training bar at most every `min_redraw_seconds` (and at the last
    batch): Lightning's redraws every batch, about 0.15 ms of Python per step.

    Its training it/s is `train_rate`: batches trained in this fit over the training time,
    timed as TimingMonitor times it (from the start of training, without the time from each
    validation's start to the next training batch, so text samples and checkpoints written
    after a validation are excluded too). At the end it is 1 / the timing table's time per
    batch (for a resumed run: of this invocation's batches). Rich's own rate, which Lightning
    shows, is over the last 30 s of wall time, validations included.

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

    def configure_columns(self, trainer: L.Trainer) -> list:
        return [TrainingSpeedColumn(style=c.style) if type(c) is ProcessingSpeedColumn else c
                for c in super().configure_columns(trainer)]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._train_t0, self._train_batches, self._paused_at, self.train_rate = self.clock(), 0, None, None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._paused_at is None:
            self._paused_at = self.clock()
        super().on_validation_start(trainer, pl_module)

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
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            return super().train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        if trainer.max_steps is not None and trainer.max_steps > 0:
            description += f" · {trainer.max_steps} steps"
        # Padding as Lightning does, so the bar does not jump between training and validation.
        return f"{description:{len(self.validation_description)}}"


class UseStepProgressBar(L.Callback):
    """Swaps the RichProgressBar that Lightning adds by default for a StepProgressBar, and
    its RichModelSummary for a CountedFlopsModelSummary (no column of zero FLOPs).

    Listing StepProgressBar in the config's callbacks directly would make
    `--trainer.enable_progress_bar=false` an error (Lightning refuses a listed bar
    with the flag off); swapping at setup keeps that flag working and does nothing
    when the bar is disabled or is another class. The new bar keeps the refresh rate and
    theme (`leave` is not readable back: for it, list a StepProgressBar instead).
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        bar = next((cb for cb in trainer.callbacks if type(cb) is RichProgressBar), None)
        if bar is not None:
            replace_callback(trainer, bar, StepProgressBar(refresh_rate=bar.refresh_rate, theme=bar.theme))
        use_counted_flops_summary(trainer)
