"""Attention registry. Importing this package registers every built-in family.

To add a family: write one module here that calls `register_attention`, and
import it below.
"""

from . import grouped, noq, quantum  # noqa: F401  (registration side effects)
from .registry import attention_names, attention_options, build_attention, get_attention, register_attention

__all__ = ["attention_names", "attention_options", "build_attention", "get_attention", "register_attention"]
