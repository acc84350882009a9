"""A fit on data with a held-out test split scores it once at its end, with the weights it ended with, into the
run's own record, which compare reads; a fit on data without one logs no test metric."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_FIT, scalars

from datamodules import CharDataModule, TokenWindows
from lit_attn.cli.lightning_cli import cli
from lit_attn.load import load_run
from lit_attn.tools.events import run_scalars
from lit_attn.tools.run_record import read_run


@pytest.mark.parametrize("test_fraction", [0.0, 0.2])
def test_a_fit_scores_the_test_split_once_at_its_end(test_fraction, corpus, tmp_path):
    split = ["--data.val_fraction=0.2", f"--data.test_fraction={test_fraction}"]
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path}", "--run=r", *TINY_FIT, *split]) == 0
    series = run_scalars(tmp_path / "r")
    row = read_run(tmp_path / "r")
    if not test_fraction:
        assert not [tag for tag in series if tag.startswith("test/")]
        assert row["test_loss"] is None and row["test_acc"] is None and row["test_ppl"] is None
        return
    assert [len(series[tag]) for tag in ("test/loss", "test/acc", "test/ppl")] == [1, 1, 1]  # once, at the end
    # The network of last.ckpt (written at the end of fit) on every window of the test split: the last fifth
    run = load_run(tmp_path / "r")
    data = CharDataModule(path=str(corpus), block_size=16, val_fraction=0.2, test_fraction=0.2)
    windows = TokenWindows(data.load_tokens("test"), 16, 16, "test")
    x, y = windows.__getitems__(list(range(len(windows))))
    with torch.no_grad():
        logits = run.network(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    acc = (logits.argmax(-1) == y).float().mean().item()
    assert row["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert row["test_acc"] == pytest.approx(acc, rel=1e-5)
    assert row["test_ppl"] == pytest.approx(math.exp(loss), rel=1e-5)
    # `test` of the run scores the same split with the same weights, into an evaluation of its own
    assert cli(["test", f"--runs_dir={tmp_path}", "--run=r"]) == 0
    assert scalars(tmp_path / "r" / "eval" / "test-1", "test/loss") == [(4, pytest.approx(loss, rel=1e-5))]
