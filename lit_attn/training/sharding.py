"""Fully sharded data parallel (FSDP2) on Lightning's ModelParallelStrategy: the strategy and the per-block sharding.

`FSDP` is the strategy a fit selects (`--trainer.strategy fsdp2`, or its class path with options): every rank is
data parallel, each block and then the rest of the Transformer are `fully_shard`ed over the ranks, so each rank
keeps 1/N of the parameters, gradients and AdamW moments (`lit_attn.memory.rank_memory`). Its checkpoints are
consolidated: rank 0 gathers the full weights and optimizer state into one ordinary `last.ckpt`, written
atomically with a digest like every other run's, so sample, compare, export and `load_run` read it as they read
any run's. (Sharded checkpoints, a directory of per-rank files, would spare the gather, but nothing here reads
them.)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import nn
from torch.utils.checkpoint import checkpoint

STRATEGY_NAME = "fsdp2"


class FSDP(ModelParallelStrategy):
    """FSDP2 over all ranks (data parallel only), with consolidated checkpoints.

    Args:
        activation_checkpointing: keep only each block's input in the forward and recompute the block in the
            backward: activation memory of one block instead of all, for about one more forward's compute.
        reshard_after_forward: free each block's gathered parameters after its forward (gathered again for the
            backward): the least memory; false keeps them to the backward, trading memory for one all-gather.
    """

    def __init__(self, activation_checkpointing: bool = False, reshard_after_forward: bool = True,
                 **kwargs: Any) -> None:
        # One-file consolidated checkpoints (see the module's docstring); all ranks data parallel.
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False,
                         **kwargs)
        self.activation_checkpointing = activation_checkpointing
        self.reshard_after_forward = reshard_after_forward

    def setup_environment(self) -> None:
        # ModelParallelStrategy's "auto" data-parallel size is the number of nodes: here it is every rank.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


StrategyRegistry.register(STRATEGY_NAME, FSDP, description="FSDP2 per block over all ranks (lit_attn)",
                          override=True)


def is_sharding(strategy: Any) -> bool:
    """Whether `strategy` shards the parameters over ranks (shard_model acts under it)."""
    return isinstance(strategy, ModelParallelStrategy)


def shard_model(module: nn.Module, transformer: nn.Module, strategy: Any) -> None:
    """Shard `transformer`'s blocks, then `module` (the rest: embeddings, head), when `strategy` is a model-parallel
    one and they are not yet; with `FSDP`'s activation_checkpointing each block is also recomputed in the backward.
    Otherwise nothing."""
    if not is_sharding(strategy):
        return
    mesh = strategy.device_mesh
    if mesh["tensor_parallel"].size() > 1:
        raise ValueError(f"the model applies no tensor parallelism (tensor_parallel_size "
                         f"{mesh['tensor_parallel'].size()}): use --trainer.strategy {STRATEGY_NAME}")
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(module, FSDPModule):  # sharded by an earlier fit, validate or test of this trainer
        return
    data_parallel = mesh["data_parallel"]
    reshard = getattr(strategy, "reshard_after_forward", True)
    for block in transformer.blocks:
        if getattr(strategy, "activation_checkpointing", False):
            recompute_in_backward(block)
        fully_shard(block, mesh=data_parallel, reshard_after_forward=reshard)
    fully_shard(module, mesh=data_parallel, reshard_after_forward=reshard)


def recompute_in_backward(block: nn.Module) -> None:
    """Make `block`'s forward keep only its inputs for the backward, which runs the forward again (with the same
    dropout masks: the RNG state is restored). The module tree, its parameter names and checkpoints are unchanged."""
    forward = block.forward

    @functools.wraps(forward)
    def recomputed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = recomputed


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds: a sharded parameter's (DTensor's) local shard, else itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


@contextlib.contextmanager
def gathered(module: nn.Module, reshard_after_forward: bool = True) -> Iterator[None]:
    """`module`'s FSDP2-sharded parameters whole on every rank (a collective: every rank enters), and kept whole
    through every forward inside, for calls that bypass the root's forward such as generation (whose CPU weight
    layout rewrites the gathered weights in place); resharded on leaving, and `reshard_after_forward` (the
    strategy's) set back."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for m in sharded:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in sharded:
            m.reshard()
            m.set_reshard_after_forward(reshard_after_forward, recurse=False)
