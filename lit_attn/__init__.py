"""lit-attn: a GPT testbed for comparing attention mechanisms.

`lit_attn.attention`, `lit_attn.config`, `lit_attn.transformer` and `lit_attn.analytic` need only
torch; `GPT` (the LightningModule) imports Lightning on first use.
"""

from typing import Any

from .attention import attention_names, build_attention, register_attention
from .config import GPTConfig
from .transformer import Transformer

__all__ = ["GPT", "GPTConfig", "Transformer", "attention_names", "build_attention", "register_attention"]


def __getattr__(name: str) -> Any:
    # Lightning takes seconds to import; tools that only count or build models should not pay for it.
    if name == "GPT":
        from lit_attn.training.model import GPT

        return GPT
    raise AttributeError(f"module 'lit_attn' has no attribute {name!r}")
