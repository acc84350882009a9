"""Train one run per attention (and seed) and compare them:
`python -m lit_attn.sweep --attention mha,gqa [--seeds 1,2,3] [--parallel 2] [-- MAIN_ARGS]`.

Each run is `python main.py fit [--config FILE] --model.attention ATTN --run NAME --runs_dir DIR
--ckpt_path auto [--seed_everything SEED] MAIN_ARGS` in its own process, so every run has the same
config and data; NAME is PREFIX-ATTN, or PREFIX-ATTN-sSEED with --seeds. The same command again
skips the runs it finished (with the same arguments) and resumes interrupted ones from their last
checkpoint (`--ckpt_path auto`): no run starts twice from step 0. With --parallel N, N runs train
at once, each with its share of the CPU cores (or its own GPU). A failed run is reported and the
others still run; at the end `lit_attn.compare` is run on the successful ones. Exit code 0 if
every run succeeded, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

import lit_attn

from .compare import compare
from .toolcli import ToolParser, csv_list, split_extra


def main_script() -> Path:
    """The project's `main.py`, whatever the working directory.

    main.py is a top-level script of the checkout, not part of the installed packages, so
    `importlib.util.find_spec("main")` finds it only when the working directory is the checkout
    (and would find another project's main.py elsewhere). The project is installed editable
    (`pip install -e .`), so the lit_attn package imported here is the checkout's, and main.py
    sits beside it.
    """
    path = Path(next(iter(lit_attn.__path__))).resolve().parent / "main.py"
    if not path.is_file():
        raise ValueError(f"main.py not found beside the lit_attn package ({path}); run from a checkout installed "
                         "with `pip install -e .`")
    return path


# Written into a run's directory when its sweep command finished: the same command later skips it.
DONE_FILE = "sweep-done.json"


@dataclass(frozen=True)
class Job:
    """One run of the grid."""

    attention: str
    seed: int | None
    run: str
    cmd: tuple[str, ...]


def fit_command(attention: str, run: str, runs_dir: str, config: list[str], extra: list[str],
                seed: int | None = None) -> list[str]:
    """The `main.py fit` command line of one run; `--ckpt_path auto` starts it or resumes it."""
    configs = [arg for path in config for arg in ("--config", path)]
    seeded = [] if seed is None else [f"--seed_everything={seed}"]
    return [sys.executable, str(main_script()), "fit", *configs, f"--model.attention={attention}", f"--run={run}",
            f"--runs_dir={runs_dir}", "--ckpt_path=auto", *seeded, *extra]


def grid(attentions: list[str], seeds: list[int] | None, prefix: str, runs_dir: str, config: list[str],
         extra: list[str]) -> list[Job]:
    """attention x seed, in that order; without seeds one run per attention."""
    jobs = []
    for attention in attentions:
        for seed in seeds or [None]:
            run = f"{prefix}-{attention}" if seed is None else f"{prefix}-{attention}-s{seed}"
            jobs.append(Job(attention, seed, run, tuple(fit_command(attention, run, runs_dir, config, extra, seed))))
    return jobs


def finished(job: Job, runs_dir: str) -> bool:
    """Whether this exact command already completed this run."""
    done = Path(runs_dir) / job.run / DONE_FILE
    try:
        return json.loads(done.read_text()).get("args") == list(job.cmd[2:])
    except (OSError, ValueError, AttributeError):
        return False


def run_environments(parallel: int) -> list[dict[str, str]]:
    """The environment of each of `parallel` slots: its own GPU where there are enough, else an equal
    share of the CPU cores (threads), so parallel runs do not oversubscribe the machine."""
    base = dict(os.environ)
    gpus = torch.cuda.device_count()
    if gpus >= parallel > 1:
        return [base | {"CUDA_VISIBLE_DEVICES": str(i)} for i in range(parallel)]
    threads = str(max(1, (os.cpu_count() or 1) // parallel))
    return [base | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads} if parallel > 1 else base
            for _ in range(parallel)]


def run_variant(cmd: Sequence[str], env: dict[str, str] | None = None, tag: str = "") -> tuple[int, str]:
    """Run one fit, echoing its stderr (each line prefixed with `tag`); return (exit code, its last
    `error:` line or last stderr line)."""
    proc = subprocess.Popen(list(cmd), stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    last, error = "", ""
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(f"{tag}{line}" if tag else line)
        if line.strip():
            last = line.strip()
            if line.startswith("error:"):
                error = line.strip()
    return proc.wait(), error or last


def sweep(attentions: list[str], runs_dir: str = "runs", prefix: str = "sweep", config: list[str] | None = None,
          extra: list[str] | None = None, out: str | None = None, seeds: list[int] | None = None,
          parallel: int = 1, task: int | None = None) -> tuple[dict[str, Path], dict[str, str]]:
    """Fit every run of the grid (skipping finished ones), then compare the successful runs into `out`.

    With `task`, only the task-th run of the grid (0-based, attention-major), and no comparison:
    one run per task of a job array. Returns ({run name: run dir} of successes, {run name:
    reason} of failures). `out` defaults to RUNS_DIR/PREFIX-compare.
    """
    jobs = grid(attentions, seeds, prefix, runs_dir, config or [], extra or [])
    if task is not None:
        if not 0 <= task < len(jobs):
            raise ValueError(f"--task {task} is outside the grid's {len(jobs)} runs (0 to {len(jobs) - 1})")
        jobs = [jobs[task]]
    ok = {job.run: Path(runs_dir) / job.run for job in jobs if finished(job, runs_dir)}
    for run in ok:
        print(f"[sweep] {run}: finished by an earlier sweep, skipped", file=sys.stderr, flush=True)
    todo = [job for job in jobs if job.run not in ok]
    failed: dict[str, str] = {}
    envs = run_environments(parallel)

    def run_job(i: int, job: Job) -> tuple[Job, int, str]:
        print(f"[sweep {i + 1}/{len(todo)}] {job.run}: {' '.join(job.cmd[1:])}", file=sys.stderr, flush=True)
        rc, reason = run_variant(job.cmd, envs[i % parallel], f"[{job.run}] " if parallel > 1 else "")
        return job, rc, reason

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for job, rc, reason in pool.map(run_job, range(len(todo)), todo):
            if rc == 0:
                ok[job.run] = Path(runs_dir) / job.run
                (ok[job.run] / DONE_FILE).write_text(json.dumps({"args": list(job.cmd[2:])}))
            else:
                failed[job.run] = f"exit code {rc}: {reason}" if reason else f"exit code {rc}"
                print(f"[sweep] {job.run} FAILED ({failed[job.run]}); continuing", file=sys.stderr, flush=True)
    if ok and task is None:
        out_dir = Path(out) if out else Path(runs_dir) / f"{prefix}-compare"
        _, table = compare([ok[job.run] for job in jobs if job.run in ok], out_dir)
        print(table, end="")
        print(f"[sweep] comparison written to {out_dir}", file=sys.stderr)
    for run, reason in failed.items():
        print(f"[sweep] failed: {run} ({reason})", file=sys.stderr)
    print(f"[sweep] {len(ok)} succeeded, {len(failed)} failed", file=sys.stderr)
    return ok, failed


def parse_args(argv: Sequence[str] | None = None):
    """Sweep options before `--` (a jsonargparse Namespace), main.py arguments after it."""
    own, extra = split_extra(argv)
    p = ToolParser(
        prog="python -m lit_attn.sweep", description=__doc__.splitlines()[0],
        epilog="Arguments after `--` go to every `main.py fit`, e.g. -- --data.path=data.txt --trainer.max_steps=500",
    )
    p.add_argument("--attention", type=str, required=True, help="comma-separated attention names, e.g. mha,gqa,mqa,sqa")
    p.add_argument("--config", action="append", default=[], help="config file for main.py (repeatable)")
    p.add_argument("--runs_dir", type=str, default="runs", help="directory that holds the run directories")
    p.add_argument("--prefix", type=str, default="sweep",
                   help="run names are PREFIX-ATTENTION, or PREFIX-ATTENTION-sSEED with --seeds")
    p.add_argument("--seeds", type=str, default=None,
                   help="comma-separated seeds (seed_everything): one run per attention and seed, e.g. 1,2,3")
    p.add_argument("--parallel", type=int, default=1,
                   help="runs trained at once; each gets its share of the CPU threads, or its own GPU")
    p.add_argument("--task", type=int | None, default=None,
                   help="train only this run of the grid (0-based, attention-major) and compare nothing: one run "
                        "per task of a job array, e.g. --task $SLURM_ARRAY_TASK_ID")
    p.add_argument("--out", type=str, default=None,
                   help="comparison output directory (default: RUNS_DIR/PREFIX-compare)")
    return p.parse_args(own), extra


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; 0 if every variant succeeded, 1 if any failed, 2 on a usage error."""
    args, extra = parse_args(argv)
    attentions = csv_list(args.attention)
    try:
        if not attentions:
            raise ValueError("--attention needs at least one name, e.g. --attention mha,gqa")
        if len(set(attentions)) != len(attentions):
            raise ValueError(f"--attention lists a name twice: {args.attention}")
        for path in args.config:
            if not Path(path).is_file():
                raise ValueError(f"config file not found: {path}")
        seeds = None if args.seeds is None else [_seed(text) for text in csv_list(args.seeds)]
        if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)):
            raise ValueError(f"--seeds needs distinct integers, e.g. --seeds 1,2,3; got {args.seeds!r}")
        if args.parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
        _, failed = sweep(attentions, args.runs_dir, args.prefix, args.config, extra, args.out, seeds, args.parallel,
                          args.task)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--seeds takes integers, e.g. --seeds 1,2,3; got {text!r}") from None


if __name__ == "__main__":
    sys.exit(main())
