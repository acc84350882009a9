"""What an attention costs, measured from the module itself: heads, parameters and forward FLOPs.

Every number comes from building the attention on the meta device (shapes only: no memory, no
compute), so any `nn.Module` gets real counts without describing itself. A family with an
analytic formula overrides these (see `AttentionSpec`), and the tests check both agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula


class FlopSplit(NamedTuple):
    """Forward FLOPs of one attention layer per token, split by how they grow with the context length T.

    Conventions (those of torch's FlopCounterMode): a multiply-accumulate is 2 FLOPs and only
    matrix multiplications count; the score matrix counts in full (T per query), as a dense
    kernel computes it.
    """

    linear: int  # projections and other per-token work: independent of T
    quadratic: int  # work against every context token (scores, weighted sum): proportional to T

    @property
    def total(self) -> int:
        return self.linear + self.quadratic

    def scale(self, factor: int) -> FlopSplit:
        return FlopSplit(self.linear * factor, self.quadratic * factor)


def meta_heads(module: nn.Module, n_head: int) -> tuple[int, int]:
    """(query heads, key/value heads) from the module's attributes `n_query_heads` and `n_kv_heads`,
    else `n_head` (or the model's n_head) for both."""
    total = getattr(module, "n_head", n_head)
    return getattr(module, "n_query_heads", total), getattr(module, "n_kv_heads", total)


def meta_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _sequence_flops(module: nn.Module, n_embd: int, context: int) -> int:
    """Forward FLOPs of one sequence of `context` tokens: batch 2 minus batch 1, so work done once per
    batch whatever its size (e.g. turning weights into operators) is not charged to the tokens."""
    counts = []
    for batch in (1, 2):
        x = torch.empty(batch, context, n_embd, device="meta")
        with FlopCounterMode(display=False) as counter:
            module(x)
        counts.append(counter.get_total_flops())
    return counts[1] - counts[0]


def meta_flops(module: nn.Module, n_embd: int, context: int) -> FlopSplit:
    """FlopSplit per token at `context`, from the FLOPs of sequences of 1, 2 and `context` tokens: linear is the
    per-token work at an empty context, 2 f(1) - f(2) (f(T) = S(T) / T; S(T) = linear * T + q * T^2 gives
    linear), quadratic the rest at `context`. So a layer whose work per token stops growing (a sliding window,
    f(T) = linear + q * min(T, W)) gets its capped count, not a fit of T^2 through two points."""
    module.eval()  # dropout draws no random numbers on meta tensors, but train-only branches should not count
    return split_sequence_flops(lambda T: _sequence_flops(module, n_embd, T), context)


def split_sequence_flops(sequence: Callable[[int], int], context: int) -> FlopSplit:
    """FlopSplit per token at `context` from `sequence(T)`, the FLOPs of a sequence of T tokens, split as
    meta_flops says: linear 2 f(1) - f(2), quadratic the rest at `context` (f(T) = sequence(T) / T)."""
    total = Fraction(sequence(context), context)
    if context < 2:
        return FlopSplit(linear=round(total), quadratic=0)
    linear = round(2 * sequence(1) - Fraction(sequence(2), 2))
    return FlopSplit(linear=linear, quadratic=round(total) - linear)


@register_flop_formula(torch.ops.aten.linalg_solve_triangular)
def triangular_solve_flops(a_shape: tuple[int, ...], b_shape: tuple[int, ...], *_: object,
                           out_shape: tuple[int, ...], unitriangular: bool = False, **__: object) -> int:
    """A triangular solve with an (..., n, n) matrix: per column of the right-hand side, a multiply-accumulate for
    each entry of the triangle below (unitriangular) or on and below the diagonal, n(n -/+ 1)/2 of them.
    FlopCounterMode counts no solve of its own; the chunked linear-recurrent layers run one per chunk, and their
    counts (and MFU) include it."""
    n = a_shape[-1]
    return math.prod(out_shape) * (n - 1 if unitriangular else n + 1)
