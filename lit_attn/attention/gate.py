"""Output gating of softmax attention (Qiu et al. 2025, arXiv 2505.06708): y <- y * sigmoid(x W_g).

The gate is computed from the attention's input x (the block's normalised input, as q/k/v are) and
multiplies the attention's per-head output before the output projection, which makes the layer's
value-to-output map non-linear and input-dependent. `headwise`: one scalar per query head (W_g: d x Hq);
`elementwise`: one per output channel (W_g: d x Hq*hs). `none` adds nothing: no parameters, the
same outputs and checkpoints as an ungated attention. A gate needs nothing cached for decoding.
"""

from __future__ import annotations

import torch
from torch import nn

GATES = ("none", "headwise", "elementwise")


def gate_width(kind: str, heads: int, head_size: int) -> int:
    """The gate projection's outputs: 0 (none), `heads` (headwise) or heads * head_size (elementwise)."""
    if kind not in GATES:
        raise ValueError(f"unknown gate {kind!r}; choose {', '.join(GATES)} "
                         '(e.g. --model.attention_options \'{"gate": "headwise"}\')')
    return {"none": 0, "headwise": heads, "elementwise": heads * head_size}[kind]


class OutputGate(nn.Module):
    """sigmoid(x W_g [+ b]) times the attention output, per head (headwise) or per channel (elementwise)."""

    def __init__(self, kind: str, n_embd: int, heads: int, head_size: int, bias: bool):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.proj = nn.Linear(n_embd, gate_width(kind, heads, head_size), bias=bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) the attention's input, y (B, T, Hq*hs) its heads' outputs -> y gated, same shape."""
        B, T, width = y.shape
        scores = torch.sigmoid(self.proj(x)).view(B, T, self.heads, -1)  # (B, T, Hq, 1 or hs)
        return (y.view(B, T, self.heads, -1) * scores).view(B, T, width)


def output_gate(kind: str, n_embd: int, heads: int, head_size: int, bias: bool) -> OutputGate | None:
    """The gate of `kind` (None for none, so an ungated attention has exactly its old parameters)."""
    return None if gate_width(kind, heads, head_size) == 0 else OutputGate(kind, n_embd, heads, head_size, bias)


def apply_gate(gate: OutputGate | None, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y gated by `gate` computed from x, or y itself without a gate."""
    return y if gate is None else gate(x, y)


def gate_params(kind: str, n_embd: int, heads: int, head_size: int, bias: bool) -> int:
    """d * w [+ w]: the gate projection's weights (and bias), w its width (gate_width)."""
    width = gate_width(kind, heads, head_size)
    return n_embd * width + (width if bias else 0)


def gate_flops(kind: str, n_embd: int, heads: int, head_size: int) -> int:
    """2 * d * w per token: the gate projection (the sigmoid and product are not matmuls, so not counted)."""
    return 2 * n_embd * gate_width(kind, heads, head_size)
