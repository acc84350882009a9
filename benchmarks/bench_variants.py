"""Time per training step of several model variants, interleaved: which attention costs what at one recipe.

Each variant is main.py's flags (the common ones after `--`, plus its own) built into a model with its own
data and fused AdamW, stepped by bench_overhead's bare loop (forward, backward, clip, step). After untimed
warm-up steps, the variants take one step each in turn, the order rotating every round so that none always
follows another; every `--steps` rounds form one repetition. Prints each variant's median time per step with
its min and max over repetitions, and its time relative to the first variant per repetition (min, median,
max), with torch's threads pinned and the load average before and after.

    python -m benchmarks.bench_variants --variant mha= \\
        --variant 'swa64=--model.attention_options {"window": 64}' -- --model.n_layer=4
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import torch

from .bench_overhead import BareLoop, build, parse_args


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'NAME=FLAGS' -> (NAME, main.py arguments); one-line ValueError when malformed.

    FLAGS are split before each `--`, not as a shell would, so a JSON value needs no inner quoting:
    'swa64=--model.attention_options {"window": 64} --model.n_layer=4'."""
    name, sep, flags = text.partition("=")
    name = name.strip()
    if not sep or not name or any(c.isspace() for c in name) or (flags.strip() and not flags.strip().startswith("--")):
        raise ValueError(f"--variant takes NAME=FLAGS, the flags starting with -- (e.g. "
                         f"'swa64=--model.attention_options {{\"window\": 64}}'), got {text!r}")
    args: list[str] = []
    for part in re.split(r"\s+(?=--)", flags.strip()) if flags.strip() else []:
        flag, _, value = part.partition(" ")
        args += [part] if "=" in flag or not value.strip() else [flag, value.strip()]
    return name, args


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: the variants rotated by the round's index."""
    k = round_index % len(names)
    return [*names[k:], *names[:k]]


def summarize(times: dict[str, list[float]], steps: int, repeats: int) -> list[str]:
    """The report's lines: per variant, the median time per step of each repetition summarized (median [min, max])
    and its ratio to the first variant's, paired by repetition."""
    names = list(times)
    per_rep = {n: [statistics.median(times[n][r * steps:(r + 1) * steps]) for r in range(repeats)] for n in names}
    first = names[0]
    lines = [f"{'variant':<12} {'ms/step median [min, max]':>28} {'vs ' + first + ' median [min, max]':>30}"]
    for n in names:
        ms = [t * 1e3 for t in per_rep[n]]
        ratios = [a / b for a, b in zip(per_rep[n], per_rep[first])]
        lines.append(f"{n:<12} {statistics.median(ms):>10.2f} [{min(ms):.2f}, {max(ms):.2f}]"
                     f"{statistics.median(ratios):>14.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    return lines


def fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.exit(2)


def main(argv: Sequence[str] | None = None) -> None:
    own = list(sys.argv[1:] if argv is None else argv)
    variants: list[tuple[str, list[str]]] = []
    rest: list[str] = []
    while own:  # --variant is repeatable and its value holds '=' and spaces: taken out before the common parser
        arg = own.pop(0)
        if arg == "--":
            rest += [arg, *own]
            break
        if arg == "--variant" or arg.startswith("--variant="):
            value = arg.partition("=")[2] if "=" in arg else (own.pop(0) if own else "")
            try:
                variants.append(parse_variant(value))
            except ValueError as e:
                fail(str(e))
        else:
            rest.append(arg)
    if len(variants) < 2:
        fail("give at least two --variant NAME=FLAGS to compare (the first is the reference)")
    if len({n for n, _ in variants}) != len(variants):
        fail("--variant names must differ")
    args = parse_args(__doc__, steps=10, repeats=5, warmup=5, warmup_help="untimed steps per variant at the start",
                      argv=rest, prog="python -m benchmarks.bench_variants")
    total = args.warmup + args.steps * args.repeats
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as runs_dir:
        loops = {name: BareLoop(build([f"--trainer.max_steps={total}", *args.extra, *flags], runs_dir, name), total)
                 for name, flags in variants}
        tokens = {loop.tokens_per_step for loop in loops.values()}
        for loop in loops.values():
            for _ in range(args.warmup):
                loop.step()
        times: dict[str, list[float]] = {name: [] for name in loops}
        for i in range(args.steps * args.repeats):
            for name in rotated(list(loops), i):
                t0 = time.perf_counter()
                loops[name].step()
                times[name].append(time.perf_counter() - t0)
    print("\n".join(summarize(times, args.steps, args.repeats)))
    print(f"{args.repeats} repetitions of {args.steps} interleaved rounds after {args.warmup} warm-up steps; "
          f"{torch.get_num_threads()} threads (pinned); tokens/step {', '.join(map(str, sorted(tokens)))}; "
          f"load average (1 min) {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
