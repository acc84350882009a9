"""LightningDataModules that serve token windows to lit_attn.GPT."""

from .char import CharDataModule
from .mqar import MQARDataModule
from .wikipedia import WikipediaDataModule
from .windows import TokenWindows, WindowDataModule, WindowSampler

__all__ = [
    "CharDataModule", "MQARDataModule", "TokenWindows", "WikipediaDataModule", "WindowDataModule", "WindowSampler",
]
