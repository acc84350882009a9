"""What TensorBoard shows first: a CUSTOM SCALARS layout with train and validation loss on one chart
(lit_attn.training.run_logger keeps Lightning's `epoch` card out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_attn.training.run_logger import event_file, purge_step

from .timing import TimingMonitor

# Chart title -> tag regexes, in the order the CUSTOM SCALARS tab shows them.
CHARTS = {
    "loss (train, val)": [r"^train/loss$", r"^val/loss$"],
    "val/acc": [r"^val/acc$"],
    "train/time_per_batch (s)": [r"^train/time_per_batch$"],
    "train/tokens_per_sec": [r"^train/tokens_per_sec$"],
    "train/lr": [r"^train/lr(/.*)?$"],
    "val/ppl": [r"^val/ppl$"],
}
MFU_CHART = {"train/device/mfu": [r"^train/device/mfu$"]}  # only where TimingMonitor knows the peak


def layout(mfu: bool = False) -> dict[str, dict[str, list]]:
    """The custom-scalars layout: one category of multiline charts."""
    charts = CHARTS | (MFU_CHART if mfu else {})
    return {"lit-attn": {title: ["Multiline", tags] for title, tags in charts.items()}}


class TensorBoardLayout(L.Callback):
    """At the start of a run's first fit (rank zero), writes the CUSTOM SCALARS layout into its TensorBoard
    directory."""

    @rank_zero_only
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        mfu = any(isinstance(cb, TimingMonitor) and cb.available_flops for cb in trainer.callbacks)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and not logged_before(logger):
                logger.experiment.add_custom_scalars(layout(mfu))


def logged_before(logger: Any) -> bool:
    """Whether the TensorBoard logger's directory holds an event file of an earlier writer
    whose step-0 events stay visible.

    A resumed run's logger purges only the events at or after the checkpoint's step
    (its RunLogger's purge_step), so what its first attempt wrote at step 0 (the layout, the
    parameter table) must not be written twice; a fresh fit purges from step 0 and writes it again.
    """
    if not isinstance(logger, TensorBoardLogger):
        return False
    purge = purge_step(logger)
    if purge is not None and purge <= 0:
        return False
    own = event_file(logger)
    logger.experiment  # noqa: B018 (its SummaryWriter opens its file when it is made)
    files = {str(p) for p in Path(logger.log_dir).glob("events.out.tfevents.*")}
    if own is None:  # an unknown writer: count its own file (the newest) out
        return len(files) > 1
    return bool(files - {str(Path(own))})
