"""Wikipedia articles as one byte-level-BPE token stream per split.

Articles come from the Hugging Face hub (`wikimedia/wikipedia`, config
`20231101.en`) or from local parquet / jsonl shards with the same columns
(id, url, title, text). The first `train_fraction` of the articles train,
the next `val_fraction` validate and the next `test_fraction` (none by default)
are a held-out test split, in file order, unshuffled. A byte-level BPE
tokenizer is trained on the train split, every article is tokenized and
followed by one end-of-text token, and each split is written once to a
content-addressed cache as a flat uint16/uint32 file that is memory-mapped.
The preparation itself (reading, training, tokenizing, caching) lives in
`datamodules.wikipedia_prep`; its public names are re-exported here.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lit_attn.bounds import (
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
    Seed,
    UnitInterval,
    bounded,
    check_bounds,
)
from lit_attn.codec import BPECodec

from .char import DEFAULT_CACHE
from .wikipedia_prep import (  # noqa: F401  (re-exported: benchmarks/bench_tokenizer.py and tests use them)
    CACHE_VERSION,
    EOT,
    SPLITS,
    TokenStream,
    build_streams,
    digest,
    file_identity,
    fraction_range,
    load_codec,
    load_hub,
    load_local,
    read_meta,
    resolve_data_files,
    sha256_file,
    single_threaded_tokenizers,
    summary_line,
    token_dtype,
    tokenize_to_file,
    train_tokenizer,
    write_atomic,
)
from .windows import WindowDataModule

# 256 bytes and <|endoftext|> at least; token ids are stored as uint32.
BPEVocabSize = bounded("BPEVocabSize", int, 2**8 + 1, 2**32)


class WikipediaDataModule(WindowDataModule):
    """Wikipedia language modelling with a byte-level BPE tokenizer, as in the Sparse Query Attention paper.

    Preparation (`prepare_data`, rank 0 only) trains the tokenizer if none is
    given, tokenizes every split and caches the result under a key made from
    every setting that changes it and the data files' path, size and mtime; a
    second run with the same settings only memory-maps the cache. Cache layout:
    `tokenizers/KEY/tokenizer.json`, `tokens/KEY/{train,val[,test]}.bin` + `meta.json`,
    `hf/` (HF's Arrow copy of local files; hub downloads stay in HF's own cache)
    and `tmp/` (scratch; a killed preparation may leave a directory there, safe
    to delete).

    Args:
        dataset: hub dataset id, used when `data_files` is not given.
        dataset_config: hub config (dump date and language).
        data_files: local .parquet or .jsonl/.json shards (a path, glob, directory or list of
            those; order is file order) with the columns id, url, title, text. When given,
            the network is not touched.
        train_fraction: the first train_fraction of the articles train.
        val_fraction: the next val_fraction of the articles validate.
        test_fraction: the next test_fraction of the articles are a held-out test split, scored once at the end
            of fit (0: none; `test` then scores the validation split).
        vocab_size: the model's vocabulary size: the size of a trained tokenizer, or at least
            the size of a given one (256 bytes and <|endoftext|> at least). Every token id is below it.
        tokenizer: an existing tokenizer.json (with an <|endoftext|> token); when absent one is
            trained on the train split and saved in the cache.
        tokenizer_max_chars: cap on the characters of train-split text (from its first
            articles) read to train the tokenizer.
        block_size: context length (the CLI links it from model.block_size).
        batch_size: windows per batch (per device).
        stride: train windows start every `stride` tokens; default block_size, so an epoch is
            one pass over the train tokens (stride 1 would make an epoch block_size passes).
        val_stride: validation window spacing; default block_size (non-overlapping).
        num_proc: processes for loading and tokenizing; default: all CPU cores, at most 8.
        cache_dir: cache root (default ~/.cache/lit_attn/wikipedia, or $LIT_ATTN_CACHE/wikipedia).
        num_workers: DataLoader worker processes.
        seed: shuffling seed; the train order depends only on (seed, epoch). None: the run's
            seed_everything (main.py writes the number into the run's config).
        hub_timeout: seconds to wait for the hub before failing with an offline error.
    """

    def __init__(
        self,
        dataset: str = "wikimedia/wikipedia",
        dataset_config: str = "20231101.en",
        data_files: str | list[str] | None = None,
        train_fraction: OpenUnitInterval = 0.45,
        val_fraction: OpenUnitInterval = 0.05,
        test_fraction: UnitInterval = 0.0,
        vocab_size: BPEVocabSize = 10_000,
        tokenizer: str | None = None,
        tokenizer_max_chars: PositiveInt = 300_000_000,
        block_size: PositiveInt = 1024,
        batch_size: PositiveInt = 32,
        stride: PositiveInt | None = None,
        val_stride: PositiveInt | None = None,
        num_proc: PositiveInt | None = None,
        cache_dir: str | None = None,
        num_workers: NonNegativeInt = 0,
        seed: Seed | None = None,
        hub_timeout: PositiveFloat = 3.0,
    ):
        check_bounds(WikipediaDataModule.__init__, locals())
        super().__init__(block_size, batch_size, stride or block_size, val_stride, num_workers, seed)
        if train_fraction + val_fraction > 1.0:
            raise ValueError(f"--data.train_fraction {train_fraction} and --data.val_fraction {val_fraction} "
                             "add up to more than 1: lower one of them")
        if train_fraction + val_fraction + test_fraction > 1.0:
            raise ValueError(f"--data.train_fraction {train_fraction}, --data.val_fraction {val_fraction} and "
                             f"--data.test_fraction {test_fraction} add up to more than 1: lower one of them")
        if tokenizer is not None and not Path(tokenizer).expanduser().is_file():
            raise FileNotFoundError(f"tokenizer file not found: {tokenizer}; check --data.tokenizer")
        self.save_hyperparameters()
        self.dataset = dataset
        self.dataset_config = dataset_config
        self.data_files = resolve_data_files(data_files) if data_files is not None else None
        self.train_fraction = train_fraction
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self._vocab_size = vocab_size
        self.tokenizer_file = Path(tokenizer).expanduser() if tokenizer is not None else None
        self.tokenizer_max_chars = tokenizer_max_chars
        self.num_proc = num_proc or min(8, os.cpu_count() or 1)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else DEFAULT_CACHE / "wikipedia"
        self.hub_timeout = hub_timeout
        # What this instance had to build ("tokenizer", "train", "val"); empty on a cache hit.
        self.built: list[str] = []

    # ----- vocabulary and tokenizer -----

    @property
    def vocab_size(self) -> int:
        self._check_tokenizer_fits()
        return self._vocab_size

    def _check_tokenizer_fits(self) -> None:
        if self.tokenizer_file is None:
            return  # a trained tokenizer has at most vocab_size tokens by construction
        size = self.tokenizer.get_vocab_size()
        if size > self._vocab_size:
            raise ValueError(
                f"tokenizer {self.tokenizer_file} has {size} tokens, more than data.vocab_size={self._vocab_size}; "
                f"pass --data.vocab_size {size}"
            )

    @cached_property
    def source(self) -> dict[str, Any]:
        """What the articles are, as it enters the cache keys (taken once, so one instance keeps one key)."""
        if self.data_files is not None:
            return {"data_files": file_identity(self.data_files)}
        return {"dataset": self.dataset, "config": self.dataset_config}

    @cached_property
    def tokenizer_path(self) -> Path:
        """The tokenizer.json in use; trains and caches one first if none was given."""
        if self.tokenizer_file is not None:
            return self.tokenizer_file
        key = digest([CACHE_VERSION, self.source, self.train_fraction, self._vocab_size, self.tokenizer_max_chars])
        path = self.cache_dir / "tokenizers" / key / "tokenizer.json"
        if not path.is_file():
            articles = self.articles("train")
            tokenizer = train_tokenizer(
                (text for batch in articles.select_columns(["text"]).iter(batch_size=1000) for text in batch["text"]),
                self._vocab_size,
                self.tokenizer_max_chars,
            )
            self._write_atomic(path, tokenizer.to_str().encode())
            self.built.append("tokenizer")
        return path

    @cached_property
    def codec(self) -> BPECodec:
        """Text <-> token ids with this run's tokenizer (lit_attn.codec.BPECodec)."""
        return load_codec(self.tokenizer_path)

    @property
    def tokenizer(self):
        """The `tokenizers.Tokenizer` (special tokens in text are encoded as plain text)."""
        return self.codec.tokenizer

    @cached_property
    def tokenizer_sha256(self) -> str:
        return sha256_file(self.tokenizer_path)

    @property
    def eot_id(self) -> int:
        return self.codec.eot_id

    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text)

    def decode(self, ids: list[int]) -> str:
        # End-of-text tokens stay visible, so generated samples show document boundaries.
        return self.codec.decode(ids)

    # ----- articles -----

    @cached_property
    def _all_articles(self):
        """Every article of the source, in order, as a datasets.Dataset (only its `text` column is used)."""
        if self.data_files is not None:
            return load_local(self.data_files, self.cache_dir, self.num_proc)
        return load_hub(self.dataset, self.dataset_config, self.num_proc, self.hub_timeout)

    @property
    def has_test_split(self) -> bool:
        return self.test_fraction > 0

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits this data prepares: train and val, and test where it holds one out."""
        return SPLITS + (("test",) if self.has_test_split else ())

    def article_range(self, split: str) -> range:
        """Indices of the articles of `split` in the source."""
        n = len(self._all_articles)
        bounds = {"train": (0.0, self.train_fraction),
                  "val": (self.train_fraction, self.train_fraction + self.val_fraction),
                  "test": (self.train_fraction + self.val_fraction,
                           self.train_fraction + self.val_fraction + self.test_fraction)}
        articles = fraction_range(n, *bounds[split])
        if not articles:
            fraction = getattr(self, f"{split}_fraction")
            raise ValueError(
                f"the {split} split is empty: {split}_fraction={fraction} of {n} articles rounds to 0; "
                f"use more data or a larger --data.{split}_fraction"
            )
        return articles

    def articles(self, split: str):
        """The articles of `split` as a datasets.Dataset: a contiguous, unshuffled slice of the source."""
        if split not in self.splits:
            raise ValueError(f"split must be one of {self.splits}, got {split!r}")
        r = self.article_range(split)
        return self._all_articles.select(range(r.start, r.stop))  # contiguous: a zero-copy slice

    # ----- token streams -----

    @cached_property
    def stream_dir(self) -> Path:
        """Cache directory of the token streams for these settings and this tokenizer."""
        key = digest([
            CACHE_VERSION, self.source, self.train_fraction, self.val_fraction, self._vocab_size, self.tokenizer_sha256,
            *([self.test_fraction] if self.has_test_split else []),  # without one, the key streams always had
        ])
        return self.cache_dir / "tokens" / key

    @cached_property
    def meta(self) -> dict[str, Any]:
        """Counts and dtype of the prepared streams; prepares them first if needed."""
        meta = read_meta(self.stream_dir, self.splits)
        if meta is not None:
            return meta
        self._check_tokenizer_fits()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        head = {
            "version": CACHE_VERSION,
            "dtype": np.dtype(token_dtype(self._vocab_size)).name,
            "eot_id": self.eot_id,
            "vocab_size": self._vocab_size,
            "tokenizer": self.tokenizer_identity(),
            "source": self.source,
        }
        ranges = {split: self.article_range(split) for split in self.splits}
        return build_streams(self.stream_dir, self.cache_dir / "tmp", head, self.articles, ranges, self.tokenizer,
                             self.num_proc, self.built)

    def prepare_data(self) -> None:
        """Train the tokenizer and tokenize every split unless the cache has them; print a summary per split."""
        from lightning.pytorch.utilities import rank_zero_info

        meta = self.meta
        for split in self.splits:
            rank_zero_info(summary_line(split, meta["splits"][split], cached=split not in self.built))

    def load_tokens(self, split: str) -> np.ndarray:
        meta = self.meta
        return TokenStream.open(self.stream_dir / f"{split}.bin", meta["dtype"])

    # ----- checkpoints -----

    def tokenizer_identity(self) -> dict[str, Any]:
        """Where the tokenizer is, its content hash and its size: what a checkpoint records."""
        size = self.tokenizer.get_vocab_size()
        return {"path": str(self.tokenizer_path), "sha256": self.tokenizer_sha256, "size": size}

    def state_dict(self) -> dict[str, Any]:
        # The checkpoint records which tokenizer its token ids mean.
        return super().state_dict() | {"tokenizer": self.tokenizer_identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("tokenizer")
        if saved is not None and saved["sha256"] != self.tokenizer_sha256:
            raise ValueError(
                f"the checkpoint was trained with a different tokenizer "
                f"({saved['path']}, sha256 {saved['sha256'][:12]}) "
                f"than this run's ({self.tokenizer_path}, sha256 {self.tokenizer_sha256[:12]}); "
                f"resume with the same data settings or pass --data.tokenizer {saved['path']}"
            )
        super().load_state_dict(state)

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        """Write `path` once, never over a finished copy (`wikipedia_prep.write_atomic`)."""
        write_atomic(path, data)
