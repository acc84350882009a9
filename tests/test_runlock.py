"""One writer per run: a fit holds RUN/.lock from before it writes anything until it ends, a second
writer is refused in one line naming the holder and touches nothing, readers are never refused, the
lock of a killed process is taken over, and its holder clears what a killed save left."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, TINY_FIT, run_main, snapshot, write_chars

from callbacks.resume import ExactResume
from lit_attn import GPT
from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.runlock import HOLDER_NAME, LOCK_NAME, RunLock, describe_holder, global_rank_zero
from lit_attn.load import load_checkpoint
from lit_attn.training.checkpoint import save_checkpoint

# Holds a run's lock in another process until its stdin closes; runlock.py is loaded on its own
# (it needs only filelock), so the holder starts in a fraction of a second.
HOLDER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("runlock", sys.argv[1])
runlock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runlock)
lock = runlock.RunLock(sys.argv[2])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


def refusal(run: str, pid: int) -> re.Pattern:
    return re.compile(rf"run '{run}' is being written by process {pid} on host {re.escape(socket.gethostname())} "
                      rf"\(since \d\d:\d\d:\d\d\); wait for it to finish or use another --run name")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_chars(tmp_path_factory.mktemp("data") / "text.txt", 2400, seed=3)


def fit(text, runs, run, *extra):
    return ["fit", f"--data.path={text}", f"--runs_dir={runs}", f"--run={run}", "--samples.max_new_tokens=2",
            "--params.print_table=false", "--trainer.enable_model_summary=false", *TINY_FIT, *extra]


@pytest.fixture(scope="module")
def finished(text, tmp_path_factory):
    """A finished 4-step run with checkpoints, to copy."""
    runs = tmp_path_factory.mktemp("finished")
    assert cli(fit(text, runs, "r")) == 0
    return runs / "r"


@pytest.fixture
def hold():
    """hold(run_dir) -> a process holding the run's lock until it is closed or killed."""
    procs = []

    def start(run_dir):
        script = ROOT / "lit_attn" / "cli" / "runlock.py"
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(script), str(run_dir)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=600)


def lock_is_free(run_dir) -> bool:
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except ValueError:
        return False
    lock.release()
    return True


@pytest.mark.parametrize("situation,extra", [
    ("a new run", ()),
    # the lock, not "already has checkpoints", answers
    pytest.param("a fresh start of a run with checkpoints", (), marks=pytest.mark.slow),
    pytest.param("a resume", ("--ckpt_path=last",), marks=pytest.mark.slow),
    ("a resume by auto", ("--ckpt_path=auto",)),
])
def test_a_second_writer_is_refused_naming_the_holder_and_touches_nothing(situation, extra, text, finished, hold,
                                                                        tmp_path, capsys):
    run_dir = tmp_path / "r"
    if situation == "a new run":
        run_dir.mkdir()
    else:  # a killed save's leftovers too: only the lock's holder may clear them
        shutil.copytree(finished, run_dir)
        (run_dir / "checkpoints" / ".last.ckpt.0123456789ab.tmp").write_bytes(b"partial")
    holder = hold(run_dir)
    before = snapshot(tmp_path)
    assert cli(fit(text, tmp_path, "r", *extra)) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert refusal("r", holder.pid).fullmatch(last.removeprefix("error: ")), last
    assert snapshot(tmp_path) == before  # the holder's lock files and every run file as they were
    assert not lock_is_free(run_dir)


def test_readers_are_not_refused(text, finished, hold, tmp_path, capsys):
    from lit_attn.tools import compare

    run_dir = tmp_path / "r"
    shutil.copytree(finished, run_dir)
    hold(run_dir)
    assert cli(["validate", f"--runs_dir={tmp_path}", "--run=r", f"--data.path={text}",
                "--trainer.enable_progress_bar=false"]) == 0
    assert compare.main([str(run_dir), "--out", str(tmp_path / "cmp")]) == 0
    assert not lock_is_free(run_dir)


@pytest.mark.slow
def test_a_second_main_py_process_is_refused(text, hold, tmp_path):
    run_dir = tmp_path / "runs" / "same"
    run_dir.mkdir(parents=True)
    holder = hold(run_dir)
    before = snapshot(tmp_path)
    result = run_main(*fit(text, tmp_path / "runs", "same"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert refusal("same", holder.pid).fullmatch(last.removeprefix("error: ")), last
    assert "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before


def test_a_lock_left_by_a_killed_process_is_taken_over(text, hold, tmp_path, capsys):
    run_dir = tmp_path / "r"
    holder = hold(run_dir)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=600)
    assert (run_dir / LOCK_NAME).exists() and (run_dir / HOLDER_NAME).exists()  # what the killed process left
    assert cli(fit(text, tmp_path, "r")) == 0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert not (run_dir / LOCK_NAME).exists() and not (run_dir / HOLDER_NAME).exists()


def _interrupt_at_step_2(monkeypatch):
    def send(self, trainer, *args, **kwargs):
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ExactResume, "on_train_batch_end", send, raising=False)


@pytest.mark.parametrize("ending", ["normal", pytest.param("user error", marks=pytest.mark.slow), "Ctrl-C"])
def test_the_lock_is_held_while_fitting_and_released_however_the_fit_ends(ending, text, tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    seen = []
    real_start = GPT.on_train_start

    def on_train_start(self):
        seen.append(lock_is_free(run_dir))
        real_start(self)
        if ending == "user error":
            raise ValueError("refused by the test")

    monkeypatch.setattr(GPT, "on_train_start", on_train_start)
    if ending == "Ctrl-C":
        _interrupt_at_step_2(monkeypatch)
        handler = signal.getsignal(signal.SIGINT)
        try:
            with pytest.raises(SystemExit) as stop:
                cli(fit(text, tmp_path, "r"))
        finally:
            signal.signal(signal.SIGINT, handler)  # Lightning ignores Ctrl-C from its interrupt on
        assert stop.value.code == 1
    else:
        assert cli(fit(text, tmp_path, "r")) == (0 if ending == "normal" else 2)
    assert seen == [False]  # held by the fit itself
    assert lock_is_free(run_dir)
    assert not (run_dir / LOCK_NAME).exists() and not (run_dir / HOLDER_NAME).exists()


def test_commands_run_one_after_another_from_python(text, tmp_path, capsys):
    from lit_attn.cli.lightning_cli import main

    main(fit(text, tmp_path, "r"))  # no cli(): the next command's start ends this one's hold
    main(fit(text, tmp_path, "r", "--ckpt_path=last", "--trainer.max_steps=6"))
    assert load_checkpoint(tmp_path / "r" / "checkpoints" / "last.ckpt")["global_step"] == 6


def test_a_lock_that_cannot_be_taken_leaves_no_directory(tmp_path, monkeypatch):
    from lit_attn.cli.runs import Invocation

    def refuse(self, timeout=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(self.lock_file))

    monkeypatch.setattr("filelock.FileLock.acquire", refuse)
    with pytest.raises(PermissionError):
        Invocation.begin(tmp_path / "runs" / "r", lock=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("env,first", [
    ({}, True),
    ({"RANK": "0", "LOCAL_RANK": "0"}, True),
    ({"LOCAL_RANK": "1"}, False),  # a worker Lightning started
    ({"RANK": "2", "LOCAL_RANK": "0"}, False),  # the first process of another node
    ({"SLURM_PROCID": "3"}, False),
    ({"SLURM_PROCID": "0"}, True),
])
def test_only_the_first_process_of_a_launch_takes_the_lock(env, first, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert global_rank_zero() is first


@pytest.mark.parametrize("age_s,pattern", [
    (0, r"process 42 on host h \(since \d\d:\d\d:\d\d\)"),
    (3 * 86400, r"process 42 on host h \(since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)"),
])
def test_the_holder_is_described_with_the_date_when_not_today(age_s, pattern):
    assert re.fullmatch(pattern, describe_holder({"pid": 42, "host": "h", "since": time.time() - age_s}))
    assert describe_holder(None) == "another process"


@pytest.mark.parametrize("record", ["", "{not json", '{"pid": 1}', "dead"])
def test_an_unreadable_or_dead_holder_record_names_another_process(record, tmp_path):
    from lit_attn.cli.runlock import read_holder

    if record == "dead":  # a process of this host that has ended
        done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        record = f'{{"pid": {int(done.stdout)}, "host": "{socket.gethostname()}", "since": {time.time()}}}'
    (tmp_path / HOLDER_NAME).write_text(record)
    assert read_holder(tmp_path / HOLDER_NAME) is None


# ---- the lock's holder clears what a killed save left ----

@pytest.fixture
def best_run(tmp_path):
    """A 4-step run in tmp_path/runs/r that keeps its best checkpoint by validation loss (the default callbacks),
    and its corpus. Made in place: a ModelCheckpoint restores its best-k list only in the directory it saved."""
    text = write_chars(tmp_path / "text.txt", 2400, seed=4)
    assert cli(fit(text, tmp_path / "runs", "r")) == 0
    return tmp_path / "runs" / "r", text


@pytest.mark.parametrize("left,resume_from,removed", [
    pytest.param(["tmp"], "last", [".last.ckpt.0123456789ab.tmp", ".best-6.ckpt.abcdef012345.tmp"],
                 marks=pytest.mark.slow),  # each alone: the quick loop has them together below
    pytest.param(["orphan"], "last", ["best-44.ckpt"], marks=pytest.mark.slow),
    (["tmp", "orphan", "missing"], "last", [".last.ckpt.0123456789ab.tmp", ".best-6.ckpt.abcdef012345.tmp",
                                            "best-44.ckpt"]),
    (["orphan"], "best", []),  # an earlier checkpoint resumed on purpose: what came after it stays
])
def test_a_resume_clears_what_a_killed_save_left(left, resume_from, removed, best_run, tmp_path, capsys):
    run, text = best_run
    ckpts = run / "checkpoints"
    (best,) = ckpts.glob("best-*.ckpt")
    if "tmp" in left:  # a kill in the middle of a save
        (ckpts / ".last.ckpt.0123456789ab.tmp").write_bytes(b"partial")
        (ckpts / ".best-6.ckpt.abcdef012345.tmp").write_bytes(b"partial")
    if "orphan" in left:  # a best checkpoint from an attempt killed before it saved last.ckpt again
        save_checkpoint({**load_checkpoint(ckpts / "last.ckpt"), "global_step": 44}, ckpts / "best-44.ckpt")
    if "missing" in left:  # the listed best one, removed by that attempt when it found a better one
        best.unlink()
    capsys.readouterr()
    start = "--ckpt_path=last" if resume_from == "last" else f"--ckpt_path={best}"
    assert cli(fit(text, tmp_path / "runs", "r", "--trainer.max_steps=8", start)) == 0
    err = capsys.readouterr().err
    for name in removed:
        assert f"run 'r': removed {ckpts / name}" in err
        assert not (ckpts / name).exists()
    assert not [p for p in ckpts.iterdir() if p.name.endswith(".tmp")]
    if "missing" in left:
        assert f"run 'r': {best}, one of the best checkpoints last.ckpt lists, is missing" in err
    state = next(v for k, v in load_checkpoint(ckpts / "last.ckpt")["callbacks"].items() if "val/loss" in k)
    listed = {Path(p).name for p in state["best_k_models"]}
    on_disk = {p.name for p in ckpts.glob("best-*.ckpt")}
    if removed or "orphan" not in left:
        assert listed == on_disk  # no best checkpoint that nothing rotates out
    else:
        assert load_checkpoint(ckpts / "best-44.ckpt")["global_step"] == 44
