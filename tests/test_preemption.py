"""Preemption under DDP: SIGTERM to every rank, or to one, stops all ranks at one step with last.ckpt.

Schedulers (SLURM, torchrun, `kill -TERM -PGID`) signal every process of a job. Each test starts a
2-process CPU DDP fit in its own session, pauses one rank at a fixed step until it has the signal
(so the signal always lands mid-run, however loaded the machine), signals the job as a scheduler
would, and expects every process gone within a bound, last.ckpt written at a known step, and a
resume that ends bit-identical to an uninterrupted run, with the same TensorBoard history.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import ROOT, assert_same_history, assert_same_weights, last_checkpoint, main_env, resumable_fit

from callbacks.checkpointing import INT, TERM, StopSignals

STEPS = 12  # small_corpus has 6 batches per rank per epoch: two epochs
BOUND = 600  # seconds: a hang fails the test instead of blocking it; far above any fit here, however loaded

# Runs main.py's command line with a test-only pause: at PAUSE_AT on rank PAUSE_RANK the process
# says so on stdout and waits (at most BOUND s) until it has received SIGTERM. Lightning starts the
# other rank by running this same script again, so both ranks have the hook.
DRIVER = """
import os, sys, time
sys.path.insert(0, {root!r})
from callbacks.checkpointing import StopSignals
from callbacks.resume import ExactResume
import lit_attn.cli.lightning_cli as main

got_sigterm = []
real_on_sigterm = StopSignals._on_sigterm
def on_sigterm(self, signum, frame):
    got_sigterm.append(signum)
    real_on_sigterm(self, signum, frame)
StopSignals._on_sigterm = on_sigterm

pause_at, pause_rank = int(os.environ.get("PAUSE_AT", -1)), int(os.environ.get("PAUSE_RANK", 0))
def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
    if trainer.global_step == pause_at and trainer.global_rank == pause_rank:
        print(f"PAUSED rank={{trainer.global_rank}} pid={{os.getpid()}}", flush=True)
        deadline = time.monotonic() + {bound}
        while not got_sigterm and time.monotonic() < deadline:
            time.sleep(0.01)
ExactResume.on_train_batch_end = on_train_batch_end
sys.exit(main.cli())
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    path = tmp_path_factory.mktemp("driver") / "driver.py"
    path.write_text(DRIVER.format(root=str(ROOT), bound=BOUND))
    return path


def ddp_args(corpus, runs_dir, run, *extra):
    return resumable_fit(corpus, runs_dir, run, STEPS, "--timing.window_size=3", "--trainer.accelerator=cpu",
                         "--trainer.devices=2", "--trainer.strategy=ddp", *extra, total_steps=STEPS, every=4,
                         val_every=3)


class Job:
    """A process started in a session of its own, as a scheduler starts a job; output collected."""

    def __init__(self, driver, args, cwd, **env):
        self.proc = subprocess.Popen(
            [sys.executable, str(driver), *args], cwd=cwd, start_new_session=True, text=True,
            env=main_env(**env),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.pgid = self.proc.pid
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, prefix: str) -> str:
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if line.startswith(prefix)]
            if found:
                return found[0]
            assert self.proc.poll() is None, f"ended before {prefix!r}:\n{self.output[-3000:]}"
            time.sleep(0.02)
        self.kill()
        raise AssertionError(f"no {prefix!r} within {BOUND} s:\n{self.output[-3000:]}")

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return True

    def finish(self) -> int:
        """Exit status of the started process once every process of its group is gone (bounded)."""
        deadline = time.monotonic() + BOUND
        try:
            code = self.proc.wait(timeout=BOUND)
            while self.group_alive():
                assert time.monotonic() < deadline, f"processes left in the group:\n{self.output[-3000:]}"
                time.sleep(0.05)
        except (subprocess.TimeoutExpired, AssertionError):
            self.kill()
            raise
        self._reader.join(timeout=BOUND)
        return code

    def kill(self) -> None:
        if self.group_alive():
            os.killpg(self.pgid, signal.SIGKILL)


def run(driver, args, cwd) -> str:
    job = Job(driver, args, cwd)
    code = job.finish()
    assert code == 0, job.output[-3000:]
    return job.output


@pytest.fixture(scope="module")
def straight(driver, small_corpus, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    run(driver, ddp_args(small_corpus, runs, "straight"), runs)
    return runs / "straight"


# Validations follow steps 3, 6, 9 and 12; checkpoints every 4 steps. One case resumes: how the job was
# signalled changes where it stops, not how a checkpoint resumes (each resume is two more processes).
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("target,pause_at,stopped_at,resume", [
    # Every rank gets SIGTERM (kill -TERM -PGID, SLURM, torchrun) during step 5: the ranks agree at
    # the end of step 6, which has a validation, so they stop at the end of that validation.
    ("group", 5, 6, True),
    # Only rank 0 (the process that was started), during step 10: all stop at the end of step 11.
    ("rank0", 10, 11, False),
    # Only rank 1, during step 7: all stop at the end of step 8 (a periodic save step anyway).
    ("rank1", 7, 8, False),
])
def test_sigterm_stops_every_rank_at_one_step_then_resumes_exactly(target, pause_at, stopped_at, resume, driver,
                                                                   small_corpus, tmp_path, request):
    rank = 1 if target == "rank1" else 0
    job = Job(driver, ddp_args(small_corpus, tmp_path, "pre"), tmp_path, PAUSE_AT=pause_at, PAUSE_RANK=rank)
    paused = job.wait_for("PAUSED")
    start = time.monotonic()
    if target == "group":
        os.killpg(job.pgid, signal.SIGTERM)
    else:
        os.kill(int(paused.split("pid=")[1]), signal.SIGTERM)
    code = job.finish()  # bounded: a hang fails here
    assert code == 0, job.output[-3000:]  # a clean stop, not a crash or a kill
    assert time.monotonic() - start < BOUND
    # One step after the signal (the agreement is asynchronous), and not before a validation
    # that step has: its checkpoint is written after that validation.
    assert f"SIGTERM: stopped after step {stopped_at}," in job.output
    assert job.output.count("SIGTERM: stopped") == 1  # said once, by rank 0
    assert last_checkpoint(tmp_path / "pre")["global_step"] == stopped_at
    if not resume:
        return
    straight = request.getfixturevalue("straight")
    run(driver, [*ddp_args(small_corpus, tmp_path, "pre"), "--ckpt_path=last"], tmp_path)
    assert_same_weights(last_checkpoint(straight), last_checkpoint(tmp_path / "pre"), STEPS)
    assert_same_history(straight, tmp_path / "pre")


@pytest.mark.slow
def test_signal_handlers_only_set_flags_then_give_the_previous_handlers_back(capfd):
    """The handlers do nothing a signal could interrupt badly (no collective, no buffered
    I/O): SIGTERM and a first Ctrl-C set flags, a second Ctrl-C interrupts. One process
    needs no agreement: exchange() returns its own flags at once."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signals = StopSignals()
    signals.install()
    try:
        assert signals.exchange() == [0, 0, -1]
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.flags[TERM] == 1 and signals.flags[INT] == 1
        assert "press again to abort at once" in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert signals.exchange() == [1, 1, -1]
    finally:
        signals.restore()
    assert {s: signal.getsignal(s) for s in before} == before
