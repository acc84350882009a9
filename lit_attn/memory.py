"""Training memory per rank, whole or fully sharded: parameters, gradients and AdamW state, from a config.

Counted on the meta device (nothing allocated) the way FSDP2 shards: each block, then the rest of the network,
is one unit; every parameter is split along its first dimension into `ranks` equal rows (padded), so a rank keeps
ceil(rows / ranks) of them. Rank 0 holds the most. Activations depend on the batch and are not counted.

    python -m lit_attn.memory    # the table of docs/training.md
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lit_attn.config import SPARSE_QUERY_LAYOUT, GPTConfig
from lit_attn.transformer import Transformer

# A Llama-shaped layout of about 1.0e9 parameters (SwiGLU, RoPE, RMSNorm, tied embeddings, GPT-2's vocabulary).
BILLION_LAYOUT = GPTConfig(
    vocab_size=50_304, n_layer=18, n_embd=2048, n_head=16, block_size=2048, norm="rmsnorm", pos="rope", ffn="swiglu",
    ffn_hidden=5632, bias=False,
)
# float32 weights, float32 gradients, AdamW's two float32 moments (also under bf16-mixed, which keeps them so).
PARAM_BYTES, GRAD_BYTES, ADAMW_BYTES = 4, 4, 8


@dataclass(frozen=True)
class RankMemory:
    """What one rank (the largest share: rank 0) keeps for training, in parameters and bytes."""

    ranks: int
    parameters: int  # elements of the parameters this rank keeps (its shards)
    gathered: int  # elements of the largest unit, whole while it computes (0 unsharded: nothing is gathered)

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + AdamW moments kept between steps."""
        return self.parameters * (PARAM_BYTES + GRAD_BYTES + ADAMW_BYTES)

    @property
    def peak_bytes(self) -> int:
        """state_bytes plus the largest unit's gathered weights and their whole gradients (before reduce-scatter)."""
        return self.state_bytes + self.gathered * (PARAM_BYTES + GRAD_BYTES)


def shard_units(config: GPTConfig) -> list[list[torch.Size]]:
    """The shapes of each FSDP2 unit's parameters: one unit per block, then the rest (embeddings, head, final
    norm); a tied head shares the embedding, counted once."""
    with torch.device("meta"):
        model = Transformer(config)
    blocks = [[p.shape for p in block.parameters()] for block in model.blocks]
    in_blocks = {id(p) for block in model.blocks for p in block.parameters()}
    rest = [p.shape for p in model.parameters() if id(p) not in in_blocks]  # parameters() yields a tied one once
    return [*blocks, rest]


def rank_memory(config: GPTConfig, ranks: int) -> RankMemory:
    """Rank 0's training memory with the network fully sharded over `ranks` (1: not sharded)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    units = shard_units(config)

    def share(shape: torch.Size) -> int:
        return math.ceil(shape[0] / ranks) * math.prod(shape[1:]) if ranks > 1 else math.prod(shape)

    kept = sum(share(shape) for unit in units for shape in unit)
    gathered = 0 if ranks == 1 else max(sum(math.prod(shape) for shape in unit) for unit in units)
    return RankMemory(ranks, kept, gathered)


def memory_table(layouts: dict[str, GPTConfig], ranks: tuple[int, ...] = (1, 2, 4, 8)) -> str:
    """A Markdown table: per layout and number of ranks, the state kept and the peak (GiB) per rank."""
    lines = ["| layout | parameters | ranks | kept per rank (GiB) | with the largest unit gathered (GiB) |",
             "|---|---:|---:|---:|---:|"]
    for name, config in layouts.items():
        total = rank_memory(config, 1).parameters
        for n in ranks:
            m = rank_memory(config, n)
            lines.append(f"| {name} | {total:,} | {n} | {m.state_bytes / 2**30:.3f} | {m.peak_bytes / 2**30:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(memory_table({"SPARSE_QUERY_LAYOUT (MHA)": SPARSE_QUERY_LAYOUT, "BILLION_LAYOUT (MHA)": BILLION_LAYOUT}))
