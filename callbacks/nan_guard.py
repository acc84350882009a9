"""Stop training on a non-finite loss before it can reach a checkpoint."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lit_attn.bounds import PositiveInt, check_bounds
from lit_attn.training.sharding import local_part


class NonFiniteLossError(ValueError):
    """The training loss became NaN or infinite; `advice` is what to change, as the evidence points to."""

    def __init__(self, message: str, advice: str = "lower --model.lr") -> None:
        super().__init__(message)
        self.advice = advice


def diagnosis(step: int, hparams: Any) -> tuple[str, str]:
    """(what the evidence points to, what to change) for a non-finite loss at optimizer step `step`.

    At step 0 no update has happened: the model's forward or initialization made it. AdamW's decoupled
    weight decay scales every weight by 1 - lr * weight_decay per step, which grows them once the product
    reaches 2 (and flips their sign from 1). Otherwise the updates diverged: the learning rate.
    """
    if step == 0:
        attention = hparams.get("attention")
        which = f" (--model.attention {attention})" if attention else ""
        return (f", before any update: the model's forward or initialization{which} gives non-finite values",
                "check the attention with lit_attn.testing.check_attention")
    lr, decay = hparams.get("lr"), hparams.get("weight_decay")
    if isinstance(lr, (int, float)) and isinstance(decay, (int, float)) and lr * decay >= 1:
        return (f", with --model.weight_decay {decay:g} at --model.lr {lr:g}: each step scales the weights by "
                f"1 - lr * weight_decay = {1 - lr * decay:g}", "lower --model.weight_decay (lr * weight_decay << 1)")
    return "", "lower --model.lr"


class FiniteLossGuard(Callback):
    """Raises NonFiniteLossError when a training loss was NaN/Inf, without a host sync per step.

    Every step keeps a reference to its (detached) loss; reading it back to the host would
    stall a GPU, so the kept losses are read, in one transfer, every `check_every_n_steps`
    steps (default: the trainer's `log_every_n_steps`), before each validation, at the end
    of training and before every checkpoint is written. A checkpoint is therefore never
    written after a bad step: the last good one stays the newest on disk.

    Args:
        check_every_n_steps: steps between loss checks; null: log_every_n_steps.
    """

    def __init__(self, check_every_n_steps: PositiveInt | None = None):
        check_bounds(FiniteLossGuard.__init__, locals())
        self.check_every_n_steps = check_every_n_steps
        self._losses: list[tuple[int, torch.Tensor]] = []  # (global step, loss) since the last check

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._losses = []

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._losses.append((trainer.global_step, loss.detach()))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        every = self.check_every_n_steps or trainer.log_every_n_steps or 1
        if trainer.global_step % every == 0:
            self.check(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Validating (and sampling text from) NaN weights would only fail later; the update since the last
        # training loss may have made them so.
        if not trainer.sanity_checking:
            self.check(trainer, pl_module, weights=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module, weights=True)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Called while the checkpoint is assembled, before anything is written.
        self.check(trainer, pl_module, weights=True)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule | None = None, weights: bool = False) -> None:
        """Raise NonFiniteLossError if any rank has kept a non-finite training loss, or with `weights`, holds
        a non-finite weight (one host read)."""
        losses, self._losses = self._losses, []
        values = [loss.float() for _, loss in losses]
        if weights and pl_module is not None and (params := list(pl_module.parameters())):
            ok = torch.stack([torch.isfinite(local_part(p.detach())).all() for p in params]).all().float()
            values.append(ok.to(values[0].device) if values else ok)
        read = torch.stack(values).cpu() if values else torch.ones(0)
        finite_weights = len(read) == len(losses) or bool(read[-1] == 1)
        bad_step, bad_value = -1, 0.0
        bad = (~torch.isfinite(read[:len(losses)])).nonzero()
        if len(bad):
            i = int(bad[0])
            bad_step, bad_value = losses[i][0], float(read[i])
        if not trainer.strategy.reduce_boolean_decision(bad_step >= 0 or not finite_weights, all=False):
            return
        if bad_step >= 0:
            where = f"is {bad_value} at step {bad_step}"
        elif not finite_weights:
            # The losses were finite: the last update made the weights non-finite.
            bad_step = trainer.global_step
            where = f"was finite, but the update to step {bad_step} made the weights non-finite"
        else:
            where = "became non-finite on another rank"
        evidence, advice = diagnosis(bad_step, getattr(pl_module, "hparams", {}))
        # No checkpoint is written after this point; the command line says which one is kept.
        raise NonFiniteLossError(f"training loss {where}{evidence}; stopped without saving", advice)
