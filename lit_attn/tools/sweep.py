"""Train one run per attention (and seed, and grid point) and compare them:
`lit-attn sweep --attention mha,gqa [--seeds 1,2,3] [--grid model.lr=1e-4,1e-3 ...] [--parallel 2] [-- MAIN_ARGS]`.

Each run is `lit-attn fit [--config FILE] MAIN_ARGS [--KEY=VALUE ...] --model.attention ATTN --run NAME
--runs_dir DIR --ckpt_path auto [--seed_everything SEED]` in its own process, so every run has the same config and
data; NAME is PREFIX-ATTN, PREFIX-ATTN-sSEED with --seeds, and PREFIX-ATTN-POINT[-sSEED] with --grid (POINT
names the run's grid point, e.g. lr4.6e-4: lit_attn.tools.sweep_grid). The sweep's own settings come last, so
no config file can override them, and each run checks before training (LIT_ATTN_EXPECT, see
lit_attn.cli.required_settings) and again in its saved config that it trains the attention, seed and grid point its
name says.
The same command again skips the runs it finished (with the same arguments) and resumes interrupted
ones from their last checkpoint (`--ckpt_path auto`): no run starts twice from step 0. With
--parallel N, N runs train at once, each with its share of the CPU cores (or its own GPU). A run
is finished when its last.ckpt is at the end of training its config sets, whatever its exit code
(a fit stopped by SIGTERM exits 0); one stopped before is reported as interrupted and resumed by
the same command. A failed or interrupted run is reported and the others still run; at the end
`lit_attn.tools.compare` is run on the finished ones (with --grid, with --best-of the grid's keys). Ctrl-C or
SIGTERM (a time limit: srun forwards it) starts no more runs, lets the running ones save last.ckpt and stop, and
prints the command that resumes the sweep. Exit code 0 if every run finished, 1 otherwise, 2 on a usage error, 130 after
Ctrl-C, 143 after SIGTERM.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from lit_attn.attention import get_attention
from lit_attn.cli.attention_check import check_before_launch
from lit_attn.cli.required_settings import ENV, MISSING, agrees, lookup
from lit_attn.cli.toolcli import ToolParser, check_outputs, check_seed, csv_list, split_extra
from lit_attn.tools.compare import OUTPUTS as COMPARE_OUTPUTS
from lit_attn.tools.compare import compare
from lit_attn.tools.sweep_fit import SweepInterrupted, SweepStop, fit_configs, last_checkpoint, run_variant, unfinished
from lit_attn.tools.sweep_grid import Grid, check_grids, point_name, points, read_grids

# How a run is started: the `lit-attn` command (lit_attn.cli.command) run by this interpreter, so an installed
# package (editable or not) works from any directory and uses the sweep's own environment.
LAUNCH = (sys.executable, "-m", "lit_attn")


# Written into a run's directory when its sweep command finished: the same command later skips it.
DONE_FILE = "sweep-done.json"

# The main.py flags the sweep sets on every run, and what to use instead of giving them after `--`.
OWN_FLAGS = {
    "--model.attention": "list the attentions with the sweep's --attention",
    "--seed_everything": "give the seeds with the sweep's --seeds",
    "--run": "runs are named PREFIX-ATTENTION[-POINT][-sSEED]: set the prefix with the sweep's --prefix",
    "--runs_dir": "use the sweep's --runs_dir (before `--`)",
    "--ckpt_path": "the sweep passes --ckpt_path=auto, which starts or resumes each run: remove it",
}


@dataclass(frozen=True)
class Job:
    """One run of the grid."""

    attention: str
    seed: int | None
    run: str
    cmd: tuple[str, ...]
    settings: tuple[tuple[str, object], ...] = ()  # its grid point: (config key, value as the config holds it)

    @property
    def expected(self) -> dict[str, object]:
        """The config settings this run must train with (dotted keys, as LIT_ATTN_EXPECT takes them)."""
        seeded = {} if self.seed is None else {"seed_everything": self.seed}
        return {"model.attention": self.attention, "run": self.run, **seeded, **dict(self.settings)}


def fit_command(attention: str, run: str, runs_dir: str, config: list[str], extra: list[str],
                seed: int | None = None, point: Sequence[str] = ()) -> list[str]:
    """The `main.py fit` command line of one run; `--ckpt_path auto` starts it or resumes it.

    The config files, then `extra` as given (a --config among them too), then the sweep's own flags:
    jsonargparse applies them in order, so nothing in a config or in `extra` overrides the grid point
    (`point`: --KEY=VALUE flags), attention, seed or run name the sweep asked for.
    """
    configs = [arg for path in config for arg in ("--config", path)]
    seeded = [] if seed is None else [f"--seed_everything={seed}"]
    return [*LAUNCH, "fit", *configs, *extra, *point, f"--model.attention={attention}",
            f"--run={run}", f"--runs_dir={runs_dir}", "--ckpt_path=auto", *seeded]


def check_extra(extra: Sequence[str]) -> None:
    """Refuse arguments after `--` that set what the sweep sets itself (`--flag value` or `--flag=value`)."""
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in OWN_FLAGS:
            raise ValueError(f"{arg} after `--` sets what the sweep sets for every run; {OWN_FLAGS[flag]}")


def grid(attentions: list[str], seeds: list[int] | None, prefix: str, runs_dir: str, config: list[str],
         extra: list[str], grids: Sequence[Grid] = ()) -> list[Job]:
    """attention x grid point x seed, in that order; without seeds one run per attention and point."""
    jobs = []
    for attention in attentions:
        for point in points(grids):
            flags = [f"--{g.key}={g.texts[i]}" for g, i in point]
            settings = tuple((g.config_key, g.values[i]) for g, i in point)
            for seed in seeds or [None]:
                run = "-".join([prefix, attention, *([point_name(point)] if point else []),
                                *([] if seed is None else [f"s{seed}"])])
                cmd = fit_command(attention, run, runs_dir, config, extra, seed, flags)
                jobs.append(Job(attention, seed, run, tuple(cmd), settings))
    return jobs


def finished(job: Job, runs_dir: str) -> bool:
    """Whether this exact command already completed this run, as it asked."""
    run_dir = Path(runs_dir) / job.run
    try:
        done = json.loads((run_dir / DONE_FILE).read_text())
        same = done.get("args") == list(job.cmd[2:]) and done.get("expected") == job.expected
    except (OSError, ValueError, AttributeError):
        return False
    # The checkpoint is checked again: a mark written when exit 0 alone counted as finished may name a
    # fit that SIGTERM stopped.
    return same and saved_mismatch(run_dir, job.expected) is None and unfinished(run_dir, "") is None


# The arguments in which the runs of one grid differ; the rest are the grid's settings.
PER_RUN = ("--model.attention=", "--run=", "--seed_everything=")


def grid_settings(args: Sequence[str], keys: Sequence[str] = ()) -> list[str]:
    """A run's fit arguments without those in which the runs of one grid differ (attention, name, seed, and the
    grid's `keys`)."""
    per_run = (*PER_RUN, *(f"--{key}=" for key in keys))
    return [arg for arg in args if not arg.startswith(per_run)]


def earlier_runs(jobs: list[Job], prefix: str, runs_dir: str) -> dict[str, Path]:
    """Finished runs PREFIX-* that are not among `jobs` but were trained by a sweep with their settings:
    the same experiment, started with other --attention or --seeds (or one --task at a time)."""
    keys = [key.replace("data.init_args.", "data.", 1) for key, _ in jobs[0].settings]  # as --grid names them
    ours, settings = {job.run for job in jobs}, grid_settings(jobs[0].cmd[2:], keys)
    found = {}
    for run_dir in sorted(d for d in Path(runs_dir).iterdir() if d.name.startswith(f"{prefix}-")):
        try:
            done = json.loads((run_dir / DONE_FILE).read_text())
            # The job its sweep ran, so that `finished` checks it as a sweep's skip does.
            expected = done["expected"]
            point = tuple((k, v) for k, v in expected.items() if k not in ("model.attention", "run", "seed_everything"))
            job = Job(expected["model.attention"], expected.get("seed_everything"), run_dir.name,
                      (*LAUNCH[:2], *done["args"]), point)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if run_dir.name not in ours and grid_settings(done["args"], keys) == settings and finished(job, runs_dir):
            found[run_dir.name] = run_dir
    return found


def saved_mismatch(run_dir: Path, expected: dict[str, object]) -> str | None:
    """Why the configs the run saved for its fits (config.yaml, and config.fit*.yaml of resumed
    attempts) do not train what the sweep asked for; None when every one does."""
    if not (run_dir / "config.yaml").is_file():
        return f"it saved no {run_dir / 'config.yaml'}, so what it trained is unknown"
    for path in fit_configs(run_dir):
        try:
            saved = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            return f"cannot read {path}: {e}"
        for key, want in expected.items():
            if not agrees(got := lookup(saved, key), want):
                shown = "nothing" if got is MISSING else repr(got)
                return f"{path} says {key}={shown}, but the sweep asked for {want!r}"
    return None


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


def fit_all(todo: list[Job], runs_dir: str, parallel: int, stop: SweepStop,
            ok: dict[str, Path]) -> tuple[dict[str, str], dict[str, str]]:
    """Fit `todo`, `parallel` runs at a time, adding each success to `ok`; returns ({run: why it
    failed}, {run: how it was stopped or "not started"}). A success is a fit that exited 0, trained to
    the end its config sets (see `unfinished`) and saved configs that train what the sweep asked for;
    it gets its DONE_FILE."""
    failed: dict[str, str] = {}
    stopped: dict[str, str] = {}
    envs = run_environments(parallel)

    def run_job(i: int, job: Job) -> tuple[Job, int | None, str]:
        if not stop.pressed:
            shown = " ".join(["lit-attn", *job.cmd[len(LAUNCH):]])
            print(f"[sweep {i + 1}/{len(todo)}] {job.run}: {shown}", file=sys.stderr, flush=True)
        env = envs[i % parallel] | {ENV: json.dumps(job.expected)}
        return job, *run_variant(job.cmd, env, f"[{job.run}] " if parallel > 1 else "", stop)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for job, rc, reason in pool.map(run_job, range(len(todo)), todo):
            run_dir = Path(runs_dir) / job.run
            wrong = saved_mismatch(run_dir, job.expected) if rc == 0 else None
            # Exit 0 is also how a fit stopped by SIGTERM ends: only its checkpoint says whether it is done.
            kind, how = (unfinished(run_dir, reason) if rc == 0 and wrong is None else None) or ("", "")
            if rc is None:
                stopped[job.run] = "not started"
            elif rc == 0 and wrong is None and not kind:
                ok[job.run] = run_dir
                (run_dir / DONE_FILE).write_text(json.dumps({"args": list(job.cmd[2:]), "expected": job.expected}))
            elif kind == "interrupted" or (rc != 0 and stop.pressed):
                stopped[job.run] = f"interrupted ({how or f'exit code {rc}'})"
                if not stop.pressed:
                    print(f"[sweep] {job.run} {stopped[job.run]}: the same sweep command resumes it; continuing",
                          file=sys.stderr, flush=True)
            elif stop.pressed and wrong is None and not last_checkpoint(run_dir).exists():
                # Signalled while it was still setting up, it exits 0 before its first save: the same command
                # starts it again, as it does a fit killed before its handlers were in place.
                stopped[job.run] = "interrupted (stopped before its first checkpoint)"
            else:
                failed[job.run] = wrong or how or (f"exit code {rc}: {reason}" if reason else f"exit code {rc}")
                print(f"[sweep] {job.run} FAILED ({failed[job.run]}); continuing", file=sys.stderr, flush=True)
    return failed, stopped


def sweep(attentions: list[str], runs_dir: str = "runs", prefix: str = "sweep", config: list[str] | None = None,
          extra: list[str] | None = None, out: str | None = None, seeds: list[int] | None = None,
          parallel: int = 1, task: int | None = None, overwrite: bool = False,
          grids: Sequence[Grid] = ()) -> tuple[dict[str, Path], dict[str, str]]:
    """Fit every run of the grid (skipping finished ones), then compare the successful runs, and the
    finished runs of earlier sweeps with this prefix and these settings (`earlier_runs`), into `out`.
    An `out` given is checked first, as `lit-attn compare` checks it (its files replaced only with `overwrite`,
    never among the runs); the default RUNS_DIR/PREFIX-compare is the sweep's own, which every sweep of the
    prefix rewrites.

    With `grids` (sweep_grid.read_grids), one run per grid point too, compared with --best-of the grids' keys.
    With `task`, only the task-th run of the grid (0-based: attention, then grid point, then seed), and no
    comparison:
    one run per task of a job array. Returns ({run name: run dir} of successes, {run name:
    reason} of failures and interrupted runs). `out` defaults to RUNS_DIR/PREFIX-compare. After
    Ctrl-C or SIGTERM, once the running fits have stopped, raises SweepInterrupted.
    """
    jobs = grid(attentions, seeds, prefix, runs_dir, config or [], extra or [], grids)
    if out is not None and task is None:
        check_outputs(Path(out), COMPARE_OUTPUTS, overwrite, runs=[Path(runs_dir) / job.run for job in jobs],
                      runs_dirs=[Path(runs_dir)])
    if task is not None:
        if not 0 <= task < len(jobs):
            raise ValueError(f"--task {task} is outside the grid's {len(jobs)} runs (0 to {len(jobs) - 1})")
        jobs = [jobs[task]]
    with SweepStop() as stop:
        ok = {job.run: Path(runs_dir) / job.run for job in jobs if finished(job, runs_dir)}
        for run in ok:
            print(f"[sweep] {run}: finished by an earlier sweep, skipped", file=sys.stderr, flush=True)
        failed, stopped = fit_all([job for job in jobs if job.run not in ok], runs_dir, parallel, stop, ok)
        if stop.pressed:
            raise SweepInterrupted([job.run for job in jobs if job.run in ok], stopped, failed, stop)
    if ok and task is None:
        out_dir = Path(out) if out else Path(runs_dir) / f"{prefix}-compare"
        # A sweep split into pieces (an attention or seed at a time) compares the whole experiment so far,
        # not only its own piece: each piece rewrites the same PREFIX-compare.
        earlier = earlier_runs(jobs, prefix, runs_dir)
        best = {"best_of": [g.key for g in grids]} if grids else {}
        _, table = compare([ok[job.run] for job in jobs if job.run in ok] + list(earlier.values()), out_dir, **best)
        print(table, end="")
        also = f" (with {len(earlier)} finished by earlier sweeps with these settings: {', '.join(earlier)})"
        print(f"[sweep] comparison written to {out_dir}{also if earlier else ''}", file=sys.stderr)
    for run, reason in failed.items():
        print(f"[sweep] failed: {run} ({reason})", file=sys.stderr)
    for run, how in stopped.items():
        print(f"[sweep] {run} {how}: the same sweep command resumes it", file=sys.stderr)
    print(f"[sweep] {len(ok)} succeeded, {len(failed)} failed, {len(stopped)} interrupted", file=sys.stderr)
    return ok, failed | stopped


def report_interrupted(stop: SweepInterrupted, command: str) -> None:
    """What Ctrl-C or SIGTERM left: the finished, interrupted, unstarted and failed runs, and how to go on."""
    def runs(names: list[str]) -> str:
        return ", ".join(names) or "none"

    interrupted = [run for run, how in stop.stopped.items() if how != "not started"]
    print(f"[sweep] stopped by {stop.name}\n[sweep] finished: {runs(stop.finished)}\n"
          f"[sweep] interrupted: {runs(interrupted)}\n"
          f"[sweep] not started: {runs([run for run in stop.stopped if run not in interrupted])}", file=sys.stderr)
    for run in interrupted:
        print(f"[sweep] {run}: {stop.stopped[run]}", file=sys.stderr)
    for run, reason in stop.failed.items():
        print(f"[sweep] failed: {run} ({reason})", file=sys.stderr)
    print(f"[sweep] resume with the same command (it skips finished runs and resumes interrupted ones from "
          f"their last.ckpt): {command}", file=sys.stderr)


def parse_args(argv: Sequence[str] | None = None):
    """Sweep options before `--` (a jsonargparse Namespace), main.py arguments after it."""
    own, extra = split_extra(argv)
    p = ToolParser(
        prog="lit-attn sweep", description=__doc__.splitlines()[0],
        epilog="Arguments after `--` go to every `main.py fit`, e.g. -- --data.path=data.txt --trainer.max_steps=500",
    )
    p.add_argument("--attention", type=str, required=True, help="comma-separated attention names, e.g. mha,gqa,mqa,sqa")
    p.add_argument("--config", action="append", default=[], help="config file for main.py (repeatable)")
    p.add_argument("--runs_dir", type=str, default="runs", help="directory that holds the run directories")
    p.add_argument("--prefix", type=str, default="sweep",
                   help="run names are PREFIX-ATTENTION, with -POINT (e.g. -lr4.6e-4) with --grid and -sSEED with "
                        "--seeds")
    p.add_argument("--seeds", type=str, default=None,
                   help="comma-separated seeds (seed_everything): one run per attention and seed, e.g. 1,2,3")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a fit option and its values, e.g. model.lr=1e-4,4.6e-4,2.2e-3,1e-2: one run per value "
                        "(repeatable: one per point of the cross product), named PREFIX-ATTENTION-lr4.6e-4[-sSEED]")
    p.add_argument("--parallel", type=int, default=1,
                   help="runs trained at once; each gets its share of the CPU threads, or its own GPU")
    p.add_argument("--task", type=int | None, default=None,
                   help="train only this run of the grid (0-based: attention, then grid point, then seed) and "
                        "compare nothing: one run "
                        "per task of a job array, e.g. --task $SLURM_ARRAY_TASK_ID")
    p.add_argument("--out", type=str, default=None,
                   help="comparison output directory (default: RUNS_DIR/PREFIX-compare, the sweep's own)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison's files in --out")
    return p.parse_args(own), extra


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; 0 if every run finished, 1 if any failed or was interrupted, 2 on a usage error,
    130 after Ctrl-C, 143 after SIGTERM."""
    args, extra = parse_args(argv)
    attentions = csv_list(args.attention)
    command = shlex.join(["lit-attn", "sweep", *(sys.argv[1:] if argv is None else argv)])
    try:
        check_extra(extra)
        if not attentions:
            raise ValueError("--attention needs at least one name, e.g. --attention mha,gqa")
        if len(set(attentions)) != len(attentions):
            raise ValueError(f"--attention lists a name twice: {args.attention}")
        for name in attentions:  # a typo fails here, not in every run
            get_attention(name)
        for path in args.config:
            if not Path(path).is_file():
                raise ValueError(f"config file not found: {path}")
        # A class named by its import path is checked once here, not refused by each of its runs.
        check_before_launch([arg for path in args.config for arg in ("--config", path)] + extra, attentions)
        seeds = None if args.seeds is None else [_seed(text) for text in csv_list(args.seeds)]
        if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)):
            raise ValueError(f"--seeds needs distinct integers, e.g. --seeds 1,2,3; got {args.seeds!r}")
        if args.parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
        configs = [arg for path in args.config for arg in ("--config", path)]
        grids = read_grids(check_grids(args.grid, extra), configs + extra)
        _, failed = sweep(attentions, args.runs_dir, args.prefix, args.config, extra, args.out, seeds, args.parallel,
                          args.task, args.overwrite, grids)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SweepInterrupted as stop:
        report_interrupted(stop, command)
        return stop.exit_code
    except KeyboardInterrupt:
        # Ctrl-C outside the fits (while checking the arguments or comparing): nothing is half done.
        print(f"\n[sweep] stopped by Ctrl-C; resume with the same command: {command}", file=sys.stderr)
        return 130
    return 1 if failed else 0


def _seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        raise ValueError(f"--seeds takes integers, e.g. --seeds 1,2,3; got {text!r}") from None
    return check_seed(seed, "--seeds")


if __name__ == "__main__":
    sys.exit(main())
