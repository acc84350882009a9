"""A command's files in the run directory: its event files sort after earlier attempts', a refused command
removes exactly the files it created (not another writer's), a runs directory it cannot write is refused up front."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import RUN_STEPS, run_args, snapshot

from lit_attn import GPT
from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.runs import Invocation, after_earlier_event_files
from lit_attn.training.checkpoint import AtomicCheckpointIO, save_checkpoint


@pytest.fixture(scope="module")
def halfway(run_text, tmp_path_factory) -> Path:
    """A run stopped at step 10 (last.ckpt at 10), to resume."""
    runs = tmp_path_factory.mktemp("halfway")
    assert cli(run_args(run_text, runs, "h", 10)) == 0
    return runs / "h"


def test_a_new_attempts_event_file_sorts_after_the_earlier_ones(tmp_path, monkeypatch):
    """TensorBoard reads event files in name order; a name starts with its creation second. On a fake clock: the
    wait is exactly up to the next second, and none when no file is from this second."""
    import lit_attn.cli.runs as runs_module

    now = 1_700_000_000
    clock = SimpleNamespace(time=lambda: clock.now, now=now + 0.25, slept=[])
    clock.sleep = lambda seconds: (clock.slept.append(seconds), setattr(clock, "now", clock.now + seconds))
    monkeypatch.setattr(runs_module, "time", clock)
    (tmp_path / "hparams").mkdir()
    (tmp_path / "hparams" / f"events.out.tfevents.{now}.host.1.9").write_bytes(b"")
    after_earlier_event_files(tmp_path)
    assert clock.slept == [pytest.approx(0.75)] and clock.now == pytest.approx(now + 1)
    (tmp_path / "hparams" / f"events.out.tfevents.{now - 100}.host.1.10").write_bytes(b"")
    after_earlier_event_files(tmp_path)  # nothing from this second: no wait
    assert clock.slept == [pytest.approx(0.75)]


# ---- a refused command removes its own files, and only those ----

def own_events_name(pid: int | None = None, n: int = 1) -> str:
    """An event file name as TensorBoard gives it: events.out.tfevents.TIME.HOST.PID.N."""
    return f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{pid or os.getpid()}.{n}"


def ckpt(step: int) -> dict:
    return {"global_step": step, "state_dict": {}}


# What another writer does in the run directory while this command runs; the path is what it leaves.
OTHERS = {
    "another process's event file": lambda run: (run / own_events_name(os.getpid() + 1)).write_bytes(b"x"),
    "a checkpoint written over this command's": lambda run: save_checkpoint(ckpt(44), run / "checkpoints/best-4.ckpt"),
    "a config this command did not save": lambda run: (run / "config.fit.yaml").write_text("x: 1\n"),
    "a file in a new directory": lambda run: (run / "notes").mkdir() or (run / "notes/n.txt").write_text("n"),
    "nothing": lambda run: None,
}


@pytest.mark.parametrize("other", OTHERS)
def test_undo_removes_exactly_what_this_command_created(other, tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / own_events_name()).write_bytes(b"old")  # a process of the same PID long ago: not this command's
    inv = Invocation.begin(run, lock=True)
    io = AtomicCheckpointIO()
    io.save_checkpoint(ckpt(4), run / "checkpoints" / "best-4.ckpt")
    io.save_checkpoint(ckpt(2), run / "checkpoints" / "best-2.ckpt")
    io.remove_checkpoint(run / "checkpoints" / "best-2.ckpt")  # rotated out: forgotten
    (run / "hparams").mkdir()
    events, hparams_events = own_events_name(n=7), own_events_name(n=8)  # named once: a second may pass meanwhile
    for path in (run / events, run / "hparams" / hparams_events, run / "hparams.yaml", run / "config.yaml"):
        path.write_text("mine")
    saver = SimpleNamespace(already_saved=True, config_filename="config.yaml")  # this command's SaveConfigCallback
    inv.cli = SimpleNamespace(trainer=SimpleNamespace(
        callbacks=[saver], logger=SimpleNamespace(log_dir=str(run)), strategy=SimpleNamespace(checkpoint_io=io)))
    OTHERS[other](run)
    theirs = {k: v for k, v in snapshot(tmp_path).items() if v != "dir"}
    for name in ("r/hparams.yaml", "r/config.yaml", f"r/{events}", f"r/hparams/{hparams_events}", "r/.lock",
                 "r/.lock.holder"):
        del theirs[name]
    if other != "a checkpoint written over this command's":
        del theirs["r/checkpoints/best-4.ckpt"]

    inv.undo()
    assert {k: v for k, v in snapshot(tmp_path).items() if v != "dir"} == theirs
    assert not (run / "hparams").exists()  # made by this command, empty again
    assert (run / "checkpoints").exists() == ("r/checkpoints/best-4.ckpt" in theirs)


def _refuse_at_train_start(monkeypatch, concurrently) -> None:
    """The fit ends in a user error at its first training step, while `concurrently` runs in another thread."""
    def on_train_start(self):
        worker = threading.Thread(target=concurrently, args=(Path(self.trainer.default_root_dir),))
        worker.start()
        worker.join()
        raise ValueError("refused by the test")

    monkeypatch.setattr(GPT, "on_train_start", on_train_start)


def _another_process_writes(name: str):
    """A writer that is another process, writing RUN/NAME (NAME may hold {pid}: that process's)."""
    code = "import os, pathlib, sys; pathlib.Path(sys.argv[1].format(pid=os.getpid())).write_text('x')"
    return lambda run: subprocess.run([sys.executable, "-c", code, str(run / name)], check=True)


WRITERS = {
    "a thread writes best-44.ckpt": lambda run: save_checkpoint(ckpt(44), run / "checkpoints" / "best-44.ckpt"),
    "a process writes an event file": _another_process_writes(
        f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{{pid}}.0"),
    "a thread writes a config": lambda run: (run / "config.validate.yaml").write_text("x: 1\n"),
    "a process writes a random file": _another_process_writes("notes.txt"),
}


# Every writer against both commands in the full suite; the quick loop keeps one pair per command.
QUICK = {("a thread writes best-44.ckpt", "new run"), ("a process writes an event file", "resume")}


@pytest.mark.parametrize("writer,command", [
    pytest.param(w, c, marks=() if (w, c) in QUICK else pytest.mark.slow)
    for w in WRITERS for c in ("new run", "resume")
])
def test_a_refused_fit_keeps_what_others_wrote_meanwhile(writer, command, run_text, halfway, tmp_path, monkeypatch,
                                                          capsys):
    if command == "resume":
        shutil.copytree(halfway, tmp_path / "r")
    before = snapshot(tmp_path)
    _refuse_at_train_start(monkeypatch, WRITERS[writer])
    extra = ["--ckpt_path=last"] if command == "resume" else []
    assert cli(run_args(run_text, tmp_path, "r", RUN_STEPS, *extra)) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: refused by the test"
    after = snapshot(tmp_path)
    written = {k: v for k, v in after.items() if k not in before and v != "dir"}
    assert len(written) == 1, written  # the other writer's file; none of this command's (config, events, lock)
    assert {k: v for k, v in after.items() if k in before} == before


@pytest.mark.parametrize("where,message", [
    ("runs", "cannot write to runs directory {runs}: permission denied; pass a writable --runs_dir"),
    ("parent", "cannot write to runs directory {runs} (cannot create it in {parent}): permission denied; "
               "pass a writable --runs_dir"),
    ("run", "cannot write to run directory {runs}/r: permission denied; fix its permissions or copy the run into "
            "a writable --runs_dir"),
])
def test_a_runs_directory_that_cannot_be_written_is_refused_up_front(where, message, run_text, tmp_path, monkeypatch,
                                                                     capsys):
    parent = tmp_path / "ro"
    runs = parent / "runs"
    denied = {"parent": parent, "runs": runs, "run": runs / "r"}[where]
    denied.mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != denied and real_access(p, mode, **kw))
    before = snapshot(tmp_path)
    assert cli(run_args(run_text, runs, "r", RUN_STEPS)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "error: " + message.format(runs=runs, parent=parent)
    assert "Traceback" not in err and snapshot(tmp_path) == before


@pytest.mark.slow
@pytest.mark.tmpfs
def test_a_read_only_runs_filesystem_is_named(run_text, tmpfs, capsys):
    where = tmpfs("1m")
    (where / "runs").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    assert cli(run_args(run_text, where / "runs", "r", RUN_STEPS)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"error: cannot write to runs directory {where / 'runs'}: read-only "
                                            f"filesystem; pass a writable --runs_dir")
    assert "Traceback" not in err and list((where / "runs").iterdir()) == []


def test_a_runs_directory_the_system_will_not_create_is_named(run_text, tmp_path, capsys):
    # os.access says yes for root, but the kernel refuses a directory here
    assert cli(run_args(run_text, Path("/proc/lit-attn-runs"), "r", RUN_STEPS)) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # root: the kernel refuses; others: the permissions
    assert last.startswith("error: cannot ") and "/proc/lit-attn-runs" in last
    assert "Traceback" not in err and "Errno" not in err
