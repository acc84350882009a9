"""Decoding states: what an attention layer keeps between decoding steps, declared by its class.

A class that decodes incrementally declares `decoding_state(**args) -> layout`, where a layout is any object with

- `new(batch, length, dtype, device) -> DecodingState`: an empty state for `batch` sequences of up to `length`
  tokens, which the model creates per layer (`Transformer.new_cache`) and passes to `forward(x, state)`;
- `values(length) -> int`: the values one sequence's state holds once `length` tokens went through it (its
  memory: per past token for a cache of keys and values, capped for a window, constant for a recurrent state).

`KVLayout` is the layout of the attentions that keep tensors per past token (keys and values, or readouts);
`RecurrentLayout` that of the layers that keep tensors of a fixed size (a recurrent state), whatever the length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["DecodingState", "KVCache", "KVLayout", "RecurrentLayout", "RecurrentState", "filled_length"]


def filled_length(positions: torch.Tensor, length: int | None) -> int | None:
    """How many positions are filled once a step's tokens at `positions` are in: `length` if the caller knows
    it, else the last of the (increasing) `positions` + 1, read from the tensor (a host sync on a GPU, hence
    callers that know it pass it). None while torch.compile traces: a step then attends over the whole
    buffer, masked, so every length is one graph."""
    if length is not None or torch.compiler.is_compiling():
        return length
    return int(positions[-1]) + 1


class DecodingState:
    """One layer's state for a batch of sequences. Before every step the model calls `step`: `positions` (T,)
    are where the step's tokens sit in their sequences (increasing, following those already seen) and
    `length` how many positions are filled once they are in (see `filled_length`)."""

    positions: torch.Tensor
    length: int | None = None

    def step(self, positions: torch.Tensor, length: int | None = None) -> None:
        self.positions = positions
        self.length = filled_length(positions, length)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the state holds: its tensor attributes and those in its dict attributes (the
        step's positions excepted)."""
        held = [v for k, v in vars(self).items() if k != "positions"]
        held += [t for v in held if isinstance(v, dict) for t in v.values()]
        return sum(t.nbytes for t in held if isinstance(t, torch.Tensor))


class KVCache(DecodingState):
    """Per-token buffers, {name: (B, L, *shape)}, read as `state[name]`; the attention writes each token's
    entries at its position and attends over the filled prefix."""

    def __init__(self, buffers: dict[str, torch.Tensor]):
        self.buffers = buffers

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.buffers[name]


@dataclass(frozen=True)
class KVLayout:
    """{name: per-token shape} of what a cache keeps for every past token, e.g. {"k": (Hkv, hs), "v": (Hkv, hs)};
    with a `window`, of the last `window` tokens only (a ring buffer: the attention writes slot position mod S)."""

    shapes: dict[str, tuple[int, ...]]
    window: int | None = None

    @property
    def per_token(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes.values())

    def slots(self, length: int) -> int:
        """Token slots of a state for `length` tokens: capped at the window."""
        return length if self.window is None else min(length, self.window)

    def values(self, length: int) -> int:
        return self.per_token * self.slots(length)

    def new(self, batch: int, length: int, dtype: torch.dtype, device: torch.device | str) -> KVCache:
        """Zeroed buffers (batch, S, *shape), S = `slots(length)`. In memory a buffer is (batch, shape[0], S,
        *shape[1:]): each head's positions are contiguous, so its filled prefix, seen as (batch, heads, n, ...), is
        a batch of matrices a matmul reads in place."""
        def buffer(shape: tuple[int, ...]) -> torch.Tensor:
            if not shape:
                return torch.zeros(batch, length, dtype=dtype, device=device)
            heads_major = torch.zeros(batch, shape[0], length, *shape[1:], dtype=dtype, device=device)
            return heads_major.transpose(1, 2)  # (batch, length, *shape)

        length = self.slots(length)
        return KVCache({name: buffer(tuple(shape)) for name, shape in self.shapes.items()})


class RecurrentState(DecodingState):
    """Fixed-size tensors, {name: (B, *shape)}, read as `state[name]`; the layer overwrites them in place with
    what it carries to the next step."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


@dataclass(frozen=True)
class RecurrentLayout:
    """{name: shape} of the tensors a recurrent layer keeps per sequence (e.g. a state matrix per head): the same
    values after any number of tokens."""

    shapes: dict[str, tuple[int, ...]]

    def values(self, length: int) -> int:
        return sum(math.prod(shape) for shape in self.shapes.values())

    def new(self, batch: int, length: int, dtype: torch.dtype, device: torch.device | str) -> RecurrentState:
        """Zeroed tensors (batch, *shape): the state before any token."""
        return RecurrentState({name: torch.zeros(batch, *shape, dtype=dtype, device=device)
                               for name, shape in self.shapes.items()})
