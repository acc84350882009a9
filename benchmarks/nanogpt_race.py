"""The race against nanoGPT: lit-attn's training time to nanoGPT's own validation loss, as a share of the time
nanoGPT takes for its iterations, both measured in one run on this machine.

nanoGPT (`train.py` of a local checkout, --nanogpt, copied into a work directory and left unchanged) trains its
`train_shakespeare_char` configuration at the shape its README gives for a CPU: 4 layers, 4 heads, width 128,
context 64, batch 12, dropout 0, no bias, 2,000 iterations (--iters), torch.compile only with --compile. Its final
checkpoint is evaluated here on the whole validation split (nanoGPT's own estimate uses random batches). lit-attn
(`main.py fit` with --lit-config and any fit flags after `--`) trains the same shape on the same text and split,
validating on the whole split every --eval-every steps; its time to nanoGPT's loss (the median over nanoGPT's
seeds) is read off that curve by lit_attn.tools.time_to_loss. Runs alternate by seed (nanoGPT seed 1, lit-attn
seed 1, nanoGPT seed 2, ...) with the same pinned thread count, and the machine's load is printed before and after.

Evaluation is excluded on both sides. lit-attn's time is its run's training clock (val/train_time), warm-up
included. nanoGPT's is the sum of the times its log prints for iterations 0 to --iters - 1 (`iter N: loss X, time
T ms`), where an iteration that holds an evaluation counts as the median of the others: nanoGPT evaluates only at
iteration 0 and at the end here (eval_interval = --iters, eval_iters 1), so its first iteration's warm-up is left
out of its time, which favours nanoGPT.

Without --nanogpt, nanoGPT's figure stored in benchmarks/nanogpt_race.json (--stored) is used, and the output says
so and names the machine it was measured on; --store writes this run's nanoGPT figure there.

    python -m benchmarks.nanogpt_race --nanogpt ~/nanoGPT --text tinyshakespeare.txt --seeds 1,2,3
    python -m benchmarks.nanogpt_race --text tinyshakespeare.txt --lit-config configs/recipe_modern.yaml
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import io
import json
import os
import pickle
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lit_attn.cli.toolcli import (
    ToolParser,
    check_output_file,
    check_seed,
    check_threads,
    cpu_cores,
    csv_list,
    split_extra,
)
from lit_attn.tools.time_to_loss import Reading, time_to_target

ROOT = Path(__file__).resolve().parents[1]
STORED = Path(__file__).resolve().with_name("nanogpt_race.json")
ITERS = 2000
# nanoGPT's README command for a CPU (config/train_shakespeare_char.py, then these), as train.py's --key=value.
SHAPE = {"device": "cpu", "block_size": 64, "batch_size": 12, "n_layer": 4, "n_head": 4, "n_embd": 128,
         "dropout": 0.0, "bias": False}
# Copied from the checkout into the work directory: what train.py and prepare.py read.
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py",
                 "data/shakespeare_char/prepare.py")
DATA_DIR = Path("data/shakespeare_char")
VAL_FRACTION = 0.1  # nanoGPT's prepare.py keeps the last 10% of the characters for validation
ITER_LINE = re.compile(r"^iter (\d+): loss \S+, time ([0-9.]+)ms", re.MULTILINE)
# The fit flags that make lit-attn's run nanoGPT's shape on the same data, validated on the whole split.
LIT_SHAPE = ["--model.n_layer=4", "--model.n_head=4", "--model.n_embd=128", "--model.block_size=64",
             "--model.dropout=0.0", "--model.bias=false", "--data.batch_size=12", f"--data.val_fraction={VAL_FRACTION}",
             "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.check_val_every_n_epoch=null",
             "--trainer.limit_val_batches=1.0", "--trainer.enable_progress_bar=false"]


class RaceError(Exception):
    """A side of the race that could not run (its message is the one line the user sees)."""


# ---- nanoGPT's side ----

def nanogpt_overrides(iters: int, compile_: bool, out_dir: str) -> list[str]:
    """train.py's arguments after its config file: the README's CPU shape, evaluation only at the start and the
    end (one batch each: the checkpoint is evaluated on the whole split afterwards), a checkpoint at the end."""
    settings = SHAPE | {"compile": compile_, "max_iters": iters, "lr_decay_iters": iters, "eval_interval": iters,
                        "eval_iters": 1, "log_interval": 1, "always_save_checkpoint": True, "out_dir": out_dir}
    return [f"--{k}={v}" for k, v in settings.items()]


def race_config(seed: int, threads: int) -> str:
    """A nanoGPT config file (train.py runs it in its own namespace): the thread count pinned, and torch's seed
    `seed` where train.py seeds 1337, since nanoGPT has no seed option."""
    return (f"import torch as _torch\n_torch.set_num_threads({threads})\n_seed = _torch.manual_seed\n"
            f"_torch.manual_seed = lambda s: _seed(s - 1337 + {seed})\n")


def prepare_nanogpt(checkout: Path, text: Path, workdir: Path) -> Path:
    """nanoGPT's files copied into `workdir`/nanogpt with `text` as its input.txt, and its prepare.py run there
    (train.bin, val.bin, meta.pkl); the directory. RaceError with prepare.py's last line if it fails."""
    home = workdir / "nanogpt"
    for name in NANOGPT_FILES:
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(checkout / name, home / name)
    shutil.copyfile(text, home / DATA_DIR / "input.txt")  # prepare.py downloads only when it is missing
    done = subprocess.run([sys.executable, "prepare.py"], cwd=home / DATA_DIR, capture_output=True, text=True)
    if done.returncode:
        raise RaceError(f"nanoGPT's prepare.py failed: {last_line(done.stderr)}")
    return home


def iteration_times(log: str) -> dict[int, float]:
    """Iteration -> its time in seconds, from nanoGPT's `iter N: loss X, time T ms` lines."""
    return {int(m.group(1)): float(m.group(2)) / 1000 for m in ITER_LINE.finditer(log)}


def training_seconds(times: dict[int, float], iters: int, eval_interval: int) -> tuple[float, float]:
    """(nanoGPT's training time for iterations 0..iters-1, what was left out of it): an iteration that holds an
    evaluation (every eval_interval-th, from 0) counts as the median of the others. ValueError when the log lacks
    one of those iterations."""
    missing = [i for i in range(iters) if i not in times]
    if missing:
        raise ValueError(f"nanoGPT's log has no time for iteration {missing[0]} ({len(missing)} of {iters} missing): "
                         f"it logs every iteration only with log_interval 1")
    evaluated = [i for i in range(iters) if i % eval_interval == 0]
    plain = [times[i] for i in range(iters) if i % eval_interval]
    if not plain:
        raise ValueError(f"every one of nanoGPT's {iters} iterations holds an evaluation: nothing to time")
    typical = statistics.median(plain)
    return sum(plain) + typical * len(evaluated), sum(times[i] - typical for i in evaluated)


def full_split_loss(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], tokens: np.ndarray,
                    block_size: int, batch: int = 256) -> float:
    """The mean cross-entropy per token over `tokens` cut into non-overlapping windows of block_size (as
    lit-attn's char data validates), `loss(x, y)` being a batch's mean over its tokens."""
    n = (len(tokens) - block_size - 1) // block_size + 1
    if n < 1:
        raise ValueError(f"{len(tokens)} tokens hold no window of block_size+1 = {block_size + 1}")
    offsets = np.arange(n)[:, None] * block_size + np.arange(block_size + 1)
    windows = torch.from_numpy(np.asarray(tokens, dtype=np.int64)[offsets])
    total = 0.0
    with torch.no_grad():
        for start in range(0, n, batch):
            w = windows[start:start + batch]
            x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()  # nanoGPT's loss views the targets flat
            total += float(loss(x, y)) * y.numel()
    return total / (n * block_size)


def load_nanogpt(home: Path, checkpoint: Path) -> torch.nn.Module:
    """nanoGPT's model (its model.py in `home`) with the weights of `checkpoint`, in eval mode."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", home / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)  # nanoGPT's own file, made here
    with contextlib.redirect_stdout(io.StringIO()):  # its parameter count, printed by the training run already
        model = module.GPT(module.GPTConfig(**state["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state["model"].items()})
    return model.eval()


def nanogpt_split(home: Path) -> tuple[str, np.ndarray]:
    """(the characters in token-id order, the validation tokens) nanoGPT's prepare.py wrote."""
    with open(home / DATA_DIR / "meta.pkl", "rb") as f:
        meta = pickle.load(f)  # nanoGPT's own file, made here
    vocab = "".join(meta["itos"][i] for i in range(meta["vocab_size"]))
    return vocab, np.fromfile(home / DATA_DIR / "val.bin", dtype=np.uint16)


def check_same_split(home: Path, text: Path) -> np.ndarray:
    """The validation tokens, after checking that lit-attn's char data (val_fraction 0.1) has nanoGPT's vocabulary
    and validation tokens; RaceError otherwise."""
    from datamodules import CharDataModule

    vocab, val = nanogpt_split(home)
    data = CharDataModule(path=str(text), block_size=SHAPE["block_size"], val_fraction=VAL_FRACTION)
    if data.vocab != vocab or not np.array_equal(data.load_tokens("val"), val):
        raise RaceError("lit-attn's char data and nanoGPT's prepare.py split the text differently: the two "
                           "validation losses would not be on the same tokens")
    return val


def run_nanogpt(home: Path, seed: int, args: Any) -> dict[str, Any]:
    """One nanoGPT training of seed `seed`: its time (s), the warm-up left out of it, its final loss on the whole
    validation split, the load before and after; its log in `home`/seed-N.log."""
    out_dir = f"out-{seed}"
    (home / f"race_{seed}.py").write_text(race_config(seed, args.threads))
    command = [sys.executable, "train.py", "config/train_shakespeare_char.py", f"race_{seed}.py",
               *nanogpt_overrides(args.iters, args.compile, out_dir)]
    load, log = os.getloadavg(), home / f"seed-{seed}.log"
    with open(log, "w") as f:  # written as it trains: its progress can be followed there
        done = subprocess.run(command, cwd=home, env=thread_env(args.threads), stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RaceError(f"nanoGPT's train.py (seed {seed}) failed: {last_line(log.read_text())}")
    try:
        seconds, left_out = training_seconds(iteration_times(log.read_text()), args.iters, args.iters)
    except ValueError as e:  # a train.py whose log reads otherwise
        raise RaceError(f"{e} (seed {seed}, {log})") from None
    model = load_nanogpt(home, home / out_dir / "ckpt.pt")
    loss = full_split_loss(lambda x, y: model(x, y)[1], args.val_tokens, SHAPE["block_size"])
    return {"seed": seed, "train_s": seconds, "warmup_left_out_s": left_out, "val_loss": loss,
            "load": [load[0], os.getloadavg()[0]]}


# ---- lit-attn's side ----

def lit_command(args: Any, seed: int, runs_dir: Path) -> list[str]:
    """`main.py fit` of seed `seed` at nanoGPT's shape on --text, validated on the whole split every --eval-every
    steps: --lit-config, the shape, then the flags given after `--`."""
    config = ["--config", str(args.lit_config)] if args.lit_config else []
    return [sys.executable, str(ROOT / "main.py"), "fit", *config, *LIT_SHAPE, f"--data.path={args.text}",
            f"--trainer.val_check_interval={args.eval_every}", f"--model.compile={str(args.compile).lower()}",
            f"--seed_everything={seed}", f"--runs_dir={runs_dir}", f"--run=race-{seed}", *args.extra]


def run_lit(args: Any, seed: int, runs_dir: Path) -> dict[str, Any]:
    """One lit-attn fit of seed `seed`: its validation curve and the load before and after."""
    from lit_attn.tools.run_record import read_run

    load = os.getloadavg()
    log = runs_dir / f"race-{seed}.log"
    with open(log, "w") as f:
        done = subprocess.run(lit_command(args, seed, runs_dir), env=thread_env(args.threads), stdout=f,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        raise RaceError(f"lit-attn's fit (seed {seed}) failed: {last_line(log.read_text())}")
    return {"seed": seed, "curve": read_run(runs_dir / f"race-{seed}")["curve"], "load": [load[0], os.getloadavg()[0]]}


# ---- the figures ----

def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, min and max of `values`; None when there are none."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def race(nanogpt: Sequence[dict[str, Any]], lit: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The race's figures: nanoGPT's target (the median of its final losses) and time (median), and per lit-attn
    seed its time to that target and its ratio to nanoGPT's time of the same seed (else to the median)."""
    target = statistics.median(r["val_loss"] for r in nanogpt)
    nano_time = {r["seed"]: r["train_s"] for r in nanogpt}
    median_time = statistics.median(nano_time.values())
    rows = []
    for r in lit:
        reading: Reading = time_to_target(r["curve"], target)
        base = nano_time.get(r["seed"], median_time)
        rows.append({"seed": r["seed"], "time_to_target_s": reading.value, "note": reading.why,
                     "ratio": None if reading.value is None else reading.value / base,
                     "final_val_loss": r["curve"][-1].loss if r["curve"] else None, "load": r.get("load")})
    reached = [r for r in rows if r["ratio"] is not None]
    return {"target_loss": target, "nanogpt_time_s": spread(list(nano_time.values())),
            "nanogpt_val_loss": spread([r["val_loss"] for r in nanogpt]), "lit": rows,
            "lit_time_s": spread([r["time_to_target_s"] for r in reached]),
            "ratio": spread([r["ratio"] for r in reached]), "reached": f"{len(reached)} of {len(rows)}"}


def fmt_spread(s: dict[str, float] | None, fmt: str) -> str:
    return "n/a" if s is None else f"{fmt.format(s['median'])} ({fmt.format(s['min'])} to {fmt.format(s['max'])})"


def report(figures: dict[str, Any], nanogpt: dict[str, Any], args: Any) -> str:
    """The race as Markdown: where nanoGPT's figure comes from, each seed, and the medians with min to max."""
    source = ("measured in this run" if nanogpt["measured"] else
              f"the stored figure {nanogpt['file']} (measured {nanogpt['date']} on {nanogpt['machine']}, "
              f"{nanogpt['threads']} thread(s)), not measured in this run")
    lines = [f"nanoGPT, {nanogpt['iters']} iterations, torch.compile {'on' if nanogpt['compile'] else 'off'}: "
             f"{source}.",
             f"Target: {figures['target_loss']:.4f}, nanoGPT's final val loss on the whole split (median of "
             f"{len(nanogpt['runs'])} seed(s)).", "",
             "| side | seed | train time (s) | val loss | load before/after |", "|---|---:|---:|---:|---|"]
    for r in nanogpt["runs"]:
        lines.append(f"| nanoGPT | {r['seed']} | {r['train_s']:.1f} | {r['val_loss']:.4f} | {loads(r)} |")
    for r in figures["lit"]:
        time = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} to target"
        final = "n/a" if r["final_val_loss"] is None else f"{r['final_val_loss']:.4f} final"
        lines.append(f"| lit-attn | {r['seed']} | {time} | {final} | {loads(r)} |")
    lines += ["", f"nanoGPT time: {fmt_spread(figures['nanogpt_time_s'], '{:.1f}')} s; lit-attn time to "
                  f"{figures['target_loss']:.4f}: {fmt_spread(figures['lit_time_s'], '{:.1f}')} s "
                  f"(reached by {figures['reached']} seeds)",
              f"ratio lit-attn / nanoGPT: {fmt_spread(figures['ratio'], '{:.3f}')} (median, min to max"
              f"{'' if all(r['ratio'] is not None for r in figures['lit']) else ' of the seeds that reached it'})"]
    lines += [f"lit-attn seed {r['seed']}: {r['note']}" for r in figures["lit"] if r["note"]]
    lines += [f"threads {args.threads}; lit-attn: {' '.join(lit_flags(args))}"]
    if not nanogpt["measured"] and nanogpt.get("threads") != args.threads:
        lines += [f"note: nanoGPT's stored figure ran with {nanogpt.get('threads')} thread(s), lit-attn here with "
                  f"{args.threads}: the ratio compares different settings"]
    return "\n".join(lines) + "\n"


def loads(r: dict[str, Any]) -> str:
    return "" if not r.get("load") else " / ".join(f"{v:.2f}" for v in r["load"])


def lit_flags(args: Any) -> list[str]:
    """The flags that say what lit-attn ran with (for the report)."""
    return (["--config", str(args.lit_config)] if args.lit_config else []) + [shlex.quote(a) for a in args.extra]


# ---- the stored figure ----

def load_stored(path: Path, iters: int, compile_: bool) -> dict[str, Any]:
    """nanoGPT's figure stored at `path` for `iters` iterations and this compile setting; ValueError (one line)
    when it is missing, unreadable or of other settings."""
    hint = "give --nanogpt PATH (a nanoGPT checkout) to measure it"
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no --nanogpt checkout given and no stored figure at {path}; {hint}") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"--stored {path} is not a stored nanoGPT figure ({e}); {hint}") from None
    figures = stored.get("figures") if isinstance(stored, dict) else None
    key = figure_key(iters, compile_)
    if not isinstance(figures, dict) or not figures:
        raise ValueError(f"--stored {path} holds no nanoGPT figure; {hint}")
    if key not in figures:
        raise ValueError(f"--stored {path} has no figure for {key} (it has {', '.join(sorted(figures))}); {hint}")
    figure = figures[key]
    runs = figure.get("runs") if isinstance(figure, dict) else None
    if not runs or not all(isinstance(r, dict) and {"seed", "train_s", "val_loss"} <= r.keys() for r in runs):
        raise ValueError(f"--stored {path}: its figure {key} has no runs with seed, train_s and val_loss; {hint}")
    return figure | {"measured": False, "file": str(path)}


def figure_key(iters: int, compile_: bool) -> str:
    """The stored figure's name: its iterations and compile setting, e.g. '2000 iterations, compile off'."""
    return f"{iters} iterations, compile {'on' if compile_ else 'off'}"


def store(path: Path, nanogpt: dict[str, Any]) -> None:
    """Add (or replace) this run's nanoGPT figure in the JSON at `path`, keeping the others."""
    stored = json.loads(path.read_text()) if path.is_file() else {}
    figures = stored.get("figures", {})
    figures[figure_key(nanogpt["iters"], nanogpt["compile"])] = {k: v for k, v in nanogpt.items()
                                                                 if k not in ("measured", "file")}
    path.write_text(json.dumps({"figures": figures}, indent=2) + "\n")


# ---- command line ----

def thread_env(threads: int) -> dict[str, str]:
    """This environment with the thread count pinned for a child process's OpenMP and MKL."""
    return os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def machine() -> str:
    from callbacks.hparams import machine_name

    return machine_name(torch.device("cpu"))


def parse_args(argv: Sequence[str] | None) -> Any:
    """The race's options (a jsonargparse Namespace, checked), with the fit flags after `--` as `extra`."""
    own, extra = split_extra(argv)
    p = ToolParser(prog="python -m benchmarks.nanogpt_race", description=__doc__.split("\n\n")[0],
                   epilog="Arguments after `--` go to lit-attn's `main.py fit`, e.g. -- --model.lr=2e-3")
    p.add_argument("--nanogpt", type=str, default=None, help="a nanoGPT checkout (github.com/karpathy/nanoGPT); "
                   "without it, the stored figure (--stored) stands for nanoGPT")
    p.add_argument("--text", type=str, default=None, help="the text both train on (Tiny Shakespeare, nanoGPT's "
                   "input.txt)")
    p.add_argument("--lit-config", type=str, default=None, help="a main.py config file for lit-attn's fit")
    p.add_argument("--seeds", type=str, default="1,2,3", help="seeds, comma-separated; the runs alternate by seed")
    p.add_argument("--threads", type=int, default=cpu_cores(), help="torch threads of every run (pinned)")
    p.add_argument("--iters", type=int, default=ITERS, help="nanoGPT's iterations (and its cosine's length)")
    p.add_argument("--eval-every", type=int, default=100, help="lit-attn validates on the whole split every N steps")
    p.add_argument("--compile", action="store_true", help="torch.compile on both sides")
    p.add_argument("--stored", type=str, default=str(STORED), help="nanoGPT's stored figure (JSON)")
    p.add_argument("--store", action="store_true", help="write this run's nanoGPT figure into --stored")
    p.add_argument("--workdir", type=str, default=None, help="keep nanoGPT's copy, logs and lit-attn's runs here (a "
                   "new directory); default: a temporary one, removed at the end")
    p.add_argument("--out", type=str, default=None, help="also write the figures to this JSON file")
    p.add_argument("--overwrite", action="store_true", help="let --out replace an existing file")
    args = p.parse_args(own)
    args.extra = extra
    try:
        check(args)
    except ValueError as e:
        p.error(str(e))
    return args


def check(args: Any) -> None:
    """ValueError (one line, naming the flag) for options the race cannot run with; reads the stored figure."""
    if args.text is None or not Path(args.text).is_file():
        raise ValueError(f"--text {args.text}: no such file; give the text both sides train on, e.g. --text "
                         f"tinyshakespeare.txt" if args.text else "--text is required: the text both sides train on")
    args.text = Path(args.text).resolve()
    args.seeds = [check_seed(int(s) if s.lstrip("-").isdigit() else s, "--seeds") for s in csv_list(args.seeds)]
    if not args.seeds or len(set(args.seeds)) < len(args.seeds):
        raise ValueError(f"--seeds {','.join(map(str, args.seeds))}: give one or more distinct seeds, e.g. 1,2,3")
    check_threads(args.threads)
    if args.iters < 1 or args.eval_every < 1:
        raise ValueError(f"--iters {args.iters} and --eval-every {args.eval_every} must be >= 1")
    if args.lit_config is not None and not Path(args.lit_config).is_file():
        raise ValueError(f"--lit-config {args.lit_config}: no such file; give a main.py config, e.g. "
                         f"configs/default.yaml")
    if args.out is not None:
        check_output_file(Path(args.out), args.overwrite)
    if args.workdir is not None and Path(args.workdir).exists():
        raise ValueError(f"--workdir {args.workdir} exists; give a new directory")
    args.stored = Path(args.stored)
    if args.nanogpt is None:
        if args.store:
            raise ValueError("--store writes a measured figure: give --nanogpt PATH too")
        args.nanogpt_figure = load_stored(args.stored, args.iters, args.compile)
        return
    checkout = Path(args.nanogpt).expanduser()
    missing = [name for name in NANOGPT_FILES if not (checkout / name).is_file()]
    if missing:
        raise ValueError(f"--nanogpt {args.nanogpt} is not a nanoGPT checkout (no {missing[0]}); give the directory "
                         f"of a clone of github.com/karpathy/nanoGPT, or leave --nanogpt out to use the stored figure")
    args.nanogpt = checkout.resolve()


def run(args: Any, workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides' runs, interleaved by seed; (nanoGPT's figure, the race's figures)."""
    torch.set_num_threads(args.threads)
    if args.nanogpt is not None:
        home = prepare_nanogpt(args.nanogpt, args.text, workdir)
        args.val_tokens = check_same_split(home, args.text)
        nanogpt = {"measured": True, "machine": f"{machine()} ({cpu_cores()} cores)", "threads": args.threads,
                   "iters": args.iters, "compile": args.compile, "date": datetime.date.today().isoformat(), "runs": []}
    else:
        nanogpt = args.nanogpt_figure
    runs_dir = workdir / "lit"
    runs_dir.mkdir(parents=True, exist_ok=True)
    print(f"{machine()}; load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    lit = []
    for seed in args.seeds:
        if args.nanogpt is not None:
            nanogpt["runs"].append(run_nanogpt(home, seed, args))
            print(f"nanoGPT seed {seed}: {nanogpt['runs'][-1]['train_s']:.1f} s, val loss "
                  f"{nanogpt['runs'][-1]['val_loss']:.4f}", flush=True)
        lit.append(run_lit(args, seed, runs_dir))
        print(f"lit-attn seed {seed}: {len(lit[-1]['curve'])} evaluations", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    return nanogpt, race(nanogpt["runs"], lit)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="nanogpt_race_"))
    try:
        nanogpt, figures = run(args, workdir)
    except RaceError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(figures, nanogpt, args), end="")
    if args.store:
        store(args.stored, nanogpt)
        print(f"nanoGPT's figure stored in {args.stored}")
    if args.out is not None:
        lit = [{k: v for k, v in r.items()} for r in figures["lit"]]
        Path(args.out).write_text(json.dumps({"nanogpt": nanogpt, "race": figures | {"lit": lit}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
