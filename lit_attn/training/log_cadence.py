"""When a training step logs its metrics: one rule for the model's train/loss and the callbacks' per-step
metrics (train/lr), and the record of what a step logged only because fit ends there, which the final
validation reads to hide it when the run is continued."""

from __future__ import annotations

import weakref
from typing import Any, Literal

from lit_attn.training.fit_state import is_last_step, last_step_index, logs_at

Reason = Literal["scheduled", "fit end"]

# Per trainer: (step, tags) logged at that step only because fit ends there.
_FIT_END: weakref.WeakKeyDictionary[Any, tuple[int, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def logging_reason(trainer: Any, step: int, *, also: bool = False) -> Reason | None:
    """Why training step `step` (0-based: `trainer.global_step` before the step runs) logs: "scheduled" at the
    first step, every `log_every_n_steps`-th, an epoch's last batch, or where the caller has a reason of its own
    (`also`); "fit end" where only `max_steps` ending fit at this step makes it log; None: it does not log."""
    # Step 0 never reaches max_steps: is_last_step(trainer, 0, epoch_end=True) is the epoch's end alone.
    if also or step == 0 or logs_at(trainer, step) or is_last_step(trainer, 0, epoch_end=True):
        return "scheduled"
    return "fit end" if is_last_step(trainer, step + 1) else None


def log_step_metrics(trainer: Any, metrics: dict[str, float], step: int, reason: Reason) -> None:
    """Send `metrics` to every logger at training step `step`; where `reason` is "fit end", note their tags."""
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)
    if reason == "fit end":
        noted = _FIT_END.get(trainer)
        earlier = noted[1] if noted is not None and noted[0] == step else ()
        _FIT_END[trainer] = (step, tuple(dict.fromkeys((*earlier, *metrics))))


def fit_end_tags(trainer: Any) -> tuple[str, ...]:
    """The tags the step that just ended logged only because fit ends there."""
    noted = _FIT_END.get(trainer)
    return noted[1] if noted is not None and noted[0] == last_step_index(trainer) else ()
