"""Recall accuracy (val/mqar_acc) on the query positions of a recall task's validation set, overall and per slice."""

from __future__ import annotations

from typing import Any

import lightning as L
from torchmetrics.classification import MulticlassAccuracy

from lit_attn.transformer import IGNORE_INDEX


class RecallAccuracy(L.Callback):
    """Logs `val/mqar_acc` (accuracy on the labelled query positions) and `val/mqar_acc/<slice>` per test setting.

    Acts only on validation batches `(x, y, slice_index)` from a datamodule with `slice_names` (one name per
    slice index, e.g. "T64_kv4"), such as MQARDataModule; other runs log nothing here (their val/acc is the
    same accuracy over every position). Metrics sync across processes when they are computed.
    """

    def __init__(self) -> None:
        self.overall: MulticlassAccuracy | None = None
        self.slices: list[MulticlassAccuracy] = []
        self.names: list[str] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.names = list(getattr(trainer.datamodule, "slice_names", None) or [])
        if not self.names:
            self.overall = None
            return

        def metric() -> MulticlassAccuracy:
            return MulticlassAccuracy(num_classes=pl_module.config.vocab_size, average="micro",
                                      ignore_index=IGNORE_INDEX).to(pl_module.device)

        self.overall, self.slices = metric(), [metric() for _ in self.names]

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.overall is None or not isinstance(outputs, dict) or len(batch) < 3:
            return
        preds, targets = outputs["preds"], outputs["targets"]  # (N,): the positions the model scored
        slice_of = batch[2][outputs["rows"]]  # (N,): each position's test setting
        self.overall.update(preds, targets)
        for i in slice_of.unique().tolist():
            where = slice_of == i
            self.slices[i].update(preds[where], targets[where])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.overall is None:
            return
        values = {"val/mqar_acc": self.overall.compute()}
        if len(self.names) > 1:  # a slice the validation did not reach (limit_val_batches, sanity check): left out
            values |= {f"val/mqar_acc/{name}": m.compute() for name, m in zip(self.names, self.slices)
                       if m.update_count}
        for tag, value in values.items():
            pl_module.log(tag, value, prog_bar=tag == "val/mqar_acc")
