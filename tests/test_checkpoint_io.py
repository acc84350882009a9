"""Checkpoints are written atomically beside their target with a SHA-256 digest, and read with one-line errors."""

import errno
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import ROOT, one_line_error
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_attn.load import load_checkpoint, verify_checkpoint
from lit_attn.training.checkpoint import AtomicCheckpointIO, save_checkpoint

HINT = "pass a .ckpt written by main.py fit (runs/RUN/checkpoints/)"
CORRUPT = "is corrupt (its contents do not match the SHA-256 digest written with it)"
ALONE = "no intact checkpoint is beside it; start the run afresh with another --run name"


def ckpt(step: int, numel: int = 65536) -> dict:
    return {"global_step": step, "epoch": 0, "state_dict": {"w": torch.arange(numel, dtype=torch.float32) + step}}


def flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8] = bytes(b ^ 0xFF for b in data[mid:mid + 8])
    path.write_bytes(bytes(data))


def newest(other: Path, step: int) -> str:
    return f"the newest intact checkpoint beside it is {other} (step {step}): resume with --ckpt_path {other}"


# ---- writing ----

def test_save_writes_a_torch_zip_with_its_digest(tmp_path):
    path = tmp_path / "new" / "dir" / "last.ckpt"  # parents are created
    save_checkpoint(ckpt(3), path)
    assert verify_checkpoint(path) is True
    comment = zipfile.ZipFile(path).comment
    assert comment.startswith(b"lit-attn sha256:") and len(comment) == 16 + 64
    loaded = load_checkpoint(path)
    assert loaded["global_step"] == 3 and torch.equal(loaded["state_dict"]["w"], ckpt(3)["state_dict"]["w"])
    assert torch.load(path, mmap=True, weights_only=True)["global_step"] == 3
    save_checkpoint(ckpt(4), path)  # replaces the file
    assert load_checkpoint(path)["global_step"] == 4 and verify_checkpoint(path) is True
    assert os.listdir(path.parent) == ["last.ckpt"]


def test_files_without_a_digest_still_load(tmp_path, monkeypatch):
    plain = tmp_path / "plain.ckpt"
    torch.save(ckpt(5), plain)
    assert verify_checkpoint(plain) is None
    assert load_checkpoint(plain)["global_step"] == 5
    # A format that is not a zip ending in a bare EOCD record is written as torch wrote it.
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, f, _use_new_zipfile_serialization=False))
    legacy = tmp_path / "legacy.ckpt"
    save_checkpoint(ckpt(6), legacy)
    assert not zipfile.is_zipfile(legacy) and verify_checkpoint(legacy) is None
    assert load_checkpoint(legacy)["global_step"] == 6


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_write_failing_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch, error):
    path = tmp_path / "checkpoints" / "last.ckpt"
    save_checkpoint(ckpt(1), path)
    before = path.read_bytes()
    real_write, seen = os.write, []

    def write_half_then_fail(fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(path.parent)):
            return real_write(fd, data)
        seen.append(sorted(os.listdir(path.parent)))
        if len(seen) == 1:
            return real_write(fd, memoryview(data)[: len(data) // 2])
        raise error

    monkeypatch.setattr(os, "write", write_half_then_fail)
    with pytest.raises(type(error)):
        save_checkpoint(ckpt(2, numel=1 << 20), path)
    monkeypatch.undo()
    assert len(seen) == 2  # half was written, to a hidden temporary file beside the target
    assert [name for name in seen[0] if name.startswith(".last.ckpt.") and name.endswith(".tmp")]
    assert path.read_bytes() == before and load_checkpoint(path)["global_step"] == 1
    assert os.listdir(path.parent) == ["last.ckpt"]


@pytest.mark.slow
def test_a_file_size_limit_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    save_checkpoint(ckpt(1), path)
    before = path.read_bytes()
    script = (
        "import resource, signal, sys, torch\n"
        "from lit_attn.training.checkpoint import save_checkpoint\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that write fails with EFBIG instead of killing us\n"
        "limit = int(sys.argv[2])\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
        "try:\n"
        "    save_checkpoint({'global_step': 2, 'state_dict': {'w': torch.ones(1 << 20)}}, sys.argv[1])\n"
        "except OSError as e:\n"
        "    print('errno', e.errno)\n"
        "else:\n"
        "    print('saved')\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(path), str(len(before) + 4096)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["errno", str(errno.EFBIG)]
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.ckpt"]


@pytest.mark.slow
@pytest.mark.tmpfs
def test_a_full_disk_on_another_filesystem_keeps_the_previous_checkpoint(tmp_path, tmpfs, monkeypatch):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)
    mnt = tmpfs("8m")
    assert os.stat(mnt).st_dev != os.stat(tmpdir).st_dev  # checkpoints and $TMPDIR on different filesystems
    path = mnt / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(ckpt(1, numel=256 << 10), path)  # 1 MiB
    before = path.read_bytes()
    with pytest.raises(OSError) as e:
        io.save_checkpoint(ckpt(2, numel=3 << 20), path)  # 12 MiB: the disk fills midway
    assert e.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and load_checkpoint(path)["global_step"] == 1
    assert os.listdir(path.parent) == ["last.ckpt"]
    assert list(tmpdir.iterdir()) == []
    io.save_checkpoint(ckpt(3, numel=256 << 10), path)  # the space was given back
    assert verify_checkpoint(path) is True and io.load_checkpoint(path)["global_step"] == 3


# ---- through Lightning ----

class RecordStart(Callback):
    def __init__(self):
        self.steps = []

    def on_train_start(self, trainer, pl_module):
        self.steps.append(trainer.global_step)


def boring_trainer(root: Path, max_steps: int, *callbacks) -> Trainer:
    return Trainer(default_root_dir=root, max_steps=max_steps, plugins=[AtomicCheckpointIO()], accelerator="cpu",
                   devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   limit_val_batches=0, callbacks=list(callbacks))


def test_lightning_writes_verified_checkpoints_and_resumes_from_them(tmp_path, monkeypatch):
    ckpt_dir = tmp_path / "checkpoints"
    every2 = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=2, save_top_k=-1, save_last=True)
    trainer = boring_trainer(tmp_path, 4, every2)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    trainer.fit(BoringModel())
    names = sorted(os.listdir(ckpt_dir))
    assert names == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    assert all(verify_checkpoint(ckpt_dir / name) is True for name in names)

    loads = []
    real_load = AtomicCheckpointIO.load_checkpoint
    monkeypatch.setattr(AtomicCheckpointIO, "load_checkpoint", lambda self, path, **kw: (
        loads.append((Path(path).name, kw.get("weights_only"))), real_load(self, path, **kw))[1])
    start = RecordStart()
    resumed = boring_trainer(tmp_path / "resumed", 6, start)
    resumed.fit(BoringModel(), ckpt_path=ckpt_dir / "last.ckpt", weights_only=True)
    assert loads == [("last.ckpt", True)] and start.steps == [4] and resumed.global_step == 6

    flip_middle(ckpt_dir / "last.ckpt")
    message = one_line_error(boring_trainer(tmp_path / "again", 6).fit, BoringModel(), ckpt_path=ckpt_dir / "last.ckpt")
    step4 = ckpt_dir / "epoch=0-step=4.ckpt"
    assert message == f"checkpoint {ckpt_dir / 'last.ckpt'} {CORRUPT}; {newest(step4, 4)}"


def test_ddp_routes_checkpoints_through_the_plugin():
    # Strategy.save_checkpoint (rank 0) and load_checkpoint (every rank) call strategy.checkpoint_io.
    io = AtomicCheckpointIO()
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, plugins=[io], logger=False)
    assert trainer.strategy.checkpoint_io is io


class Custom:
    """Not on torch's weights_only allowlist."""


def test_plugin_loads_like_lightning(tmp_path):
    io, path = AtomicCheckpointIO(), tmp_path / "x.ckpt"
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint(ckpt(1), path, storage_options={"a": 1})
    assert not path.exists()
    io.save_checkpoint({**ckpt(1), "custom": Custom()}, path)
    assert verify_checkpoint(path) is True
    with pytest.raises(pickle.UnpicklingError):
        io.load_checkpoint(path, weights_only=True)
    locations = []
    loaded = io.load_checkpoint(path, map_location=lambda storage, loc: (locations.append(loc), storage)[1],
                                weights_only=False)
    assert isinstance(loaded["custom"], Custom) and locations == ["cpu"]
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")


# ---- reading damaged and foreign files ----

def test_flipped_bytes_are_caught_and_the_newest_intact_sibling_named(tmp_path):
    d = tmp_path / "checkpoints"
    save_checkpoint(ckpt(2), d / "epoch=0-step=2.ckpt")
    torch.save(ckpt(5), d / "plain-step=5.ckpt")  # no digest, loads: intact as far as anyone can tell
    save_checkpoint(ckpt(9), d / "epoch=0-step=9.ckpt")
    flip_middle(d / "epoch=0-step=9.ckpt")  # newer, but corrupt
    save_checkpoint(ckpt(20), d / "truncated.ckpt")
    (d / "truncated.ckpt").write_bytes((d / "truncated.ckpt").read_bytes()[:4000])
    (d / "garbage.ckpt").write_bytes(os.urandom(4096))
    torch.save(ckpt(30)["state_dict"], d / "weights.ckpt")  # not a training checkpoint
    last = d / "last.ckpt"
    save_checkpoint(ckpt(7), last)
    flip_middle(last)
    damaged = torch.load(last, weights_only=True)  # torch itself does not notice
    assert not torch.equal(damaged["state_dict"]["w"], ckpt(7)["state_dict"]["w"])
    assert verify_checkpoint(last) is False

    expected = f"checkpoint {last} {CORRUPT}; {newest(d / 'plain-step=5.ckpt', 5)}"
    assert one_line_error(load_checkpoint, last) == expected
    assert one_line_error(AtomicCheckpointIO().load_checkpoint, last) == expected
    (d / "plain-step=5.ckpt").unlink()
    assert (one_line_error(load_checkpoint, last)
            == f"checkpoint {last} {CORRUPT}; {newest(d / 'epoch=0-step=2.ckpt', 2)}")
    (d / "epoch=0-step=2.ckpt").unlink()
    assert one_line_error(load_checkpoint, last) == f"checkpoint {last} {CORRUPT}; {ALONE}"


def test_a_corrupt_checkpoint_alone(tmp_path):
    path = tmp_path / "last.ckpt"
    save_checkpoint(ckpt(3), path)
    flip_middle(path)
    assert one_line_error(load_checkpoint, path) == f"checkpoint {path} {CORRUPT}; {ALONE}"
    assert one_line_error(AtomicCheckpointIO().load_checkpoint, path) == f"checkpoint {path} {CORRUPT}; {ALONE}"


def test_a_truncated_checkpoint_names_an_intact_sibling(tmp_path):
    path = tmp_path / "last.ckpt"
    save_checkpoint(ckpt(8), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    alone = one_line_error(load_checkpoint, path)
    assert alone.startswith(f"checkpoint {path} is unreadable, probably truncated or corrupt")
    assert alone.endswith("; use another checkpoint")
    save_checkpoint(ckpt(6), tmp_path / "epoch=0-step=6.ckpt")
    beside = one_line_error(load_checkpoint, path)
    assert beside.startswith(f"checkpoint {path} is unreadable, probably truncated or corrupt")
    assert beside.endswith(f"; {newest(tmp_path / 'epoch=0-step=6.ckpt', 6)}")


@pytest.mark.parametrize("obj,what", [
    ({"w": torch.zeros(2), "b": torch.zeros(1)}, "a dict of tensors"),
    ([1, 2, 3], "a list"),
    (torch.zeros(3), "a Tensor"),
    ({"state_dict": {"w": torch.zeros(2)}, "epoch": 1}, "a dict without 'global_step'"),
    ({"global_step": 4, "epoch": 1}, "a dict without 'state_dict'"),
])
def test_pickles_that_are_not_checkpoints(tmp_path, obj, what):
    path = tmp_path / "thing.ckpt"
    torch.save(obj, path)
    assert one_line_error(load_checkpoint, path) == f"{path} is not a lit-attn checkpoint (it holds {what}); {HINT}"


def test_require_loosens_or_tightens_the_check(tmp_path):
    model_only = tmp_path / "model.ckpt"  # what sample.py accepts: weights and hyperparameters, no training state
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"n_embd": 2}}, model_only)
    assert load_checkpoint(model_only, require=("state_dict", "hyper_parameters"))["hyper_parameters"] == {"n_embd": 2}
    no_hp = tmp_path / "no_hp.ckpt"
    save_checkpoint(ckpt(1), no_hp)
    assert one_line_error(load_checkpoint, no_hp, require=("state_dict", "hyper_parameters")) == (
        f"{no_hp} is not a lit-attn checkpoint (it holds a dict without 'hyper_parameters'); {HINT}")


# ---- what a killed save leaves behind ----

@pytest.mark.parametrize("name,stale", [
    (".last.ckpt.0123456789ab.tmp", True),
    (".best-4.ckpt.abcdef012345.tmp", True),
    ("last.ckpt", False),
    (".last.ckpt.0123.tmp", False),  # not a save's name: 12 hex digits
    (".last.ckpt.0123456789ab.tmp.keep", False),
    ("notes.tmp", False),
])
def test_stale_temporaries_are_the_saves_own_names(name, stale, tmp_path):
    from lit_attn.training.checkpoint import stale_temporaries

    (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".dir.ckpt.0123456789ab.tmp").mkdir()  # a directory is never one
    assert stale_temporaries(tmp_path) == ([tmp_path / name] if stale else [])
    assert stale_temporaries(tmp_path / "missing") == []


def test_the_plugin_knows_which_files_it_wrote(tmp_path):
    io = AtomicCheckpointIO()
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    io.save_checkpoint(ckpt(1), a)
    io.save_checkpoint(ckpt(2), b)
    assert io.written == {str(p): (os.stat(p).st_dev, os.stat(p).st_ino) for p in (a, b)}
    io.remove_checkpoint(a)
    assert not a.exists() and list(io.written) == [str(b)]
    save_checkpoint(ckpt(3), b)  # another writer's file at the same path: another inode
    assert io.written[str(b)] != (os.stat(b).st_dev, os.stat(b).st_ino)


@pytest.mark.parametrize("mode,missing,best,kth", [
    ("min", ["b"], "a", "c"),
    ("min", ["a"], "b", "c"),
    ("max", ["c"], "b", "a"),
    ("min", ["a", "b", "c"], "", ""),
    ("min", [], "a", "c"),
])
def test_missing_best_checkpoints_are_dropped_from_the_list(mode, missing, best, kth, tmp_path):
    from callbacks.checkpointing import drop_missing_best

    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val/loss", mode=mode, save_top_k=3)
    scores = {"a": 1.0, "b": 2.0, "c": 3.0}
    callback.best_k_models = {str(tmp_path / k): torch.tensor(v) for k, v in scores.items()}
    callback.best_model_path, callback.kth_best_model_path = str(tmp_path / "a"), str(tmp_path / "c")
    callback.best_model_score, callback.kth_value = torch.tensor(1.0), torch.tensor(3.0)
    if mode == "max":
        callback.best_model_path, callback.kth_best_model_path = callback.kth_best_model_path, callback.best_model_path
        callback.best_model_score, callback.kth_value = callback.kth_value, callback.best_model_score
    for name in scores:
        if name not in missing:
            (tmp_path / name).write_bytes(b"x")
    assert drop_missing_best(callback) == [str(tmp_path / k) for k in missing]
    assert sorted(callback.best_k_models) == [str(tmp_path / k) for k in scores if k not in missing]
    assert callback.best_model_path == (str(tmp_path / best) if best else "")
    assert callback.kth_best_model_path == (str(tmp_path / kth) if kth else "")
    if best:
        assert callback.best_model_score == scores[best] and callback.kth_value == scores[kth]
    else:
        assert callback.best_model_score is None
