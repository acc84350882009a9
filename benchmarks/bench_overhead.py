"""Framework tax: tokens/s of our Trainer.fit path vs a bare PyTorch loop, same model, data and optimiser.

(a) `main.py`'s CLI with configs/default.yaml (default callbacks and TensorBoard logging,
    validation off), and (b) a plain loop: forward, backward, clip, fused AdamW step with the
    same schedule, zero_grad. Repetitions alternate (a, b, a, b, ...) in one process so machine
    noise hits both alike; prints tokens/s per repetition and the ratio a/b (min/median/max).

    python benchmarks/bench_overhead.py --steps 150 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_attn.model import lr_factor  # noqa: E402
from main import LitAttnCLI, DEFAULT_CONFIG  # noqa: E402

from datamodules.windows import WindowDataModule  # noqa: E402
from lit_attn import GPT  # noqa: E402


class StepClock(Callback):
    """Wall time from the start of batch `warmup` to the end of the last batch."""

    def __init__(self, warmup: int):
        self.warmup, self.t0, self.t1 = warmup, 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup:
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.t1 = time.perf_counter()


def build(args: argparse.Namespace, runs_dir: str, run: str) -> LitAttnCLI:
    argv = [f"--runs_dir={runs_dir}", f"--run={run}", f"--trainer.max_steps={args.steps}",
            "--trainer.limit_val_batches=0", "--trainer.enable_model_summary=false", *args.extra]
    return LitAttnCLI(GPT, WindowDataModule, subclass_mode_data=True, run=False, args=argv,
                      parser_kwargs={"default_config_files": [str(DEFAULT_CONFIG)]})


def lightning_tokens_per_s(args: argparse.Namespace, runs_dir: str, rep: int) -> float:
    cli = build(args, runs_dir, f"a{rep}")
    clock = StepClock(args.warmup)
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steps = args.steps - args.warmup
    return steps * cli.datamodule.batch_size * cli.model.block_size / (clock.t1 - clock.t0)


def bare_tokens_per_s(args: argparse.Namespace, runs_dir: str, rep: int) -> float:
    cli = build(args, runs_dir, f"b{rep}")  # same model, data and settings, never fit by Lightning
    model, dm, hp = cli.model, cli.datamodule, cli.model.hparams
    dm.setup("fit")
    loader = dm.train_dataloader()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.steps, hp.warmup_fraction, hp.min_lr_ratio))
    model.train()
    t0 = 0.0
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            t0 = time.perf_counter()
        loss = model._loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step + 1 == args.steps:
            break
    return (args.steps - args.warmup) * dm.batch_size * model.block_size / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="optimiser steps per repetition")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps at the start of each repetition")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of each path, alternating")
    parser.add_argument("extra", nargs="*", help="extra main.py flags, e.g. --model.n_layer=8 (after --)")
    args = parser.parse_args()
    ratios, a_all, b_all = [], [], []
    with tempfile.TemporaryDirectory() as runs_dir:
        for rep in range(args.repeats):
            a = lightning_tokens_per_s(args, runs_dir, rep)
            b = bare_tokens_per_s(args, runs_dir, rep)
            a_all.append(a), b_all.append(b), ratios.append(a / b)
            print(f"rep {rep}: Trainer.fit {a:,.0f} tok/s   bare loop {b:,.0f} tok/s   ratio {a / b:.3f}", flush=True)
    print(f"ratio (a) Trainer.fit / (b) bare loop: min {min(ratios):.3f}  median {statistics.median(ratios):.3f}  "
          f"max {max(ratios):.3f}  ({args.repeats} alternating repetitions, {args.steps - args.warmup} timed steps each)")


if __name__ == "__main__":
    main()
