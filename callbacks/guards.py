"""Stop training on a non-finite loss before it can reach the weights or a checkpoint."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite."""


class FiniteLossGuard(Callback):
    """Raises NonFiniteLossError before backward when the loss is NaN/Inf.

    Checking before backward means the optimiser never steps on the bad loss,
    and the checkpoint callbacks skip saving on this error, so the last good
    checkpoint stays the newest one on disk.
    """

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at step {trainer.global_step}; stopped without saving, the last good "
                f"checkpoint is kept (lower --model.lr, or resume from an earlier checkpoint)"
            )
