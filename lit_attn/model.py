"""GPT language model as a LightningModule, with a pluggable attention block."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities.enums import GradClipAlgorithmType
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from .analytic import ffn_hidden_size
from .attention import build_attention
from .lightning_compat import attached_trainer, is_last_step, should_log_now

IGNORE_INDEX = -100  # target value excluded from loss and metrics


class PerplexityFromLoss(MeanMetric):
    """exp of the token-weighted mean cross-entropy.

    torchmetrics' Perplexity takes full (B, T, V) logits and softmaxes them again;
    reusing the loss costs nothing and is the same number.
    """

    def compute(self) -> torch.Tensor:
        return super().compute().exp()


def make_norm(kind: str, dim: int, bias: bool) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=1e-5)
    raise ValueError(f"unknown norm {kind!r}; choose layernorm or rmsnorm")


class FeedForward(nn.Module):
    """GELU MLP or SwiGLU; the output projection is `out_proj` (scaled residual init)."""

    def __init__(self, kind: str, n_embd: int, hidden: int, bias: bool, dropout: float):
        super().__init__()
        if kind not in ("gelu", "swiglu"):
            raise ValueError(f"unknown ffn {kind!r}; choose gelu or swiglu")
        self.kind = kind
        # SwiGLU's gate and up projections are fused into one matmul.
        self.in_proj = nn.Linear(n_embd, hidden * (2 if kind == "swiglu" else 1), bias=bias)
        self.out_proj = nn.Linear(hidden, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.dropout(self.out_proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, attn: nn.Module, ffn: FeedForward, norm: str, n_embd: int, bias: bool):
        super().__init__()
        self.norm1 = make_norm(norm, n_embd, bias)
        self.attn = attn
        self.norm2 = make_norm(norm, n_embd, bias)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class GPT(L.LightningModule):
    """Decoder-only transformer whose attention comes from the registry by name.

    Args:
        vocab_size: number of token ids (linked from the datamodule by the CLI).
        attention: registered attention name (mha, gqa, mqa, sqa, ssqa, xsqa, xsmqa, noq, ...).
        n_layer, n_embd, n_head: depth, width and total heads (head size = n_embd / n_head).
        n_query_heads, n_kv_heads: override the attention preset's head counts.
        block_size: context length (linked to the datamodule by the CLI).
        norm: layernorm | rmsnorm.  pos: learned | rope.  ffn: gelu | swiglu.
        ffn_hidden: FFN width; default 4*n_embd (gelu) or 8/3*n_embd rounded up to 64 (swiglu).
        bias: biases in linear layers and LayerNorms; the LM head has one only if untied.
        qkv_bias: bias on the q/k/v projections (default: same as `bias`).
        tie_embeddings: share the token embedding with the LM head.
        final_norm: normalise before the LM head (the seed-002 reference layout has none).
        dropout: dropout on embeddings, attention weights and residual branches.
        attention_options: extra keyword options for the chosen attention.
        lr, weight_decay, betas: AdamW; weight decay applies to matrices only.
        warmup_fraction: linear warm-up length as a fraction of the total steps.
        min_lr_ratio: cosine decay floor as a fraction of lr.
        total_steps: schedule length; default `trainer.estimated_stepping_batches`.
        compile: torch.compile the model's forward (in place: checkpoints stay interchangeable
            with uncompiled models; the first steps are slow while it compiles).
    """

    def __init__(
        self,
        vocab_size: int,
        attention: str = "mha",
        n_layer: int = 4,
        n_embd: int = 128,
        n_head: int = 8,
        n_query_heads: int | None = None,
        n_kv_heads: int | None = None,
        block_size: int = 128,
        norm: str = "layernorm",
        pos: str = "learned",
        ffn: str = "gelu",
        ffn_hidden: int | None = None,
        bias: bool = True,
        qkv_bias: bool | None = None,
        tie_embeddings: bool = True,
        final_norm: bool = True,
        dropout: float = 0.0,
        attention_options: dict[str, Any] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_fraction: float = 0.05,
        min_lr_ratio: float = 0.1,
        total_steps: int | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        for name, value in (("vocab_size", vocab_size), ("n_layer", n_layer), ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if pos not in ("learned", "rope"):
            raise ValueError(f"unknown pos {pos!r}; choose learned or rope")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), e.g. [0.9, 0.95]; got {list(betas)}")
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise ValueError(
                f"total_steps must be a positive integer, or null for the trainer's estimate; got {total_steps!r}"
            )
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2 for a language model, got {vocab_size}")
        if not 0.0 <= warmup_fraction <= 1.0 or not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError("warmup_fraction and min_lr_ratio must be in [0, 1]")
        ffn_hidden = ffn_hidden_size(n_embd, ffn, ffn_hidden)

        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd) if pos == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(
                build_attention(
                    attention,
                    attention_options,
                    n_embd=n_embd,
                    n_head=n_head,
                    n_query_heads=n_query_heads,
                    n_kv_heads=n_kv_heads,
                    block_size=block_size,
                    dropout=dropout,
                    bias=bias,
                    qkv_bias=qkv_bias,
                    rope=pos == "rope",
                ),
                FeedForward(ffn, n_embd, ffn_hidden, bias, dropout),
                norm,
                n_embd,
                bias,
            )
            for _ in range(n_layer)
        )
        self.norm_f = make_norm(norm, n_embd, bias) if final_norm else nn.Identity()
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=bias and not tie_embeddings)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) keep the residual stream's variance flat.
        for name, p in self.named_parameters():
            if name.endswith("out_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

        # Built once: a fresh arange per step would be a host-side op in the hot path.
        self.register_buffer("positions", torch.arange(block_size), persistent=False)
        # Checkpoints of a model wrapped by torch.compile(model) carry "_orig_mod." in their keys.
        self.register_load_state_dict_pre_hook(_strip_compile_prefix)
        if compile:
            # nn.Module.compile compiles __call__ in place, so parameter names (and checkpoints) are unchanged.
            self.compile()

        self.val_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes=vocab_size, average="micro", ignore_index=IGNORE_INDEX)
        self.val_ppl = PerplexityFromLoss()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size)."""
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(self.positions[:T])
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self._loss(self(x), y)
        if self._is_logging_step():
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def _is_logging_step(self) -> bool:
        """Logging steps, the first and the last step of fit (or of an epoch).

        train/loss is logged only then: each self.log costs Python time, and showing the
        value in the progress bar would read it back from the device every step.
        """
        trainer = attached_trainer(self)
        if trainer is None:
            return True
        step = trainer.global_step
        return step == 0 or is_last_step(trainer, step + 1, epoch_end=True) or should_log_now(trainer)

    def on_fit_start(self) -> None:
        # A trainer.validate() before fit leaves the metric states as inference-mode tensors,
        # which fit's validation may not update in place; resetting rebuilds them.
        for metric in (self.val_loss, self.val_acc, self.val_ppl):
            metric.reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        loss = self._loss(logits, y)
        n_tokens = (y != IGNORE_INDEX).sum()
        self.val_loss.update(loss, weight=n_tokens)
        self.val_acc.update(logits.flatten(0, 1), y.flatten())
        self.val_ppl.update(loss, weight=n_tokens)
        self.log("val/loss", self.val_loss, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)
        self.log("val/ppl", self.val_ppl)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        loss = self._loss(self(x), y)
        self.log("test/loss", loss, batch_size=int((y != IGNORE_INDEX).sum()))

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, _ = batch
        return self(x)[:, -1].argmax(-1)  # greedy next token per window

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        decay, no_decay = self._group_decays()
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": no_decay},
        ]
        # Fused AdamW at full precision and under bf16 autocast (see configure_gradient_clipping);
        # not with fp16's GradScaler, whose unscaling a fused step would do itself, after clipping.
        mixed = attached_trainer(self) is not None and "mixed" in str(self.trainer.precision)
        fused = all(p.device.type in ("cuda", "cpu") for p in params) and (not mixed or self._unscaled_amp())
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), fused=fused)
        total = hp.total_steps if hp.total_steps is not None else self.trainer.estimated_stepping_batches
        if not math.isfinite(total) or total < 1:
            raise ValueError("cannot size the LR schedule: "
                             "set trainer.max_steps, trainer.max_epochs or model.total_steps")
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda=lambda step: lr_factor(step, int(total), hp.warmup_fraction, hp.min_lr_ratio)
        )
        self._schedule, self._schedule_total = scheduler, int(total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _group_decays(self) -> tuple[float, float]:
        """Weight decay of the two parameter groups: matrices (linear weights, embeddings) decay;
        biases and norm gains do not."""
        return self.hparams.weight_decay, 0.0

    def on_train_start(self) -> None:
        """Apply this run's optimizer settings from the current step on.

        Resuming restores the optimizer's saved param groups (lr, betas, weight decay) and
        the scheduler's base LRs over the ones given now; re-applying them makes a changed
        --model.lr, betas, weight_decay or schedule take effect from the resumed step (a
        no-op on a fresh run). Skipped for an optimizer or scheduler this class did not build.
        """
        scheduler = getattr(self, "_schedule", None)
        if scheduler is None or not any(c.scheduler is scheduler for c in self.trainer.lr_scheduler_configs):
            return
        hp = self.hparams
        scheduler.base_lrs = [hp.lr] * len(scheduler.optimizer.param_groups)
        for group, decay, factor in zip(scheduler.optimizer.param_groups, self._group_decays(), scheduler.lr_lambdas):
            group.update(weight_decay=decay, betas=tuple(hp.betas), initial_lr=hp.lr,
                         lr=hp.lr * factor(scheduler.last_epoch))
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
        saved = getattr(self, "_saved_schedule_total", None)
        if saved is not None and saved != self._schedule_total:
            source = "set by --model.total_steps" if hp.total_steps is not None else "it follows trainer.max_steps"
            rank_zero_info(
                f"resume: the LR schedule's length changes from {saved} to {self._schedule_total} steps from step "
                f"{scheduler.last_epoch} on ({source}); pass --model.total_steps {saved} to keep it"
            )

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

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None
    ) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to idx (B, T); temperature 0 is greedy."""
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            # forward, not __call__: with compile=True every new length would trigger a recompilation
            logits = self.forward(idx[:, -self.block_size :])[:, -1, :].float()  # (B, V)
            if temperature == 0:
                next_id = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, next_id], dim=1)
        self.train(was_training)
        return idx


def _strip_compile_prefix(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    for key in [k for k in state_dict if "_orig_mod." in k]:
        state_dict[key.replace("_orig_mod.", "")] = state_dict.pop(key)


def lr_factor(step: int, total: int, warmup_fraction: float, min_ratio: float) -> float:
    """LR multiplier: linear warm-up over warmup_fraction*total steps, then cosine to min_ratio."""
    warmup = int(round(warmup_fraction * total))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
