"""Periodic `last.ckpt` that is also written at the end of fit and on SIGTERM / Ctrl-C, on one or many ranks."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lit_attn.bounds import NonNegativeInt, PositiveFloat, check_bounds
from lit_attn.training.fit_state import is_last_step, stops_here
from lit_attn.training.lightning_compat import validation_follows


class StopRequested(KeyboardInterrupt):
    """Ctrl-C, raised at a step boundary after the checkpoint was written."""


class Preempted(SIGTERMException):
    """SIGTERM, raised on every rank at the same step boundary after last.ckpt was written.

    A SystemExit without a code: the process ends with exit status 0, like Lightning's own
    SIGTERMException, so a scheduler sees a clean stop.
    """


# Indices of the stop flags that StopSignals keeps and agrees on.
TERM, INT, TIME = 0, 1, 2


class StopSignals:
    """SIGTERM and Ctrl-C as flags that every rank acts on at the same step boundary.

    The handlers only set a flag of this process: no collective, no I/O (but the one
    unbuffered Ctrl-C notice), so a signal may land anywhere, even inside a collective or
    a checkpoint write. Lightning's own SIGTERM handler broadcasts inside the handler and
    forwards the signal to the other local ranks (signal_connector.py, `_sigterm_notifier_fn`):
    when the scheduler signals every rank, the ranks' collectives no longer match and the job
    hangs. So these handlers replace Lightning's from the start of training (or of the sanity
    check) on; Lightning's per-step broadcast of its own flag then always sends 0.

    `exchange` is the agreement: the elementwise MAX over ranks of each rank's flags (an OR),
    on a gloo group of its own, so it needs no GPU sync. Asynchronously by default: the
    reduction started at one step boundary is awaited at the next, so every rank gets the
    same answer one step later, without waiting for the other ranks at every step. One
    process needs no agreement and pays nothing: its own flags are the answer, at once.
    """

    def __init__(self) -> None:
        # [SIGTERM seen, Ctrl-C seen, time-interval generation]; written by the handlers and the callback.
        self.flags = [0, 0, -1]
        self.rank = 0
        self._group: Any = None
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._previous: dict[int, Any] = {}

    # ---- handlers ----

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.flags[TERM] = 1

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.flags[INT]:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.flags[INT] = 1
        if self.rank == 0:  # os.write: a print here could re-enter a print the main thread was in
            os.write(2, b"\nCtrl-C: saving last.ckpt at the end of this step (press again to abort at once)\n")

    def install(self) -> None:
        """Make the handlers current (main thread only); idempotent, remembers what they replaced."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint)):
            if signal.getsignal(signum) != handler:
                previous = signal.signal(signum, handler)
                self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Put back the handlers that `install` replaced, unless someone replaced ours since."""
        if threading.current_thread() is not threading.main_thread():
            return
        ours = {signal.SIGTERM: self._on_sigterm, signal.SIGINT: self._on_sigint}
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == ours[signum] and previous is not None:
                signal.signal(signum, previous)
        self._previous = {}

    # ---- agreement across ranks ----

    def connect(self, trainer: L.Trainer) -> None:
        """Create the agreement's process group (every rank calls this, in setup)."""
        self.rank = trainer.global_rank
        if self._group is None and trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")

    def disconnect(self) -> None:
        self._pending = None
        if self._group is not None:
            if dist.is_initialized():
                dist.destroy_process_group(self._group)
            self._group = None

    def exchange(self, wait: bool = False) -> list[int]:
        """The flags of all ranks, reduced by MAX; every rank must call this at the same points.

        wait=False returns the flags as they were at the previous call (0s at the first) and
        starts the reduction of the current ones; wait=True also reduces the current ones now.
        """
        local = list(self.flags)
        if self._group is None:
            return local
        agreed = self.drain()
        flags = torch.tensor(local, dtype=torch.int64)  # a CPU tensor: gloo, no device sync
        if wait:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
            return [max(a, int(b)) for a, b in zip(agreed, flags.tolist())]
        self._pending = (dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flags)
        return agreed

    def drain(self) -> list[int]:
        """The result of the reduction in flight (0s and -1 if none), after waiting for it."""
        if self._pending is None:
            return [0, 0, -1]
        work, flags = self._pending
        self._pending = None
        work.wait()
        return [int(v) for v in flags.tolist()]


def drop_missing_best(callback: ModelCheckpoint) -> list[str]:
    """Remove the files that are gone from a restored ModelCheckpoint's best-k list (a killed attempt
    removed them after the checkpoint that holds the list was written) and set its best and k-th best
    from what is left, as ModelCheckpoint itself would; the paths dropped."""
    missing = [path for path in callback.best_k_models if not os.path.exists(path)]
    if not missing:
        return []
    for path in missing:
        del callback.best_k_models[path]
    scores = callback.best_k_models
    best, worst = (min, max) if callback.mode == "min" else (max, min)
    if scores:
        callback.best_model_path = best(scores, key=scores.get)
        callback.best_model_score = scores[callback.best_model_path]
        callback.kth_best_model_path = worst(scores, key=scores.get)
        callback.kth_value = scores[callback.kth_best_model_path]
    else:
        callback.best_model_path, callback.best_model_score, callback.kth_best_model_path = "", None, ""
        callback.kth_value = torch.tensor(torch.inf if callback.mode == "min" else -torch.inf)
    rank_zero_info(f"{type(callback).__name__}: {', '.join(missing)} no longer on disk; "
                   f"dropped from its best {callback.save_top_k}")
    return missing


def _rebased(state: dict[str, Any], dirpath: str) -> dict[str, Any]:
    """A ModelCheckpoint's saved state with every file it names moved, by name, into `dirpath`."""
    def moved(path: Any) -> Any:
        return str(Path(dirpath) / Path(path).name) if path else path

    state = dict(state, dirpath=dirpath, best_k_models={moved(k): v for k, v in state.get("best_k_models", {}).items()})
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = moved(state[key])
    return state


class LastCheckpoint(ModelCheckpoint):
    """Keeps the run's one `checkpoints/last.ckpt` current: every `every_n_train_steps`
    and/or every `every_minutes` of training, at the end of fit, and when the run is
    stopped by SIGTERM (cluster preemption) or Ctrl-C.

    There is exactly one such file per run, whatever the settings of the run that
    wrote it: the callback's state key is fixed and Lightning's `last-v1.ckpt`
    versioning is off, so changing the frequency or moving the run directory never
    leaves a stale `last.ckpt` beside a newer one.

    A checkpoint is written at the end of a step: after the step's metrics were logged
    and, when a validation follows the step, after that validation (its metrics and text
    samples) too. Every logger is flushed first, so the TensorBoard history a resume
    continues from is on disk whenever the checkpoint is, and a resumed run neither
    re-runs nor loses a validation.

    SIGTERM and Ctrl-C only set a flag (see StopSignals); at the next step boundary all
    ranks agree on it, write last.ckpt together and stop: SIGTERM with exit status 0,
    Ctrl-C as Lightning does (status 1). A stop that falls on a step with a validation
    waits for the end of that validation. Under DDP the ranks agree one step later (the
    agreement is asynchronous), whichever ranks got the signal. A second Ctrl-C
    interrupts at once. Other exceptions (a non-finite loss, a crash mid-step) save
    nothing: the periodic checkpoint stays the newest.

    Built on ModelCheckpoint (its last.ckpt naming, state, loggers' notice); what it adds is when to save.
    Lightning's OnExceptionCheckpoint is not used: it saves on any exception, which would put a non-finite
    loss's weights over the last good checkpoint; and ModelCheckpoint's step and time triggers exclude each
    other and fire before a step's validation, which a run resumed from that checkpoint would skip.

    Args:
        every_n_train_steps: save every this many optimizer steps (0: only at the end and on a stop).
        every_minutes: also save when this many minutes of training passed since the last save (null: off).
    """

    def __init__(self, every_n_train_steps: NonNegativeInt = 250, every_minutes: PositiveFloat | None = None):
        check_bounds(LastCheckpoint.__init__, locals())
        # Lightning makes step and time intervals exclusive; the time one is kept here instead.
        # Its step trigger is not used either: this class decides when to save (see on_train_batch_end).
        super().__init__(every_n_train_steps=every_n_train_steps, save_last=True, save_top_k=0,
                         enable_version_counter=False)
        self.every_n_train_steps = every_n_train_steps
        self.every_minutes = every_minutes
        self._last_save_time = time.monotonic()
        self._saves = 0  # checkpoints written in this fit (the same count on every rank)
        self._after_validation: str | bool | None = None  # a save (True) or stop ("SIGTERM"/"Ctrl-C") deferred
        self._signals = StopSignals()
        self.saved_step = 0  # the global step of this callback's latest save in this process

    @property
    def state_key(self) -> str:
        # Lightning keys the state by the save frequency; a resumed run with another
        # frequency would not find it and would version the file as last-v1.ckpt.
        return "LastCheckpoint"

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A run directory moved to another --runs_dir: the saved paths name the old place, and
        # Lightning would warn that they "won't be reloaded". Nothing is lost: last.ckpt is found
        # by name in the run's own directory, and this callback keeps no best-k state.
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Before Lightning restores the checkpoint callbacks' states: rebase them onto the run's own directory when
        the run was copied or moved (fit), leave them out for an evaluation."""
        states = checkpoint.get("callbacks") or {}
        for callback in trainer.checkpoint_callbacks:
            state = states.get(callback.state_key)
            if not isinstance(state, dict) or state.get("dirpath") in (None, callback.dirpath):
                continue
            if trainer.state.fn != TrainerFn.FITTING:
                # An evaluation saves no checkpoint, and its checkpoint callbacks resolve their directory into the
                # evaluation's own log directory (RUN/eval/validate-N/checkpoints): the training's best-k paths
                # have nothing to be restored against there (Lightning would warn "The dirpath has changed").
                del states[callback.state_key]
            elif callback.dirpath == self.dirpath and Path(state["dirpath"]).name == "checkpoints":
                # The run's checkpoints directory, saved under the place the run was trained in: the run was
                # copied or moved. Its best-k files are the ones of that name here, never the other place's.
                states[callback.state_key] = _rebased(state, callback.dirpath)

    # ---- signals ----

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        self._signals = StopSignals()
        self._signals.connect(trainer)
        self._after_validation = None
        self._saves = 0

    def _take_over_signals(self, trainer: L.Trainer) -> None:
        """Replace Lightning's SIGTERM handler (installed just before the sanity check and training) by ours;
        a SIGTERM it caught meanwhile is ours to act on, agreed at once (every rank is here), so every rank
        stops at the first step boundary, before Lightning's loop would act on its own flag."""
        self._signals.install()
        if trainer.received_sigterm:
            self._signals.flags[TERM] = 1
        self._signals.flags[TERM] = self._signals.exchange(wait=True)[TERM]

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._take_over_signals(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._take_over_signals(trainer)
        self._last_save_time = time.monotonic()
        for callback in trainer.checkpoint_callbacks:
            if callback is not self and isinstance(callback, ModelCheckpoint):
                drop_missing_best(callback)

    # ---- when to save ----

    def _time_due(self) -> bool:
        return self.every_minutes is not None and time.monotonic() - self._last_save_time >= 60 * self.every_minutes

    def _agree(self, wait: bool = False) -> tuple[bool, str | None]:
        """(a time-interval save is due, the stop to make) as all ranks agree."""
        # The time flag carries the save count it was raised at, so a reduction that was in
        # flight during a save does not ask for a second one.
        self._signals.flags[TIME] = self._saves if self._time_due() else -1
        term, intr, time_gen = self._signals.exchange(wait=wait)
        stop = "SIGTERM" if term else "Ctrl-C" if intr else None
        return time_gen >= self._saves, stop

    def _agree_with_deferred(self, wait: bool = False) -> tuple[bool, bool | str | None, str | None]:
        """(time-interval save due, the save or stop deferred to this point, the stop to make now)."""
        time_due, stop = self._agree(wait)
        deferred, self._after_validation = self._after_validation, None
        return time_due, deferred, stop or (deferred if isinstance(deferred, str) else None)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        time_due, deferred, stop = self._agree_with_deferred()  # a deferral here: no validation came after all
        step_due = self.every_n_train_steps > 0 and trainer.global_step % self.every_n_train_steps == 0
        # The final step (max_steps, or a stop asked for at this batch: max_time, an early stop)
        # is saved here rather than in on_train_end: by then Lightning has marked the epoch
        # complete, and a mid-epoch run resumed from that state would start the next epoch
        # instead of finishing this one.
        final = is_last_step(trainer) or stops_here(trainer)
        if not (step_due or time_due or final or stop or deferred):
            return
        if validation_follows(trainer):  # False for another Lightning: save at the batch end, as before
            # Saving now would put the checkpoint before this step's validation, which a run
            # resumed from it skips (Lightning treats a batch-end checkpoint's validation as
            # done): a stop during that validation would lose it. Save at its end instead.
            self._after_validation = stop or True
            return
        # This step's own metrics are in the loggers already (GPT.optimizer_step, the callbacks' batch hooks,
        # which run before this one: Lightning calls checkpoint callbacks last).
        self._save_now(trainer)
        if stop:
            self._stop(trainer, stop)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        # Every rank validates at the same steps, so a blocking agreement here costs nothing
        # extra, and it also sees a signal that arrived during the validation.
        time_due, deferred, stop = self._agree_with_deferred(wait=True)
        # A stop asked for at this validation (an early stop) ends the fit: saved here for the reason
        # the final step is saved at its batch end (see on_train_batch_end).
        if deferred or time_due or stop or stops_here(trainer):
            self._save_now(trainer)  # after the validation's metrics and samples were logged
        if stop:
            self._stop(trainer, stop)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Nothing: saves happen at step ends (ModelCheckpoint would re-save last.ckpt here)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._signals.drain()
        self._signals.restore()
        self._save_now(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._signals.restore()
        # A SIGTERM that Lightning itself turned into an exception between steps (one process:
        # no agreement needed). Ours (Preempted) has saved already.
        if isinstance(exception, SIGTERMException) and not isinstance(exception, Preempted) and trainer.world_size == 1:
            self._save_now(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._signals.restore()
        if stage == "fit":
            self._signals.disconnect()

    # ---- saving and stopping ----

    def _save_now(self, trainer: L.Trainer) -> None:
        if self.saved_step != trainer.global_step and not trainer.sanity_checking:
            for logger in trainer.loggers:  # every event of the steps this checkpoint covers is on disk first
                logger.save()
            # As ModelCheckpoint saves its last.ckpt, whose own triggers this class replaces.
            self.last_model_path = self.format_checkpoint_name({}, self.CHECKPOINT_NAME_LAST)
            trainer.save_checkpoint(self.last_model_path, self.save_weights_only)
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.after_save_checkpoint(proxy(self))
            self.saved_step = trainer.global_step
            self._last_save_time = time.monotonic()
            self._saves += 1

    def _stop(self, trainer: L.Trainer, reason: str) -> None:
        rank_zero_info(f"{reason}: stopped after step {trainer.global_step}, last.ckpt is saved; "
                       f"resume with --ckpt_path last")
        self._signals.drain()  # every rank is here: the reduction in flight completes
        self._signals.restore()
        raise Preempted() if reason == "SIGTERM" else StopRequested()
