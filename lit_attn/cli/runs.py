"""Run directories: plain names, the one latest checkpoint, and what a refused command leaves behind.

A run lives in RUNS_DIR/NAME (TensorBoard events, configs, checkpoints/). These are the rules
main.py applies before anything is built or written; they need neither Lightning nor a model.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_attn.cli.runlock import RunLock
from lit_attn.load import checkpoint_step
from lit_attn.training.checkpoint import stale_temporaries

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
EVENTS = "events.out.tfevents.*"


@dataclass
class Invocation:
    """What one command found in its run directory and what it made there, so that a refused command
    removes exactly its own files, never one another process wrote meanwhile.

    Its own files: the config it saved, the TensorBoard event files its writers named after this
    process, hparams.yaml if there was none, the checkpoints its AtomicCheckpointIO wrote (still the
    same files), its lock files; then the directories that were not there, if they are left empty.
    """

    run_dir: Path | None = None
    run_dir_existed: bool = True
    runs_dir_existed: bool = True
    dirs_before: set[Path] = field(default_factory=set)
    events_before: set[Path] = field(default_factory=set)
    hparams_before: set[Path] = field(default_factory=set)
    lock: RunLock | None = None
    start_step: int = 0
    cli: Any = None  # the LightningCLI, whose trainer tells whether this command trained

    @classmethod
    def begin(cls, run_dir: Path, cli: Any = None, lock: bool = False) -> Invocation:
        """Check that the run directory can be written, note what is there and, with `lock`, take the
        run's lock (a one-line ValueError if another process holds it). Writes nothing else."""
        check_writable(run_dir)
        existed = run_dir.is_dir()
        self = cls(
            run_dir=run_dir, run_dir_existed=existed, runs_dir_existed=run_dir.parent.is_dir(), cli=cli,
            dirs_before={p for p in run_dir.rglob("*") if p.is_dir()} if existed else set(),
            events_before=set(run_dir.rglob(EVENTS)) if existed else set(),
            hparams_before=set(run_dir.rglob("hparams.yaml")) if existed else set(),
        )
        if lock:
            self.lock = RunLock(run_dir)
            try:
                self.lock.acquire()
            except BaseException:
                self.undo()  # the directories it made for the lock file
                raise
        return self

    def trained(self) -> bool:
        trainer = getattr(self.cli, "trainer", None)
        return trainer is not None and trainer.global_step > self.start_step

    def locked(self) -> bool:
        return self.lock is not None and self.lock.held

    def release(self) -> None:
        """Give the run's lock up, if this command holds it."""
        if self.lock is not None:
            self.lock.release()

    def tidy(self, resumed: Path | None, checkpoint: dict[str, Any] | None) -> list[str]:
        """`tidy_checkpoints` while this command holds the run's lock; nothing otherwise."""
        return tidy_checkpoints(self.run_dir, resumed, checkpoint) if self.locked() and self.run_dir else []

    def own_files(self) -> list[Path]:
        """The files this command created that are still there."""
        if self.run_dir is None or not self.run_dir.is_dir():
            return []
        trainer = getattr(self.cli, "trainer", None)
        # TensorBoard names an event file after the writing process: events.out.tfevents.TIME.HOST.PID.N
        own = re.compile(rf"events\.out\.tfevents\.\d+\.{re.escape(socket.gethostname())}\.{os.getpid()}\.\d+.*")
        files = [p for p in self.run_dir.rglob(EVENTS) if own.fullmatch(p.name) and p not in self.events_before]
        # A logger writes hparams.yaml beside its event file where there is none yet.
        files += {p.parent / "hparams.yaml" for p in files} - self.hparams_before
        files += _saved_configs(trainer)
        io = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
        files += [Path(p) for p, identity in dict(getattr(io, "written", None) or {}).items()
                  if _identity(p) == identity]
        return [p for p in files if p.is_file()]

    def undo(self) -> None:
        """Remove this command's own files (see the class) and the directories it created, if empty."""
        for path in self.own_files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.release()
        if self.run_dir is None or not self.run_dir.is_dir():
            return
        new = [p for p in self.run_dir.rglob("*") if p.is_dir() and p not in self.dirs_before]
        for path in sorted(new, key=lambda p: len(p.parts), reverse=True):
            _remove_if_empty(path)
        if not self.run_dir_existed and _remove_if_empty(self.run_dir) and not self.runs_dir_existed:
            _remove_if_empty(self.run_dir.parent)


def _saved_configs(trainer: Any) -> list[Path]:
    """The config files the trainer's SaveConfigCallback saved: it never overwrites one, so they are its own."""
    logger = getattr(trainer, "logger", None)
    log_dir = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    log_dir = log_dir or getattr(trainer, "default_root_dir", None)
    return [Path(log_dir) / c.config_filename for c in getattr(trainer, "callbacks", None) or []
            if log_dir and getattr(c, "already_saved", False) and getattr(c, "config_filename", None)]


def _identity(path: str | Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _remove_if_empty(directory: Path) -> bool:
    """rmdir, which refuses a directory that is not empty (another process's files stay)."""
    try:
        directory.rmdir()
    except OSError:
        return False
    return True


def check_writable(run_dir: Path) -> None:
    """A one-line ValueError unless the run directory, or the nearest existing directory it would be made
    in, can be written; called before anything is built."""
    existing = next((p for p in (run_dir, *run_dir.parents) if p.is_dir()), None)
    if existing is None or os.access(existing, os.W_OK | os.X_OK):
        return
    read_only = hasattr(os, "statvfs") and bool(os.statvfs(existing).f_flag & getattr(os, "ST_RDONLY", 1))
    why = "read-only filesystem" if read_only else "permission denied"
    runs_dir = run_dir.parent
    if existing == run_dir:
        raise ValueError(f"cannot write to run directory {run_dir}: {why}; fix its permissions or copy the run "
                         f"into a writable --runs_dir")
    where = "" if existing == runs_dir else f" (cannot create it in {existing})"
    raise ValueError(f"cannot write to runs directory {runs_dir}{where}: {why}; pass a writable --runs_dir")


def listed_checkpoints(checkpoint: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(every file name the checkpoint callbacks' states in `checkpoint` name, the best-k ones among them)."""
    named, best = set(), set()
    for state in (checkpoint.get("callbacks") or {}).values():
        if not isinstance(state, dict):
            continue
        best |= {Path(p).name for p in state.get("best_k_models") or {}}
        named |= {Path(state[k]).name for k in ("best_model_path", "kth_best_model_path", "last_model_path")
                  if state.get(k)}
    return named | best, best


def tidy_checkpoints(run_dir: Path, resumed: Path | None, checkpoint: dict[str, Any] | None) -> list[str]:
    """Clear what an attempt of this run that was killed left in RUN/checkpoints: temporary files of saves
    that never finished and, when resuming from the run's latest checkpoint, the checkpoints written after
    it that no checkpoint callback's state in it lists (nothing would ever rotate them out); listed best
    checkpoints that are missing are reported (LastCheckpoint drops them from the list). One line per file.

    Only for the holder of the run's lock: then no save of this run is in progress.
    """
    ckpt_dir = run_dir / "checkpoints"
    notices = []
    for tmp in stale_temporaries(ckpt_dir):
        tmp.unlink(missing_ok=True)
        notices.append(f"removed {tmp}, the temporary file of a save that did not finish")
    latest = latest_checkpoint(run_dir)
    if resumed is None or checkpoint is None or latest is None or latest.resolve() != Path(resumed).resolve():
        return notices
    named, best = listed_checkpoints(checkpoint)
    step = int(checkpoint["global_step"])
    for path in sorted(ckpt_dir.glob("*.ckpt")):
        if path.name in named or path.name == "last.ckpt":
            continue
        written = checkpoint_step(path)
        if written is not None and written > step:
            path.unlink(missing_ok=True)
            notices.append(f"removed {path} (step {written}), written after {latest.name} (step {step}) by an "
                           f"attempt that was stopped before saving again; this run repeats those steps")
    for name in sorted(best):
        if not (ckpt_dir / name).exists():
            notices.append(f"{ckpt_dir / name}, one of the best checkpoints {latest.name} lists, is missing; "
                           f"it is dropped from the list")
    return notices


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's one latest checkpoint, `checkpoints/last.ckpt`; None if it has none."""
    last = run_dir / "checkpoints" / "last.ckpt"
    return last if last.is_file() else None


def find_run(run: str, runs_dir: str | Path = "runs", flag: str = "--run") -> Path:
    """The run's directory: RUNS_DIR/RUN, or RUN itself when that path is a run directory (holds config.yaml);
    FileNotFoundError (one line, naming the newest runs) otherwise."""
    runs_dir = Path(runs_dir).expanduser()
    for candidate in (runs_dir / run, Path(run).expanduser()):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"{flag} {run}: no such run ({runs_dir / run} holds no config.yaml); check {flag} and "
                            f"--runs_dir{known_runs(runs_dir) if runs_dir.is_dir() else ''}")


def run_checkpoint(run_dir: Path, which: str = "last", flag: str = "--ckpt") -> Path:
    """The checkpoint `which` names: last (the run's latest), best (the one its latest checkpoint's callbacks
    name best), or a file's path; FileNotFoundError (one line) otherwise."""
    from lit_attn.load import load_checkpoint

    if which not in ("last", "best"):
        path = Path(which).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{flag} {which}: no such checkpoint file; give last, best or a file")
        return path
    last = latest_checkpoint(run_dir)
    if last is None:
        raise FileNotFoundError(f"run {run_dir.name} has no checkpoint in {run_dir / 'checkpoints'} (it saved none "
                                f"yet); train it first, or give {flag} a file")
    if which == "last":
        return last
    states = (load_checkpoint(last, require=()).get("callbacks") or {}).values()
    named = [Path(str(s["best_model_path"])).name for s in states
             if isinstance(s, dict) and s.get("monitor") and s.get("best_model_path")]
    best = [run_dir / "checkpoints" / name for name in named if (run_dir / "checkpoints" / name).is_file()]
    if not best:
        raise FileNotFoundError(f"run {run_dir.name} has no best checkpoint ({last.name} names none that exists); "
                                f"use {flag} last")
    return best[0]


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


def after_non_finite_loss(run_dir: Path, advice: str = "lower --model.lr") -> str:
    """What is kept after a non-finite loss, and `advice` (what to change), for the end of its error line."""
    last = latest_checkpoint(run_dir)
    if last is not None:
        return (f"; the last good checkpoint is kept: {last} (step {checkpoint_step(last)}); "
                f"{advice} and resume with --run {run_dir.name} --ckpt_path last")
    return (f"; no checkpoint had been written yet; the run's TensorBoard events and config are kept in {run_dir} "
            f"for diagnosis; {advice} and start a new run")




def fit_configs(run_dir: Path) -> list[Path]:
    """The configs the run's fits saved, oldest first: config.yaml, then config.fit.yaml, config.fit-2.yaml, ..."""
    def attempt(path: Path) -> int:
        rest = path.name.removeprefix("config.fit").removesuffix(".yaml")
        return 0 if path.name == "config.yaml" else 1 if rest == "" else int(rest[1:]) if rest[1:].isdigit() else -1

    candidates = [run_dir / "config.yaml", *run_dir.glob("config.fit*.yaml")]
    return sorted((p for p in candidates if p.is_file() and attempt(p) >= 0), key=attempt)


class RunComplete(Exception):
    """A fit asked to resume a run that already reached its end: nothing to do, nothing written."""


def complete_message(run: str, checkpoint: dict[str, Any], trainer: dict[str, Any]) -> str | None:
    """The line for a resume with these trainer settings of a run whose `checkpoint` has nothing left to train;
    None when it has (a larger --trainer.max_steps or max_epochs, or a run stopped before its end).

    A run is complete when the end of fit that callbacks/final_validation.py records in the checkpoint (under
    "FinalValidation") is at the checkpoint's step and reaches max_steps or max_epochs, as Lightning counts
    them, or when the checkpoint is past max_steps. A run stopped at its last step without that end is not
    complete: its resume adds the final validation.
    """
    end = ((checkpoint.get("callbacks") or {}).get("FinalValidation") or {}).get("end") or {}
    step = int(checkpoint["global_step"])
    max_steps = -1 if trainer.get("max_steps") is None else int(trainer["max_steps"])
    if 0 < max_steps < step:
        return (f"run {run!r} is at step {step}, past --trainer.max_steps {max_steps}; nothing to do, nothing "
                f"written; to train it further, resume with --trainer.max_steps M, M > {step}")
    stopped = [state for key, state in (checkpoint.get("callbacks") or {}).items()
               if str(key).startswith("EarlyStopping") and isinstance(state, dict) and state.get("stopping_reason")]
    if stopped:  # the checkpoint holds an EarlyStopping's stop (its threshold, its patience): it would stop again
        why = " ".join(str(stopped[0].get("stopping_reason_message") or "an EarlyStopping callback").split())
        return (f"run {run!r} is complete at step {step} (stopped early: {why}); nothing to do, nothing written; "
                f"to train it further, resume with that EarlyStopping removed from --trainer.callbacks")
    if end.get("step") != step:
        return None
    max_epochs = trainer.get("max_epochs")
    if max_epochs is None:  # Lightning's default (its fit loop's max_epochs)
        max_epochs = 1000 if max_steps == -1 and trainer.get("max_time") is None else -1
    if 0 < max_steps <= step:
        reached, flag, count = f"--trainer.max_steps {max_steps}", "--trainer.max_steps", step
    elif 0 <= max_epochs <= int(end.get("epochs", 0)):
        reached, flag, count = f"--trainer.max_epochs {max_epochs}", "--trainer.max_epochs", int(end["epochs"])
    else:
        return None
    return (f"run {run!r} is complete at step {step} ({reached} reached); nothing to do, nothing written; "
            f"to train it further, resume with {flag} M, M > {count}")


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
            ckpt_dir = runs_dir / run / "checkpoints"
            others = sorted(ckpt_dir.glob("*.ckpt"), key=lambda p: checkpoint_step(p) or -1)
            fix = (f"give another of its checkpoints with --ckpt_path, e.g. {others[-1]}" if others
                   else "start it afresh without --ckpt_path" if stage == "fit"
                   else f"train it first (fit --run {run}), or give --ckpt_path FILE")
            verb = "resume" if stage == "fit" else stage
            raise ValueError(f"run {run!r} has no checkpoint to {verb} ({ckpt_dir / 'last.ckpt'} does not exist); "
                             f"{fix}")
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
