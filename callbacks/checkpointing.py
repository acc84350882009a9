"""Periodic `last.ckpt` that is also written at the end of fit and on SIGTERM / Ctrl-C."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException


class StopRequested(KeyboardInterrupt):
    """Ctrl-C, raised at a step boundary after the checkpoint was written."""


class LastCheckpoint(ModelCheckpoint):
    """Keeps the run's one `checkpoints/last.ckpt` current: every `every_n_train_steps`
    and/or every `every_minutes` of training, at the end of fit, and when the run is
    stopped by SIGTERM (cluster preemption) or Ctrl-C.

    There is exactly one such file per run, whatever the settings of the run that
    wrote it: the callback's state key is fixed and Lightning's `last-v1.ckpt`
    versioning is off, so changing the frequency or moving the run directory never
    leaves a stale `last.ckpt` beside a newer one.

    Ctrl-C is deferred to the end of the current step so the saved state is
    consistent; a second Ctrl-C interrupts at once. Other exceptions (a
    non-finite loss, a crash mid-step) save nothing: the periodic checkpoint
    stays the newest.

    Args:
        every_n_train_steps: save every this many optimizer steps (0: only at the end and on a stop).
        every_minutes: also save when this many minutes of training passed since the last save.
    """

    def __init__(self, every_n_train_steps: int = 250, every_minutes: float | None = None):
        if not isinstance(every_n_train_steps, int) or every_n_train_steps < 0:
            raise ValueError(
                f"checkpoint.every_n_train_steps must be a whole number >= 0 (0: only at the end and on a stop), "
                f"got {every_n_train_steps!r}"
            )
        if every_minutes is not None and not every_minutes > 0:
            raise ValueError(f"checkpoint.every_minutes must be positive, got {every_minutes}")
        # Lightning makes step and time intervals exclusive; the time one is kept here instead.
        super().__init__(every_n_train_steps=every_n_train_steps, save_last=True, save_top_k=0,
                         enable_version_counter=False)
        self.every_minutes = every_minutes
        self._last_save_time = time.monotonic()
        self._stop_requested = False
        self._previous_sigint: Any = None

    @property
    def state_key(self) -> str:
        # Lightning keys the state by the save frequency; a resumed run with another
        # frequency would not find it and would version the file as last-v1.ckpt.
        return "LastCheckpoint"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._stop_requested:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self._stop_requested = True
        print("\nCtrl-C: saving last.ckpt at the end of this step (press again to abort at once)", flush=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        # Save the final step here rather than in on_train_end: by then Lightning has
        # marked the epoch complete, and a mid-epoch run resumed from that state would
        # start the next epoch instead of finishing this one.
        due = self.every_minutes is not None and time.monotonic() - self._last_save_time >= 60 * self.every_minutes
        if due or self._stop_requested or 0 < trainer.max_steps <= trainer.global_step:
            self._save_now(trainer)
        if self._stop_requested:
            raise StopRequested

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()
        self._save_now(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_sigint()
        # SIGTERM is raised by Lightning between steps, so the state is consistent.
        if isinstance(exception, SIGTERMException):
            self._save_now(trainer)

    def _save_now(self, trainer: L.Trainer) -> None:
        if self._last_global_step_saved != trainer.global_step and not trainer.sanity_checking:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._last_save_time = time.monotonic()

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
