"""torch.compile on/off: tokens/s of the same training step with `--model.compile` false and true.

Two copies of the model (same flags, same initial weights), each with its own data and fused
AdamW, trained by bench_overhead's bare loop. After untimed warm-up steps (which include the
compilation), their steps are interleaved one by one so machine noise hits both alike; every
`--steps` steps form one repetition. Prints the compile time, tokens/s and the ratio
compiled/eager per repetition with min/median/max. Lightning's own cost per step is the same
either way (see bench_overhead.py), so this is the speed-up of `python main.py fit --model.compile true`.

    python -m benchmarks.bench_compile                              # default config
    python -m benchmarks.bench_compile -- --model.n_layer=8 ...     # extra main.py flags after --
"""

from __future__ import annotations

import tempfile
import time

import torch

from .bench_overhead import BareLoop, build, parse_args, report


def main() -> None:
    args = parse_args(__doc__, steps=20, repeats=5, warmup=5, warmup_help="untimed steps (the first one compiles)",
                      prog="python -m benchmarks.bench_compile")
    total = args.warmup + args.steps * args.repeats
    flags = [f"--trainer.max_steps={total}", *args.extra]
    with tempfile.TemporaryDirectory() as runs_dir:
        eager = BareLoop(build([*flags, "--model.compile=false"], runs_dir, "eager"), total)
        compiled = BareLoop(build([*flags, "--model.compile=true"], runs_dir, "compiled"), total)
    t0 = time.perf_counter()
    compiled.step()
    print(f"{torch.get_num_threads()} threads; first compiled step (compilation) {time.perf_counter() - t0:.1f} s")
    for _ in range(args.warmup):
        eager.step()
    for _ in range(args.warmup - 1):
        compiled.step()

    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(args.steps * args.repeats):
        for loop, record in ((compiled, times[0]), (eager, times[1])):
            t0 = time.perf_counter()
            loop.step()
            record.append(time.perf_counter() - t0)
    report(("compiled", "eager"), times, eager.tokens_per_step, args)


if __name__ == "__main__":
    main()
