"""TimingMonitor's warm-up: the first batches of a run are left out of the logged rates and the end-of-fit means,
the summary says how many, the warm-up's end survives a checkpoint; its options' ranges."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import FakeClock
from lightning.pytorch.trainer.states import RunningStage

import callbacks.timing as timing_module
from callbacks import TimingMonitor

SLOW, FAST, SLOW_BATCHES, STEPS = 0.2, 0.01, 3, 10


class _SlowStart(L.LightningModule):
    """A linear layer whose first SLOW_BATCHES training steps take SLOW seconds of `clock` and the rest FAST: a
    warm-up. Only the steps move the clock, so every time the monitor measures is exact."""

    def __init__(self, clock: FakeClock):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.advance(SLOW if self.global_step < SLOW_BATCHES else FAST)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        return torch.utils.data.DataLoader(data, batch_size=4)


def _fit(monkeypatch, timing: TimingMonitor) -> tuple[list[tuple[int, dict]], str]:
    """(the (batches trained, metrics) TimingMonitor logged, the console) of a STEPS-batch fit of _SlowStart,
    timed by a fake clock."""
    logged: list[tuple[int, dict]] = []
    monkeypatch.setattr(timing_module, "log_metrics",
                        lambda trainer, metrics, step: logged.append((trainer.global_step, metrics)))
    timing.clock = FakeClock()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False, max_steps=STEPS, log_every_n_steps=1, limit_val_batches=0,
                        callbacks=[timing])
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        trainer.fit(_SlowStart(timing.clock))
    return logged, console.getvalue()


@pytest.mark.parametrize(("warmup", "slow_counted"), [
    (0, SLOW_BATCHES), pytest.param(2, 1, marks=pytest.mark.slow), (SLOW_BATCHES, 0),
    pytest.param(SLOW_BATCHES + 2, 0, marks=pytest.mark.slow)])
def test_warmup_batches_are_left_out_of_rates_and_means(warmup, slow_counted, monkeypatch):
    """Three slow batches, then fast ones: the means and every logged rate count only the batches after the
    warm-up; the rates wait for a window (2 batch ends) that starts at the warm-up's end or later."""
    timing = TimingMonitor(window_size=2, warmup_batches=warmup)
    logged, console = _fit(monkeypatch, timing)
    s = timing.summary
    assert (s["batches"], s["warmup_batches"]) == (STEPS, warmup)
    assert s["warmup_time"] == pytest.approx(min(warmup, SLOW_BATCHES) * SLOW + max(warmup - SLOW_BATCHES, 0) * FAST)
    expected = (slow_counted * SLOW + (STEPS - warmup - slow_counted) * FAST) / (STEPS - warmup)
    assert s["time_per_batch"] == pytest.approx(expected)
    assert s["tokens_per_sec"] == pytest.approx(16 * (STEPS - warmup) / (s["train_time"] - s["warmup_time"]))
    assert s["train_time"] == pytest.approx(SLOW_BATCHES * SLOW + (STEPS - SLOW_BATCHES) * FAST)  # the whole run's
    # The first window's batch ends: batch max(warmup, 1) and the one after it.
    batches = [n for n, metrics in logged if "train/time_per_batch" in metrics]
    assert batches == list(range(max(warmup, 1) + 1, STEPS + 1))
    rates = [metrics["train/time_per_batch"] for _, metrics in logged]
    assert (max(rates) > SLOW / 2) == (warmup < SLOW_BATCHES)  # a slow batch in a window only without the warm-up
    assert min(rates) == pytest.approx(FAST)  # a window of fast batches alone
    assert f"| warm-up, left out of the means below | first {warmup} batches," in _rows_text(console)


def _rows_text(console: str) -> str:
    """The console table's rows as `| label | value` lines, whatever its box drawing."""
    rows = [[c.strip() for c in line.strip("│┃ ").split("│")] for line in console.splitlines() if "│" in line]
    return "\n".join(f"| {' | '.join(r)}" for r in rows if len(r) == 2)


def test_a_run_of_warmup_only_has_no_rates(monkeypatch):
    timing = TimingMonitor(window_size=2, warmup_batches=STEPS)
    logged, console = _fit(monkeypatch, timing)
    assert logged == []
    s = timing.summary
    assert (s["batches"], s["warmup_batches"], s["warmup_time"]) == (STEPS, STEPS, s["train_time"])
    assert not {"time_per_batch", "tokens_per_sec", "samples_per_sec", "mfu"} & set(s)
    assert f"| time per batch (mean) | n/a: all {STEPS} batches were warm-up" in _rows_text(console)


def test_timing_syncs_the_gpu_only_at_window_edges_and_the_end():
    timing = TimingMonitor(window_size=20)
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(is_last_batch=False)))
    trainer = SimpleNamespace(log_every_n_steps=25, max_steps=100, fit_loop=loop)
    synced = [i for i in range(1, 101) if timing._needs_sync(trainer, RunningStage.TRAINING, i)]
    # A window of 20 logged at step 25 spans updates 6..25: its first and last timestamps are exact, and
    # so is the end of the warm-up (10 batches by default).
    assert synced == [6, 10, 25, 31, 50, 56, 75, 81, 100]
    assert timing._needs_sync(trainer, RunningStage.VALIDATING, 7)


# (what the checkpoint holds, the warm-up setting of the resumed run -> the warm-up's end it continues from)
WINDOW = {"time": [5.0, 6.0, 7.0], "batches": [11, 12, 13], "samples": [44, 48, 52], "lengths": [176, 192, 208],
          "flops": []}
SAVED = {"time": 4.0, "batches": 10, "samples": 40, "lengths": 160}
RESUMED = [
    (WINDOW | {"warmup_end": SAVED}, 10, SAVED),  # as saved
    (WINDOW, 10, {"time": 5.0, "batches": 11, "samples": 44, "lengths": 176}),  # none saved: the window's first end
    (WINDOW | {"warmup_end": SAVED}, 12, {"time": 6.0, "batches": 12, "samples": 48, "lengths": 192}),  # another N
    (WINDOW | {"warmup_end": SAVED}, 20, None),  # still warming up: its end is yet to come
    (WINDOW, 0, {"time": 0.0, "batches": 0, "samples": 0, "lengths": 0}),  # no warm-up
]


@pytest.mark.parametrize(("state", "warmup", "end"), RESUMED)
def test_a_resumed_run_continues_from_the_warmups_end(state, warmup, end):
    assert timing_module._resumed_warmup_end(state, warmup) == end


def test_the_warmups_end_is_in_the_checkpoint(monkeypatch):
    timing = TimingMonitor(window_size=2, warmup_batches=4)
    _fit(monkeypatch, timing)
    state = timing.state_dict()
    assert state["warmup_end"]["batches"] == 4 and state["batches"] == [STEPS - 1, STEPS]
    assert timing_module._resumed_warmup_end(state, 4) == state["warmup_end"]


def test_a_resumed_runs_table_says_which_times_are_the_whole_runs(monkeypatch):
    """Resumed at 7 s of training and 13 batches: the training time and batches are the whole run's, the wall time
    this fit's (on the fake clock, which only the steps move: 3 slow and 7 fast ones)."""
    timing = TimingMonitor(window_size=2, warmup_batches=0)
    timing.load_state_dict(WINDOW)
    _, console = _fit(monkeypatch, timing)
    this_fit = SLOW_BATCHES * SLOW + (STEPS - SLOW_BATCHES) * FAST
    rows = _rows_text(console)
    assert f"| training time, whole run | {7.0 + this_fit:.2f} s (excl. validation)" in rows
    assert f"| wall time, this fit | {this_fit:.2f} s" in rows
    assert f"| batches, whole run (per device) | {13 + STEPS}" in rows


def test_an_unknown_flops_source_is_a_one_line_error():  # the numeric options' ranges: tests/test_ranges.py
    with pytest.raises(ValueError, match="^flops must be 'measured' or 'analytic', got 'guessed'$"):
        TimingMonitor(flops="guessed")


@pytest.mark.parametrize("options", [{}, {"window_size": 2, "warmup_batches": 0}, {"peak_flops": 9.89e14},
                                     {"peak_flops": 10**15, "warmup_batches": 50}])
def test_options_in_range_are_kept(options):
    timing = TimingMonitor(**options)
    assert timing.warmup_batches == options.get("warmup_batches", 10)
    assert timing.peak_flops == options.get("peak_flops")
