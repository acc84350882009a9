"""Serving a contiguous token stream as (input, target) windows of block_size tokens.

Shared by every datamodule: a dataset of windows over a 1-D token array
(in memory or memory-mapped), a sized sampler whose order depends only on
(seed, epoch) and can restart mid-epoch, a train DataLoader whose position
Lightning saves and restores, and a base LightningDataModule that builds the
loaders from those.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.data import AttributeDict
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate


def check_context(n_tokens: int, block_size: int, split: str) -> None:
    """Raise ValueError unless a split of `n_tokens` tokens holds one window of block_size+1 tokens."""
    if n_tokens < block_size + 1:
        fixes = [f"lower --model.block_size to at most {n_tokens - 1}"] if n_tokens > 1 else []
        fixes += [f"raise --data.{split}_fraction"] if split in ("val", "test") else []
        raise ValueError(
            f"the {split} split has {n_tokens} tokens, fewer than block_size+1 = {block_size + 1}; "
            f"{', '.join(fixes) + ' or ' if fixes else ''}use more data"
        )


def check_batches(n_windows: int, batch_size: int, world_size: int, stride: int, split: str = "train") -> None:
    """Raise ValueError unless each of `world_size` processes gets one full batch of the split's windows
    (the train loader drops an incomplete last batch, so fewer would train no step and report success)."""
    per_process = n_windows // world_size
    if per_process >= batch_size:
        return
    where = f" on each of {world_size} processes" if world_size > 1 else ""
    fixes = [f"lower --data.batch_size to at most {per_process}"] if per_process else []
    fixes += ["lower --data.stride"] if stride > 1 else []
    fixes += ["use fewer --trainer.devices"] if world_size > 1 else []
    raise ValueError(
        f"the {split} split has {n_windows} windows, fewer than one batch of --data.batch_size {batch_size}{where}: "
        f"training would take no step; {', '.join(fixes) + ' or ' if fixes else ''}use more data"
    )


def check_share(limit: Any, n_batches: int, flag: str) -> None:
    """Raise ValueError if `limit`, a float Lightning reads as a share of `n_batches`, rounds to no batch
    (Lightning would stop with a traceback once the run directory exists)."""
    if isinstance(limit, float) and limit > 0 and int(n_batches * limit) == 0:
        raise ValueError(
            f"{flag} {limit} of {n_batches} batch(es) rounds to none; pass a share of at least 1/{n_batches} "
            f"or a number of batches, e.g. {flag} 1"
        )


def check_schedule(trainer: Any, batches: int) -> None:
    """Raise ValueError for a debug run longer than an epoch of the data's `batches` training batches (per
    process), or gradients accumulated over more batches than an epoch has: no step would be as asked."""
    debug = getattr(trainer, "fast_dev_run", False)
    if not isinstance(debug, bool) and isinstance(debug, int) and debug > batches:
        raise ValueError(f"--trainer.fast_dev_run {debug}: a debug run longer than the data, which has {batches} "
                         f"training batch(es) per epoch; use --trainer.fast_dev_run <= {batches} (true: 1)")
    limit = getattr(trainer, "limit_train_batches", None)
    per_epoch = (min(batches, limit) if isinstance(limit, int) else
                 int(batches * limit) if isinstance(limit, float) else batches)
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    if isinstance(accumulate, int) and per_epoch > 0 and accumulate > per_epoch:
        raise ValueError(f"--trainer.accumulate_grad_batches {accumulate}: more batches than an epoch's {per_epoch}, "
                         f"so each optimizer step would take a whole epoch; use --trainer.accumulate_grad_batches "
                         f"<= {per_epoch}")


class TokenWindows(Dataset):
    """Windows of block_size+1 tokens starting every `stride` tokens.

    Item i is (x, y) with x = tokens[s : s+block_size], y = tokens[s+1 : s+block_size+1],
    s = i * stride, both int64. stride=1 uses every offset; stride=block_size
    gives non-overlapping windows.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, stride: int = 1, split: str = "data"):
        if block_size < 1 or stride < 1:
            raise ValueError(f"block_size and stride must be positive, got {block_size} and {stride}")
        check_context(len(tokens), block_size, split)
        self.tokens = tokens
        self.block_size = block_size
        self.stride = stride

    def __len__(self) -> int:
        return (len(self.tokens) - self.block_size - 1) // self.stride + 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range [0, {len(self)})")
        start = i * self.stride
        window = torch.from_numpy(np.asarray(self.tokens[start : start + self.block_size + 1], dtype=np.int64))
        return window[:-1], window[1:]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch, x and y (B, block_size), with one gather (the DataLoader calls this)."""
        index = np.asarray(indices, dtype=np.int64)
        if len(index) and not (0 <= index.min() and index.max() < len(self)):
            raise IndexError(f"windows {indices} out of range [0, {len(self)})")
        offsets = index[:, None] * self.stride + np.arange(self.block_size + 1)  # (B, block_size + 1)
        windows = torch.from_numpy(np.asarray(self.tokens[offsets], dtype=np.int64))
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def collate_windows(batch: Any) -> Any:
    """DataLoader collate: batches from TokenWindows.__getitems__ are complete already."""
    if isinstance(batch, tuple) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return batch
    return default_collate(batch)


class WindowSampler(DistributedSampler):
    """Sized, resumable sampler: the order is a function of (seed, epoch) only.

    Each of `num_replicas` ranks takes every num_replicas-th index of the
    epoch's order, so it also shards under DDP; it subclasses DistributedSampler
    only so that Lightning does not wrap it in another one. `len()` is always
    the full per-rank epoch, also after `load_state_dict`, so step counts and
    LR schedules do not depend on where a run was resumed.
    """

    def __init__(
        self, dataset: Dataset, shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0,
        drop_last: bool = True,
    ):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self._start = 0  # index into this rank's order where the next iteration starts
        self._yielded = 0

    def order(self, epoch: int) -> list[int]:
        """This rank's full index order for `epoch`."""
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + epoch)
            indices = torch.randperm(n, generator=g).tolist()
        else:
            indices = list(range(n))
        if self.drop_last:
            indices = indices[: self.total_size]
        else:  # pad by wrapping so every rank gets the same count
            indices += (indices * (self.total_size // max(n, 1) + 1))[: self.total_size - n]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self.order(self.epoch)
        start, self._start = self._start, 0
        self._yielded = start
        for i in indices[start:]:
            self._yielded += 1
            yield i

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._start = 0  # a pending mid-epoch start belongs to the epoch it was saved in
        self.epoch = epoch

    @property
    def start(self) -> int:
        """Where in this rank's order the next iteration starts (0 but after `load_state_dict`)."""
        return self._start

    def state_dict(self) -> dict[str, int]:
        """Epoch and samples handed out so far; a DataLoader's workers fetch ahead, so WindowLoader
        overwrites `index` with the samples of the batches it handed out."""
        return {"epoch": self.epoch, "index": self._yielded, "seed": self.seed, "num_replicas": self.num_replicas}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if (state.get("seed", self.seed) != self.seed
                or state.get("num_replicas", self.num_replicas) != self.num_replicas):
            raise ValueError(
                f"sampler state was saved with seed={state.get('seed')} on {state.get('num_replicas')} ranks, "
                f"but this run uses seed={self.seed} on {self.num_replicas}; resume with the same seed and devices"
            )
        self.epoch = int(state["epoch"])
        self._start = int(state["index"])
        if not 0 <= self._start <= self.num_samples:
            raise ValueError(f"sampler index {self._start} is outside this epoch's {self.num_samples} samples")


# A held-out test split's size, left out of `data_identity` at 0 (none): such data is named as before the option was.
NO_TEST_SPLIT = frozenset({"test_fraction", "num_heldout_examples"})


class WindowLoader(DataLoader):
    """The train DataLoader, resumable mid-epoch: being stateful, its position is saved by Lightning's fit loop in
    every checkpoint (loops > fit_loop > state_dict > combined_loader) and restored before the epoch continues.

    The position is the samples of the batches this loader handed out in the sampler's epoch: Lightning fetches
    no batch ahead from a sized loader, so at a checkpoint they are the batches trained on, whereas the sampler's
    own count runs ahead of them when workers prefetch. A sampler other than a WindowSampler (Lightning puts its
    own in for `overfit_batches`) has no position to keep.
    """

    def __init__(self, dataset: Dataset, sampler: Any, **kwargs: Any):
        super().__init__(dataset, sampler=sampler, **kwargs)
        self._consumed = 0

    def __iter__(self) -> Iterator[Any]:
        # A generator: the start is read when the first batch is asked for, after Lightning set the epoch.
        self._consumed = self.sampler.start if isinstance(self.sampler, WindowSampler) else 0
        for batch in super().__iter__():
            self._consumed += self.batch_size
            yield batch

    def state_dict(self) -> dict[str, int]:
        if not isinstance(self.sampler, WindowSampler):
            return {}
        return self.sampler.state_dict() | {"index": self._consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state and isinstance(self.sampler, WindowSampler):
            self.sampler.load_state_dict(state)
            self._consumed = self.sampler.start


# Settings that shape the batches or where files are kept, not what the data is: left out of `data_identity`.
NOT_DATA = frozenset({"block_size", "batch_size", "stride", "val_stride", "num_workers", "seed", "cache_dir",
                      "num_proc", "hub_timeout"})


class WindowDataModule(L.LightningDataModule):
    """Base datamodule: subclasses provide `vocab_size` and `load_tokens(split)`, and check their options'
    ranges, which their signatures' types state (`lit_attn.bounds.check_bounds`)."""

    def __init__(self, block_size: int, batch_size: int, stride: int, val_stride: int | None, num_workers: int,
                 seed: int | None):
        super().__init__()
        self.block_size = block_size
        self.batch_size = batch_size
        self.stride = stride
        self.val_stride = val_stride or block_size
        self.num_workers = num_workers
        # None follows seed_everything, so a seed varies the data order as well as the initialization.
        self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed
        self.train_set: TokenWindows | None = None
        self.val_set: TokenWindows | None = None
        self.test_set: TokenWindows | None = None
        self.sampler: WindowSampler | None = None
        self._fingerprint: str | None = None

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def data_identity(self) -> str:
        """What a run on this datamodule learns from, in one line: its class and the settings that choose the data
        (NOT_DATA left out). Runs whose identities differ have losses that do not compare."""
        settings = [f"{k}={v}" for k, v in sorted(self.hparams.items()) if k not in NOT_DATA and not k.startswith("_")
                    and not (k in NO_TEST_SPLIT and not v)]
        return f"{type(self).__name__}({', '.join(settings)})"

    @property
    def hparams_initial(self) -> AttributeDict:
        """The hyperparameters Lightning logs at the start of each fit (hparams.yaml), with `data`: data_identity."""
        return AttributeDict(super().hparams_initial | {"data": self.data_identity})

    def load_tokens(self, split: str) -> np.ndarray:
        """The whole token stream of `split` ("train", "val", or "test" where has_test_split) as a 1-D integer
        array."""
        raise NotImplementedError

    @property
    def has_test_split(self) -> bool:
        """Whether the data holds out a test split of its own (else `test` scores the validation split)."""
        return False

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.train_set is None:
            train_set = self.build_train_set()
            check_batches(len(train_set), self.batch_size, self.trainer.world_size if self.trainer else 1, self.stride)
            self.train_set = train_set
        if self.val_set is None:
            self.val_set = self.build_val_set()
        if stage == "test" and self.has_test_split and self.test_set is None:
            self.test_set = self.build_test_set()
        if self.trainer is not None:
            self._check_shares(stage)

    def build_train_set(self) -> Dataset:
        """The training examples: windows of the train split's tokens (a subclass may serve others)."""
        return TokenWindows(self.load_tokens("train"), self.block_size, self.stride, "train")

    def build_val_set(self) -> Dataset:
        return TokenWindows(self.load_tokens("val"), self.block_size, self.val_stride, "val")

    def build_test_set(self) -> Dataset:
        """The held-out test split's examples (where has_test_split), spaced as validation's."""
        return TokenWindows(self.load_tokens("test"), self.block_size, self.val_stride, "test")

    def val_batches(self, world: int, dataset: Dataset | None = None) -> int:
        """Evaluation batches per process of the validation set (or `dataset`): Lightning's DistributedSampler pads
        the windows so each gets as many."""
        return math.ceil(math.ceil(len(self.val_set if dataset is None else dataset) / world) / self.batch_size)

    def _check_shares(self, stage: str) -> None:
        """Each limit_*_batches given as a share leaves at least one batch of its loader on every process."""
        world = self.trainer.world_size
        if stage == "fit":
            batches = len(self.train_set) // world // self.batch_size
            check_share(self.trainer.limit_train_batches, batches, "--trainer.limit_train_batches")
            check_schedule(self.trainer, batches)
        name = f"limit_{'val' if stage in ('fit', 'validate') else stage}_batches"
        batches = self.val_batches(world, self.test_set if stage == "test" else None)
        check_share(getattr(self.trainer, name, None), batches, f"--trainer.{name}")

    def _on_gpu(self) -> bool:
        """Whether batches go to a CUDA device: then pinned host memory makes the copy asynchronous."""
        if self.trainer is not None:
            return self.trainer.strategy.root_device.type == "cuda"
        return torch.cuda.is_available()

    def _loader(self, dataset: TokenWindows, loader: type[DataLoader] = DataLoader, **kwargs: Any) -> DataLoader:
        return loader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self._on_gpu(),
            collate_fn=collate_windows,
            **kwargs,
        )

    def train_dataloader(self) -> WindowLoader:
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        self.sampler = WindowSampler(self.train_set, shuffle=True, seed=self.seed, num_replicas=world, rank=rank)
        return self._loader(self.train_set, sampler=self.sampler, drop_last=True, loader=WindowLoader)

    def fingerprint(self) -> str:
        """A digest of the train and validation token streams (and the test split's, where there is one): the
        data's identity by content.

        Two files with the same characters but other text, or other split fractions, differ
        here. Computed once per process (about a second per GB of tokens).
        """
        if self._fingerprint is None:
            h = hashlib.blake2b(digest_size=16)
            for split in ("train", "val", *(["test"] if self.has_test_split else [])):
                tokens = self.load_tokens(split)
                h.update(f"{split}:{len(tokens)}:{np.dtype(tokens.dtype).str};".encode())
                for start in range(0, len(tokens), 1 << 26):  # memory-mapped streams are read in chunks
                    h.update(np.ascontiguousarray(tokens[start : start + (1 << 26)]).tobytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """What the train loader's saved position (WindowLoader, saved by Lightning) is counted in: the data's
        fingerprint, batch size, stride, and the seed and processes that deal the windows."""
        if self.trainer is None or self.train_set is None:
            return {}
        return {"data": {"fingerprint": self.fingerprint(), "batch_size": self.batch_size, "stride": self.stride,
                         "seed": self.seed, "num_replicas": self.trainer.world_size}}

    def check_resume(self, state: dict[str, Any], world_size: int) -> None:
        """Raise ValueError naming the first data setting that differs from the checkpoint's, or for a
        checkpoint whose position in the epoch this version cannot restore.

        Exact resume continues the saved position in the epoch, which is counted in windows of
        this data, batch size and stride, dealt by this seed over this many processes.
        """
        if "sampler" in state:
            raise ValueError(
                "the checkpoint was written by an older lit-attn (the epoch position in the datamodule's state, not "
                "the train loader's), so the resumed run would not continue its epoch; resume it with that "
                "lit-attn, or start a new run"
            )
        saved = state.get("data") or {}
        for name in ("batch_size", "stride", "seed"):
            ours, theirs = getattr(self, name), saved.get(name)
            if theirs is not None and theirs != ours:
                raise ValueError(
                    f"data.{name}={ours} differs from the checkpoint's {theirs}: the saved position in the epoch "
                    f"is counted in its windows; resume with --data.{name} {theirs}, or start a new run"
                )
        if saved.get("num_replicas", world_size) != world_size:
            raise ValueError(
                f"the checkpoint was trained on {saved['num_replicas']} process(es), this run has {world_size}: "
                f"each process's share of the epoch would change; resume with the same --trainer.devices/num_nodes"
            )
        if saved.get("fingerprint") not in (None, self.fingerprint()):
            raise ValueError(
                f"the data differs from the checkpoint's (token fingerprint {self.fingerprint()[:12]} vs "
                f"{saved['fingerprint'][:12]}): resume with the same data files and split fractions, or start a new run"
            )

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """The held-out test split where the data has one, else the validation split."""
        return self._loader(self.test_set, shuffle=False) if self.test_set is not None else self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()
