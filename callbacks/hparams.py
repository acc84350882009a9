"""The run's settings and final results in TensorBoard's HPARAMS tab, one row per run."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.fabric.loggers import TensorBoardLogger as FabricTensorBoardLogger
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from .timing import TimingMonitor

# TensorBoard metric tag -> where its value comes from (trainer.callback_metrics or TimingMonitor.summary).
METRICS = {
    "hp/val_loss": ("callback", "val/loss"),
    "hp/val_acc": ("callback", "val/acc"),
    "hp/time_per_batch": ("timing", "time_per_batch"),
    "hp/train_time": ("timing", "train_time"),
    "hp/tokens_per_sec": ("timing", "tokens_per_sec"),
    "hp/mfu": ("timing", "mfu"),
}


class HParamsSummary(L.Callback):
    """At the end of fit (rank zero): one TensorBoard hparams record for the run.

    Columns: the model's hyperparameters (attention, sizes, layout, optimiser),
    `n_params` (all parameters, tied ones once), the query/key-value heads the
    attention really uses, precision, devices and batch size; metrics: the last
    validation loss and accuracy (reduced over all ranks by the model's metrics)
    and, from TimingMonitor, time per batch, training time, tokens/s and MFU.
    The metrics are also written as hp/* scalars, which the tab reads.
    hparams.yaml is left as Lightning wrote it (these extra columns are not
    constructor arguments).
    """

    def __init__(self) -> None:
        self._n_params = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Counted before the strategy wraps the model: FSDP would show only this rank's shards.
        self._n_params = sum(p.numel() for p in pl_module.parameters())

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not loggers:
            return
        metrics = collect_metrics(trainer)
        params = collect_params(trainer, pl_module, self._n_params)
        for logger in loggers:
            # The Fabric base method writes the hparams record and the metric scalars; the
            # PyTorch subclass would also merge these columns into hparams.yaml.
            FabricTensorBoardLogger.log_hyperparams(logger, params, metrics=metrics, step=trainer.global_step)


def collect_metrics(trainer: L.Trainer) -> dict[str, float]:
    """hp/* values available at the end of fit (absent ones are left out, not faked)."""
    timing = next((cb for cb in trainer.callbacks if isinstance(cb, TimingMonitor)), None)
    sources = {"callback": trainer.callback_metrics, "timing": timing.summarize(trainer) if timing else {}}
    out = {}
    for tag, (source, key) in METRICS.items():
        value = sources[source].get(key)
        if value is not None and math.isfinite(float(value)):
            out[tag] = float(value)
    return out


def collect_params(trainer: L.Trainer, pl_module: L.LightningModule, n_params: int) -> dict[str, Any]:
    """The hparams columns: model hyperparameters plus what identifies the run's cost."""
    params: dict[str, Any] = {k: v for k, v in pl_module.hparams.items() if not k.startswith("_")}
    params["n_params"] = n_params
    blocks = getattr(pl_module, "blocks", None)
    if blocks:
        params["attn_query_heads"] = getattr(blocks[0].attn, "n_query_heads", None)
        params["attn_kv_heads"] = getattr(blocks[0].attn, "n_kv_heads", None)
    params["precision"] = str(trainer.precision)
    params["world_size"] = trainer.world_size
    batch_size = getattr(trainer.datamodule, "batch_size", None) if trainer.datamodule is not None else None
    if batch_size is not None:
        params["batch_size_per_device"] = batch_size
    return params
