"""GPT as a LightningModule: the Transformer plus loss, metrics, optimizer and LR schedule."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities.enums import GradClipAlgorithmType
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from lit_attn.bounds import NonNegativeFloat, PositiveFloat, PositiveInt, Probability, UnitInterval, check_bounds
from lit_attn.config import GPTConfig
from lit_attn.training.fit_state import attached_trainer
from lit_attn.training.log_cadence import log_step_metrics, logging_reason
from lit_attn.training.muon import MuonWithAdamW
from lit_attn.training.sharding import STRATEGY_NAME, is_sharding, shard_model
from lit_attn.transformer import IGNORE_INDEX, Transformer, strip_compile_prefix

SCHEDULES = ("cosine", "cosine_epochs", "trapezoidal")
OPTIMIZERS = ("adamw", "muon")


class PerplexityFromLoss(MeanMetric):
    """exp of the token-weighted mean cross-entropy.

    torchmetrics' Perplexity takes full (B, T, V) logits and softmaxes them again;
    reusing the loss costs nothing and is the same number.
    """

    def compute(self) -> torch.Tensor:
        return super().compute().exp()


class GPT(L.LightningModule):
    """A GPT language model for training: the Transformer built from the architecture settings
    (GPTConfig's fields, flat: GPT(vocab_size=..., attention="sqa", n_layer=8, lr=5e-4)) plus
    the loss, validation metrics, optimizer and LR schedule.

    Args:
        optimizer: adamw: AdamW for every parameter; muon: Muon (lit_attn.training.muon) for the blocks' 2-D
            matrices (attention and MLP weights) and AdamW for the rest (embeddings, LM head, norms, biases), as
            modded-nanogpt and nanochat train; a resumed fit keeps its checkpoint's optimizer.
        lr: AdamW's learning rate, e.g. 1e-3.
        weight_decay: AdamW's weight decay, e.g. 0.1; it applies to matrices only unless decay_all.
        decay_all: apply weight_decay to every parameter (biases and norm gains too), as torch's AdamW does
            when given all parameters in one group.
        betas: AdamW's betas, e.g. [0.9, 0.95].
        muon_lr: Muon's learning rate (optimizer muon), e.g. 0.02, scaled per matrix by sqrt(max(1, rows/cols)).
        muon_momentum: Muon's Nesterov momentum, e.g. 0.95.
        muon_weight_decay: Muon's decoupled weight decay (the matrices shrink by muon_lr * muon_weight_decay a step).
        schedule: cosine: a linear warm-up, then a cosine decay, updated every optimizer step over total_steps;
            cosine_epochs: the same shape counted in epochs, updated at the end of each epoch over
            trainer.max_epochs (constant within an epoch; with warmup_fraction 0 and min_lr_ratio 0 it is
            torch's CosineAnnealingLR(T_max=max_epochs, eta_min=0) stepped once per epoch); trapezoidal
            (warm-up, stable, decay): the linear warm-up, then constant, then a linear cool-down over the last
            cooldown_fraction of total_steps, to min_lr_ratio at its end.
        warmup_fraction: linear warm-up length as a fraction of the schedule's length.
        min_lr_ratio: the decay's floor as a fraction of the learning rates.
        cooldown_fraction: trapezoidal's cool-down length as a fraction of total_steps, e.g. 0.2.
        total_steps: schedule length of `cosine` and `trapezoidal`; default `trainer.estimated_stepping_batches`.
        sparse_targets: compute the training loss's LM head only at positions that have a target: the same
            loss with far less work where most targets are ignored (recall tasks such as MQAR: 4 of 64);
            leave it off for language modelling, where every position has one.
        compile: torch.compile the network's forward (in place: checkpoints stay interchangeable
            with uncompiled models; the first steps are slow while it compiles).
        init_from: a Hugging Face transformers GPT-2 or Llama model directory (e.g. from `lit-attn export`)
            whose weights start a fresh fit; the architecture settings must match its config (checked
            here). A resumed fit, validate and test use the checkpoint's weights and do not read it.
    """

    def __init__(
        self,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.1,
        betas: tuple[Probability, Probability] = (0.9, 0.95),
        decay_all: bool = False,
        optimizer: Literal["adamw", "muon"] = "adamw",
        muon_lr: PositiveFloat = 0.02,
        muon_momentum: Probability = 0.95,
        muon_weight_decay: NonNegativeFloat = 0.0,
        schedule: Literal["cosine", "cosine_epochs", "trapezoidal"] = "cosine",
        warmup_fraction: UnitInterval = 0.05,
        min_lr_ratio: UnitInterval = 0.1,
        cooldown_fraction: UnitInterval = 0.2,
        total_steps: PositiveInt | None = None,
        compile: bool = False,
        sparse_targets: bool = False,
        init_from: str | None = None,
        **architecture: Any,
    ):
        super().__init__()
        training = {k: v for k, v in locals().items() if k not in ("self", "architecture", "__class__", "init_from")}
        unknown = sorted(set(architecture) - {f.name for f in dataclasses.fields(GPTConfig)})
        if unknown:
            raise ValueError(f"GPT got unknown setting(s) {', '.join(unknown)}; see `python main.py fit --help`")
        check_bounds(GPT.__init__, training)  # each numeric setting's range is its type (lit_attn.bounds)
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; choose {' or '.join(SCHEDULES)}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; choose {' or '.join(OPTIMIZERS)}")
        if schedule == "trapezoidal" and warmup_fraction + cooldown_fraction > 1:
            raise ValueError(f"--model.warmup_fraction {warmup_fraction} and --model.cooldown_fraction "
                             f"{cooldown_fraction} overlap: trapezoidal's warm-up and cool-down must sum to at most 1")
        self.config = GPTConfig(**architecture)
        self.save_hyperparameters({**dataclasses.asdict(self.config), **training})
        self.transformer = Transformer(self.config)
        self._init_from = init_from
        self._step_loss: tuple[int, torch.Tensor, str] | None = None  # train/loss to send after the optimizer step
        if init_from is not None and Path(init_from).expanduser().exists():  # else refused when a fit reads it
            from lit_attn.hf import check_hf_architecture  # transformers is imported only when asked for

            check_hf_architecture(self.config, init_from)
        # Checkpoints of a model wrapped by torch.compile(model) carry "_orig_mod." in their keys.
        self.register_load_state_dict_pre_hook(strip_compile_prefix)
        if compile:
            # nn.Module.compile compiles __call__ in place, so parameter names (and checkpoints) are unchanged.
            self.transformer.compile()

        self.val_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes=self.config.vocab_size, average="micro",
                                          ignore_index=IGNORE_INDEX)
        self.val_ppl = PerplexityFromLoss()
        # The held-out test split's, scored as validation is (the end of fit, `lit-attn test`).
        self.test_loss = MeanMetric()
        self.test_acc = MulticlassAccuracy(num_classes=self.config.vocab_size, average="micro",
                                           ignore_index=IGNORE_INDEX)
        self.test_ppl = PerplexityFromLoss()

    def configure_model(self) -> None:
        """Shard the blocks under a model-parallel strategy (`lit_attn.training.sharding`); else nothing."""
        trainer = attached_trainer(self)
        if trainer is None:
            return
        if self._optimizer() == "muon" and is_sharding(trainer.strategy):
            # Newton-Schulz orthogonalises a whole matrix; a rank holds a shard of each, and a shard's
            # orthogonalisation is not a shard of the matrix's.
            raise ValueError("--model.optimizer muon orthogonalises whole matrices, and under a sharding strategy "
                             "each rank holds a part of each: use --model.optimizer adamw with "
                             f"--trainer.strategy {STRATEGY_NAME}, or muon with ddp")
        shard_model(self, self.transformer, trainer.strategy)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size)."""
        return self.transformer(idx)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of (..., V) logits against (...) targets, IGNORE_INDEX left out."""
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX)

    def _scored(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, targets) of the positions the loss reads: every position, flattened, or with sparse_targets
        the labelled ones only (the LM head runs on those alone)."""
        if self.hparams.sparse_targets:
            labelled = y != IGNORE_INDEX
            return self.transformer(x, select=labelled), y[labelled]
        return self(x).flatten(0, 1), y.flatten()

    def _scored_rows(self, y: torch.Tensor) -> torch.Tensor:
        """The example (row of y) of each position `_scored` returns, in its order."""
        if self.hparams.sparse_targets:
            return (y != IGNORE_INDEX).nonzero()[:, 0]
        return torch.arange(y.size(0), device=y.device).repeat_interleave(y.size(1))

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        logits, targets = self._scored(*batch[:2])
        loss = self._loss(logits, targets)
        self._log_train_loss(loss)
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)  # runs the closure: training_step, backward
        self._log_train_loss()

    def _log_train_loss(self, loss: torch.Tensor | None = None) -> None:
        """train/loss at the first step, every `log_every_n_steps`-th and the last of fit or of an epoch.

        At the steps `log_cadence.logging_reason` names: each self.log costs Python time, and the progress bar
        would read the value back from the device every step. training_step's call shows the loss in the progress
        bar (and callback_metrics); the call after the optimizer step (no device wait before it) sends it to the
        loggers, before the batch-end hooks, so a checkpoint written or a stop made there comes after it. Batches
        that only accumulate gradients reach no optimizer step: the last one's loss is sent. A non-finite loss is
        left out: the curve ends at the last finite one, and the NaN guard stops the run at its next check.
        """
        if loss is None:
            logged, self._step_loss = self._step_loss, None
            value = logged[1].item() if logged is not None else math.nan
            if math.isfinite(value):
                log_step_metrics(self.trainer, {"train/loss": value}, logged[0], logged[2])
            return
        trainer = attached_trainer(self)
        reason = "scheduled" if trainer is None else logging_reason(trainer, trainer.global_step)
        if reason is None:
            return
        # Lightning would write it to the loggers on its own cadence only, and after the batch-end hooks.
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        self._step_loss = None if trainer is None else (trainer.global_step, loss.detach(), reason)

    def on_fit_start(self) -> None:
        # A trainer.validate() before fit leaves the metric states as inference-mode tensors,
        # which fit's validation may not update in place; resetting rebuilds them.
        for metric in (self.val_loss, self.val_acc, self.val_ppl):
            metric.reset()
        if self._init_from is not None and self.trainer.ckpt_path is None:  # a resumed fit keeps its weights
            from lit_attn.hf import load_hf_weights

            load_hf_weights(self.transformer, self._init_from)

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        """Loss, accuracy and perplexity of (x, y[, ...]); returns the scored positions' predictions, targets
        and example rows, for callbacks that score parts of the batch (e.g. per-setting recall accuracy)."""
        logits, targets = self._scored(*batch[:2])
        loss = self._loss(logits, targets)
        n_tokens = (targets != IGNORE_INDEX).sum()
        self.val_loss.update(loss, weight=n_tokens)
        self.val_acc.update(logits, targets)
        self.val_ppl.update(loss, weight=n_tokens)
        self.log("val/loss", self.val_loss, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)
        self.log("val/ppl", self.val_ppl)
        return {"preds": logits.argmax(-1), "targets": targets, "rows": self._scored_rows(batch[1])}

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        """Loss, accuracy and perplexity of (x, y[, ...]), as validation_step's, under test/."""
        logits, targets = self._scored(*batch[:2])
        loss = self._loss(logits, targets)
        n_tokens = (targets != IGNORE_INDEX).sum()
        self.test_loss.update(loss, weight=n_tokens)
        self.test_acc.update(logits, targets)
        self.test_ppl.update(loss, weight=n_tokens)
        self.log("test/loss", self.test_loss)
        self.log("test/acc", self.test_acc)
        self.log("test/ppl", self.test_ppl)

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x = batch[0]
        return self(x)[:, -1].argmax(-1)  # greedy next token per window

    def configure_optimizers(self):
        hp = self.hparams
        groups = [setting | {"params": params} for setting, params in zip(self._group_settings(), self._group_params())]
        # Fused AdamW at full precision and under bf16 autocast (see configure_gradient_clipping);
        # not with fp16's GradScaler, whose unscaling a fused step would do itself, after clipping.
        params = [p for group in groups for p in group["params"]]
        mixed = attached_trainer(self) is not None and "mixed" in str(self.trainer.precision)
        fused = all(p.device.type in ("cuda", "cpu") for p in params) and (not mixed or self._unscaled_amp())
        adamw = {"lr": hp.lr, "betas": tuple(hp.betas), "fused": fused}
        if self._optimizer() == "muon":
            optimizer = MuonWithAdamW(groups[:1], groups[1:], muon={"lr": hp.muon_lr}, adamw=adamw)
        else:
            optimizer = torch.optim.AdamW(groups, **adamw)
        total = self._schedule_length()
        cooldown = hp.cooldown_fraction if hp.get("schedule") == "trapezoidal" else None
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda=lambda step: lr_factor(step, total, hp.warmup_fraction, hp.min_lr_ratio, cooldown)
        )
        self._schedule, self._schedule_total = scheduler, total
        interval = "epoch" if self._schedule_unit() == "epochs" else "step"
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    def _optimizer(self) -> str:
        return self.hparams.get("optimizer", "adamw")  # checkpoints from before the option trained with AdamW

    def _group_params(self) -> list[list[torch.nn.Parameter]]:
        """The trainable parameters of each group, in `_group_settings`' order: with muon, the blocks' 2-D
        matrices first; then (AdamW's) the other matrices, and the vectors (biases, norm gains)."""
        params = [p for p in self.parameters() if p.requires_grad]
        muon = self._optimizer() == "muon"
        hidden = {id(p) for p in self.transformer.blocks.parameters() if p.dim() == 2} if muon else set()
        adamw = [[p for p in params if p.dim() >= 2 and id(p) not in hidden], [p for p in params if p.dim() < 2]]
        return [[p for p in params if id(p) in hidden], *adamw] if muon else adamw

    def _group_settings(self) -> list[dict[str, Any]]:
        """Each parameter group's name and settings (the learning rate before the schedule's factor), in the
        optimizer's order: AdamW's matrices, then its vectors, with Muon's group first where it has one."""
        hp = self.hparams
        decay, no_decay = self._group_decays()
        # Names unique within the optimizer, as LearningRateMonitor (callbacks.lr) requires.
        adamw = [{"name": name, "lr": hp.lr, "weight_decay": d, "betas": tuple(hp.betas)}
                 for name, d in (("adamw", decay), ("adamw_no_decay", no_decay))]
        if self._optimizer() != "muon":
            return adamw
        return [{"name": "muon", "lr": hp.muon_lr, "weight_decay": hp.muon_weight_decay,
                 "momentum": hp.muon_momentum}, *adamw]

    def _schedule_unit(self) -> str:
        return "epochs" if self.hparams.get("schedule", "cosine") == "cosine_epochs" else "steps"

    def _schedule_length(self) -> int:
        """The LR schedule's length: epochs (trainer.max_epochs) for cosine_epochs; else total_steps or the
        trainer's estimate of the optimizer steps."""
        hp = self.hparams
        if self._schedule_unit() == "epochs":
            epochs = self.trainer.max_epochs
            if epochs is None or epochs < 1:
                raise ValueError("--model.schedule cosine_epochs runs over trainer.max_epochs: set "
                                 f"--trainer.max_epochs to a number of epochs >= 1 (got {epochs})")
            return int(epochs)
        total = hp.total_steps if hp.total_steps is not None else self.trainer.estimated_stepping_batches
        if not math.isfinite(total) or total < 1:
            raise ValueError("cannot size the LR schedule: "
                             "set trainer.max_steps, trainer.max_epochs or model.total_steps")
        return int(total)

    def _group_decays(self) -> tuple[float, float]:
        """Weight decay of the two parameter groups: matrices (linear weights, embeddings) decay; biases and norm
        gains do too with decay_all, else not."""
        decay = self.hparams.weight_decay
        return decay, decay if self.hparams.get("decay_all", False) else 0.0

    def on_train_start(self) -> None:
        """Apply this run's optimizer settings from the current step on.

        Resuming restores the optimizer's saved param groups (lr, betas, weight decay, Muon's momentum) and
        the scheduler's base LRs over the ones given now; re-applying them makes a changed
        --model.lr, betas, weight_decay, muon_* or schedule take effect from the resumed step (a
        no-op on a fresh run). Skipped for an optimizer or scheduler this class did not build.
        """
        scheduler = getattr(self, "_schedule", None)
        if scheduler is None or not any(c.scheduler is scheduler for c in self.trainer.lr_scheduler_configs):
            return
        hp = self.hparams
        settings = self._group_settings()
        scheduler.base_lrs = [setting["lr"] for setting in settings]
        for group, setting, factor in zip(scheduler.optimizer.param_groups, settings, scheduler.lr_lambdas):
            group.update(setting, initial_lr=setting["lr"], lr=setting["lr"] * factor(scheduler.last_epoch))
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
        saved = getattr(self, "_saved_schedule_total", None)
        if saved is not None and saved != self._schedule_total:
            unit = self._schedule_unit()
            if unit == "epochs":
                source, keep = "it follows trainer.max_epochs", f"--trainer.max_epochs {saved}"
            else:
                source = ("set by --model.total_steps" if hp.total_steps is not None
                          else "it follows trainer.max_steps")
                keep = f"--model.total_steps {saved}"
            rank_zero_info(
                f"resume: the LR schedule's length changes from {saved} to {self._schedule_total} {unit} from "
                f"{unit[:-1]} {scheduler.last_epoch} on ({source}); pass {keep} to keep it"
            )

    def check_resumable(self, saved: dict[str, Any]) -> None:
        """ValueError for a fit resuming a checkpoint (its hyperparameters `saved`) of another optimizer, whose saved
        state this one cannot continue."""
        trained = saved.get("optimizer", "adamw")  # checkpoints from before the option trained with AdamW
        if trained != self._optimizer():
            raise ValueError(f"--model.optimizer {self._optimizer()}: the checkpoint was trained with {trained}, whose "
                             f"state {self._optimizer()} cannot continue; resume with --model.optimizer {trained}, "
                             "or start a new run")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The schedule's length is not in the scheduler's state (a lambda); kept to notice a change on resume.
        if hasattr(self, "_schedule_total"):
            checkpoint["schedule_total"] = self._schedule_total

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._saved_schedule_total = checkpoint.get("schedule_total")

    def _unscaled_amp(self) -> bool:
        """Lightning's autocast plugin without a GradScaler (bf16-mixed): gradients are the true ones."""
        trainer = attached_trainer(self)
        plugin = trainer.precision_plugin if trainer is not None else None
        return isinstance(plugin, MixedPrecision) and plugin.scaler is None

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning's mixed-precision plugin refuses to clip for any fused optimizer, even under
        # bf16 where no scaler exists and the gradients are the true ones; clip those directly.
        if gradient_clip_val and self._unscaled_amp() and getattr(optimizer, "_step_supports_amp_scaling", False):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if GradClipAlgorithmType(gradient_clip_algorithm or "norm") == GradClipAlgorithmType.VALUE:
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
            else:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **sampling: Any) -> torch.Tensor:
        """Append up to `max_new_tokens` sampled tokens to idx (B, T): `Transformer.generate`."""
        return self.transformer.generate(idx, max_new_tokens, **sampling)


def lr_factor(step: int, total: int, warmup_fraction: float, min_ratio: float,
              cooldown_fraction: float | None = None) -> float:
    """LR multiplier at `step` of a `total`-step schedule: a linear warm-up over warmup_fraction*total steps, then
    a cosine decay to min_ratio at step total; or, with a cooldown_fraction, constant until the last
    cooldown_fraction*total steps, then a linear decay to min_ratio at step total (trapezoidal)."""
    warmup = int(round(warmup_fraction * total))
    if step < warmup:
        return (step + 1) / warmup
    if cooldown_fraction is None:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    cooldown = int(round(cooldown_fraction * total))
    progress = min(1.0, max(0, step - (total - cooldown)) / max(1, cooldown))
    return 1.0 - (1.0 - min_ratio) * progress
