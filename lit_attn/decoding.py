"""CPU decoding's weight layout: how a generation's linears stream their weights for a step's few rows.

`Transformer.generate` runs in `decoding_layout` for generations of `LAYOUT_MIN_TOKENS` tokens or more; the values
computed are the same, only the weights' memory layout (or a prepacked copy of them) changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

LAYOUT_MIN_TOKENS = 32  # generations at least this long run in `decoding_layout`


@contextlib.contextmanager
def decoding_layout(model: nn.Module, rows: int = 1) -> Iterator[None]:
    """Within it, every CPU float32 nn.Linear (but one tied to an embedding) streams its weight the way the CPU
    reads it fastest for inputs of `rows` rows, with the same values; other inputs (a prompt) run as usual.

    One row on one thread: a weight with more outputs than inputs is stored transposed in memory (same (out, in)
    values, strides (1, out)), so F.linear's x @ W^T reads W^T as a contiguous (in, out) matrix: the CPU's
    matrix-vector product streams a matrix faster along its longer side. More rows or threads: oneDNN's linear on
    a copy of the weight prepacked for that many rows, where torch has it (the measurements behind both choices:
    docs/benchmarks.md, "Why CPU decoding is laid out as it is"). On exit the usual layout and torch's oneDNN
    setting are back; meanwhile the weights take twice their memory."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in tied
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32 and m.weight.is_contiguous()]
    saved, packed = [], []
    onednn_was = torch.backends.mkldnn.enabled
    try:  # a failure part-way through still restores what was changed
        for m in linears:
            # Only a plain nn.Linear's forward is known to be F.linear; a subclass keeps its own.
            if (rows > 1 or torch.get_num_threads() > 1) and type(m) is nn.Linear and "forward" not in vars(m) \
                    and has_onednn_linear():
                packed.append(m)
                m.forward = _prepacked_forward(m, rows)
            elif m.out_features > m.in_features:  # rows of `out` values: longer contiguous runs than `in`
                saved.append((m.weight, m.weight.data))
                m.weight.data = m.weight.data.t().contiguous().t()
        # ATen's own kernels where torch would call oneDNN (GELU): on a step's few rows oneDNN's per-call cost
        # outweighs its work, worst with two threads on a busy machine. The prepacked linears call oneDNN directly.
        torch.backends.mkldnn.enabled = onednn_was and not linears
        yield
    finally:
        torch.backends.mkldnn.enabled = onednn_was
        for w, data in saved:
            w.data = data
        for m in packed:
            vars(m).pop("forward", None)  # the class's forward again


def has_onednn_linear() -> bool:
    """Whether torch has the prepacked oneDNN linear its own compiler uses for frozen CPU weights (an internal
    op, hence looked up, not assumed)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _prepacked_forward(m: nn.Linear, rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """m's forward, through oneDNN on a copy of its weight packed for inputs of `rows` rows."""
    packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)
    linear = torch.ops.mkldnn._linear_pointwise

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.numel() != rows * m.in_features or torch.is_grad_enabled():
            return F.linear(x, m.weight, m.bias)
        return linear(x, packed, m.bias, "none", [], "")

    return forward
