"""Rotary position embedding (rotate-half form, as in GPT-NeoX / LLaMA)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotates the channel pairs (i, i + hs/2) of q or k by position-dependent angles.

    The cos/sin tables are built once for `block_size` positions and kept as
    non-persistent buffers, so they follow the module's device and never enter
    a checkpoint.
    """

    def __init__(self, head_size: int, block_size: int, base: float = 10000.0):
        super().__init__()
        if head_size % 2:
            raise ValueError(f"RoPE needs an even head size, got {head_size}; change n_embd or n_head")
        inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)  # (T, hs/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T, hs)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, nh, T, hs) at `positions` (T,) (default 0..T-1) -> same shape and dtype."""
        if positions is None:
            cos, sin = self.cos[: x.size(-2)], self.sin[: x.size(-2)]
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * cos + rotated * sin
