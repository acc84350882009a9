"""Every use of Lightning's private API in this project, in one place.

Each item below is a read of a private attribute, a private key of Lightning's checkpoint, or a
subclass overriding a private method, where Lightning offers no public way to do what the project
needs; it says why, and what Lightning does (file and function as of Lightning 2.6; `pyproject.toml`
pins the tested range). Nothing here assigns to an object Lightning made. After a Lightning upgrade,
`tests/test_lightning_compat.py` exercises each item against a real Trainer and fails there first,
naming the assumption that broke; it also fails when code outside this file uses a private name.

Nothing here is expensive to import: only Lightning itself.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor, RichModelSummary, RichProgressBar

TESTED_LIGHTNING = (2, 6)  # the minor version these assumptions were checked against (2.6.6)

# The private names used below: tests/test_lightning_private_names.py checks that the list is complete.
PRIVATE_NAMES = (
    "_should_check_val_fx", "_data_fetcher", "_batches_that_stepped", "_get_train_description",
    "_parse_ckpt_path", "_max_depth", "_summarize_kwargs", "_extract_stats",
)


# ---------------------------------------------------------------------------------------------
# When validation runs
# ---------------------------------------------------------------------------------------------

def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the training batch that just ended (asked as Lightning
    will ask, from `on_train_batch_end`); False if the loop's internals are not as expected.

    loops/training_epoch_loop.py, `_TrainingEpochLoop.on_advance_end`: it validates when
    `_should_check_val_fx(data_fetcher)` is true (the schedule: val_check_interval, check_val_every_n_epoch,
    a time interval, a requested stop). The data fetcher is `_FitLoop._data_fetcher` (loops/fit_loop.py).
    The public settings alone cannot say it (a time interval, an iterable dataset's end, ...).
    """
    loop = trainer.fit_loop.epoch_loop
    try:
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    except Exception:  # another Lightning: callers fall back to not waiting for a validation
        return False


def count_replayed_batch_end(checkpoint: dict[str, Any]) -> bool:
    """Count, in a checkpoint written right after a validation that the schedule did not have (the one
    at the end of fit), the end of its batch as Lightning would after replaying it; whether it did (not
    for a checkpoint written later, at the end of training, where the batch is counted already).

    loops/training_epoch_loop.py: the epoch loop counts a batch in `_batches_that_stepped` (the step
    Lightning logs at) after its validation, in `on_advance_end`; on a restart from a checkpoint written
    at a validation's end, `advance` replays that end (and counts the batch) only if its schedule says a
    validation followed that batch, which for this one it does not: the count would stay one short and
    every later validation would log one step early. The count is in the checkpoint under
    loops > fit_loop > epoch_loop.state_dict > `_batches_that_stepped`; edited before Lightning restores it.
    """
    state = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    # One optimizer: a batch that stepped is one global step.
    if state.get("_batches_that_stepped") != checkpoint.get("global_step", 0) - 1:
        return False
    state["_batches_that_stepped"] += 1
    return True


# ---------------------------------------------------------------------------------------------
# Callbacks: subclasses and the settings of the ones Lightning adds
# ---------------------------------------------------------------------------------------------

class RichProgressBarWithDescription(RichProgressBar):
    """RichProgressBar whose training description comes from the public `train_description`.

    callbacks/progress/rich_progress.py, `RichProgressBar._get_train_description(current_epoch)`
    makes "Epoch N/max_epochs-1", which reads "Epoch 0/-2" for a run bounded by max_steps only;
    its constructor options (refresh_rate, leave, theme, console_kwargs) cannot change it.
    """

    def _get_train_description(self, current_epoch: int) -> str:
        return self.train_description(current_epoch)

    def train_description(self, current_epoch: int) -> str:
        """Lightning's description; override to change it."""
        return RichProgressBar._get_train_description(self, current_epoch)


def model_summary_settings(summary: RichModelSummary) -> dict[str, Any]:
    """The constructor arguments a ModelSummary was made with: {"max_depth": ..., **summarize_kwargs}.

    callbacks/model_summary.py, `ModelSummary.__init__` keeps them in `_max_depth` and `_summarize_kwargs`,
    with no accessor; a replacement summary (callbacks.summary) is made with the same ones.
    """
    return {"max_depth": summary._max_depth, **summary._summarize_kwargs}


def monitored_rates(monitor: LearningRateMonitor, trainer: L.Trainer) -> dict[str, float]:
    """Every parameter group's learning rate, under LearningRateMonitor's name for it ("lr-AdamW",
    "lr-AdamW/pg1", "lr-AdamW/NAME", or a scheduler's own name), whatever its scheduler's interval.
    The monitor's `on_train_start` must have run (it names the groups).

    callbacks/lr_monitor.py, `LearningRateMonitor._extract_stats(trainer, interval)` names and reads them (and
    records them in `lrs` and `trainer.callback_metrics`, as the monitor does whenever it logs); its public
    hooks would also log them, at Lightning's own cadence and under those names.
    """
    return monitor._extract_stats(trainer, "any")


# ---------------------------------------------------------------------------------------------
# LightningCLI
# ---------------------------------------------------------------------------------------------

class NoCheckpointHparamsMerge:
    """Mixin for a LightningCLI subclass (list it first): `--ckpt_path` is not read by the CLI.

    cli.py, `LightningCLI.__init__` calls `_parse_ckpt_path`, which torch.loads the checkpoint
    given as --ckpt_path and merges its hyper_parameters into the config, whatever
    `load_from_checkpoint_support` says. This project reads the checkpoint once itself
    (lit_attn/cli/lightning_cli.py, before_instantiate_classes) with one-line errors and checks the
    given settings against it instead.
    """

    def _parse_ckpt_path(self) -> None:
        pass
