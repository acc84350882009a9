"""What a run's TensorBoard directory holds: the scalar set the dashboards and comparisons build on,
the learning rate through the warm-up, the CUSTOM SCALARS layout, constants as text."""

import itertools
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_FIT, events, scalars, write_corpus
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2, metadata

from callbacks.lr import LearningRateLogger
from lit_attn.cli.lightning_cli import cli

STEPS, LOG_EVERY, WARMUP = 8, 4, 4  # warmup_fraction 0.5 of 8 steps: the rate rises at steps 1, 2, 3

RUN_SCALARS = {"train/loss", "train/lr", "train/time_per_batch", "train/tokens_per_sec", "val/loss", "val/acc",
               "val/ppl", "val/train_time"}
PEAK_SCALARS = {"train/device/flops_per_sec", "train/device/mfu"}


def tiny_run(runs, peak_flops: float | None) -> SimpleNamespace:
    """A tiny fit through the command line; with a (made-up) peak FLOP/s, MFU is known on CPU too."""
    corpus = write_corpus(runs / "corpus.txt")
    peak = [] if peak_flops is None else [f"--timing.peak_flops={peak_flops}"]
    args = ["fit", f"--data.path={corpus}", f"--runs_dir={runs}", "--run=r", *TINY_FIT, f"--trainer.max_steps={STEPS}",
            f"--trainer.log_every_n_steps={LOG_EVERY}", "--timing.window_size=2", "--model.warmup_fraction=0.5",
            "--params.print_table=false", *peak]
    assert cli(args) == 0
    return SimpleNamespace(dir=runs / "r", acc=events(runs / "r"), peak=peak_flops is not None, args=args)


@pytest.fixture(scope="module", params=[None, 1e12], ids=["no-peak", "peak"])
def run(request, tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("runs"), request.param)


def test_the_scalar_set_is_the_runs_story_and_nothing_else(run):
    # whole_run/* are the HParams tab's (callbacks/hparams.py), single values shown last.
    tags = {tag for tag in run.acc.Tags()["scalars"] if not tag.startswith("whole_run/")}
    assert tags == RUN_SCALARS | (PEAK_SCALARS if run.peak else set())
    # No curve repeats another (the same points under two names).
    series = {tag: scalars(run.acc, tag) for tag in tags}
    for a, b in itertools.combinations(sorted(tags), 2):
        assert series[a] != series[b], (a, b)


def test_constants_are_text(run):
    texts = {tag for tag in run.acc.Tags()["tensors"] if tag.endswith("/text_summary")}
    assert {"params/text_summary", "timing/text_summary", "samples/text_summary"} <= texts
    (timing,) = run.acc.Tensors("timing/text_summary")
    assert timing.step == STEPS  # a summary after the last step
    body = timing.tensor_proto.string_val[0].decode()
    assert "| time per batch (mean) |" in body and "| tokens/s (all devices) |" in body
    assert ("| MFU | n/a" in body) != run.peak


def test_learning_rate_is_one_curve_with_every_warmup_step(run):
    lr = scalars(run.acc, "train/lr")
    # Step 0, every step while the rate rises (0..3), every logging step (3, 7; 7 is the last).
    assert [s for s, _ in lr] == [0, 1, 2, 3, 7]
    assert {s for s, _ in scalars(run.acc, "train/loss")} <= {s for s, _ in lr}
    values = [v for _, v in lr]
    assert values[:WARMUP] == sorted(values[:WARMUP]) and values[0] == pytest.approx(1e-3 / WARMUP)


def test_custom_scalars_layout_is_in_the_run_dir(run):
    (layout_event,) = run.acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    layout = layout_pb2.Layout.FromString(layout_event.tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    first = layout.category[0].chart[0]
    assert first.title == "loss (train, val)" and list(first.multiline.tag) == ["^train/loss$", "^val/loss$"]
    assert {"val/acc", "train/time_per_batch (s)", "train/tokens_per_sec", "train/lr"} <= set(charts)
    assert ("train/device/mfu" in charts) == run.peak


def test_a_resumed_run_writes_the_layout_and_tables_once(tmp_path):
    run = tiny_run(tmp_path, None)
    more = [a for a in run.args if not a.startswith("--trainer.max_steps")]
    assert cli([*more, f"--trainer.max_steps={STEPS + 2}", "--ckpt_path=last"]) == 0
    files = sorted(run.dir.glob("events.out.tfevents.*"))
    assert len(files) == 2
    written = [value.tag for f in files for event in EventFileLoader(str(f)).Load() for value in event.summary.value]
    assert written.count(metadata.CONFIG_SUMMARY_TAG) == 1 and written.count("params/text_summary") == 1
    assert [s for s, _ in scalars(run.dir, "train/lr")][-1] == STEPS + 1


def _trainer(rates, step=5, logging=False, group_names=None):
    """What LearningRateLogger reads of a trainer, at the start of training batch `step`."""
    logged = []
    group_names = group_names or [{}] * len(rates)
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(is_last_batch=False)))
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": r} | names for r, names in zip(rates, group_names)]
    every = 1 if logging else 1000  # step 5, 6 or 7 is a logging step, or not
    return SimpleNamespace(optimizers=[torch.optim.SGD(groups)], lr_scheduler_configs=[], loggers=[logger],
                           fit_loop=loop, global_step=step, max_steps=100, log_every_n_steps=every, callback_metrics={},
                           strategy=SimpleNamespace(root_device=torch.device("cpu"))), logged


@pytest.mark.parametrize("rates,names,expected", [
    ([1e-3, 5e-4], None, {"train/lr/pg1": 1e-3, "train/lr/pg2": 5e-4}),
    ([1e-3, 5e-4], [{"name": "matrices"}, {}], {"train/lr/matrices": 1e-3, "train/lr/pg2": 5e-4}),
    ([1e-3, 1e-3], [{"name": "matrices"}, {}], {"train/lr": 1e-3}),  # one rate: one curve
    ([0.02, 1e-3, 1e-3], [{"name": "muon"}, {"name": "adamw"}, {"name": "adamw_no_decay"}],  # --model.optimizer muon
     {"train/lr/muon": 0.02, "train/lr/adamw": 1e-3, "train/lr/adamw_no_decay": 1e-3}),
])
def test_learning_rate_per_group_when_the_groups_differ(rates, names, expected):
    callback = LearningRateLogger()
    trainer, logged = _trainer(rates, logging=True, group_names=names)
    callback.on_train_start(trainer, None)
    callback.on_train_batch_start(trainer, None, None, 5)
    assert logged == [(5, expected)]


def test_learning_rate_rising_is_known_across_a_resume():
    callback = LearningRateLogger()
    trainer, logged = _trainer([1e-4])
    callback.on_train_batch_start(trainer, None, None, 5)
    assert logged == []  # not a logging step, and no earlier rate to compare with
    resumed = LearningRateLogger()
    resumed.load_state_dict(callback.state_dict())
    trainer, logged = _trainer([2e-4], step=6)
    resumed.on_train_batch_start(trainer, None, None, 6)
    assert logged == [(6, {"train/lr": 2e-4})]
    trainer, logged = _trainer([2e-4], step=7)
    resumed.on_train_batch_start(trainer, None, None, 7)
    assert logged == []  # the warm-up is over
