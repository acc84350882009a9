"""Exact resume: training randomness that a restart cannot shift."""

from __future__ import annotations

import os
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from lit_attn.bounds import Seed, check_bounds


class ExactResume(Callback):
    """Makes a resumed run take exactly the steps an uninterrupted one would.

    Dropout draws from the global torch RNG, which other code also consumes
    (every DataLoader iterator draws a worker seed, validation can fall at
    different points). So each training step reseeds torch, numpy and random
    from (seed, global step, rank): step k gets the same masks whenever and
    however often the run was stopped. The RNG states are also stored in the
    checkpoint and restored, so code outside training steps continues its
    streams too. The data order is the train loader's job (datamodules.windows.WindowLoader,
    whose position Lightning saves and restores).

    Args:
        seed: the dropout seed; null: seed_everything's.
    """

    def __init__(self, seed: Seed | None = None):
        check_bounds(ExactResume.__init__, locals())
        self.seed = seed

    def _base_seed(self) -> int:
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        step_seed = hash((self._base_seed(), trainer.global_step, trainer.global_rank)) % 2**31
        # torch.manual_seed would also queue lazy seeding of every accelerator type, at every
        # step; the CPU generator and this rank's device generator are the ones training draws from.
        torch.default_generator.manual_seed(step_seed)
        device = pl_module.device
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.default_generators[index].manual_seed(step_seed)
        elif device.type != "cpu":
            torch.manual_seed(step_seed)
        np.random.seed(step_seed)
        random.seed(step_seed)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state()[1].tolist(),  # plain data: loads with weights_only=True
            "numpy_pos": int(np.random.get_state()[2]),
            "python": [list(random.getstate()[1]), random.getstate()[0]],
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))
        internal, version = state["python"]
        random.setstate((version, tuple(internal), None))
        if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
