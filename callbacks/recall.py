"""Recall accuracy on the labelled positions of a recall task's validation set (val/mqar_acc, val/passkey_acc),
overall and per slice."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from lit_attn.transformer import IGNORE_INDEX

DEFAULT_TAG = "val/mqar_acc"  # a datamodule's `recall_metric` names its own


class RecallAccuracy(L.Callback):
    """Logs the accuracy on the labelled positions (the queries, the answer) as the datamodule's `recall_metric`
    (default `val/mqar_acc`; PasskeyDataModule's is `val/passkey_acc`), and `<metric>/<slice>` per test setting.
    A datamodule with an `exact_metric` name also gets the share of examples whose labels are all right under it
    (`val/passkey_exact`: with the whole answer right, greedy decoding gives it too).

    Acts only on validation batches `(x, y, slice_index)` from a datamodule with `slice_names` (one name per
    slice index, e.g. "T64_kv4"), such as MQARDataModule; other runs log nothing here (their val/acc is the
    same accuracy over every position). Metrics sync across processes when they are computed.
    """

    def __init__(self) -> None:
        self.overall: MulticlassAccuracy | None = None
        self.slices: list[MulticlassAccuracy] = []
        self.names: list[str] = []
        self.tag = DEFAULT_TAG
        self.exact_tag: str | None = None
        self.exact: MeanMetric | None = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.names = list(getattr(trainer.datamodule, "slice_names", None) or [])
        self.tag = getattr(trainer.datamodule, "recall_metric", None) or DEFAULT_TAG
        if not self.names:
            self.overall = None
            return

        def metric() -> MulticlassAccuracy:
            return MulticlassAccuracy(num_classes=pl_module.config.vocab_size, average="micro",
                                      ignore_index=IGNORE_INDEX).to(pl_module.device)

        self.overall, self.slices = metric(), [metric() for _ in self.names]
        self.exact_tag = getattr(trainer.datamodule, "exact_metric", None)
        self.exact = MeanMetric().to(pl_module.device) if self.exact_tag else None

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
        if self.exact is not None:
            self.exact.update(_all_right(preds, targets, outputs["rows"], len(batch[0])))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.overall is None:
            return
        values = {self.tag: self.overall.compute()}
        if len(self.names) > 1:  # a slice the validation did not reach (limit_val_batches, sanity check): left out
            values |= {f"{self.tag}/{name}": m.compute() for name, m in zip(self.names, self.slices)
                       if m.update_count}
        if self.exact is not None and self.exact.update_count:
            values[self.exact_tag] = self.exact.compute()
        for tag, value in values.items():
            pl_module.log(tag, value, prog_bar=tag == self.tag)


def _all_right(preds: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """1.0 per example (row) whose labelled positions are all predicted right, else 0.0; unlabelled rows left out."""
    labelled = targets != IGNORE_INDEX
    rows = rows[labelled]
    wrong = torch.zeros(n_rows, device=rows.device).index_add_(0, rows, (preds[labelled] != targets[labelled]).float())
    has_labels = torch.bincount(rows, minlength=n_rows) > 0
    return (wrong[has_labels] == 0).float()
