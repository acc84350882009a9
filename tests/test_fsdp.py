"""Fully sharded data parallel: the strategy from the command line, per-block recomputation, the memory per rank,
and a 2-process CPU fit (gloo) stopped by SIGTERM that resumes exactly from its consolidated checkpoint."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    ROOT,
    assert_same_weights,
    last_checkpoint,
    one_line_error,
    resumable_fit,
    run_main,
    tiny_gpt,
    tiny_trainer,
)
from lightning.pytorch.strategies import ModelParallelStrategy
from test_preemption import BOUND, DRIVER, Job
from torch.distributed.fsdp import FSDPModule

from lit_attn.config import SPARSE_QUERY_LAYOUT, GPTConfig
from lit_attn.decoding import LAYOUT_MIN_TOKENS
from lit_attn.load import load_run
from lit_attn.memory import ADAMW_BYTES, GRAD_BYTES, PARAM_BYTES, rank_memory
from lit_attn.training.sharding import FSDP, recompute_in_backward, shard_model

# Two blocks of width 4 (2 heads, GELU MLP of 16, biases), vocabulary 10, context 8, learned positions, tied head.
TINY = GPTConfig(vocab_size=10, n_layer=2, n_embd=4, n_head=2, block_size=8)


@pytest.mark.parametrize("ranks, kept, gathered", [
    # whole: a block is 2 norms (4+4 each), qkv 12x4+12, out 4x4+4, MLP 16x4+16 and 4x16+4 = 244; the rest is
    # tokens 10x4, positions 8x4, final norm 4+4 = 80 (the tied head adds none): 2*244 + 80
    (1, 568, 0),
    # 3 ranks keep ceil(rows/3) rows of each: a block 2+2 + 4*4+4 + 2*4+2 + 2+2 + 6*4+6 + 2*16+2 = 102, the rest
    # 4*4 + 3*4 + 2+2 = 32; the largest unit gathered is a whole block
    (3, 2 * 102 + 32, 244),
    # 16 ranks: one row of each parameter
    (16, 2 * (1 + 1 + 4 + 1 + 4 + 1 + 1 + 1 + 4 + 1 + 16 + 1) + 4 + 4 + 1 + 1, 244),
])
def test_memory_per_rank_matches_a_hand_count(ranks, kept, gathered):
    m = rank_memory(TINY, ranks)
    assert (m.parameters, m.gathered) == (kept, gathered)
    assert m.state_bytes == kept * (PARAM_BYTES + GRAD_BYTES + ADAMW_BYTES) == kept * 16
    assert m.peak_bytes == m.state_bytes + gathered * 8


def test_memory_of_the_sparse_query_layout_is_its_published_parameter_count():
    assert rank_memory(SPARSE_QUERY_LAYOUT, 1).parameters == 11_966_224  # the SQA paper's MHA count
    halves = rank_memory(SPARSE_QUERY_LAYOUT, 2).parameters
    assert 11_966_224 / 2 <= halves < 11_966_224 / 2 + 1000  # padding only where a first dimension is odd
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        rank_memory(TINY, 0)


def test_recomputed_blocks_give_the_same_loss_and_gradients():
    """Activation checkpointing runs each block's forward again in the backward, keeps the module tree (checkpoint
    keys) and, with dropout, the same numbers."""
    x = torch.randint(0, 10, (3, 8))
    grads, calls = [], []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = tiny_gpt(10, n_layer=2, dropout=0.2)
        keys = list(model.state_dict())
        if recompute:
            for block in model.transformer.blocks:
                recompute_in_backward(block)
        calls.append(0)
        model.transformer.blocks[0].attn.register_forward_hook(lambda *_: calls.__setitem__(-1, calls[-1] + 1))
        torch.manual_seed(1)
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        assert list(model.state_dict()) == keys
        grads.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss0, g0), (loss1, g1) = grads
    assert calls == [1, 2]
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))


@pytest.mark.parametrize("flags, checkpointing", [
    (["--trainer.strategy=fsdp2"], False),
    ([f"--config={ROOT / 'configs/trainer/fsdp.yaml'}", "--trainer.strategy.activation_checkpointing=true"], True),
])
def test_the_strategy_is_built_from_the_command_line(flags, checkpointing, corpus):
    """The GPU command parses and builds an all-data-parallel FSDP with consolidated checkpoints."""
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    from lit_attn.cli.fit_parse import parse_fit

    strategy = parse_fit([f"--data.path={corpus}", *flags]).trainer.strategy
    if isinstance(strategy, str):  # a registered name, which the Trainer looks up
        strategy = _AcceleratorConnector(accelerator="cpu", devices=1, strategy=strategy).strategy
    else:  # a class path and its arguments, which the Trainer instantiates
        assert strategy.class_path == "lit_attn.training.sharding.FSDP"
        strategy = FSDP(**vars(strategy.init_args))
    assert isinstance(strategy, FSDP)
    assert strategy.activation_checkpointing is checkpointing
    assert strategy._save_distributed_checkpoint is False and strategy._tensor_parallel_size == 1


def test_one_sharded_rank_trains_exactly_as_the_unsharded_model(corpus, tmp_path):
    """In this process (a gloo group of one): FSDP2 with recomputed blocks changes no bit of a fit; the parameters
    are sharded (DTensors) and the checkpoint holds them whole."""
    import lightning as L
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    environment = dict(os.environ)  # the strategy sets MASTER_ADDR/PORT and ranks for its group
    checkpoints = []
    try:
        for strategy in (FSDP(activation_checkpointing=True), "auto"):
            L.seed_everything(0)
            model, trainer, data = tiny_trainer(corpus, strategy=strategy, devices=1, max_steps=3,
                                                val_check_interval=2, limit_val_batches=1)
            trainer.fit(model, data)
            sharded = [isinstance(p, DTensor) for p in model.parameters()]
            assert all(sharded) if isinstance(strategy, FSDP) else not any(sharded)
            trainer.save_checkpoint(tmp_path / f"{len(checkpoints)}.ckpt")
            checkpoints.append(torch.load(tmp_path / f"{len(checkpoints)}.ckpt", weights_only=True))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)
    assert_same_weights(*checkpoints, 3)


def test_muon_is_refused_under_sharding_in_one_line(corpus):
    import torch.distributed as dist

    environment = dict(os.environ)
    try:
        model, trainer, data = tiny_trainer(corpus, strategy=FSDP(), devices=1, max_steps=1)
        model.hparams.optimizer = "muon"
        with pytest.raises(ValueError, match=r"^--model.optimizer muon orthogonalises whole matrices.*"
                                             r"use --model.optimizer adamw with --trainer.strategy fsdp2"):
            trainer.fit(model, data)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)


@pytest.mark.slow
@pytest.mark.long
def test_two_cpu_processes_stop_on_sigterm_and_resume_exactly(tmp_path, small_corpus):
    """2-process FSDP2 on CPU (gloo), recomputing its blocks: SIGTERM to rank 1 alone during step 4 stops both
    ranks at the end of step 5 (the stop agreement) with last.ckpt written there; resumed to step 8, it equals a
    run of 8 steps straight without recomputation, bit for bit. Text samples are drawn from the gathered weights
    at the validation; last.ckpt is one consolidated file the project's loader reads. (test_preemption.py's job
    and driver: a rank pauses until the signal has arrived.)"""
    steps = 8

    def args(run: str, *strategy: str) -> list[str]:
        # Samples as long as generation's CPU weight layout needs, which rewrites the gathered weights.
        return resumable_fit(small_corpus, tmp_path / "runs", run, steps, "--trainer.accelerator=cpu",
                             "--trainer.devices=2", "--model.n_layer=2", *strategy, total_steps=steps, every=4,
                             new_tokens=LAYOUT_MIN_TOKENS)

    done = run_main(*args("straight", "--trainer.strategy=fsdp2"), cwd=tmp_path, timeout=BOUND)
    assert done.returncode == 0, done.stderr[-3000:]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(root=str(ROOT), bound=BOUND))
    recomputed = args("pre", "--trainer.strategy=lit_attn.training.sharding.FSDP",
                      "--trainer.strategy.activation_checkpointing=true")
    job = Job(driver, recomputed, tmp_path, PAUSE_AT=4, PAUSE_RANK=1)
    os.kill(int(job.wait_for("PAUSED").split("pid=")[1]), signal.SIGTERM)
    assert job.finish() == 0, job.output[-3000:]
    assert "SIGTERM: stopped after step 5," in job.output
    assert last_checkpoint(tmp_path / "runs" / "pre")["global_step"] == 5
    resumed = run_main(*recomputed, "--ckpt_path=last", cwd=tmp_path, timeout=BOUND)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    straight = last_checkpoint(tmp_path / "runs" / "straight")
    assert_same_weights(straight, last_checkpoint(tmp_path / "runs" / "pre"), steps)
    assert all(type(v) is torch.Tensor for v in straight["state_dict"].values())  # whole, not DTensor shards
    assert load_run(tmp_path / "runs" / "straight").config.n_layer == 2


def test_tensor_parallel_meshes_are_refused_in_one_line():
    """Only data parallel sharding: a model-parallel strategy with a tensor-parallel dimension says what to use."""
    model = tiny_gpt(10)
    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
    strategy._device_mesh = {"tensor_parallel": SimpleNamespace(size=lambda: 2)}
    message = one_line_error(shard_model, model, model.transformer, strategy)
    assert "tensor_parallel_size 2" in message and "--trainer.strategy fsdp2" in message
    shard_model(model, model.transformer, SimpleNamespace())  # any other strategy: left whole
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
