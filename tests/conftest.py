"""Shared fixtures. Torch and the helpers are imported where a fixture needs them: pytest-xdist's controller loads
this file too, and it starts the workers only after, so imports here would delay every worker by seconds."""

import os
import subprocess
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _pinned_threads():
    """Torch threads here and in every child process: OMP_NUM_THREADS where it is set, else 1.

    The models are tiny, so more threads gain nothing, and on shared CPUs they make each other
    wait; one number for parent and children keeps a run resumed in a child process comparable,
    bit for bit, with one run here.
    """
    import torch

    threads = os.environ.get("OMP_NUM_THREADS") or "1"
    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", threads)
        torch.set_num_threads(int(threads))
        yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)


@pytest.fixture
def corpus(tmp_path):
    """A small UTF-8 text file (~20 KB) with some non-ASCII characters."""
    from helpers import write_corpus

    return write_corpus(tmp_path / "corpus.txt")


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """~1.9 KB of 18 distinct characters: with block 16, stride 16 and batch 8 an epoch is 13 batches
    (6 per rank under 2-process DDP), so a run of a few dozen steps crosses epoch boundaries."""
    from helpers import write_chars

    return write_chars(tmp_path_factory.mktemp("data") / "small.txt", 1900, seed=1)


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `where`: None, or why that is impossible here."""
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
    except FileNotFoundError as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited with {done.returncode}")


# The files whose tests start training processes, longest first (about 310, 140, 110, 70, 55, 55, 45 and 35 s
# on 2 cores). pytest-xdist (--dist=loadfile --no-loadscope-reorder) hands the files to its workers in collection
# order, the next to whichever is free: with the long files first the workers end together, where a long file
# handed out last would run alone at the end. Any order is correct; this one is the quickest.
LONGEST_FIRST = ("test_docs.py", "test_preemption.py", "test_resume.py", "test_sweep.py", "test_errors.py",
                 "test_sweep_stop.py", "test_runlock.py", "test_callbacks.py")


def _longest_first(items: list) -> None:
    """Reorder `items` in place: LONGEST_FIRST's files in that order, then the rest by number of tests (most first,
    as xdist would); each file's tests keep their order."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.path.name, []).append(item)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = sorted(by_file, key=lambda name: (rank.get(name, len(rank)), -len(by_file[name])))
    items[:] = [item for name in order for item in by_file[name]]


def pytest_collection_modifyitems(config, items):
    """Long files first (see LONGEST_FIRST). Tests marked `tmpfs` run wherever a filesystem can be mounted (root or
    CAP_SYS_ADMIN); elsewhere they are reported as skipped with the mount's own error, decided once, before any
    test runs."""
    _longest_first(items)
    wanting = [item for item in items if item.get_closest_marker("tmpfs")]
    if not wanting:
        return
    with tempfile.TemporaryDirectory() as probe:
        error = _mount_tmpfs(Path(probe), "64k")
        if error is None:
            subprocess.run(["umount", probe], check=False)
    for item in wanting:
        item.add_marker(pytest.mark.skipif(error is not None, reason=f"cannot mount a tmpfs here: {error}"))


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a new directory on a tmpfs of its own (another filesystem than $TMPDIR, and one that
    fills up at `size`, e.g. "2m"); unmounted after the test. For tests marked `tmpfs`."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs-{len(mounts)}"
        where.mkdir()
        error = _mount_tmpfs(where, size)
        assert error is None, f"mounting a tmpfs failed although the probe succeeded: {error}"
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def run_text(tmp_path_factory) -> Path:
    """The run tests' corpus: 2,400 random characters."""
    from helpers import write_chars

    return write_chars(tmp_path_factory.mktemp("data") / "text.txt", 2400, seed=2)
