"""Train one run per attention and compare them: `python -m lit_attn.sweep --attention mha,gqa [-- MAIN_ARGS]`.

Each variant is `python main.py fit [--config FILE] --model.attention ATTN --run PREFIX-ATTN
--runs_dir DIR MAIN_ARGS` in its own process, so every run has the same config, seed and data.
A failed variant is reported and the others still run; at the end `lit_attn.compare` is run
on the successful ones. Exit code 0 if every variant succeeded, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

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


def fit_command(attention: str, run: str, runs_dir: str, config: list[str], extra: list[str]) -> list[str]:
    """The `main.py fit` command line of one variant."""
    configs = [arg for path in config for arg in ("--config", path)]
    return [sys.executable, str(main_script()), "fit", *configs, f"--model.attention={attention}", f"--run={run}",
            f"--runs_dir={runs_dir}", *extra]


def run_variant(cmd: list[str]) -> tuple[int, str]:
    """Run one fit, echoing its output; return (exit code, its last `error:` line or last stderr line)."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
    last, error = "", ""
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        if line.strip():
            last = line.strip()
            if line.startswith("error:"):
                error = line.strip()
    return proc.wait(), error or last


def sweep(attentions: list[str], runs_dir: str = "runs", prefix: str = "sweep", config: list[str] | None = None,
          extra: list[str] | None = None, out: str | None = None) -> tuple[dict[str, Path], dict[str, str]]:
    """Fit every attention in turn, then compare the successful runs into `out`.

    Returns ({attention: run dir} of successes, {attention: reason} of failures).
    `out` defaults to RUNS_DIR/PREFIX-compare.
    """
    ok: dict[str, Path] = {}
    failed: dict[str, str] = {}
    for i, attention in enumerate(attentions, 1):
        run = f"{prefix}-{attention}"
        cmd = fit_command(attention, run, runs_dir, config or [], extra or [])
        print(f"[sweep {i}/{len(attentions)}] {attention}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        rc, reason = run_variant(cmd)
        if rc == 0:
            ok[attention] = Path(runs_dir) / run
        else:
            failed[attention] = f"exit code {rc}: {reason}" if reason else f"exit code {rc}"
            print(f"[sweep] {attention} FAILED ({failed[attention]}); continuing", file=sys.stderr, flush=True)
    if ok:
        out_dir = Path(out) if out else Path(runs_dir) / f"{prefix}-compare"
        _, table = compare(list(ok.values()), out_dir)
        print(table, end="")
        print(f"[sweep] comparison written to {out_dir}", file=sys.stderr)
    for attention, reason in failed.items():
        print(f"[sweep] failed: {attention} ({reason})", file=sys.stderr)
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
    p.add_argument("--prefix", type=str, default="sweep", help="run names are PREFIX-ATTENTION")
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
        _, failed = sweep(attentions, args.runs_dir, args.prefix, args.config, extra, args.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
