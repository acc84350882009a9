import random
import string
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def corpus(tmp_path):
    """A small UTF-8 text file (~20 KB) with some non-ASCII characters."""
    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(300)]
    words += ["café", "naïve", "Straße", "日本語", "émigré"]
    lines = [" ".join(rng.choices(words, k=rng.randint(4, 12))).capitalize() + "." for _ in range(600)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `where`: None, or why that is impossible here."""
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
    except FileNotFoundError as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited with {done.returncode}")


def pytest_collection_modifyitems(config, items):
    """Tests marked `tmpfs` run wherever a filesystem can be mounted (root or CAP_SYS_ADMIN); elsewhere
    they are reported as skipped with the mount's own error, decided once, before any test runs."""
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
