"""LightningDataModules that serve token windows to lit_attn.GPT."""

from .char import CharDataModule
from .wikipedia import WikipediaDataModule
from .windows import TokenWindows, WindowDataModule, WindowSampler

__all__ = ["CharDataModule", "TokenWindows", "WikipediaDataModule", "WindowDataModule", "WindowSampler"]
