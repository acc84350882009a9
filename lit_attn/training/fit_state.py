"""Where a fit is, read from public Trainer attributes: the checks the model and the callbacks share."""

from __future__ import annotations

from typing import Any

import lightning as L


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The module's trainer, or None when it is not attached (sampling, benchmarks, meta-device FLOP counts):
    `LightningModule.trainer` raises RuntimeError then."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def is_last_step(trainer: Any, step: int | None = None, *, epoch_end: bool = False) -> bool:
    """Whether `step` (default: `trainer.global_step`, optimizer steps done) reaches `max_steps`;
    with epoch_end=True, also whether the current batch is the epoch's last one.

    Pass `trainer.global_step + 1` from inside `training_step` (the step running now is not counted yet).
    """
    step = trainer.global_step if step is None else step
    if 0 < trainer.max_steps <= step:
        return True
    return bool(epoch_end and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def is_last_batch_of_fit(trainer: Any) -> bool:
    """Whether the batch that just ended is fit's last: `max_steps` reached, or the last batch of the last epoch."""
    last_epoch = 0 < (trainer.max_epochs or 0) <= trainer.current_epoch + 1
    return is_last_step(trainer) or bool(last_epoch and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def stops_here(trainer: Any) -> bool:
    """Whether a stop was asked for (max_time's Timer, an early stop) that Lightning acts on after this batch:
    once `min_steps` and `min_epochs` are met (the epochs before this one, as Lightning counts them)."""
    loop = trainer.fit_loop
    return bool(trainer.should_stop and trainer.global_step >= (loop.epoch_loop.min_steps or 0)
                and trainer.current_epoch >= (loop.min_epochs or 0))


def logs_at(trainer: Any, index: int) -> bool:
    """Whether training step `index` (0-based: `trainer.global_step` before the step, `global_step - 1` after it)
    is a logging step: every `log_every_n_steps`-th step, as Lightning logs step metrics (never when it is 0)."""
    every = trainer.log_every_n_steps
    return bool(every) and (index + 1) % every == 0


def last_step_index(trainer: Any) -> int:
    """The 0-based index of the last completed training step (0 before any). Lightning logs a step's
    metrics, and the validation's after it, at this index; callbacks logging at a step of their own use it too.
    """
    return max(trainer.global_step - 1, 0)
