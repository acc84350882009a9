"""Datamodules of drawn examples (MQAR, passkey) rather than windows of a token stream: the validation set is
made of whole batches ahead of time, and the settings that draw the data are the data's identity."""

from __future__ import annotations

import hashlib
import math

import torch
from torch.utils.data import DataLoader, Dataset

from .windows import WindowDataModule


class SliceBatches(Dataset):
    """Test slices served whole batches at a time, a batch never spanning two slices (their lengths differ):
    item i is (x, y, slice_index), slice_index a (B,) int64 tensor. A loader takes it with batch_size=None."""

    def __init__(self, slices: list[Dataset], batch_size: int):
        self.batches = [
            (part.inputs[s : s + batch_size], part.labels[s : s + batch_size],
             torch.full((min(batch_size, len(part) - s),), i, dtype=torch.long))
            for i, part in enumerate(slices) for s in range(0, len(part), batch_size)
        ]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.batches[i]


class ExampleDataModule(WindowDataModule):
    """A WindowDataModule whose subclass draws examples: it builds its train set and SliceBatches of validation
    examples (build_train_set, build_val_set) and names what draws them (`drawing`)."""

    def __init__(self, block_size: int, batch_size: int, num_workers: int, seed: int | None):
        super().__init__(block_size, batch_size, 1, None, num_workers, seed)

    def drawing(self) -> tuple[str, tuple]:
        """(task name, every setting that changes the examples drawn)."""
        raise NotImplementedError

    def val_batches(self, world: int, dataset: Dataset | None = None) -> int:
        return math.ceil(len(self.val_set if dataset is None else dataset) / world)  # its items are whole batches

    def val_dataloader(self) -> DataLoader:
        # The batches are made already (one slice each): the loader only hands them out.
        return DataLoader(self.val_set, batch_size=None, shuffle=False, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, pin_memory=self._on_gpu())

    def test_dataloader(self) -> DataLoader:
        if self.test_set is None:
            return self.val_dataloader()
        return DataLoader(self.test_set, batch_size=None, shuffle=False, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, pin_memory=self._on_gpu())

    def load_tokens(self, split: str):
        raise NotImplementedError(f"{self.drawing()[0]} has examples, not a token stream: use its datasets")

    def fingerprint(self) -> str:
        """A digest of the settings that draw the data: the data's identity for exact resume."""
        if self._fingerprint is None:
            name, settings = self.drawing()
            self._fingerprint = hashlib.blake2b(f"{name}:{settings}".encode(), digest_size=16).hexdigest()
        return self._fingerprint
