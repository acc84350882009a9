"""configs/mqar_zoology.yaml builds Zoology's Figure 2 attention baseline and its training protocol, and a fit that
an EarlyStopping threshold ends stops, validates there and records the stop."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import ROOT, scalars
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from torch import nn

ZOOLOGY = ROOT / "configs" / "mqar_zoology.yaml"
# The config at seconds' size: 2 pairs in 16 tokens of a 64-token vocabulary, 4 batches an epoch.
TINY = ["--model.n_embd=16", "--model.block_size=16", "--data.input_seq_len=16", "--data.num_kv_pairs=2",
        "--data.vocab_size=64", "--data.num_train_examples=32", "--data.num_test_examples=16", "--data.batch_size=8",
        "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=2", "--timing.warmup_batches=1",
        "--params.print_table=false"]


def _built(tmp_path, *args: str):
    from datamodules.windows import WindowDataModule
    from lit_attn import GPT
    from lit_attn.cli.lightning_cli import DEFAULT_CONFIG, LitAttnCLI

    return LitAttnCLI(GPT, WindowDataModule, subclass_mode_data=True, run=False,
                      args=[f"--config={ZOOLOGY}", f"--runs_dir={tmp_path}", "--run=zoo", *args],
                      parser_kwargs={"default_config_files": [str(DEFAULT_CONFIG)]})


def test_the_zoology_config_builds_its_model_optimizer_schedule_and_stop(tmp_path):
    from lit_attn.transformer import FeedForward

    cli = _built(tmp_path, "--data.num_train_examples=64", "--data.num_test_examples=16")
    model, trainer, data = cli.model, cli.trainer, cli.datamodule
    config = model.config
    # the model: 2 blocks of 1-head attention, learned positions, no MLP (the second branch is LayerNorm(x))
    assert (config.n_layer, config.n_embd, config.heads, config.pos, config.ffn) == (2, 64, (1, 1), "learned",
                                                                                     "identity")
    net = model.transformer
    assert net.pos_emb is not None and net.lm_head.weight is net.tok_emb.weight and net.lm_head.bias is None
    assert not any(isinstance(m, FeedForward) for m in net.modules())
    for block in net.blocks:
        assert isinstance(block.norm2, nn.LayerNorm) and type(block.ffn) is nn.Dropout and block.ffn.p == 0.0
        assert block.attn.dropout == 0.1 and block.resid_dropout.p == 0.0  # attention weights' dropout only
        assert block.attn.qkv.bias is not None and block.attn.out_proj.bias is not None
    assert net.drop.p == 0.1  # the embeddings'
    # the data: Figure 2's (64, 4) setting, batch 512, and every position but the pairs and the queries is 0
    assert data.batch_size == 512 and (data.input_seq_len, data.num_kv_pairs, data.vocab_size) == (64, 4, 8192)
    for examples in (data.train_examples(), *data.test_slices()):
        filler = examples.labels == -100
        filler[:, :8] = False  # the 4 key-value pairs
        assert filler.sum(1).min() > 0 and (examples.inputs[filler] == 0).all()
    # the optimizer: AdamW (0.9, 0.999), weight decay 0.1 on every parameter, at one of Figure 2's learning rates
    assert model.hparams.lr in np.logspace(-4, -2, 4).tolist()
    model.trainer = trainer
    setup = model.configure_optimizers()
    optimizer, schedule = setup["optimizer"], setup["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert {(g["weight_decay"], tuple(g["betas"]), g["eps"]) for g in optimizer.param_groups} == {(0.1, (0.9, 0.999),
                                                                                                     1e-8)}
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    # the schedule: per epoch, torch's CosineAnnealingLR(T_max=64, eta_min=0) stepped once an epoch, no warm-up
    assert schedule["interval"] == "epoch" and trainer.max_epochs == 64
    reference = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=model.hparams.lr)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(reference, T_max=64, eta_min=0.0)
    for epoch in range(64):
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([cosine.get_last_lr()[0]] * 2, rel=1e-12), \
            epoch
        schedule["scheduler"].step()
        cosine.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-15)  # down to 0 after the last epoch
    # no clipping; the stop at validation accuracy above 0.99 after each validation, never for patience
    assert trainer.gradient_clip_val is None
    (stop,) = [cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping)]
    assert (stop.monitor, stop.mode, stop.stopping_threshold) == ("val/mqar_acc", "max", 0.99)
    assert stop._check_on_train_epoch_end is False and stop.patience > 64
    assert (trainer.val_check_interval, trainer.check_val_every_n_epoch) == (1.0, 1)


def test_weight_decay_applies_to_matrices_only_unless_decay_all():
    from helpers import tiny_gpt

    for decay_all, expected in ((False, [0.1, 0.0]), (True, [0.1, 0.1])):
        model = tiny_gpt(16, decay_all=decay_all, total_steps=10)
        groups = model.configure_optimizers()["optimizer"].param_groups
        assert [g["weight_decay"] for g in groups] == expected
        assert all(p.dim() < 2 for p in groups[1]["params"]) and groups[1]["params"]


def test_the_epoch_schedule_needs_max_epochs(tmp_path):
    from helpers import one_line_error, tiny_gpt

    model = tiny_gpt(16, schedule="cosine_epochs")
    model.trainer = type("Trainer", (), {"max_epochs": -1, "precision": "32-true"})()
    one_line_error(model.configure_optimizers, match="--trainer.max_epochs")
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        tiny_gpt(16, schedule="linear")


@pytest.mark.parametrize("ffn", ["identity", "none"])
def test_blocks_without_an_mlp(ffn):
    """identity adds norm2(x) as the block's second branch (Zoology's identity state mixer); none adds nothing."""
    from lit_attn import GPTConfig, Transformer

    config = GPTConfig(vocab_size=20, n_layer=1, n_embd=8, n_head=1, block_size=6, ffn=ffn)
    block = Transformer(config).eval().blocks[0]
    x = torch.randn(2, 6, 8)
    after_attention = x + block.attn(block.norm1(x))
    expected = after_attention + (block.norm2(after_attention) if ffn == "identity" else 0)
    torch.testing.assert_close(block(x), expected)
    assert (block.norm2 is None) == (ffn == "none")
    with pytest.raises(ValueError, match=f"ffn {ffn} has no MLP to size"):
        dataclasses.replace(config, ffn_hidden=32)


def test_dropouts_default_to_dropout_and_each_can_be_set():
    from lit_attn import GPTConfig, Transformer

    config = GPTConfig(vocab_size=20, n_layer=1, n_embd=8, n_head=1, block_size=6, dropout=0.2)
    net = Transformer(config)
    assert (net.drop.p, net.blocks[0].attn.dropout, net.blocks[0].resid_dropout.p) == (0.2, 0.2, 0.2)
    net = Transformer(dataclasses.replace(config, attn_dropout=0.1, embd_dropout=0.0))
    assert (net.drop.p, net.blocks[0].attn.dropout, net.blocks[0].resid_dropout.p) == (0.0, 0.1, 0.2)
    with pytest.raises(ValueError, match=r"attn_dropout must be a number in \[0, 1\) or null"):
        dataclasses.replace(config, attn_dropout=1.0)


@pytest.mark.parametrize("schedule,stop_step", [
    ((), 4),  # the config's validation at each epoch's end: the first epoch's ends the fit
    (("--trainer.val_check_interval=2", "--trainer.check_val_every_n_epoch=null"), 2),  # one mid-epoch
])
def test_a_fit_the_threshold_stops_validates_there_and_records_the_stop(tmp_path, schedule, stop_step, capsys):
    """The config's stop with a threshold every accuracy passes (-1): the first validation ends the fit."""
    from lit_attn.cli.lightning_cli import cli
    from lit_attn.tools.run_record import read_run

    override = tmp_path / "stop.yaml"
    override.write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n      init_args:\n"
        "        monitor: val/mqar_acc\n        mode: max\n        stopping_threshold: -1.0\n        patience: 1000\n"
        "        check_on_train_epoch_end: false\n")
    runs = tmp_path / "runs"
    assert cli(["fit", f"--config={ZOOLOGY}", f"--config={override}", *TINY, "--trainer.max_epochs=3", *schedule,
                f"--runs_dir={runs}", "--run=zoo"]) == 0
    ckpt = torch.load(runs / "zoo" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == stop_step  # of 3 epochs of 4 batches
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("EarlyStopping")]
    assert state["stopping_reason"] == EarlyStoppingReason.STOPPING_THRESHOLD.value  # last.ckpt holds the stop
    # one validation, at the last step (logged at its index): the one that stopped the fit, none added after it
    assert [step for step, _ in scalars(runs / "zoo", "val/mqar_acc")] == [stop_step - 1]
    row = read_run(runs / "zoo")
    assert row["stopped_at_step"] == stop_step
    assert row["stopped"].startswith("Stopping threshold reached: val/mqar_acc")
    # Resumed, the run is complete (the stop would come again at once): one line, nothing written.
    before = sorted((p.relative_to(runs), p.is_file() and p.read_bytes()) for p in runs.rglob("*"))
    capsys.readouterr()
    assert cli(["fit", "--run=zoo", f"--runs_dir={runs}", "--ckpt_path=last"]) == 0
    assert (f"run 'zoo' is complete at step {stop_step} (stopped early: Stopping threshold reached: val/mqar_acc"
            in capsys.readouterr().err)
    assert sorted((p.relative_to(runs), p.is_file() and p.read_bytes()) for p in runs.rglob("*")) == before
    if not schedule:
        assert _full_fit_row(tmp_path)["stopped"] is None


def _full_fit_row(tmp_path) -> dict:
    """A run that trains to max_epochs under the config's own threshold (0.99, out of reach here): no stop."""
    from lit_attn.cli.lightning_cli import cli
    from lit_attn.tools.run_record import read_run

    runs = tmp_path / "runs"
    assert cli(["fit", f"--config={ZOOLOGY}", *TINY, "--trainer.max_epochs=1", f"--runs_dir={runs}",
                "--run=full"]) == 0
    row = read_run(runs / "full")
    assert row["stopped_at_step"] is None
    return row
