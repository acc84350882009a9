"""The learning rate as one TensorBoard curve, `train/lr`, with every step of the warm-up."""

from __future__ import annotations

from typing import Any

import lightning as L

from lit_attn.training.fit_state import is_last_step, logs_at


class LearningRateLogger(L.Callback):
    """Logs the learning rate at the start of training batches, at the step train/loss is logged at.

    Logged at the first step, at every logging step (`log_every_n_steps`, the last step, the end
    of an epoch: where train/loss is logged) and, with `every_warmup_step`, at every step where the
    rate rose since the previous step, so a warm-up shows its whole ramp whatever the logging
    interval. One tag, `train/lr`, when all parameter groups (of all optimizers) share the rate;
    otherwise `train/lr/NAME` per group (its "name", else pg1, pg2, ... in order).

    The previous step's rates are kept in checkpoints, so a resumed run logs at the steps an
    uninterrupted one does. Tags logged only because `max_steps` ends fit at this step are named
    in `last_step_only_tags` (callbacks.final_validation hides them when the run is continued).

    Args:
        every_warmup_step: also log at every step where the rate rose.
    """

    def __init__(self, every_warmup_step: bool = True):
        self.every_warmup_step = every_warmup_step
        self._previous: list[float] | None = None  # the rates of the previous training step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        names, rates = group_rates(trainer)
        previous, self._previous = self._previous, rates
        step = trainer.global_step  # the index of the step about to run, where train/loss is logged
        rising = previous is not None and len(previous) == len(rates) and any(
            now > before for now, before in zip(rates, previous))
        # Step 0 never reaches max_steps: is_last_step(trainer, 0, epoch_end=True) is the epoch's end alone.
        scheduled = (step == 0 or logs_at(trainer, step) or is_last_step(trainer, 0, epoch_end=True)
                     or (self.every_warmup_step and rising))
        fit_end = is_last_step(trainer, trainer.global_step + 1)
        self.last_step_only_tags: tuple[str, ...] = ()
        if not (scheduled or fit_end):
            return
        if len(set(rates)) == 1:
            metrics = {"train/lr": rates[0]}
        else:
            metrics = {f"train/lr/{name}": rate for name, rate in zip(names, rates)}
        if not scheduled:
            self.last_step_only_tags = tuple(metrics)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def state_dict(self) -> dict[str, Any]:
        return {} if self._previous is None else {"previous": list(self._previous)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._previous = [float(v) for v in state["previous"]] if "previous" in state else None


def group_rates(trainer: L.Trainer) -> tuple[list[str], list[float]]:
    """(names, learning rates) of every parameter group of every optimizer, in order."""
    groups = [group for optimizer in trainer.optimizers for group in optimizer.param_groups]
    names = [str(group.get("name") or f"pg{i}") for i, group in enumerate(groups, start=1)]
    return names, [float(group["lr"]) for group in groups]
