"""torch.compile on/off: tokens/s of the same training step with `--model.compile` false and true.

Two copies of the model (same flags, same initial weights), each with its own data and fused
AdamW, trained by bench_overhead's bare loop. After untimed warm-up steps (which include the
compilation), their steps are interleaved one by one so machine noise hits both alike; every
`--steps` steps form one repetition. Prints the compile time, tokens/s and the ratio
compiled/eager per repetition with min/median/max. Lightning's own cost per step is the same
either way (see bench_overhead.py), so this is the speed-up of `python main.py fit --model.compile true`.

    python benchmarks/bench_compile.py                              # default config
    python benchmarks/bench_compile.py -- --model.n_layer=8 ...     # extra main.py flags after --
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from bench_overhead import BareLoop, build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per repetition")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps (the first one compiles)")
    parser.add_argument("extra", nargs="*", help="extra main.py flags, e.g. --model.n_layer=8 (after --)")
    args = parser.parse_args()
    total = args.warmup + args.steps * args.repeats
    flags = [f"--trainer.max_steps={total}", *args.extra]
    with tempfile.TemporaryDirectory() as runs_dir:
        eager = BareLoop(build([*flags, "--model.compile=false"], runs_dir, "eager"), total)
        compiled = BareLoop(build([*flags, "--model.compile=true"], runs_dir, "compiled"), total)
    t0 = time.perf_counter()
    compiled.step()
    compile_seconds = time.perf_counter() - t0
    for _ in range(args.warmup):
        eager.step()
    for _ in range(args.warmup - 1):
        compiled.step()

    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.steps * args.repeats):
        for name, loop in (("eager", eager), ("compiled", compiled)):
            t0 = time.perf_counter()
            loop.step()
            times[name].append(time.perf_counter() - t0)

    tokens = eager.tokens_per_step * args.steps
    print(f"{torch.get_num_threads()} threads; first compiled step (compilation) {compile_seconds:.1f} s")
    print(f"{'rep':>3} {'eager tok/s':>12} {'compiled tok/s':>15} {'speed-up':>9}")
    ratios = []
    for rep in range(args.repeats):
        block = slice(rep * args.steps, (rep + 1) * args.steps)
        e, c = tokens / sum(times["eager"][block]), tokens / sum(times["compiled"][block])
        ratios.append(c / e)
        print(f"{rep:>3} {e:>12,.0f} {c:>15,.0f} {c / e:>8.3f}x")
    print(f"compile speed-up (compiled / eager tokens/s): min {min(ratios):.3f}  median {statistics.median(ratios):.3f}  "
          f"max {max(ratios):.3f}  ({args.repeats} repetitions of {args.steps} interleaved steps)")


if __name__ == "__main__":
    main()
