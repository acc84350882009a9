"""One rule for the steps that log training metrics, and one record of what only the end of fit logged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_attn.training.log_cadence import fit_end_tags, log_step_metrics, logging_reason


class Logger:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


class Trainer(SimpleNamespace):
    """The attributes the rule reads; hashed by identity and weakly referable, as Lightning's Trainer is."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def trainer(step: int, max_steps: int = 10, every: int = 4, last_batch: bool = False) -> Trainer:
    progress = SimpleNamespace(is_last_batch=last_batch)
    return Trainer(global_step=step, max_steps=max_steps, log_every_n_steps=every, loggers=[Logger()],
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))


@pytest.mark.parametrize("step,kw,reason", [
    (0, {}, "scheduled"),  # the first step
    (3, {}, "scheduled"),  # the 4th: every log_every_n_steps-th
    (4, {}, None),
    (5, {"last_batch": True}, "scheduled"),  # an epoch's last batch
    (5, {"also": True}, "scheduled"),  # the caller's own reason (a rising learning rate)
    (9, {}, "fit end"),  # max_steps ends fit at it: logged, but only because fit ends
    (7, {}, "scheduled"),  # the 8th step logs on schedule
    (9, {"max_steps": -1}, None),
])
def test_the_steps_that_log(step, kw, reason):
    also = kw.pop("also", False)
    assert logging_reason(trainer(step, **kw), step, also=also) == reason


def test_what_only_the_end_of_fit_logged_is_read_at_that_step():
    t = trainer(9)
    log_step_metrics(t, {"train/lr": 1e-4}, 9, "fit end")
    log_step_metrics(t, {"train/loss": 2.5}, 9, "fit end")
    log_step_metrics(t, {"train/tokens": 1.0}, 9, "scheduled")
    assert t.loggers[0].logged == [(9, {"train/lr": 1e-4}), (9, {"train/loss": 2.5}), (9, {"train/tokens": 1.0})]
    t.global_step = 10  # the step has ended: the final validation reads the record
    assert fit_end_tags(t) == ("train/lr", "train/loss")
    t.global_step = 11  # a later step (the same trainer fit again): nothing only its end logged
    assert fit_end_tags(t) == ()
    assert fit_end_tags(trainer(10)) == ()  # another trainer's record is its own
