"""lit-attn: a GPT testbed for comparing attention mechanisms.

The model library (`lit_attn.attention`, `.config`, `.transformer`, `.analytic`, `.testing`, `.load`) needs
torch only: `load_run(path)` reads a trained run's network, config and codec. `GPT` (the LightningModule,
`lit_attn.training.model`) imports Lightning. The names below load on first use, so `import lit_attn` itself is
instant (the command line installs its Ctrl-C handler first).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module it comes from
_EXPORTS = {
    "GPT": "lit_attn.training.model",
    "GPTConfig": "lit_attn.config",
    "Transformer": "lit_attn.transformer",
    "Run": "lit_attn.load",
    "attention_names": "lit_attn.attention",
    "build_attention": "lit_attn.attention",
    "load_run": "lit_attn.load",
    "register_attention": "lit_attn.attention",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lit_attn' has no attribute {name!r}")
