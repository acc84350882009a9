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
        self._validation: dict[str, float] = {}  # the last validation's hp/* sources (val/loss, val/acc)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Counted before the strategy wraps the model: FSDP would show only this rank's shards.
        self._n_params = sum(p.numel() for p in pl_module.parameters())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation = _callback_values(trainer.callback_metrics)

    # A run resumed after its last validation validates no more: the checkpoint carries that
    # validation's results, so its final record has them, as an uninterrupted run's has.
    def state_dict(self) -> dict[str, float]:
        return dict(self._validation)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._validation = {k: float(v) for k, v in state.items()}

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not loggers:
            return
        metrics = collect_metrics(trainer, {**self._validation, **trainer.callback_metrics})
        params = collect_params(trainer, pl_module, self._n_params)
        for logger in loggers:
            # The Fabric base method writes the hparams record and the metric scalars; the
            # PyTorch subclass would also merge these columns into hparams.yaml.
            FabricTensorBoardLogger.log_hyperparams(logger, params, metrics=metrics, step=trainer.global_step)


def _callback_values(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite values of the hp/* metrics that come from trainer.callback_metrics, as floats."""
    keys = [key for source, key in METRICS.values() if source == "callback"]
    values = {k: float(metrics[k]) for k in keys if metrics.get(k) is not None}
    return {k: v for k, v in values.items() if math.isfinite(v)}


def collect_metrics(trainer: L.Trainer, callback_metrics: dict[str, Any] | None = None) -> dict[str, float]:
    """hp/* values available at the end of fit (absent ones are left out, not faked)."""
    timing = next((cb for cb in trainer.callbacks if isinstance(cb, TimingMonitor)), None)
    callback = trainer.callback_metrics if callback_metrics is None else callback_metrics
    sources = {"callback": callback, "timing": timing.summarize(trainer) if timing else {}}
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
