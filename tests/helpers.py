"""Builders and readers the test modules share; fixtures are in conftest.py."""

from __future__ import annotations

import hashlib
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

ROOT = Path(__file__).resolve().parents[1]

# Flags for a fit that takes seconds: one layer, width 32, four heads, 16-token windows, 4 steps (the first of
# them warm-up for the timing, so the rates have batches to measure).
TINY_FIT = ["--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16",
            "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false", "--timing.warmup_batches=1"]

NON_ASCII_WORDS = ["café", "naïve", "Straße", "日本語", "émigré"]


# ---- corpora ----

def write_corpus(path: Path, *, non_ascii: bool = True, start: str | None = None) -> Path:
    """~20 KB of UTF-8: 600 lines of random lowercase words (seed 0) ending in a full stop.

    Lines are capitalized and draw on a few non-ASCII words too; with `start`, each line
    begins with it instead and is otherwise left as drawn. `non_ascii=False` leaves those words out.
    """
    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(300)]
    if non_ascii:
        words += NON_ASCII_WORDS
    bodies = [" ".join(rng.choices(words, k=rng.randint(4, 12))) for _ in range(600)]
    lines = [(body.capitalize() if start is None else start + body) + "." for body in bodies]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_chars(path: Path, n: int, seed: int) -> Path:
    """`n` characters drawn (seeded) from 16 letters, space and newline: a corpus whose epochs are a few batches."""
    rng = random.Random(seed)
    path.write_text("".join(rng.choice("abcdefgh ijklmnop\n") for _ in range(n)))
    return path


# ---- time ----

class FakeClock:
    """A clock that moves only when told to: `clock()` reads it, `advance(seconds)` moves it. Set on a
    TimingMonitor or StepProgressBar (`.clock = FakeClock()`), it makes their times exact on any machine."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ---- tiny models and trainers ----

class StopAfterValidation(L.Callback):
    """Asks the fit to stop after the validation at `step`, as an early stop does (a CLI callback: the
    checkpoint then holds no EarlyStopping state, which would make the run complete)."""

    def __init__(self, step: int):
        self.step = step

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.global_step == self.step:
            trainer.should_stop = True


def tiny_gpt(vocab_size: int, **overrides):
    """A one-layer GPT of width 16 with two heads and an 8-token context, unless overridden."""
    from lit_attn import GPT

    return GPT(**(dict(vocab_size=vocab_size, n_layer=1, n_embd=16, n_head=2, block_size=8) | overrides))


def tiny_trainer(corpus: Path, **trainer_kwargs):
    """(model, trainer, data): `tiny_gpt` on `corpus` in batches of 4 windows, and a CPU Trainer that
    logs, checkpoints, draws and summarizes nothing unless `trainer_kwargs` say so. Nothing has run."""
    import lightning as L

    from datamodules import CharDataModule

    data = CharDataModule(path=str(corpus), block_size=8, batch_size=4)
    quiet = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 enable_model_summary=False)
    return tiny_gpt(data.vocab_size), L.Trainer(**(quiet | trainer_kwargs)), data


def resumable_fit(corpus: Path, runs_dir: Path, run: str, max_steps: int, *extra: str, total_steps: int,
                  every: int = 5, val_every: int = 7, new_tokens: int = 4) -> list[str]:
    """`main.py fit` arguments for a tiny run, with dropout, checkpointed every `every` steps and validated
    every `val_every`; the LR schedule spans `total_steps`, so stopping and resuming follows one curve."""
    return [
        "fit", f"--data.path={corpus}", f"--runs_dir={runs_dir}", f"--run={run}",
        f"--checkpoint.every_n_train_steps={every}", "--trainer.callbacks=[]", f"--samples.max_new_tokens={new_tokens}",
        "--params.print_table=false", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4",
        "--model.block_size=16", "--model.dropout=0.1", f"--model.total_steps={total_steps}", "--data.batch_size=8",
        "--data.stride=16", f"--trainer.max_steps={max_steps}", f"--trainer.val_check_interval={val_every}",
        "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", *extra,
    ]


def fit_straight_and_resumed(corpus: Path, runs_dir: Path, *flags: str, steps: int = 8, stop: int = 4):
    """Train `runs_dir/straight` for `steps` and `runs_dir/halves` stopped at `stop` and resumed, in-process with
    `flags`; assert both end with the same weights and optimizer state. Returns fit(run, steps, *extra) -> exit
    status, for more calls on the two runs."""
    from lit_attn.cli.lightning_cli import cli

    def fit(run: str, max_steps: int, *extra: str) -> int:
        return cli(resumable_fit(corpus, runs_dir, run, max_steps, *flags, *extra, total_steps=steps, every=4,
                                 val_every=4))

    assert fit("straight", steps) == 0
    assert fit("halves", stop) == 0 and fit("halves", steps, "--ckpt_path=last") == 0
    assert_same_weights(last_checkpoint(runs_dir / "straight"), last_checkpoint(runs_dir / "halves"), steps)
    return fit


RUN_STEPS = 20  # the LR schedule of the run tests' short runs, however they are stopped and resumed


def run_args(corpus: Path, runs: Path, run: str, steps: int, *extra: str) -> list[str]:
    """`resumable_fit` as the run tests (test_runs.py, test_runs_tidy.py) use it."""
    return resumable_fit(corpus, runs, run, steps, *extra, total_steps=RUN_STEPS, new_tokens=2)


# ---- main.py in another process ----

def main_env(**extra) -> dict[str, str]:
    """This process's environment for a child main.py: unbuffered output, errors as their one line."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | {k: str(v) for k, v in extra.items()}
    env.pop("LIT_ATTN_DEBUG", None)
    return env


def run_main(*args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None,
             script: Path | None = None) -> subprocess.CompletedProcess:
    """`python main.py ARGS` (or `script`) in `cwd`, its output captured as text."""
    return subprocess.run([sys.executable, str(script or ROOT / "main.py"), *args], cwd=cwd,
                          env=main_env(**(env or {})), capture_output=True, text=True, timeout=timeout)


# ---- errors ----

def one_line_error(call, *args, error: type[BaseException] = ValueError, match: str | None = None, **kwargs) -> str:
    """The message of the `error` that call(*args, **kwargs) raises, checked to be a single line."""
    with pytest.raises(error, match=match) as e:
        call(*args, **kwargs)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


# ---- runs on disk ----

def snapshot(root: Path) -> dict[str, tuple[int, int, str] | str]:
    """Every path under `root`: a file as its size, mtime and SHA-256, a directory as "dir"."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def assert_same_weights(a: dict, b: dict, steps: int) -> None:
    """Both checkpoints are at `steps`, with bit-identical weights and optimizer state (Adam's moments, Muon's
    momentum)."""
    assert a["global_step"] == b["global_step"] == steps
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    # Each parameter's state, in the order of the parameter groups: torch numbers the state by the groups' order,
    # FSDP's consolidated state by the model's parameter order; load_state_dict maps either through the groups.
    state_a, state_b = (_group_ordered_state(c["optimizer_states"][0]) for c in (a, b))
    assert len(state_a) == len(state_b) and any(s is not None for s in state_a)
    for index, (sa, sb) in enumerate(zip(state_a, state_b)):
        assert (sa is None) == (sb is None), index
        if sa is not None:
            assert sa.keys() == sb.keys(), index
            for name, value in sa.items():
                assert torch.equal(value, sb[name]), (index, name)


def _group_ordered_state(optimizer_state: dict) -> list[dict | None]:
    return [optimizer_state["state"].get(i) for group in optimizer_state["param_groups"] for i in group["params"]]


# ---- TensorBoard ----

def events(path: Path) -> EventAccumulator:
    """What TensorBoard reads from `path` (a run directory, or one event file), every point kept."""
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def newest_events(root: Path) -> EventAccumulator:
    """`events` of the newest event file anywhere under `root`."""
    files = sorted(root.rglob("events.out.tfevents.*"))
    assert files, f"no event file under {root}"
    return events(files[-1])


def scalars(source: Path | EventAccumulator, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` in file order; `source` is an accumulator or a path for `events`."""
    acc = source if isinstance(source, EventAccumulator) else events(source)
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# Scalars measured with a clock (times, rates, MFU): the same steps in every run, other values.
WALL_CLOCK = ("train/time", "val/train_time", "validate/time", "timing/", "whole_run/time_per_batch",
              "whole_run/train_time", "whole_run/tokens_per_sec", "whole_run/mfu")


def wall_clock(tag: str) -> bool:
    return tag.startswith(WALL_CLOCK) or tag.endswith("_per_sec") or "/device/" in tag


def history(run_dir: Path) -> dict[str, list[tuple[int, object]]]:
    """Every scalar and text tag of a run as TensorBoard shows it: (step, value) in file order.

    Read with the accumulator TensorBoard's dashboards use, which applies a resume's purge
    (events of an earlier attempt at or after the resumed step are hidden) to text too.
    """
    acc = plugin_event_accumulator.EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for plugin in ("scalars", "text"):
        for tag in acc.PluginTagToContent(plugin) if plugin in acc.ActivePlugins() else ():
            values = [tensor_util.make_ndarray(e.tensor_proto) for e in acc.Tensors(tag)]
            out[tag] = [(e.step, v.item() if plugin == "scalars" else v.tolist())
                        for e, v in zip(acc.Tensors(tag), values)]
    return out


# The end-of-fit record (callbacks/hparams.py): one per fit, so a run ended (max_steps, a signal) and continued also
# shows its first fit's, at that fit's last step; the last one is the whole run's.
END_OF_FIT = "whole_run/"


def same_steps(tag: str, got: list, expected: list) -> tuple[list, list]:
    """The points of `tag` that a run continued after its fit ended shares with one run: all, or the end-of-fit
    record's last."""
    return (got[-1:], expected[-1:]) if tag.startswith(END_OF_FIT) else (got, expected)


def assert_same_history(expected_run: Path, run: Path) -> None:
    """The same tags, each at the same steps; the same values but for clock readings (see same_steps)."""
    expected, got = history(expected_run), history(run)
    assert sorted(got) == sorted(expected)
    for tag, points in expected.items():
        got[tag], points = same_steps(tag, got[tag], points)
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        if not wall_clock(tag):
            assert [v for _, v in got[tag]] == [v for _, v in points], tag


# ---- tools ----

# Checks of what a tool says on a machine without a CUDA GPU.
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


def exit_status(main, argv) -> int:
    """A tool's main(argv) return value, or the status it exits with (flag errors exit from the parser)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def write_bpe_tokenizer(path: Path, text: str = "hello world, hello there. the world is wide.", vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on `text`, with <|endoftext|>, saved at `path`; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text] * 50, trainer=trainer)
    tok.save(str(path))
    return tok


# ---- cost-card quality runs ----

def extrapolation_result(losses: dict[int, float]) -> dict:
    """An extrapolation result as lit-attn probe returns it: loss per multiple of block_size 16, ratios to 1x."""
    return {"block_size": 16, "tokens": 257, "contexts": [
        {"multiple": m, "context": 16 * m, "windows": 4 // m, "loss": loss, "ratio": loss / losses[1],
         "buckets": [{"start": 0, "end": 16 * m, "loss": loss}]} for m, loss in losses.items()]}


def passkey_result(accuracy: list[list[float | None]]) -> dict:
    """A passkey result as lit-attn probe returns it: accuracy per (length, depth) and their mean."""
    cells = [a for row in accuracy for a in row if a is not None]
    return {"lengths": [16, 32][:len(accuracy)], "depths": [0.0, 1.0], "trials": 5, "seed": 0, "accuracy": accuracy,
            "mean": sum(cells) / len(cells) if cells else None, "examples": [["12345"] * 2] * len(accuracy)}


def quality_run(root: Path, attention: str, seed: int, mqar: float | None, probes: dict[str, dict]) -> Path:
    """ROOT/ATTENTION-sSEED: a run's config and events (final val/mqar_acc `mqar` unless None) and the probe
    results `probes` (name -> result), written with lit-attn probe's own writer."""
    from torch.utils.tensorboard import SummaryWriter

    from lit_attn.tools.probe_output import write_results

    run = root / f"{attention}-s{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed_everything: {seed}\nmodel:\n  attention: {attention}\n"
                                     f"data:\n  init_args:\n    seed: {seed}\n")
    writer = SummaryWriter(str(run))
    writer.add_scalar("val/loss", 2.0 + seed / 10, 3)
    writer.add_scalar("whole_run/time_per_batch", 0.5, 4)
    if mqar is not None:
        writer.add_scalar("val/mqar_acc", mqar - 0.3, 1)  # an earlier validation: the final one counts
        writer.add_scalar("val/mqar_acc", mqar, 3)
        writer.add_scalar("val/mqar_acc/T64_kv4", mqar, 3)
    writer.close()
    for name, result in probes.items():
        assert write_results(run, run.name, {name: result}, step=4, checkpoint="last.ckpt") == 0
    return run
