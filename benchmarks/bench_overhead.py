"""Framework tax: tokens/s of our Trainer.fit path vs a bare PyTorch loop, same model, data and optimiser.

(a) `main.py`'s CLI with configs/default.yaml (default callbacks, TensorBoard logging and
    progress bar; validation off), and (b) a plain loop written here: next batch, forward,
    backward, clip, AdamW step (fused, same schedule), zero_grad(set_to_none). The two are
    interleaved step by step: after every Lightning step, a callback runs one bare step on its
    own copy of the model, so machine noise hits both alike. (a)'s step time is the time
    between two Lightning steps minus the bare step between them. Every `--steps` timed steps
    form one repetition; the ratio a/b is printed per repetition with min/median/max.

    python -m benchmarks.bench_overhead                          # default config
    python -m benchmarks.bench_overhead -- --model.n_layer=8     # extra main.py flags after --
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from datamodules.windows import WindowDataModule
from lit_attn import GPT
from lit_attn.cli.console import quiet_known_warnings
from lit_attn.cli.lightning_cli import DEFAULT_CONFIG, USER_ERRORS, LitAttnCLI
from lit_attn.cli.parser import LitAttnParser
from lit_attn.cli.toolcli import ToolParser, check_threads, split_extra
from lit_attn.training.model import lr_factor


def build(flags: list[str], runs_dir: str, run: str) -> LitAttnCLI:
    """The CLI's model, datamodule and trainer for `flags` (validation and model summary off)."""
    argv = [f"--runs_dir={runs_dir}", f"--run={run}", "--trainer.limit_val_batches=0",
            "--trainer.enable_model_summary=false", *flags]
    try:  # main.py's parser and its user errors: one line, exit status 2
        with warnings.catch_warnings():
            # The flags are this tool's command line, passed on on purpose: no warning that both are given.
            warnings.filterwarnings("ignore", "LightningCLI's args parameter is intended",
                                    module=r"lightning\.pytorch\.cli")
            return LitAttnCLI(GPT, WindowDataModule, subclass_mode_data=True, run=False, args=argv,
                              parser_class=LitAttnParser,
                              parser_kwargs={"default_config_files": [str(DEFAULT_CONFIG)]})
    except USER_ERRORS as e:
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        sys.stderr.write(f"error: {' '.join(str(e).split()) or type(e).__name__} (the flags after -- go to main.py)\n")
        sys.exit(2)


class BareLoop:
    """The plain training loop, one step per call, on its own model, data and optimiser."""

    def __init__(self, cli: LitAttnCLI, total_steps: int):
        self.model, dm, hp = cli.model, cli.datamodule, cli.model.hparams
        dm.setup("fit")
        self.batches = iter(dm.train_dataloader())
        self.tokens_per_step = dm.batch_size * self.model.config.block_size
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in self.params if p.dim() >= 2], "weight_decay": hp.weight_decay},
                  {"params": [p for p in self.params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), fused=True)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, total_steps, hp.warmup_fraction, hp.min_lr_ratio))
        self.model.train()
        self.loading = 0.0  # seconds spent in next(loader)

    def step(self) -> None:
        t0 = time.perf_counter()
        x, y = next(self.batches)
        self.loading += time.perf_counter() - t0
        loss = self.model._loss(self.model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)


class Interleave(Callback):
    """After each Lightning step, one bare step; records both step times once past `warmup`."""

    def __init__(self, bare: BareLoop, warmup: int):
        self.bare, self.warmup = bare, warmup
        self.lightning: list[float] = []
        self.plain: list[float] = []
        self._mark: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        timed = trainer.global_step > self.warmup
        if timed and self._mark is not None:
            self.lightning.append(now - self._mark)
        if trainer.global_step == self.warmup + 1:
            self.bare.loading = 0.0
        with torch.enable_grad():
            t0 = time.perf_counter()
            self.bare.step()
            if timed:
                self.plain.append(time.perf_counter() - t0)
        self._mark = time.perf_counter()


def parse_args(doc: str, steps: int, repeats: int, warmup: int, warmup_help: str,
               argv: Sequence[str] | None = None, prog: str = "python -m benchmarks.bench_overhead") -> Any:
    """The interleaved benchmarks' common flags (a jsonargparse Namespace), plus extra main.py flags after --."""
    own, extra = split_extra(argv)
    parser = ToolParser(prog=prog, description=doc.split("\n\n")[0],
                        epilog="Arguments after `--` go to main.py, e.g. -- --model.n_layer=8")
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per repetition")
    parser.add_argument("--repeats", type=int, default=repeats, help="repetitions")
    parser.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch intra-op threads, pinned for the whole run (default: torch's at start)")
    args = parser.parse_args(own)
    quiet_known_warnings()
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--steps, --repeats and --threads must be >= 1, --warmup >= 0")
    try:
        check_threads(args.threads)
    except ValueError as e:
        parser.error(str(e))
    torch.set_num_threads(args.threads)
    args.extra = extra
    return args


def report(names: tuple[str, str], times: tuple[list[float], list[float]], tokens_per_step: int,
           args: Any) -> list[float]:
    """Print tokens/s of both and their ratio (first / second) per repetition; return the ratios."""
    print(f"{'rep':>3} {names[0] + ' tok/s':>20} {names[1] + ' tok/s':>20} {'ratio':>6}")
    ratios = []
    for rep in range(args.repeats):
        block = slice(rep * args.steps, (rep + 1) * args.steps)
        a, b = (tokens_per_step * args.steps / sum(t[block]) for t in times)
        ratios.append(a / b)
        print(f"{rep:>3} {a:>20,.0f} {b:>20,.0f} {a / b:>6.3f}")
    print(f"ratio {names[0]} / {names[1]} tokens/s: min {min(ratios):.3f}  median {statistics.median(ratios):.3f}  "
          f"max {max(ratios):.3f}  overall {sum(times[1]) / sum(times[0]):.3f}  "
          f"({args.repeats} repetitions of {args.steps} interleaved steps)")
    print(f"time per step (medians): {names[0]} {statistics.median(times[0]) * 1e3:.2f} ms, "
          f"{names[1]} {statistics.median(times[1]) * 1e3:.2f} ms; {torch.get_num_threads()} threads (pinned)")
    return ratios


def main() -> None:
    args = parse_args(__doc__, steps=50, repeats=8, warmup=20, warmup_help="untimed steps at the start")
    total = args.warmup + 1 + args.steps * args.repeats
    flags = [f"--trainer.max_steps={total}", *args.extra]
    with tempfile.TemporaryDirectory() as runs_dir:
        bare = BareLoop(build(flags, runs_dir, "bare"), total)
        cli = build(flags, runs_dir, "fit")
        clock = Interleave(bare, args.warmup)
        cli.trainer.callbacks.append(clock)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    report(("Trainer.fit", "bare loop"), (clock.lightning, clock.plain), bare.tokens_per_step, args)
    print(f"data loading: {bare.loading / sum(clock.plain):.2%} of the bare loop's time")


if __name__ == "__main__":
    main()
