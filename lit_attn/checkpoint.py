"""Reading checkpoints safely: plain data only, with one-line errors."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True: a crafted file cannot run code.

    Raises FileNotFoundError if it is missing, and ValueError if it holds anything but
    tensors and plain data, or is truncated or corrupt.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}; check --ckpt_path")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses any global outside an allowlist of tensor and container types,
        # before calling it: whatever the file holds, nothing in it ran.
        lines = [line.strip() for line in str(e).splitlines() if "unsupported global" in line.lower()]
        if lines:
            raise ValueError(
                f"refusing to load {path}: it holds objects other than tensors and plain data ({lines[0]}); "
                f"only load checkpoints you trust"
            ) from None
        raise ValueError(f"checkpoint {path} is unreadable, probably truncated or corrupt; use another checkpoint") from None
    except Exception as e:  # zip or pickle damage shows up as many exception types
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"checkpoint {path} is unreadable, probably truncated or corrupt ({reason}); use another checkpoint"
        ) from None
