"""Run directories: plain names, the one latest checkpoint, and what a refused command leaves behind.

A run lives in RUNS_DIR/NAME (TensorBoard events, configs, checkpoints/). These are the rules
main.py applies before anything is built or written; they need neither Lightning nor a model.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import checkpoint_step

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class Invocation:
    """What this command found and made, so that a refused command can leave no trace."""

    run_dir: Path | None = None
    run_dir_existed: bool = True
    runs_dir_existed: bool = True
    files_before: set[Path] = field(default_factory=set)
    start_step: int = 0
    cli: Any = None  # the LightningCLI, whose trainer tells whether this command trained

    def trained(self) -> bool:
        trainer = getattr(self.cli, "trainer", None)
        return trainer is not None and trainer.global_step > self.start_step

    def undo(self) -> None:
        """Remove the files and directories this command created in the run directory."""
        if self.run_dir is None or not self.run_dir.is_dir():
            return
        for path in sorted(self.run_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path in self.files_before:
                continue
            if path.is_dir():
                if not any(path.iterdir()):
                    path.rmdir()
            else:
                path.unlink()
        if not self.run_dir_existed and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
            if not self.runs_dir_existed and not any(self.run_dir.parent.iterdir()):
                self.run_dir.parent.rmdir()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's one latest checkpoint, `checkpoints/last.ckpt`.

    Runs written before last.ckpt was unique may also hold last-v1.ckpt, last-v2.ckpt, ...:
    then the one with the highest step wins, whatever the file names say.
    """
    candidates = sorted((run_dir / "checkpoints").glob("last*.ckpt"))
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    # An unreadable one counts as oldest; it is reported when loaded, if it is all there is.
    steps = {path: checkpoint_step(path) or -1 for path in candidates}
    return max(candidates, key=lambda p: (steps[p], p.name == "last.ckpt"))


def known_runs(runs_dir: Path) -> str:
    """ " (runs in DIR: newest five)" for error messages that name a run that is not there."""
    runs = sorted((p for p in runs_dir.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    return f" (runs in {runs_dir}: {', '.join(p.name for p in runs[:5])})" if runs else f" ({runs_dir} has no runs)"


def unique_path(path: Path) -> Path:
    """`path`, or the first of path-2, path-3, ... (before the suffix) that does not exist yet."""
    n = 2
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return candidate


def after_non_finite_loss(run_dir: Path) -> str:
    """What is kept after a non-finite loss, for the end of its error line."""
    last = latest_checkpoint(run_dir)
    if last is not None:
        return (f"; the last good checkpoint is kept: {last} (step {checkpoint_step(last)}); "
                f"lower --model.lr and resume with --run {run_dir.name} --ckpt_path last")
    return (f"; no checkpoint had been written yet; the run's TensorBoard events and config are kept in {run_dir} "
            f"for diagnosis; lower --model.lr and start a new run")




def check_names(runs_dir: Path, run: str | None) -> None:
    """One-line ValueErrors for a runs directory that is a file and a run name that is not plain."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise ValueError(f"--runs_dir {runs_dir} is a file; give a directory (it is created if missing)")
    if run is not None and not RUN_NAME.fullmatch(run):
        raise ValueError(
            f"--run {run!r} is not a plain name; use letters, digits, '.', '_' and '-' (not starting with '.'), "
            f"e.g. --run sqa-1: the run lives in --runs_dir/NAME"
        )


def resolve_checkpoint(ckpt: str | None, run: str | None, runs_dir: Path, stage: str) -> tuple[Path | None, str | None]:
    """(the checkpoint file to load or None, the run) for --ckpt_path auto | last | PATH | None.

    `auto` resumes the run if it has a checkpoint and starts it otherwise: one command for a
    job a scheduler restarts (SLURM --requeue, torchrun --max-restarts). `last` is the run's
    latest checkpoint. A PATH inside RUNS_DIR/RUN/checkpoints/ continues that run.
    """
    if ckpt == "auto":
        if run is None or stage != "fit":
            raise ValueError("--ckpt_path auto is for fit with --run NAME: it resumes the run if it has a "
                             "checkpoint and starts it otherwise")
        ckpt = "last" if latest_checkpoint(runs_dir / run) is not None else None
    if ckpt is None:
        return None, run
    if ckpt == "last":
        if run is None:
            raise ValueError(f"--ckpt_path last needs --run NAME to know which run to resume{known_runs(runs_dir)}")
        if not (runs_dir / run).is_dir():
            raise ValueError(f"there is no run {run!r}{known_runs(runs_dir)}")
        path = latest_checkpoint(runs_dir / run)
        if path is None:
            raise ValueError(
                f"run {run!r} has no checkpoint to resume ({runs_dir / run / 'checkpoints' / 'last.ckpt'} "
                f"does not exist); start it afresh without --ckpt_path"
            )
        return path, run
    path = Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {ckpt}; check --ckpt_path")
    inside = path.resolve().parent
    if run is None and inside.name == "checkpoints" and inside.parent.parent == runs_dir.resolve():
        run = inside.parent.name  # resuming a run's checkpoint by path continues that run
    return path, run


def after_earlier_event_files(run_dir: Path) -> None:
    """Wait, if needed, until the clock's second is past the creation second of every TensorBoard event
    file under `run_dir`.

    TensorBoard reads a directory's event files in name order, and a name starts with its creation
    second (then host, process and a per-process counter, as text). A resumed attempt started in the
    same second as the earlier one, in the same process, could sort first and have its curves read
    as older: at most a second's wait keeps the attempts in order.
    """
    newest = 0
    for path in Path(run_dir).rglob("events.out.tfevents.*"):
        stamp = path.name.split(".")[3]
        if stamp.isdigit():
            newest = max(newest, int(stamp))
    wait = newest + 1 - time.time()
    if wait > 0:
        time.sleep(wait)
