"""Every fit ends with a validation at its last step; a run continued past that end keeps the curves
of one uninterrupted run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lit_attn.training.fit_state import is_last_batch_of_fit, stops_here
from lit_attn.training.lightning_compat import count_replayed_batch_end, validation_follows
from lit_attn.training.log_cadence import fit_end_tags
from lit_attn.training.run_logger import event_file, purge_step

STATE_KEY = "FinalValidation"


class FinalValidation(L.Callback):
    """Validates after fit's last training step (`max_steps` reached, the last batch of the last
    epoch, or a stop asked for at this batch: `max_time`) unless the schedule (`val_check_interval`,
    `check_val_every_n_epoch`) validates there already; nothing when validation is off
    (`limit_val_batches=0`, no validation data).

    The validation runs where Lightning runs scheduled ones, so every callback sees it as one:
    the best checkpoint (monitor val/loss), last.ckpt (written after it), samples and timing. It is
    asked for as an early stop is (`trainer.should_stop` at the last batch: Lightning validates before
    it stops), in an epoch the schedule skips with `check_val_every_n_epoch` lifted for that batch, and
    with `min_steps`/`min_epochs` lifted too: Lightning validates on a stop only once they are met, but
    the fit ends at `max_steps`/`max_epochs` whether they are or not (a `min_steps` alone sets `min_epochs=1`).
    A run stopped by SIGTERM or Ctrl-C before its last step stops without it.

    What the end of fit adds to the curves (this validation, and what the last step logged only because
    fit ends there: `log_cadence.fit_end_tags`) is recorded in the checkpoint. A run resumed from that
    checkpoint to train further (a larger `max_steps` or `max_epochs`) hides the last step's points
    (`resume_purge_step`, the CLI's purge step) and writes back those of them that an uninterrupted run has
    too, so the curves are those of one run.
    """

    def __init__(self) -> None:
        self._end: dict[str, Any] | None = None  # the end of fit: its step and what only the end logged
        self._added = False  # the schedule has no validation at the last step: this callback's is added
        self._every_n_epoch: int | None = None  # check_val_every_n_epoch, lifted for the added validation
        self._minimums: tuple[Any, Any] | None = None  # (min_epochs, min_steps), lifted for it

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._added = False
        # After every callback that may end the fit at a batch (Lightning's Timer for max_time, an early
        # stop), before the checkpoints (Lightning orders them last), which must see the validation.
        others = [c for c in trainer.callbacks if c is not self]
        at = next((i for i, c in enumerate(others) if isinstance(c, Checkpoint)), len(others))
        trainer.callbacks = [*others[:at], self, *others[at:]]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # A checkpoint written after the validation added at its step: Lightning, resuming, would count
        # that step's end as logged only if its schedule had that validation; it is counted here instead.
        end = checkpoint.get("callbacks", {}).get(STATE_KEY, {}).get("end")
        added = end is not None and end["step"] == checkpoint["global_step"] and end["since"] is not None
        if added:
            count_replayed_batch_end(checkpoint)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        end, self._end = self._end, None  # restored from the checkpoint being resumed, if any
        if end is None or not trainer.is_global_zero:
            return
        continues = not (0 < trainer.max_steps <= end["step"]) and not (
            trainer.max_epochs is not None and 0 <= trainer.max_epochs <= end["epochs"])
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and purge_step(logger) == end["step"] - 1:
                rewrite_last_step(logger, end, keep_all=not continues)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not (is_last_batch_of_fit(trainer) or stops_here(trainer)):
            return
        tags = list(fit_end_tags(trainer))
        self._end = {"step": trainer.global_step, "epochs": trainer.current_epoch + 1, "tags": tags, "since": None}
        if trainer.enable_validation and not scheduled_validation_follows(trainer):
            self._added = True
            trainer.should_stop = True  # Lightning validates before a requested stop...
            every = trainer.check_val_every_n_epoch
            if every and (trainer.current_epoch + 1) % every:  # ...in an epoch its schedule validates in
                self._every_n_epoch, trainer.check_val_every_n_epoch = every, None
            # ...and once the minimums are met
            self._minimums = (trainer.fit_loop.min_epochs, trainer.fit_loop.epoch_loop.min_steps)
            trainer.fit_loop.min_epochs, trainer.fit_loop.epoch_loop.min_steps = None, None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_schedule(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_schedule(trainer)

    def _restore_schedule(self, trainer: L.Trainer) -> None:
        if self._every_n_epoch is not None:
            trainer.check_val_every_n_epoch, self._every_n_epoch = self._every_n_epoch, None
        if self._minimums is not None:
            (trainer.fit_loop.min_epochs, trainer.fit_loop.epoch_loop.min_steps), self._minimums = self._minimums, None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._added and self._end is not None and not trainer.sanity_checking and self._end["since"] is None:
            self._end["since"] = time.time()  # what is logged from here on is this validation's

    def state_dict(self) -> dict[str, Any]:
        return {} if self._end is None else {"end": dict(self._end)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._end = dict(state["end"]) if "end" in state else None


def scheduled_validation_follows(trainer: L.Trainer) -> bool:
    """Whether the validation schedule alone has a validation after the batch that just ended. Lightning also
    validates before any stop asked for (max_time's Timer): a run resumed from there, asked for no stop, would not
    replay that validation, so it counts as added at the end of fit."""
    stop, trainer.should_stop = trainer.should_stop, False
    try:
        return validation_follows(trainer)
    finally:
        trainer.should_stop = stop


def resume_purge_step(checkpoint: dict[str, Any]) -> int:
    """The step from which TensorBoard hides what earlier attempts of a run logged, for a fit resumed
    from `checkpoint`: its step, or the step before when the checkpoint was written at the end of a
    fit (FinalValidation then writes back that step's points an uninterrupted run has too)."""
    step = int(checkpoint["global_step"])
    end = checkpoint.get("callbacks", {}).get(STATE_KEY, {}).get("end")
    # At step 1 the step before is 0, where a fit writes its tables anew; the end's points stay.
    return step - 1 if end is not None and end.get("step") == step and step >= 2 else step


def rewrite_last_step(logger: TensorBoardLogger, end: dict[str, Any], keep_all: bool) -> None:
    """Write into the logger's event file the points that earlier event files hold at the step before
    `end["step"]` (which its purge_step hides), leaving out, unless `keep_all`, those only the end logged."""
    step = end["step"] - 1
    own = event_file(logger)
    files = sorted(str(p) for p in Path(logger.log_dir).glob("events.out.tfevents.*") if str(p) != own)
    writer = logger.experiment.file_writer
    for event in visible_events(files, step):
        # The HParams session (callbacks.hparams) is written once, at the end of fit.
        values = [v for v in event.summary.value if v.metadata.plugin_data.plugin_name != "hparams" and (
            keep_all or not (v.tag in end["tags"] or (end["since"] is not None and event.wall_time >= end["since"])))]
        if values:
            del event.summary.value[:]
            event.summary.value.extend(values)
            writer.add_summary(event.summary, event.step, event.wall_time)
    writer.flush()


def visible_events(files: list[str], step: int) -> list[Any]:
    """The summary events at `step` that TensorBoard shows from `files`, read in order: a session start
    (a writer's purge_step) hides the events before it at or after its step."""
    # The raw events: EventFileLoader would turn simple scalar values into tensors, which the
    # scalars of the non-plugin EventAccumulator do not include.
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    kept: list[Any] = []
    for path in files:
        for event in LegacyEventFileLoader(path).Load():
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                kept = [e for e in kept if e.step < event.step]
            elif event.HasField("summary") and event.step == step:
                kept.append(event)
    return kept
