"""Text generated from fixed prompts at every validation, logged to TensorBoard."""

from __future__ import annotations

import contextlib
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lit_attn.bounds import NonNegativeFloat, NonNegativeInt, PositiveInt, Seed, check_bounds
from lit_attn.training.fit_state import last_step_index
from lit_attn.training.sharding import gathered


class TextSamples(L.Callback):
    """After each validation (not the sanity check): `pl_module.generate` from each prompt,
    encoded and decoded with the datamodule's codec (`trainer.datamodule.codec`, a
    lit_attn.codec codec; a datamodule with only encode/decode serves as its own), logged as
    TensorBoard text under `samples`, at the step val/loss is logged at (`last_step_index`).

    Sampling uses its own seeded RNG stream, so the samples differ between
    validations only because the model changed, and training randomness is not
    disturbed. Skipped without a TensorBoard logger or a datamodule with
    a codec; prompts the vocabulary cannot encode are skipped with a warning.
    Every rank generates (in lock-step, so FSDP can gather the full weights); rank zero logs.

    Args:
        prompts: texts to continue.
        max_new_tokens: tokens generated per prompt (0: none).
        temperature: sampling temperature (0 = greedy).
        top_k: sample among the k most likely tokens only (None = all).
        seed: seed of the sampling stream.
    """

    def __init__(
        self,
        prompts: list[str] | None = None,
        max_new_tokens: NonNegativeInt = 64,
        temperature: NonNegativeFloat = 0.8,
        top_k: PositiveInt | None = 40,
        seed: Seed = 0,
    ):
        check_bounds(TextSamples.__init__, locals())
        self.prompts = list(prompts) if prompts is not None else ["The ", "\n"]
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.seed = seed
        self._warned: set[str] = set()

    def _encoded_prompts(self, codec: Any) -> list[tuple[str, list[int]]]:
        out = []
        for prompt in self.prompts:
            try:
                ids = list(codec.encode(prompt))
            except (ValueError, KeyError) as e:
                if prompt not in self._warned:
                    self._warned.add(prompt)
                    rank_zero_warn(f"TextSamples: skipping prompt {prompt!r}: {e}")
                continue
            if ids:
                out.append((prompt, ids))
        return out

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        tensorboard = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        codec = datamodule_codec(getattr(trainer, "datamodule", None))
        if tensorboard is None or codec is None:
            return
        texts = []
        devices = [pl_module.device] if pl_module.device.type == "cuda" else []
        with full_parameters(trainer), torch.random.fork_rng(devices=devices):  # training RNG streams stay put
            torch.manual_seed(self.seed)
            for prompt, ids in self._encoded_prompts(codec):
                idx = torch.tensor([ids], dtype=torch.long, device=pl_module.device)
                out = pl_module.generate(idx, self.max_new_tokens, temperature=self.temperature, top_k=self.top_k)
                texts.append((prompt, codec.decode(out[0, len(ids):].tolist())))
        if texts and trainer.is_global_zero:
            step = last_step_index(trainer)
            tensorboard.experiment.add_text("samples", markdown(texts, step), step)





def datamodule_codec(datamodule: object) -> Any:
    """The datamodule's codec (its `codec`, else the datamodule itself if it has encode and decode), or None."""
    codec = getattr(datamodule, "codec", None)
    if codec is None and hasattr(datamodule, "encode") and hasattr(datamodule, "decode"):
        codec = datamodule
    return codec if hasattr(codec, "encode") and hasattr(codec, "decode") else None


def full_parameters(trainer: L.Trainer) -> contextlib.AbstractContextManager:
    """Unsharded parameters for calling the module directly: FSDP gathers them on every rank
    (a collective, hence generation on all ranks); other strategies need nothing."""
    if isinstance(trainer.strategy, FSDPStrategy):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False)
    if isinstance(trainer.strategy, ModelParallelStrategy):  # FSDP2 (lit_attn.training.sharding)
        return gathered(trainer.strategy.model, getattr(trainer.strategy, "reshard_after_forward", True))
    return contextlib.nullcontext()


def markdown(texts: list[tuple[str, str]], step: int) -> str:
    """Prompt and continuation per sample; indented blocks keep whitespace and newlines verbatim."""
    parts = [f"step {step}"]
    for prompt, continuation in texts:
        block = "\n".join("    " + line for line in (prompt + continuation).split("\n"))
        parts.append(f"prompt `{prompt!r}`:\n\n{block}")
    return "\n\n".join(parts)
