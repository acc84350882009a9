"""A non-finite loss or weight stops the fit with what the evidence points to: the forward, the weight decay or
the learning rate."""

import pytest
from helpers import TINY_FIT, write_corpus

from lit_attn import GPT
from lit_attn.cli.lightning_cli import cli


def _nan_from_step(step):
    """GPT._loss, NaN from optimizer step `step` on."""
    real_loss = GPT._loss
    return lambda self, logits, y: real_loss(self, logits, y) * (
        float("nan") if self.trainer.global_step >= step else 1.0)


@pytest.mark.parametrize("args,nan_from,says", [
    # Nothing was updated yet: the forward (the attention's) or the initialization made it
    ([], 0, "training loss is nan at step 0, before any update: the model's forward or initialization "
            "(--model.attention mha) gives non-finite values; stopped without saving; no checkpoint had been written "
            "yet; the run's TensorBoard events and config are kept in {run} for diagnosis; check the attention with "
            "lit_attn.testing.check_attention and start a new run"),
    (["--model.weight_decay=1e12"], None, "with --model.weight_decay 1e+12 at --model.lr 0.001: each step scales the "
                                          "weights by 1 - lr * weight_decay = -1e+09; stopped without saving"),
    (["--model.weight_decay=1e12"], None, "lower --model.weight_decay (lr * weight_decay << 1) and start a new run"),
    ([], 2, "training loss is nan at step 2; stopped without saving; no checkpoint had been written yet; the run's "
            "TensorBoard events and config are kept in {run} for diagnosis; lower --model.lr and start a new run"),
])
def test_the_nan_guard_says_what_the_evidence_points_to(args, nan_from, says, tmp_path, capsys, monkeypatch):
    if nan_from is not None:
        monkeypatch.setattr(GPT, "_loss", _nan_from_step(nan_from))
    corpus = write_corpus(tmp_path / "corpus.txt")
    code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp_path / 'runs'}", "--run=r", *TINY_FIT,
                "--model.lr=0.001", "--checkpoint.every_n_train_steps=0", *args])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("error: ") and says.format(run=tmp_path / "runs" / "r") in line, line
