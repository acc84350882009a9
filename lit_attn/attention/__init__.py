"""Attention registry. Importing this package registers every built-in family.

An attention is one `nn.Module` class (see `registry`); a family lives in one module here that
registers its names, imported below. `lit_attn.testing.check_attention` checks any of them.
"""

from . import differential, gated_deltanet, grouped, mamba2, mla, noq, quantum  # noqa: F401  (registration side effects)
from .registry import (
    FlopSplit,
    attention_names,
    attention_options,
    build_attention,
    get_attention,
    register_attention,
    unregister_attention,
)
from .rope import RotaryEmbedding
from .state import DecodingState, KVCache, KVLayout

__all__ = ["DecodingState", "FlopSplit", "KVCache", "KVLayout", "RotaryEmbedding", "attention_names",
           "attention_options", "build_attention", "get_attention", "register_attention", "unregister_attention"]
