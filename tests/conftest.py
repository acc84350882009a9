import random
import string

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
