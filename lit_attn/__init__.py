"""lit-attn: a GPT testbed for comparing attention mechanisms."""

from .attention import attention_names, build_attention, register_attention
from .model import GPT

__all__ = ["GPT", "attention_names", "build_attention", "register_attention"]
