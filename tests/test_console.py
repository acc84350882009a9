"""What a fit prints besides its own tables: no known third-party warnings, no uncounted FLOPs, an honest it/s."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import FakeClock
from lightning.pytorch.callbacks import RichModelSummary, RichProgressBar
from rich import get_console

import callbacks.progress as progress_module
from callbacks import StepProgressBar, TimingMonitor, UseStepProgressBar, ValidationLines
from callbacks.summary import CountedFlopsModelSummary
from lit_attn.cli.console import quiet_known_warnings

LEAF_SPEC = ("`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and "
             "treespec.is_leaf()` instead.")
PYTREE = "lightning.pytorch.utilities._pytree"


def _shown(message: str, category: type[Warning], module: str) -> bool:
    """Whether a warning attributed to `module` gets through the filters as they are now."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit(message, category, filename=f"{module.replace('.', '/')}.py", lineno=21, module=module)
    return bool(caught)


def test_quiet_known_warnings_hides_exactly_the_leafspec_deprecation():
    with warnings.catch_warnings():  # the filters are restored afterwards
        warnings.simplefilter("always")
        assert _shown(LEAF_SPEC, FutureWarning, PYTREE)
        quiet_known_warnings()
        quiet_known_warnings()  # once or twice: the same single filter
        assert sum(f[0] == "ignore" and f[3] is not None and "_pytree" in f[3].pattern for f in warnings.filters) == 1
        assert not _shown(LEAF_SPEC, FutureWarning, PYTREE)
        # The same words from other code, other words from that module, another category: all still shown.
        assert _shown(LEAF_SPEC, FutureWarning, "lit_attn.training.model")
        assert _shown(LEAF_SPEC, FutureWarning, "lightning.pytorch.utilities._pytree_extra")
        assert _shown("`isinstance(x, Foo)` is deprecated", FutureWarning, PYTREE)
        assert _shown(LEAF_SPEC, UserWarning, PYTREE)
        assert _shown("The dataloader does not have many workers", UserWarning, "lightning.pytorch.trainer")


def test_quiet_known_warnings_hides_lightnings_real_call():
    from lightning.pytorch.utilities._pytree import _tree_flatten

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _tree_flatten({"a": 1})
    # With the pinned torch and Lightning the warning is real; if an upgrade drops it, so can the filter.
    assert any("LeafSpec" in str(w.message) for w in caught), "no LeafSpec warning left: drop the filter"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_warnings()
        _tree_flatten({"a": 1})
    assert not caught


class _Tiny(L.LightningModule):
    """A linear layer over (x, y) batches whose steps take `train_s` of `clock` and whose validation batches
    `val_s` (with a FakeClock, which nothing else moves: exact times on any machine)."""

    def __init__(self, train_s: float = 0.0, val_s: float = 0.0, clock: FakeClock | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.train_s, self.val_s, self.clock = train_s, val_s, clock or FakeClock()

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.train_s)
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.clock.advance(self.val_s)
        self.log("val/loss", self.layer(batch[0]).pow(2).mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _loader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        return torch.utils.data.DataLoader(data, batch_size=4)

    train_dataloader = val_dataloader = _loader


def _printed(**trainer_kwargs) -> tuple[L.Trainer, str]:
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, max_steps=2,
                        limit_val_batches=1, num_sanity_val_steps=0, **trainer_kwargs)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        trainer.fit(_Tiny())
    return trainer, out.getvalue()


def test_model_summary_has_no_uncounted_flops():
    _, before = _printed()  # Lightning's default summary: the motivation
    assert "Total FLOPs: 0" in before
    trainer, after = _printed(callbacks=[UseStepProgressBar()])
    assert any(type(cb) is CountedFlopsModelSummary for cb in trainer.callbacks)
    assert "Total params" in after and "Linear" in after
    assert "FLOPs" not in after and "Flops" not in after


def test_model_summary_keeps_counted_flops(capsys):
    data = [(" ", ["0"]), ("Name", ["layer"]), ("Type", ["Linear"]), ("Params", ["5"]), ("Mode", ["train"]),
            ("FLOPs", ["40"])]
    CountedFlopsModelSummary.summarize(data, 5, 5, 2e-5, {"train": 1, "eval": 0}, total_flops=40)
    assert "Total FLOPs: 40" in capsys.readouterr().out
    CountedFlopsModelSummary.summarize(data, 5, 5, 2e-5, {"train": 1, "eval": 0}, total_flops=0)
    out = capsys.readouterr().out
    assert "FLOPs" not in out and "Linear" in out and "Total params: 5" in out


def test_a_listed_summary_keeps_its_settings():
    summary = RichModelSummary(max_depth=3)
    trainer = L.Trainer(callbacks=[UseStepProgressBar(), summary], logger=False, enable_checkpointing=False)
    trainer.callbacks[0].setup(trainer, None, "fit")
    summary = next(cb for cb in trainer.callbacks if isinstance(cb, RichModelSummary))  # the one in its place
    assert type(summary) is CountedFlopsModelSummary and summary._max_depth == 3


def test_a_listed_progress_bar_keeps_its_rate_and_theme(monkeypatch):
    from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBarTheme

    monkeypatch.setattr(progress_module, "live_console", lambda: True)  # as on a terminal
    theme = RichProgressBarTheme(description="green")
    trainer = L.Trainer(callbacks=[UseStepProgressBar(), RichProgressBar(refresh_rate=7, theme=theme)], logger=False,
                        enable_checkpointing=False)
    trainer.callbacks[0].setup(trainer, None, "fit")
    (bar,) = [cb for cb in trainer.callbacks if isinstance(cb, RichProgressBar)]
    assert type(bar) is StepProgressBar and bar.refresh_rate == 7 and bar.theme is theme


def test_step_progress_bar(monkeypatch):
    monkeypatch.setattr(progress_module, "live_console", lambda: True)  # as on a terminal
    bar = StepProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1, max_steps=2000)
    assert bar._get_train_description(0).strip() == "Epoch 0 · 2000 steps"
    bar._trainer = SimpleNamespace(max_epochs=3, max_steps=-1)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"
    # Swapped in for Lightning's default bar; with the bar disabled there is nothing to swap and no error.
    trainer = L.Trainer(callbacks=[UseStepProgressBar()], logger=False, enable_checkpointing=False)
    trainer.callbacks[0].setup(trainer, None, "fit")
    assert type(trainer.progress_bar_callback) is StepProgressBar
    trainer = L.Trainer(callbacks=[UseStepProgressBar()], enable_progress_bar=False, logger=False)
    trainer.callbacks[0].setup(trainer, None, "fit")
    assert trainer.progress_bar_callback is None


def test_step_progress_bar_redraws_at_most_every_tenth_of_a_second(monkeypatch):
    draws = []
    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", lambda self, t, m, o, b, i: draws.append(i))
    bar = StepProgressBar()
    bar.clock = clock = FakeClock()
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(is_last_batch=False)))
    trainer = SimpleNamespace(max_epochs=-1, max_steps=50, global_step=0, fit_loop=loop)
    for i in range(50):
        clock.advance(1 / 32)  # a batch: a 32nd of a second
        trainer.global_step = i + 1
        bar.on_train_batch_end(trainer, None, None, None, i)
    assert draws == [*range(0, 50, 4), 49]  # every 4th batch (0.125 s), and the last one


def test_progress_bar_rate_excludes_validation_and_agrees_with_timing():
    """10 steps of 10 ms around one 0.6 s validation: counted in, the pause would hold the rate at 10 / 0.7 s;
    left out, the rate is 100 it/s, the timing table's 1 / time per batch."""
    bar, timing = StepProgressBar(), TimingMonitor(window_size=2, warmup_batches=0)  # every batch, as the bar
    bar.clock = timing.clock = clock = FakeClock()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False,
                        max_steps=10, val_check_interval=5, limit_val_batches=1, num_sanity_val_steps=0,
                        callbacks=[bar, timing])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(_Tiny(train_s=0.01, val_s=0.6, clock=clock))
    assert bar.train_rate == pytest.approx(100)
    assert bar.train_rate == pytest.approx(1 / timing.summary["time_per_batch"])
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert task.fields["rate"] == bar.train_rate  # what the it/s column shows


# ---- the progress of a resumed fit, on a terminal and in a file ----

@pytest.fixture
def terminal():
    """(the text written, console_kwargs for a StepProgressBar): a Rich console that acts as a terminal of 150
    columns, recorded. Lightning reconfigures Rich's global console with them: it is put back afterwards."""
    console = get_console()
    saved = dict(console.__dict__)
    out = io.StringIO()
    yield out, {"file": out, "force_terminal": True, "width": 150}
    console.__dict__.clear()
    console.__dict__.update(saved)


@pytest.fixture
def checkpoint_at_step_20(tmp_path) -> str:
    """A checkpoint of _Tiny after 20 steps: mid-epoch (16 batches an epoch), to resume."""
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, max_steps=20, limit_val_batches=0)
    trainer.fit(_Tiny())
    trainer.save_checkpoint(tmp_path / "step20.ckpt")
    return str(tmp_path / "step20.ckpt")


class _RecordedBar(StepProgressBar):
    """A StepProgressBar that redraws at every batch and records (step, count, total, finished) after each."""

    min_redraw_seconds = 0.0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen: list[tuple[int, float, float | None, bool]] = []

    def on_train_batch_end(self, trainer, *args):
        super().on_train_batch_end(trainer, *args)
        task = self.progress.tasks[self.train_progress_bar_id]
        self.seen.append((trainer.global_step, task.completed, task.total, task.finished))


def _plain(text: str) -> list[str]:
    """The lines a terminal would show last of each: ANSI codes dropped, each line's last redraw (after its \r)."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_a_resumed_runs_bar_counts_the_runs_steps_with_lightnings_lines_on_their_own(terminal, checkpoint_at_step_20):
    """Resumed at step 20 (mid-epoch) to 40: the bar reads 21/40 .. 40/40 through the next epoch too, finished only
    at the end (Lightning's counted the epoch's batches, on from the checkpoint's, out of the loader's 16: "5/16" ..
    "20/16", finished at once, with no elapsed time or ETA). Lightning's log lines, which its handler writes to the
    stderr it was made with, start on a line of their own."""
    import logging

    out, console_kwargs = terminal
    bar = _RecordedBar(console_kwargs=console_kwargs)
    lightning_log = logging.getLogger("lightning.pytorch")
    handler_stream = io.StringIO()  # the stream Lightning's own handler keeps (made at import, with no pytest)
    handler = logging.StreamHandler(handler_stream)
    lightning_log.addHandler(handler)
    try:
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False,
                            max_steps=40, val_check_interval=5, limit_val_batches=1, num_sanity_val_steps=0,
                            callbacks=[bar])
        trainer.fit(_Tiny(), ckpt_path=checkpoint_at_step_20)
    finally:
        lightning_log.removeHandler(handler)
    assert bar.seen == [(step, step, 40, step == 40) for step in range(21, 41)]
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert task.start_time is not None and task.finished_time is not None
    shown = _plain(out.getvalue())
    assert "`Trainer.fit` stopped: `max_steps=40` reached." in shown  # a line of its own
    assert "stopped" not in handler_stream.getvalue()  # through Rich while the bar was live; then as it was:
    assert handler.stream is handler_stream
    assert re.match(r"Epoch 3 · 40 steps .*━ 40/40 ", shown[-2]), shown[-2]  # the bar as left on the terminal
    assert not [line for line in shown if "/16" in line]


def test_a_fit_whose_output_is_no_terminal_prints_a_line_per_validation(checkpoint_at_step_20, monkeypatch):
    """A resumed fit into a file: no bar (Rich would show one at the end), a line after each validation (5 batches
    into the epoch and 10) with the run's step, the losses and this fit's elapsed time (on a fake clock: 1 s a step,
    2 s a validation)."""
    clock = FakeClock()
    monkeypatch.setattr(ValidationLines, "clock", clock)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False,
                        max_steps=30, val_check_interval=5, limit_val_batches=1, num_sanity_val_steps=0,
                        callbacks=[UseStepProgressBar()])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        trainer.fit(_Tiny(train_s=1.0, val_s=2.0, clock=clock), ckpt_path=checkpoint_at_step_20)
    assert type(trainer.progress_bar_callback) is ValidationLines
    loss = r"\d+\.\d{4}"
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "Epoch" not in out.getvalue(), out.getvalue()
    assert re.fullmatch(rf"step 21/30 · train/loss {loss} · val/loss {loss} · elapsed 0:00:03", lines[0]), lines
    assert re.fullmatch(rf"step 26/30 · train/loss {loss} · val/loss {loss} · elapsed 0:00:10", lines[1]), lines


# ---- Lightning's adverts, a resumed run's checkpoint directory, the profiler's native lines ----

NOISE = ("💡 Tip:", "litlogger", "litmodels", "Checkpoint directory", "USDT:", "STAGE:")


@pytest.mark.parametrize("message", [
    "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](...)",
    "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels](...)",
])
def test_lightnings_adverts_are_dropped_and_its_other_info_kept(message, caplog):
    import logging

    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    quiet_known_warnings()
    quiet_known_warnings()  # once or twice: the same single filter
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    assert sum(type(f).__name__ == "_DropAdverts" for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        rank_zero_info(message)
        rank_zero_info("GPU available: False, used: False")
        rank_zero_info("Tip: a line that is no advert")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False",
                                                         "Tip: a line that is no advert"]


@pytest.mark.parametrize(("module", "shown"), [("lightning.pytorch.callbacks.model_checkpoint", False),
                                               ("lit_attn.cli.runs", True)])
def test_the_checkpoint_directory_warning_is_hidden_only_from_lightning(module, shown):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        quiet_known_warnings()
        assert _shown("Checkpoint directory runs/r/checkpoints exists and is not empty.", UserWarning, module) == shown


@pytest.mark.parametrize(("written", "kept"), [
    (b"USDT:2026-11-24 18:50:42 28119:28119 SyncActivityProfilerHandler.cpp:52] profiler_start\n", ""),
    (b"STAGE:2026-11-24 18:50:48 28126:28126 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n", ""),
    (b"a real error\nUSDT:2026-11-24 18:50:42 1:1 x.cpp:59] profiler_stop\nanother\n", "a real error\nanother\n"),
    (b"USDT: not the profiler's format\n", "USDT: not the profiler's format\n"),
])
def test_quiet_native_stderr_drops_only_the_profilers_lines(written, kept, capfd):
    import os

    from lit_attn.cli.console import quiet_native_stderr

    with quiet_native_stderr():
        os.write(2, written)  # as C++ code writes: to the file descriptor, past sys.stderr
    assert capfd.readouterr().err == kept


def test_the_profiler_prints_no_native_lines(capfd):
    from torch.profiler import profile

    from lit_attn.cli.console import quiet_native_stderr

    with quiet_native_stderr(), profile():
        torch.ones(3).sum()
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith(NOISE)]


@pytest.mark.slow
def test_a_resumed_fit_prints_no_adverts_or_checkpoint_directory_warning(tmp_path, corpus, capsys, monkeypatch):
    """In a process of its own, where Lightning's adverts (printed by every fit) and its warning about a checkpoint
    directory that is not empty (printed by a resume) would reach the console; the run it resumes is made here."""
    from helpers import TINY_FIT, run_main

    from lit_attn.cli.lightning_cli import cli

    monkeypatch.chdir(tmp_path)
    assert cli(["fit", f"--data.path={corpus}", "--run=r", *TINY_FIT]) == 0
    capsys.readouterr()
    result = run_main("fit", f"--data.path={corpus}", "--run=r", *TINY_FIT, "--ckpt_path=last", "--trainer.max_steps=6",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = (result.stdout + result.stderr).splitlines()
    assert any("resuming from last.ckpt" in line for line in printed)  # it did resume
    assert not [line for line in printed if any(n in line for n in NOISE)]
