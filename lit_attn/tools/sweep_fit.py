"""One fit of a sweep: its process, the signals that stop the sweep, and whether the fit reached its end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

# The line a fit prints on stderr when SIGTERM or Ctrl-C stopped it (callbacks/checkpointing.py,
# LastCheckpoint._stop); after SIGTERM the fit exits 0 on purpose, so a scheduler sees a clean stop.
STOP_LINE = re.compile(r"\b(SIGTERM|Ctrl-C): stopped after step \d+")
# What each signal is called in messages, and the sweep's exit code after it (128 + the signal number).
SIGNALS = {signal.SIGINT: ("Ctrl-C", 130), signal.SIGTERM: ("SIGTERM", 143)}


class SweepStop:
    """Ctrl-C or SIGTERM during a sweep, as a flag: no more runs start, and the running fits save
    last.ckpt and stop by themselves.

    Ctrl-C reaches the fits from the terminal (they share the sweep's process group) and is not sent
    again: a second one aborts a fit at once. SIGTERM may come to the sweep alone (`kill`, or srun
    forwarding it to the job step's task), so it is forwarded to every running fit; a fit that got
    it already only notes it again. The handler writes one unbuffered notice and otherwise only
    notes the signal, so it may land anywhere; Python installs handlers from the main thread only,
    so elsewhere this does nothing.
    """

    def __init__(self) -> None:
        self.at: float | None = None  # time.monotonic() of the first signal
        self.signum: int | None = None
        self._running: dict[subprocess.Popen, float] = {}  # the fits running now: when each was launched
        self._previous: dict[int, Any] = {}

    def __call__(self, signum: int, frame: object) -> None:
        if self.at is None:
            self.at, self.signum = time.monotonic(), signum
            os.write(2, f"\n[sweep] {self.name}: starting no more runs; the running ones save last.ckpt and stop\n"
                     .encode())
        if signum == signal.SIGTERM:
            for proc in tuple(self._running):  # tuple(): one C call, no other thread runs meanwhile
                _terminate(proc)

    @property
    def pressed(self) -> bool:
        return self.at is not None

    @property
    def name(self) -> str:
        return SIGNALS.get(self.signum, ("Ctrl-C", 130))[0]

    @property
    def exit_code(self) -> int:
        return SIGNALS.get(self.signum, ("Ctrl-C", 130))[1]

    def missed(self, launched: float) -> bool:
        """Whether a fit launched at `launched` (time.monotonic()) was started after the signal, so never got it."""
        return self.at is not None and self.at < launched

    def started(self, proc: subprocess.Popen, launched: float) -> None:
        """Track a fit just launched; a SIGTERM that came while it was launched is passed on to it."""
        self._running[proc] = launched
        if self.signum == signal.SIGTERM:
            _terminate(proc)

    def ended(self, proc: subprocess.Popen) -> None:
        self._running.pop(proc, None)

    def __enter__(self) -> SweepStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self) for signum in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, previous if previous is not None else default)
        self._previous = {}


def _terminate(proc: subprocess.Popen) -> None:
    try:
        proc.send_signal(signal.SIGTERM)  # nothing once the process has been waited for
    except ProcessLookupError:
        pass


class SweepInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the sweep; every fit it started has ended."""

    def __init__(self, finished: list[str], stopped: dict[str, str], failed: dict[str, str], stop: SweepStop):
        super().__init__(f"stopped by {stop.name}")
        self.finished, self.stopped, self.failed = finished, stopped, failed
        self.name, self.exit_code = stop.name, stop.exit_code


def run_variant(cmd: Sequence[str], env: dict[str, str] | None = None, tag: str = "",
                ctrl_c: SweepStop | None = None) -> tuple[int | None, str]:
    """Run one fit, echoing its stderr (each line prefixed with `tag`); return (exit code, its last
    `error:` line, else its stop line, else its last stderr line), or (None, "not started") when
    the sweep was stopped before the fit started."""
    if ctrl_c is not None and ctrl_c.pressed:
        return None, "not started"
    launched = time.monotonic()
    proc = subprocess.Popen(list(cmd), stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    if ctrl_c is not None and ctrl_c.missed(launched):
        # The signal came between the check and the launch: this fit never saw it and has done nothing yet.
        proc.kill()
        proc.communicate()
        return None, "not started"
    if ctrl_c is not None:
        ctrl_c.started(proc, launched)
    last, stop, error = "", "", ""
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            sys.stderr.write(f"{tag}{line}" if tag else line)
            if line.strip():
                last = line.strip()
                if line.startswith("error:"):
                    error = line.strip()
                elif STOP_LINE.search(line):
                    stop = line.strip()
        return proc.wait(), error or stop or last
    finally:
        if ctrl_c is not None:
            ctrl_c.ended(proc)


def fit_configs(run_dir: Path) -> list[Path]:
    """The configs the run's fits saved, oldest first: config.yaml, then config.fit.yaml, config.fit-2.yaml, ..."""
    def attempt(path: Path) -> int:
        rest = path.name.removeprefix("config.fit").removesuffix(".yaml")
        return 0 if path.name == "config.yaml" else 1 if rest == "" else int(rest[1:]) if rest[1:].isdigit() else -1

    return sorted((p for p in [run_dir / "config.yaml", *run_dir.glob("config.fit*.yaml")] if attempt(p) >= 0),
                  key=attempt)


def latest_config(run_dir: Path) -> dict[str, Any]:
    """The config saved by the run's latest fit ({} if there is none)."""
    paths = [p for p in fit_configs(run_dir) if p.is_file()]
    saved = yaml.safe_load(paths[-1].read_text()) if paths else None
    return saved if isinstance(saved, dict) else {}


def last_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a resume of the run continues from."""
    return run_dir / "checkpoints" / "last.ckpt"


def unfinished(run_dir: Path, last_line: str) -> tuple[str, str] | None:
    """None when a fit that exited 0 trained to the end its saved config sets; else ("interrupted",
    how far it got) or ("failed", why its checkpoint cannot tell).

    The exit code cannot tell: a fit stopped by SIGTERM exits 0. The stop line on stderr alone is
    not enough either (a log level or another Lightning code path can drop it), so the run's
    checkpoints/last.ckpt decides, the file a resume continues from: its global_step reaches
    trainer.max_steps, or the end of fit that callbacks/final_validation.py records in it (the last
    batch of the last epoch) is at its step and reaches trainer.max_epochs. A stop line still makes
    the run interrupted (a stop at the last step skips what the end of fit writes; the resume adds
    it). A run with trainer.max_time or an EarlyStopping callback may end before both counts: there,
    exit 0 without a stop line is its end.
    """
    path = last_checkpoint(run_dir)
    try:
        # mmap: the pickle is read, tensor data stays on disk; cheap even for a GB checkpoint.
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        step = int(ckpt["global_step"])
    except FileNotFoundError:
        return "failed", f"it exited 0 but wrote no {path}"
    except Exception as e:  # torch.load fails in many ways on a damaged file
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return "failed", f"it exited 0 but {path} is not a readable checkpoint ({reason})"
    trainer = latest_config(run_dir).get("trainer") or {}
    max_steps = trainer.get("max_steps")
    max_steps = -1 if max_steps is None else int(max_steps)
    max_epochs = trainer.get("max_epochs")
    if max_epochs is None:  # Lightning's default (Trainer: fit_loop.max_epochs)
        max_epochs = 1000 if max_steps == -1 and trainer.get("max_time") is None else -1
    end = ((ckpt.get("callbacks") or {}).get("FinalValidation") or {}).get("end") or {}
    at_end = 0 < max_steps <= step or (end.get("step") == step and 0 < max_epochs <= end.get("epochs", 0))
    callbacks = trainer.get("callbacks") or []
    own_rule = trainer.get("max_time") is not None or "EarlyStopping" in str(callbacks)
    stopped = STOP_LINE.search(last_line) is not None
    if not stopped and (at_end or own_rule):
        return None
    if max_steps > 0:
        return "interrupted", f"stopped at step {step} of {max_steps}"
    epoch = f", epoch {int(ckpt.get('epoch', 0)) + 1} of {max_epochs}" if max_epochs > 0 else ""
    return "interrupted", f"stopped at step {step}{epoch}"
