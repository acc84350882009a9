"""The learning rate as one TensorBoard curve, `train/lr`, with every step of the warm-up."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor

from lit_attn.training.lightning_compat import monitored_rates
from lit_attn.training.log_cadence import log_step_metrics, logging_reason


class LearningRateLogger(LearningRateMonitor):
    """Lightning's LearningRateMonitor at the project's cadence and under the project's tags.

    Lightning names and reads each parameter group's rate; this class adds when and where they are logged.
    At the step train/loss is logged at (`lit_attn.training.log_cadence`, where the monitor would log at
    Lightning's own steps, missing the end of fit) and, with `every_warmup_step`, at every step where the
    rate rose since the previous step, so a warm-up shows its whole ramp whatever the logging interval.
    One tag, `train/lr`, when all parameter groups share the rate; otherwise `train/lr/NAME` per group,
    NAME being Lightning's name for it without its optimizer's prefix (the group's "name", else pg1,
    pg2, ...), or with it ("AdamW/pg1") when there are several optimizers.

    The previous step's rates are kept in checkpoints, so a resumed run logs at the steps an
    uninterrupted one does. Without a logger it logs nothing (the monitor would refuse to start).

    Args:
        every_warmup_step: also log at every step where the rate rose.
    """

    def __init__(self, every_warmup_step: bool = True):
        super().__init__(logging_interval="step")
        self.every_warmup_step = every_warmup_step
        self._previous: list[float] | None = None  # the rates of the previous training step

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        rates = [float(group["lr"]) for optimizer in trainer.optimizers for group in optimizer.param_groups]
        previous, self._previous = self._previous, rates
        step = trainer.global_step  # the index of the step about to run, where train/loss is logged
        rising = previous is not None and len(previous) == len(rates) and any(
            now > before for now, before in zip(rates, previous))
        reason = logging_reason(trainer, step, also=self.every_warmup_step and rising)
        if reason is None or not trainer.loggers:
            return
        log_step_metrics(trainer, tags(monitored_rates(self, trainer)), step, reason)

    def state_dict(self) -> dict[str, Any]:
        return {} if self._previous is None else {"previous": list(self._previous)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._previous = [float(v) for v in state["previous"]] if "previous" in state else None


def tags(named: dict[str, float]) -> dict[str, float]:
    """LearningRateMonitor's {name: rate} as the project's tags: `train/lr` when the rates are one,
    else `train/lr/GROUP` (`train/lr/OPTIMIZER/GROUP` for several optimizers or schedulers)."""
    if len(set(named.values())) == 1:
        return {"train/lr": next(iter(named.values()))}
    prefixes = {name.split("/", 1)[0] for name in named}
    if len(prefixes) == 1:
        return {f"train/lr/{name.split('/', 1)[-1]}": rate for name, rate in named.items()}
    return {f"train/lr/{name.removeprefix('lr-')}": rate for name, rate in named.items()}
