"""A command acts on the run directory the user names: a copied or moved run never reaches the run it was copied
from, a damaged one is refused in one line, an evaluation of untrained weights must be asked for, and a resume
starts from the run's own config."""

import os
import shutil
import warnings
from pathlib import Path

import pytest
from helpers import TINY_FIT, last_checkpoint, snapshot

from lit_attn.cli.lightning_cli import cli

# Not the default config's model: an evaluation or resume that rebuilt another model would be refused.
LAYOUT = ["--model.n_layer=2", "--model.attention=gqa", "--model.n_kv_heads=2", "--model.pos=rope"]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A finished tiny run (4 steps) in an absolute runs directory, which its config.yaml records."""
    from helpers import write_corpus

    root = tmp_path_factory.mktemp("original")
    corpus = write_corpus(root / "corpus.txt")
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={root / 'runs'}", "--run=base", *TINY_FIT,
                *LAYOUT]) == 0
    run = root / "runs" / "base"
    assert f"runs_dir: {root / 'runs'}" in (run / "config.yaml").read_text()
    return run


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot in the middle: torch.load would not notice
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


LAST = "runs/copy/checkpoints/last.ckpt"
CONFIG = "runs/copy/config.yaml"

# (how the copy is damaged, the file it damages, the error line's text; None: the evaluation runs, on the copy)
DAMAGES = {
    "intact": (None, None, None),
    "last.ckpt deleted": (os.unlink, LAST, f"error: run 'copy' has no checkpoint to {{verb}} ({LAST} does not "
                                           f"exist); give another of its checkpoints with --ckpt_path, e.g. "
                                           f"runs/copy/checkpoints/best-4.ckpt"),
    "last.ckpt truncated": (_truncate, LAST, f"error: checkpoint {LAST} is unreadable, probably truncated or corrupt"),
    "last.ckpt bit-flipped": (_flip, LAST, f"error: checkpoint {LAST} is corrupt (its contents do not match the "
                                           f"SHA-256 digest written with it); the newest intact checkpoint beside "
                                           f"it is runs/copy/checkpoints/best-4.ckpt (step 4)"),
    "hparams.yaml garbage": (lambda p: p.write_bytes(os.urandom(300)), "runs/copy/hparams.yaml", None),
    "config.yaml missing": (os.unlink, CONFIG, f"error: {CONFIG} is missing, so the run's settings (its model, its "
                                               f"data) are unknown; restore the file"),
    "config.yaml empty": (lambda p: p.write_text(""), CONFIG, f"error: the run's config {CONFIG} is empty, so the "
                                                              f"run's model cannot be rebuilt"),
    "config.yaml binary": (lambda p: p.write_bytes(bytes(range(128, 256))), CONFIG,
                           f"error: the run's config {CONFIG} is not UTF-8 text (byte 0x80 at offset 0)"),
    "config.yaml not YAML": (lambda p: p.write_text("model: [1,\n"), CONFIG,
                             f"error: the run's config {CONFIG} is not valid YAML (line 2, column 1)"),
    "config.yaml not a config": (lambda p: p.write_text("some words\n"), CONFIG,
                                 f"error: the run's config {CONFIG} holds no model section"),
}

ROWS = [pytest.param("validate", damage, id=f"validate-{damage}") for damage in DAMAGES] + [
    pytest.param(stage, damage, id=f"{stage}-{damage}", marks=pytest.mark.slow)
    for stage in ("test", "predict") for damage in ("intact", "last.ckpt bit-flipped", "config.yaml missing")] + [
    pytest.param("fit", damage, id=f"fit-{damage}")  # a resume of the copy: intact, it is complete
    for damage in ("intact", "last.ckpt deleted", "last.ckpt truncated", "last.ckpt bit-flipped",
                   "config.yaml missing", "config.yaml binary")]


@pytest.mark.parametrize("stage, damage", ROWS)
def test_a_copied_run_is_acted_on_alone(stage, damage, original, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "runs" / "copy"
    shutil.copytree(original, copy)
    harm, target, message = DAMAGES[damage]
    if harm is not None:
        harm(tmp_path / target)
    before_original, before_copy = snapshot(original.parent), snapshot(copy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli([stage, "--run=copy", *(["--ckpt_path=last"] if stage == "fit" else [])])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert snapshot(original.parent) == before_original, "the original run was touched"
    if message is None and stage == "fit":
        assert code == 0 and err.strip().splitlines()[-1].startswith("run 'copy' is complete at step 4"), err[-2000:]
        assert snapshot(copy) == before_copy
    elif message is None:
        assert code == 0, err[-2000:]
        assert f"run 'copy' in runs/copy: {stage} of last.ckpt (step 4)" in err
        assert [p.name for p in (copy / "eval").iterdir()] == [f"{stage}-1"]
        assert {k: v for k, v in snapshot(copy).items() if not k.startswith("eval")} == before_copy
        assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    else:
        assert code == 2
        last = err.strip().splitlines()[-1]
        assert last.startswith(message.format(verb="resume" if stage == "fit" else stage)), last
        assert snapshot(copy) == before_copy


def test_an_evaluation_of_a_moved_run_leaves_its_old_place_alone(original, tmp_path, monkeypatch, capsys):
    """Moved twice: neither the runs directory its config names nor the one it was moved from gets anything."""
    monkeypatch.chdir(tmp_path)
    old = tmp_path / "old"
    shutil.copytree(original, old / "base")
    shutil.move(old / "base", tmp_path / "runs" / "moved")
    before = snapshot(original.parent)
    assert cli(["validate", "--run=moved"]) == 0
    assert list(old.iterdir()) == [] and (tmp_path / "runs" / "moved" / "eval" / "validate-1").is_dir()
    assert snapshot(original.parent) == before


@pytest.mark.parametrize("args, message", [
    (["validate"], "error: validate without --run NAME or --ckpt_path FILE would score untrained weights; name the "
                   "run (--run NAME) or checkpoint to validate, or pass --untrained true"),
    (["test"], "error: test without --run NAME or --ckpt_path FILE would score untrained weights"),
    (["predict"], "error: predict without --run NAME or --ckpt_path FILE would score untrained weights"),
    (["validate", "--run=base", "--untrained=true"], "error: --untrained true scores the initial weights, but a "
                                                     "checkpoint is named"),
    (["fit", "--untrained=true"], "error: --untrained is for validate, test and predict"),
])
def test_untrained_weights_are_scored_only_when_asked_for(args, message, original, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = snapshot(original.parent)
    assert cli([*args, f"--runs_dir={original.parent}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(message) and "Traceback" not in err
    assert snapshot(original.parent) == before and list(tmp_path.iterdir()) == []


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_untrained_true_scores_the_initial_weights(original, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = f"--data.path={original.parent.parent / 'corpus.txt'}"
    assert cli(["validate", data, "--untrained=true", *TINY_FIT[:4]]) == 0
    assert ": untrained weights (--untrained true)" in capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    assert [p.name for p in (run / "eval").iterdir()] == ["validate-1"]


def test_a_resume_starts_from_the_runs_own_config(original, tmp_path, monkeypatch, capsys):
    """Neither the model (LAYOUT) nor the data are given again; a larger max_steps trains on, in the copy: its best
    checkpoints are the copy's own."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(original, tmp_path / "runs" / "r")
    before = snapshot(original.parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(["fit", "--run=r", "--ckpt_path=last", "--trainer.max_steps=6"]) == 0, capsys.readouterr().err
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    state = last_checkpoint(tmp_path / "runs" / "r")
    assert state["global_step"] == 6 and state["hyper_parameters"]["attention"] == "gqa"
    assert "runs_dir: runs\n" in (tmp_path / "runs" / "r" / "config.fit.yaml").read_text()
    (best,) = [s for k, s in state["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert {str(Path(p).parent) for p in best["best_k_models"]} == {"runs/r/checkpoints"}
    assert snapshot(original.parent) == before


COMPLETE = ("run 'done' is complete at step 4 (--trainer.max_steps 4 reached); nothing to do, nothing written; to "
            "train it further, resume with --trainer.max_steps M, M > 4")


@pytest.mark.parametrize("args, line", [
    (["--ckpt_path=last"], COMPLETE),
    (["--ckpt_path=auto"], COMPLETE),  # a scheduler's restart of a finished job
    (["--ckpt_path=last", "--trainer.max_steps=4", "--model.lr=0.01"], COMPLETE),
    (["--ckpt_path=last", "--trainer.max_steps=2"], "run 'done' is at step 4, past --trainer.max_steps 2; nothing to "
                                                    "do, nothing written; to train it further, resume with "
                                                    "--trainer.max_steps M, M > 4"),
])
def test_resuming_a_finished_run_says_so_and_writes_nothing(args, line, original, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "done"
    shutil.copytree(original, run)
    before = snapshot(tmp_path)
    assert cli(["fit", "--run=done", *args]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert [e for e in err if "Seed set to" not in e] == [line]  # Lightning's seed line comes before any
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("content, message", [
    (bytes(range(128, 256)), "is not UTF-8 text (byte 0x80 at offset 0); give a YAML file"),
    (b"trainer: {max_steps: 5\n", "is not valid YAML (line 2, column 1)"),
])
def test_a_broken_config_file_is_named(content, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(content)
    assert cli(["fit", "--config=bad.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --config bad.yaml {message}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_resume_never_saves_into_the_place_a_run_was_copied_from(original, tmp_path, monkeypatch, capsys):
    """A best-checkpoint callback whose dirpath names the original run would rotate (delete) the original's files."""
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "runs" / "copy"
    shutil.copytree(original, copy)
    config = (copy / "config.yaml").read_text()
    assert "      dirpath: null\n" in config
    (copy / "config.yaml").write_text(config.replace("      dirpath: null\n",
                                                     f"      dirpath: {original / 'checkpoints'}\n", 1))
    before = snapshot(tmp_path), snapshot(original.parent)
    assert cli(["fit", "--run=copy", "--ckpt_path=last", "--trainer.max_steps=6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: the run's config runs/copy/config.yaml saves checkpoints into "
                       f"{original / 'checkpoints'}, in the directory the run was trained in ({original}), not in "
                       f"runs/copy; give "
                       f"--trainer.callbacks again with a dirpath inside runs/copy (or none: RUN/checkpoints)")
    assert (snapshot(tmp_path), snapshot(original.parent)) == before
