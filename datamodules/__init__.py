"""LightningDataModules that serve token windows to lit_attn.GPT."""

from .char import CharDataModule
from .mqar import MQARDataModule
from .passkey import PasskeyDataModule
from .wikipedia import WikipediaDataModule
from .windows import TokenWindows, WindowDataModule, WindowSampler

__all__ = [
    "CharDataModule", "MQARDataModule", "PasskeyDataModule", "TokenWindows", "WikipediaDataModule",
    "WindowDataModule", "WindowSampler",
]
