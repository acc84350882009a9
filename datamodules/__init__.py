"""LightningDataModules that serve token windows to lit_attn.GPT."""

from .char import CharDataModule
from .windows import TokenWindows, WindowDataModule, WindowSampler

__all__ = ["CharDataModule", "TokenWindows", "WindowDataModule", "WindowSampler"]
