"""lit_attn.tools.sweep stopped: by Ctrl-C or SIGTERM to the sweep, or a fit that exits 0 before the end of its
training (SIGTERM); neither is marked done, and the same command resumes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_FIT, main_env
from test_sweep import fake_fit, write_checkpoint

from lit_attn.load import checkpoint_step
from lit_attn.tools import sweep
from lit_attn.tools.sweep_fit import latest_config, unfinished

# ---- Ctrl-C and SIGTERM ----

@pytest.mark.parametrize("signum, fit_ends, exit_code, how", [
    (signal.SIGINT, (1, None), 130, "interrupted (exit code 1)"),  # a fit stopped by Ctrl-C exits 1
    (signal.SIGTERM, (0, 2), 143, "interrupted (stopped at step 2 of 5)"),  # by SIGTERM: exit 0, at step 2
    (signal.SIGTERM, (-15, None), 143, "interrupted (exit code -15)"),  # killed before its handlers were in place
    # signalled while setting up: Lightning's handler lets it exit 0 before its first save
    (signal.SIGTERM, (0, "none"), 143, "interrupted (stopped before its first checkpoint)"),
])
def test_a_stopped_sweep_starts_no_more_runs_and_reports_what_is_left(signum, fit_ends, exit_code, how, tmp_path,
                                                                        monkeypatch, capfd):
    """The second run gets the signal while it trains: the first is finished, the third never starts."""
    calls: list = []
    fit = fake_fit(calls)
    rc, step = fit_ends
    stopped_fit = fake_fit([], step=None if step == "none" else step, rc=rc)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def run_variant(cmd, env=None, tag="", ctrl_c=None):
        if "--run=t-gqa" in cmd:
            ctrl_c(signum, None)  # what the signal does, mid-run
            rc_line = stopped_fit(cmd, env, tag, None)
            if step == "none":  # its configs are saved, its first checkpoint is not
                (tmp_path / "runs" / "t-gqa" / "checkpoints" / "last.ckpt").unlink()
                return rc, ""
            return rc_line
        return fit(cmd, env, tag, ctrl_c)

    monkeypatch.setattr(sweep, "run_variant", run_variant)
    monkeypatch.chdir(tmp_path)
    args = ["--attention", "mha,gqa,sqa", "--prefix", "t", "--", "--trainer.max_steps=5"]
    assert sweep.main(args) == exit_code
    err = capfd.readouterr().err
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert (f"[sweep] stopped by {name}\n[sweep] finished: t-mha\n[sweep] interrupted: t-gqa\n"
            f"[sweep] not started: t-sqa\n[sweep] t-gqa: {how}\n") in err
    assert err.rstrip().endswith("(it skips finished runs and resumes interrupted ones from their last.ckpt): "
                                 "lit-attn sweep --attention mha,gqa,sqa --prefix t -- --trainer.max_steps=5")
    assert "Traceback" not in err and "comparison" not in err and not (tmp_path / "runs" / "t-compare").exists()
    assert (tmp_path / "runs" / "t-mha" / sweep.DONE_FILE).is_file() and len(calls) == 1
    assert not (tmp_path / "runs" / "t-gqa" / sweep.DONE_FILE).exists()
    assert {s: signal.getsignal(s) for s in before} == before  # the sweep's handlers are gone


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_fit_launched_just_after_the_signal_is_stopped_before_it_does_anything(signum):
    class LateStop(sweep.SweepStop):
        @property
        def pressed(self) -> bool:  # the signal lands right after the check
            self.at, self.signum = time.monotonic(), signum
            return False

    started = time.monotonic()
    assert sweep.run_variant([sys.executable, "-c", "import time; time.sleep(600)"], ctrl_c=LateStop()) == (
        None, "not started")
    assert time.monotonic() - started < 300  # killed, not waited for (a bound far above a process start)
    assert sweep.run_variant(["false"], ctrl_c=sweep.SweepStop()) == (1, "")


# A fit as main.py ends on SIGTERM: it notes the signal, prints its stop line, and exits 0. It creates the file
# named by its argument once its handler is installed.
TRAPS_SIGTERM = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (print("SIGTERM: stopped after step 2, last.ckpt is saved", file=sys.stderr),
                                          sys.exit(0)))
pathlib.Path(sys.argv[1]).touch()
print("training", file=sys.stderr, flush=True)
time.sleep(600)
sys.exit(3)
"""


def test_sigterm_to_the_sweep_is_passed_on_to_the_running_fits(tmp_path):
    """srun or `kill` may signal the sweep alone: the running fit gets SIGTERM too, and saves and stops."""
    stop = sweep.SweepStop()
    ready = tmp_path / "handler-installed"
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(sweep.run_variant, [sys.executable, "-c", TRAPS_SIGTERM, str(ready)], None, "", stop)
        deadline = time.monotonic() + 600  # a hang guard only
        while not (stop._running and ready.exists()) and time.monotonic() < deadline:
            time.sleep(0.01)
        stop(signal.SIGTERM, None)
        assert result.result(timeout=600) == (0, "SIGTERM: stopped after step 2, last.ckpt is saved")
    assert stop.pressed and stop.exit_code == 143 and not stop._running


# ---- a fit that exits 0 is finished only at the end of its training ----

@pytest.mark.parametrize("trainer, step, end, line, expected", [
    ({"max_steps": 5}, 5, None, "", None),
    ({"max_steps": 100000}, 3, None, "", ("interrupted", "stopped at step 3 of 100000")),
    # SIGTERM on the last step: what the end of fit writes is skipped, the resume adds it
    ({"max_steps": 5}, 5, None, "SIGTERM: stopped after step 5, last.ckpt is saved", ("interrupted",
                                                                                       "stopped at step 5 of 5")),
    ({"max_steps": 100000}, 3, None, "[t-mha] Ctrl-C: stopped after step 3", ("interrupted",
                                                                              "stopped at step 3 of 100000")),
    # epochs: the end of fit that FinalValidation records in the checkpoint, at its step
    ({"max_steps": -1, "max_epochs": 2}, 6, {"step": 6, "epochs": 2}, "", None),
    ({"max_steps": -1, "max_epochs": 2}, 3, None, "", ("interrupted", "stopped at step 3, epoch 1 of 2")),
    # the end of an earlier, shorter fit of the run, which this one resumed and was stopped before its first save
    ({"max_steps": -1, "max_epochs": 3}, 6, {"step": 6, "epochs": 2}, "", ("interrupted",
                                                                            "stopped at step 6, epoch 2 of 3")),
    ({"max_steps": 8}, 4, {"step": 4, "epochs": 1}, "", ("interrupted", "stopped at step 4 of 8")),
    ({}, 3, None, "", ("interrupted", "stopped at step 3, epoch 1 of 1000")),  # Lightning's default: 1000 epochs
    # a run that may end before both counts, by a rule of its own: exit 0 without a stop line is its end
    ({"max_steps": 100, "max_time": "00:00:01:00"}, 3, None, "", None),
    ({"max_steps": 100, "callbacks": [{"class_path": "lightning.pytorch.callbacks.EarlyStopping"}]}, 3, None, "", None),
    ({"max_steps": 100, "max_time": "00:00:01:00"}, 3, None, "SIGTERM: stopped after step 3", (
        "interrupted", "stopped at step 3 of 100")),
])
def test_a_fit_that_exited_0_is_finished_only_at_the_end_its_config_sets(trainer, step, end, line, expected,
                                                                            tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"trainer": trainer}))
    write_checkpoint(tmp_path, step, end, epoch=0 if end is None else end["epochs"] - 1)
    assert unfinished(tmp_path, line) == expected


@pytest.mark.parametrize("saved, latest", [
    (["config.yaml"], "config.yaml"), (["config.yaml", "config.fit.yaml"], "config.fit.yaml"),
    (["config.yaml", "config.fit.yaml", "config.fit-2.yaml"], "config.fit-2.yaml"),
    (["config.yaml", "config.fit.yaml", "config.fit-10.yaml", "config.fit-2.yaml"], "config.fit-10.yaml"),
    (["config.yaml", "config.fit-x.yaml"], "config.yaml"),  # not a name main.py gives
])
def test_the_end_is_the_one_the_latest_fit_of_the_run_saved(saved, latest, tmp_path):
    """main.py saves a resumed fit's config as config.fit.yaml, then config.fit-2.yaml, ..."""
    for i, name in enumerate(saved):
        (tmp_path / name).write_text(yaml.safe_dump({"trainer": {"max_steps": i + 1}}))
    assert latest_config(tmp_path)["trainer"]["max_steps"] == saved.index(latest) + 1


@pytest.mark.parametrize("content, message", [
    (None, "it exited 0 but wrote no "), (b"not a checkpoint", "is not a readable checkpoint"),
    ({"state_dict": {}}, "is not a readable checkpoint ('global_step')"),
])
def test_a_fit_that_exited_0_without_a_readable_checkpoint_failed(content, message, tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"trainer": {"max_steps": 5}}))
    if content is not None:
        (tmp_path / "checkpoints").mkdir()
        path = tmp_path / "checkpoints" / "last.ckpt"
        path.write_bytes(content) if isinstance(content, bytes) else torch.save(content, path)
    kind, why = unfinished(tmp_path, "")
    assert kind == "failed" and message in why


@pytest.mark.parametrize("stopped_at", [0, 3])
@pytest.mark.parametrize("task", [None, 1])
def test_a_fit_stopped_by_sigterm_is_not_finished_and_the_same_sweep_resumes_it(stopped_at, task, tmp_path,
                                                                                 monkeypatch, capsys):
    """A fit exits 0 after SIGTERM (a time limit, a preemption): it is reported as interrupted, not
    compared, not marked done, and the same command trains it again (main.py resumes it from last.ckpt)."""
    calls: list = []
    compared: list = []
    monkeypatch.setattr(sweep, "compare", lambda runs, out: (compared.append([p.name for p in runs]), "table\n"))
    finish, stop_gqa = fake_fit(calls), fake_fit(calls, step=stopped_at)
    monkeypatch.setattr(sweep, "run_variant", lambda cmd, *a: (stop_gqa if "--run=t-gqa" in cmd else finish)(cmd, *a))
    args = ["--attention", "mha,gqa", "--prefix", "t", "--runs_dir", str(tmp_path / "runs"),
            *([] if task is None else ["--task", str(task)])]
    assert sweep.main(args) == 1
    err = capsys.readouterr().err
    assert (f"[sweep] t-gqa interrupted (stopped at step {stopped_at} of 5): the same sweep command resumes it"
            in err) and "0 failed, 1 interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "t-gqa" / sweep.DONE_FILE).exists()
    assert compared == ([] if task is not None else [["t-mha"]])  # only what finished is compared
    monkeypatch.setattr(sweep, "run_variant", finish)
    assert sweep.main(args) == 0  # the same command: t-mha is skipped, t-gqa trains to its end
    assert "--ckpt_path=auto" in calls[-1]  # which main.py resumes from last.ckpt
    assert [next(a for a in c if a.startswith("--run=")) for c in calls] == (
        ["--run=t-mha", "--run=t-gqa", "--run=t-gqa"] if task is None else ["--run=t-gqa", "--run=t-gqa"])
    assert (tmp_path / "runs" / "t-gqa" / sweep.DONE_FILE).is_file()
    assert f"{1 if task else 2} succeeded, 0 failed, 0 interrupted" in capsys.readouterr().err
    assert compared == ([] if task is not None else [["t-mha"], ["t-mha", "t-gqa"]])


@pytest.mark.slow
def test_ctrl_c_in_a_real_sweep_ends_cleanly_and_says_how_to_resume(tmp_path, corpus):
    args = ["--attention", "mha,gqa", "--prefix", "c", "--", f"--data.path={corpus}", *TINY_FIT,
            "--trainer.max_steps=100000", "--checkpoint.every_n_train_steps=1"]
    proc = subprocess.Popen([sys.executable, "-m", "lit_attn.tools.sweep", *args], cwd=tmp_path, env=main_env(),
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    last = tmp_path / "runs" / "c-mha" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 600
    while not last.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the sweep and its fit get it
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert "[sweep] finished: none\n[sweep] interrupted: c-mha\n[sweep] not started: c-gqa\n" in err
    assert f"lit-attn sweep {' '.join(args[:5])} --data.path=" in err.splitlines()[-1]
    assert last.is_file() and not (tmp_path / "runs" / "c-mha" / sweep.DONE_FILE).exists()
    assert not (tmp_path / "runs" / "c-gqa").exists()


@pytest.mark.parametrize("step, trained_again", [(5, False), (3, True), (None, True)])
def test_a_run_marked_done_is_skipped_only_if_its_checkpoint_is_at_the_end(step, trained_again, tmp_path,
                                                                           monkeypatch):
    """A mark written when exit 0 alone counted as finished may name a fit that SIGTERM stopped."""
    calls: list = []
    monkeypatch.setattr(sweep, "run_variant", fake_fit(calls))
    args = ["--attention", "mha", "--task", "0", "--prefix", "t", "--runs_dir", str(tmp_path / "runs")]
    assert sweep.main(args) == 0 and len(calls) == 1
    last = tmp_path / "runs" / "t-mha" / "checkpoints" / "last.ckpt"
    if step is None:
        last.unlink()
    else:
        write_checkpoint(last.parent.parent, step)
    assert (last.parent.parent / sweep.DONE_FILE).is_file()
    assert sweep.main(args) == 0 and len(calls) == 1 + trained_again


def children(pid: int) -> list[int]:
    """The processes `pid` started (from any of its threads)."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


@pytest.mark.slow
@pytest.mark.long
def test_sigterm_in_a_real_sweep_leaves_the_run_to_resume(tmp_path, corpus):
    """A time limit: SIGTERM to the fit alone (it exits 0), then, on the next submission, to the sweep alone."""
    args = ["--attention", "mha,gqa", "--task", "0", "--prefix", "c", "--", f"--data.path={corpus}", *TINY_FIT,
            "--trainer.max_steps=100000", "--checkpoint.every_n_train_steps=1"]
    run_dir = tmp_path / "runs" / "c-mha"
    last = run_dir / "checkpoints" / "last.ckpt"
    steps = []
    for attempt, exit_code in ((1, 1), (2, 143)):
        saved = last.stat().st_mtime_ns if last.is_file() else 0
        proc = subprocess.Popen([sys.executable, "-m", "lit_attn.tools.sweep", *args], cwd=tmp_path, env=main_env(),
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 600
        while (last.stat().st_mtime_ns if last.is_file() else 0) == saved and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)  # until this attempt's fit has trained and saved a step
        os.kill(children(proc.pid)[0] if attempt == 1 else proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == exit_code, err[-3000:]
        assert "Traceback" not in err and not (run_dir / sweep.DONE_FILE).exists()
        step = checkpoint_step(last)
        assert step is not None and 0 < step < 100000
        steps.append(step)
        if attempt == 1:
            assert f"[sweep] c-mha interrupted (stopped at step {step} of 100000): the same sweep command resumes it" \
                in err and "[sweep] 0 succeeded, 0 failed, 1 interrupted" in err
        else:
            assert f"run 'c-mha' in runs/c-mha: resuming from last.ckpt (step {steps[0]})" in err and step > steps[0]
            assert ("[sweep] stopped by SIGTERM\n[sweep] finished: none\n[sweep] interrupted: c-mha\n[sweep] not "
                    f"started: none\n[sweep] c-mha: interrupted (stopped at step {step} of 100000)\n") in err
            assert f"lit-attn sweep {' '.join(args[:7])} --data.path=" in err.splitlines()[-1]
