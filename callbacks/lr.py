"""The learning rate as one TensorBoard curve, `train/lr`, with every step of the warm-up."""

from __future__ import annotations

from typing import Any

import lightning as L

from lit_attn.training.log_cadence import log_step_metrics, logging_reason


class LearningRateLogger(L.Callback):
    """Logs the learning rate at the start of training batches, at the step train/loss is logged at.

    Logged where train/loss is (`lit_attn.training.log_cadence`) and, with `every_warmup_step`, at every
    step where the rate rose since the previous step, so a warm-up shows its whole ramp whatever the logging
    interval. One tag, `train/lr`, when all parameter groups (of all optimizers) share the rate;
    otherwise `train/lr/NAME` per group name (the group's "name", else pg1, pg2, ... in order): e.g.
    `train/lr/muon` and `train/lr/adamw` with --model.optimizer muon.

    The previous step's rates are kept in checkpoints, so a resumed run logs at the steps an
    uninterrupted one does.

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
        reason = logging_reason(trainer, step, also=self.every_warmup_step and rising)
        if reason is None:
            return
        log_step_metrics(trainer, lr_metrics(names, rates), step, reason)

    def state_dict(self) -> dict[str, Any]:
        return {} if self._previous is None else {"previous": list(self._previous)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._previous = [float(v) for v in state["previous"]] if "previous" in state else None


def group_rates(trainer: L.Trainer) -> tuple[list[str], list[float]]:
    """(names, learning rates) of every parameter group of every optimizer, in order."""
    groups = [group for optimizer in trainer.optimizers for group in optimizer.param_groups]
    names = [str(group.get("name") or f"pg{i}") for i, group in enumerate(groups, start=1)]
    return names, [float(group["lr"]) for group in groups]


def lr_metrics(names: list[str], rates: list[float]) -> dict[str, float]:
    """`train/lr` when every group has one rate; else `train/lr/NAME` per name, groups of one name and rate
    sharing a curve (AdamW's decayed and undecayed groups), a group of a name taken at another rate NAME_i."""
    if len(set(rates)) == 1:
        return {"train/lr": rates[0]}
    metrics: dict[str, float] = {}
    for i, (name, rate) in enumerate(zip(names, rates), start=1):
        tag = f"train/lr/{name}"
        metrics[tag if metrics.get(tag, rate) == rate else f"{tag}_{i}"] = rate
    return metrics
