"""Bad input ends in one actionable line and a non-zero exit, and touches no existing run files."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import run_main, snapshot

from lit_attn import GPT
from lit_attn.cli.lightning_cli import cli

SLOW = pytest.mark.slow

TINY = ["--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16",
        "--data.batch_size=4", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.limit_val_batches=2", "--trainer.val_check_interval=3"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A corpus and a finished run 'good' (with checkpoints) in runs/."""
    root = tmp_path_factory.mktemp("ws")
    corpus = root / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 80)
    runs = root / "runs"
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", "--run=good", "--trainer.max_steps=6",
                *TINY]) == 0
    assert (runs / "good" / "checkpoints" / "last.ckpt").is_file()
    return root


def fails_cleanly(workspace, capsys, *args, message: str) -> str:
    runs = workspace / "runs"
    before = snapshot(runs)
    try:
        code = cli(["fit", f"--runs_dir={runs}", *TINY, *args])
    except SystemExit as e:  # the parser's own exit, on a value it cannot read or out of its type's range
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, err[-1500:]
    assert "Traceback" not in err
    assert snapshot(runs) == before  # nothing created, modified or deleted
    return last


def corpus_arg(workspace):
    return f"--data.path={workspace / 'corpus.txt'}"


@pytest.mark.parametrize("args,message", [
    (["--model.attention=bogus"], "unknown attention 'bogus'; choose one of: diff, gated_deltanet, gqa, mamba2, mha"),
    (["--model.n_head=3"], "n_embd=32 is not divisible by n_head=3"),
    (["--model.n_query_heads=2", "--model.n_kv_heads=4"], "n_query_heads=2 is smaller than n_kv_heads=4"),
    (["--model.n_query_heads=3"], "n_query_heads=3 must divide n_head=4"),
    (["--model.block_size=5000"], "the val split has 360 tokens, fewer than block_size+1 = 5001; lower "
                                  "--model.block_size to at most 359, raise --data.val_fraction or use more data"),
    (["--data.batch_size=5000"], "the train split has 3224 windows, fewer than one batch of --data.batch_size 5000: "
                                 "training would take no step; lower --data.batch_size to at most 3224 or use more "
                                 "data"),
    (["--trainer.limit_train_batches=0.0001"], "--trainer.limit_train_batches 0.0001 of 806 batch(es) rounds to none"),
    (["--trainer.limit_val_batches=0.0001"], "--trainer.limit_val_batches 0.0001 of 6 batch(es) rounds to none"),
    (["--model.lr=0"], "--model.lr must be a number > 0 (AdamW's learning rate, e.g. 1e-3), got 0.0"),
    # More instances of one check each: the quick loop has one (range rules are probed in test_ranges.py)
    pytest.param(["--model.lr=-0.1"], "--model.lr must be a number > 0 (AdamW's learning rate, e.g. 1e-3), got -0.1",
                 marks=SLOW),
    (["--data.batch_size=0"], "--data.batch_size must be an integer >= 1 (windows per batch (per device)), got 0"),
    pytest.param(["--data.batch_size=-4"],
                 "--data.batch_size must be an integer >= 1 (windows per batch (per device)), got -4", marks=SLOW),
    pytest.param(["--model.total_steps=0"], "--model.total_steps must be an integer >= 1 or null (schedule length "
                 "of `cosine` and `trapezoidal`; default `trainer.estimated_stepping_batches`), got 0", marks=SLOW),
    pytest.param(["--model.weight_decay=-1"],
                 "--model.weight_decay must be a number >= 0 (AdamW's weight decay, e.g. 0.1; it applies to "
                 "matrices only unless decay_all), got -1.0", marks=SLOW),
    (["--model.betas=[0.9, 1.5]"], "--model.betas must be a number in [0, 1) (AdamW's betas, e.g. [0.9, 0.95]), "
                                   "got 1.5"),
    pytest.param(["--checkpoint.every_n_train_steps=-1"], "--checkpoint.every_n_train_steps must be an integer >= 0 "
                 "(save every this many optimizer steps (0: only at the end and on a stop)), got -1", marks=SLOW),
    (["--run=../x"], "--run '../x' is not a plain name; use letters, digits"),
    pytest.param(["--run=/tmp/abs"], "--run '/tmp/abs' is not a plain name", marks=SLOW),
    pytest.param(["--run=."], "--run '.' is not a plain name", marks=SLOW),
    (["--run="], "--run '' is not a plain name"),
    pytest.param(["--run=a/b"], "--run 'a/b' is not a plain name", marks=SLOW),
    (["--trainer.devices=0"], "--trainer.devices must be an integer >= 1, -1 (every device), 'auto' or a list of "
                              "device indices >= 0 (devices per node), got '0'"),
    (["--trainer.accelerator=gpu"], "(this machine has no GPU); check --trainer.accelerator"),
])
def test_bad_settings(args, message, workspace, capsys):
    fails_cleanly(workspace, capsys, corpus_arg(workspace), *args, message=message)


@pytest.mark.parametrize("flag", ["--trainer.devices=0", "--model.n_head=3", "--model.block_size=5000",
                                  "--data.batch_size=5000", "--trainer.limit_val_batches=0.0001"])
def test_a_refused_first_run_leaves_no_directory(flag, workspace, capsys, tmp_path):
    runs = tmp_path / "new-runs"
    assert cli(["fit", corpus_arg(workspace), f"--runs_dir={runs}", *TINY, flag]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: ")
    assert not runs.exists()  # neither the run directory nor the runs directory it would have lived in


def test_runs_dir_that_is_a_file(workspace, capsys, tmp_path):
    a_file = tmp_path / "runs.txt"
    a_file.write_text("not a directory")
    fails_cleanly(workspace, capsys, corpus_arg(workspace), f"--runs_dir={a_file}",
                  message=f"--runs_dir {a_file} is a file; give a directory")
    assert a_file.read_text() == "not a directory"


@pytest.mark.parametrize("flag,message", [
    ("--model.attention_options=not json", "--model.attention_options='not json' is invalid: expected a JSON mapping, "
                                           "e.g. --model.attention_options '{\"normalization\": \"softmax\"}'"),
    ("--model.n_layer=two", "--model.n_layer must be an integer >= 1 (number of transformer blocks), got 'two'"),
])
def test_unparsable_flags(flag, message, workspace, capsys):
    before = snapshot(workspace / "runs")
    with pytest.raises(SystemExit) as stop:
        cli(["fit", corpus_arg(workspace), f"--runs_dir={workspace / 'runs'}", flag])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert snapshot(workspace / "runs") == before


def test_bad_text_files(workspace, capsys, tmp_path):
    empty, binary, latin1 = tmp_path / "empty.txt", tmp_path / "blob.bin", tmp_path / "latin1.txt"
    one_char = tmp_path / "aaaa.txt"
    one_char.write_text("a" * 500)
    fails_cleanly(workspace, capsys, f"--data.path={one_char}", message="has only one distinct character ('a'); "
                  "a language model needs at least two")
    empty.write_text("")
    binary.write_bytes(bytes(range(256)) * 4)
    latin1.write_bytes("naïve café\n".encode("latin-1") * 50)
    fails_cleanly(workspace, capsys, f"--data.path={empty}", message="is empty")
    fails_cleanly(workspace, capsys, f"--data.path={binary}", message="looks binary")
    fails_cleanly(workspace, capsys, f"--data.path={latin1}", message="is not UTF-8 text")
    fails_cleanly(workspace, capsys, f"--data.path={tmp_path / 'nope.txt'}", message="text file not found")
    fails_cleanly(workspace, capsys, "--data.url=http://127.0.0.1:9/corpus.txt", f"--data.cache_dir={tmp_path}",
                  message="could not download http://127.0.0.1:9/corpus.txt")


def test_resume_with_other_vocabulary(workspace, capsys, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("completely different characters: 0123456789 XYZ!?\n" * 80)
    fails_cleanly(workspace, capsys, f"--data.path={other}", "--run=good", "--ckpt_path=last",
                  message="different vocabulary")


def test_resume_with_other_model_shape(workspace, capsys):
    fails_cleanly(workspace, capsys, corpus_arg(workspace), "--run=good", "--ckpt_path=last", "--model.n_embd=64",
                  message="the checkpoint's model differs from this run's: n_embd=32 (this run: 64)")
    fails_cleanly(workspace, capsys, corpus_arg(workspace), "--run=good", "--ckpt_path=last", "--model.attention=gqa",
                  message="attention='mha' (this run: 'gqa')")


def test_damaged_checkpoints(workspace, capsys, tmp_path):
    good = (workspace / "runs" / "good" / "checkpoints" / "last.ckpt").read_bytes()
    truncated, garbage = tmp_path / "truncated.ckpt", tmp_path / "garbage.ckpt"
    truncated.write_bytes(good[: len(good) // 2])
    garbage.write_bytes(os.urandom(4096))
    fails_cleanly(workspace, capsys, corpus_arg(workspace), f"--ckpt_path={truncated}",
                  message="is unreadable, probably truncated or corrupt")
    fails_cleanly(workspace, capsys, corpus_arg(workspace), f"--ckpt_path={garbage}",
                  message="is unreadable, probably truncated or corrupt")


def test_corrupt_last_checkpoint_names_the_newest_intact_one(workspace, capsys, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(workspace / "runs" / "good", runs / "good")
    ckpts = runs / "good" / "checkpoints"
    (best,) = ckpts.glob("best-*.ckpt")
    data = bytearray((ckpts / "last.ckpt").read_bytes())
    data[len(data) // 2: len(data) // 2 + 8] = bytes(8)  # bit rot in the middle: torch.load would not notice
    (ckpts / "last.ckpt").write_bytes(bytes(data))
    before = snapshot(runs)
    assert cli(["fit", corpus_arg(workspace), f"--runs_dir={runs}", *TINY, "--run=good", "--ckpt_path=last"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    step = torch.load(best, weights_only=True)["global_step"]
    assert err == (f"error: checkpoint {ckpts / 'last.ckpt'} is corrupt (its contents do not match the SHA-256 digest "
                   f"written with it); the newest intact checkpoint beside it is {best} (step {step}): resume with "
                   f"--ckpt_path {best}")
    assert snapshot(runs) == before


def test_a_checkpoint_of_an_older_format_is_refused_in_one_line(workspace, capsys, tmp_path):
    """The network's weights at the state_dict's top level, as before it was GPT.transformer: fit and the tools."""
    from lit_attn.tools import sample

    ckpt = torch.load(workspace / "runs" / "good" / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["state_dict"] = {k.removeprefix("transformer."): v for k, v in ckpt["state_dict"].items()}
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    line = (f"error: {old} is in the format of lit-attn before 2026-11-23 (its state_dict has no 'transformer.' "
            f"keys); retrain the run, or load it with an older lit-attn")
    assert fails_cleanly(workspace, capsys, corpus_arg(workspace), f"--ckpt_path={old}", message="") == line
    assert sample.main(["--ckpt_path", str(old)]) == 2
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("obj,what", [
    ({"w": torch.zeros(2)}, "a dict of tensors"), ([1, 2], "a list"), (torch.zeros(3), "a Tensor"),
    ({"state_dict": {}, "epoch": 1}, "a dict without 'global_step'"),
])
def test_pickles_that_are_not_checkpoints(obj, what, workspace, capsys, tmp_path):
    path = tmp_path / "thing.ckpt"
    torch.save(obj, path)
    fails_cleanly(workspace, capsys, corpus_arg(workspace), f"--ckpt_path={path}",
                  message=f"{path} is not a lit-attn checkpoint (it holds {what}); pass a .ckpt written by main.py fit")


def test_missing_checkpoints(workspace, capsys, tmp_path):
    fails_cleanly(workspace, capsys, corpus_arg(workspace), f"--ckpt_path={tmp_path / 'none.ckpt'}",
                  message="checkpoint not found")
    fails_cleanly(workspace, capsys, corpus_arg(workspace), "--ckpt_path=last",
                  message="--ckpt_path last needs --run NAME to know which run to resume (runs in")
    fails_cleanly(workspace, capsys, corpus_arg(workspace), "--run=nosuch", "--ckpt_path=last",
                  message="there is no run 'nosuch'")
    (workspace / "runs" / "empty-run").mkdir()
    try:
        fails_cleanly(workspace, capsys, corpus_arg(workspace), "--run=empty-run", "--ckpt_path=last",
                      message="run 'empty-run' has no checkpoint to resume")
    finally:
        (workspace / "runs" / "empty-run").rmdir()


def test_fresh_start_never_overwrites_a_run(workspace, capsys):
    fails_cleanly(workspace, capsys, corpus_arg(workspace), "--run=good",
                  message="run 'good' already has checkpoints")


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_is_refused_without_running(workspace, tmp_path, capsys):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "global_step": 3, "x": Payload(marker)}, evil)
    before = snapshot(workspace / "runs")
    assert cli(["fit", corpus_arg(workspace), f"--runs_dir={workspace / 'runs'}", f"--ckpt_path={evil}", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: refusing to load {evil}")
    assert "Traceback" not in err
    assert not marker.exists()  # the payload never ran (here it would have run in this very process)
    assert snapshot(workspace / "runs") == before


@pytest.mark.slow
def test_user_error_in_a_real_process(workspace, tmp_path):
    result = run_main("fit", corpus_arg(workspace), "--model.attention=bogus", f"--runs_dir={workspace / 'runs'}",
                      cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: unknown attention 'bogus'")
    assert "Traceback" not in result.stderr


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(workspace, capsys, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    shutil.copytree(workspace / "runs" / "good", runs / "nan")
    last = runs / "nan" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    real_loss = GPT._loss

    def loss_goes_nan(self, logits, targets):
        loss = real_loss(self, logits, targets)
        return loss * float("nan") if self.trainer.global_step >= 8 else loss

    monkeypatch.setattr(GPT, "_loss", loss_goes_nan)
    code = cli(["fit", corpus_arg(workspace), f"--runs_dir={runs}", "--run=nan", "--ckpt_path=last",
                "--trainer.max_steps=20", *TINY])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert err.startswith("error: training loss is nan at step 8; stopped without saving; the last good checkpoint "
                          f"is kept: {last} (step 6)")
    assert last.read_bytes() == before  # the last good checkpoint (step 6) is what is on disk


@pytest.mark.parametrize("where", ["lit_attn.transformer.Transformer.__init__",
                                   "datamodules.char.CharDataModule.setup"])
def test_ctrl_c_before_training_ends_in_one_line_and_leaves_nothing(where, workspace, capsys, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupt)
    runs = workspace / "runs"
    before = snapshot(runs)
    assert cli(["fit", f"--runs_dir={runs}", "--run=interrupted", corpus_arg(workspace), *TINY]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C) before training started; nothing was written"
    assert "Traceback" not in err and snapshot(runs) == before


@pytest.mark.slow
def test_ctrl_c_while_the_libraries_load(tmp_path):
    """Ctrl-C once torch has started to load (the command's handler is installed before it), however long the
    process took to get there."""
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT

    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "fit", "--run=x"], cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 600  # a hang guard only
    while "/torch/" not in maps.read_text():  # torch's own libraries mapped: it is importing
        assert proc.poll() is None and time.monotonic() < deadline, "main.py ended or hung before importing torch"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert "before training started" in err and not (tmp_path / "runs").exists()


def test_a_setting_lightning_refuses_during_fit_is_one_line(workspace, capsys):
    # Lightning checks this only once it counts the training batches, inside fit
    fails_cleanly(workspace, capsys, corpus_arg(workspace), "--run=epochs", "--trainer.max_epochs=1",
                  "--trainer.max_steps=-1", "--trainer.check_val_every_n_epoch=1",
                  "--trainer.val_check_interval=100000", message="must be less than or equal to the number of")
