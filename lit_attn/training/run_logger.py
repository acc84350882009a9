"""The run's TensorBoard logger: what Lightning sends it, less the `epoch` scalar, plus what resuming needs to know."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only


class RunLogger(TensorBoardLogger):
    """TensorBoardLogger that never writes Lightning's automatic `epoch` scalar, and knows its `purge_step`
    and its own event file.

    Lightning adds `epoch` to every batch of metrics it logs without a step (the validation's, the
    epoch's); in TensorBoard it is a card of its own, a staircase that says nothing the step axis does
    not. A metric logged under the name `epoch` is dropped with it.

    Args:
        purge_step: TensorBoard hides the events of earlier writers in this directory at or after this
            step (a resumed run's curves continue without repeats); None: hides nothing.
        **kwargs: TensorBoardLogger's.
    """

    def __init__(self, *args: Any, purge_step: int | None = None, **kwargs: Any) -> None:
        self.purge_step = purge_step
        # A name no other writer's file has: the event file this logger writes is found by it.
        self.event_file_suffix = kwargs.setdefault("filename_suffix", f".{secrets.token_hex(4)}")
        super().__init__(*args, purge_step=purge_step, **kwargs)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        metrics = {key: value for key, value in metrics.items() if key != "epoch"}
        if metrics:
            super().log_metrics(metrics, step)

    @property
    def event_file(self) -> str | None:
        """The path of the event file this logger writes (its writer, made here if not yet, creates it)."""
        self.experiment  # noqa: B018 (the SummaryWriter opens its file when it is made)
        files = sorted(Path(self.log_dir).glob(f"events.out.tfevents.*{self.event_file_suffix}"))
        return str(files[-1]) if files else None


def purge_step(logger: Any) -> int | None:
    """The logger's purge step: a RunLogger's (None for any other logger)."""
    return logger.purge_step if isinstance(logger, RunLogger) else None


def event_file(logger: Any) -> str | None:
    """The event file a RunLogger writes (None for any other logger)."""
    return logger.event_file if isinstance(logger, RunLogger) else None
