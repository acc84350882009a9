"""Wikipedia articles as one byte-level-BPE token stream per split (seed 002).

Articles come from the Hugging Face hub (`wikimedia/wikipedia`, config
`20231101.en`) or from local parquet / jsonl shards with the same columns
(id, url, title, text). The first `train_fraction` of the articles train and
the next `val_fraction` validate, in file order, unshuffled. A byte-level BPE
tokenizer is trained on the train split, every article is tokenized and
followed by one end-of-text token, and each split is written once to a
content-addressed cache as a flat uint16/uint32 file that is memory-mapped.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .char import DEFAULT_CACHE
from .windows import WindowDataModule

EOT = "<|endoftext|>"
SPLITS = ("train", "val")
# Bump when the cache layout or the tokenization changes, so old caches are not reused.
CACHE_VERSION = 1
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
LOCAL_HINT = "--data.data_files 'path/to/*.parquet' (or .jsonl) with the columns id, url, title, text"


def _one_line(message: object, limit: int = 300) -> str:
    """First line of an error message, shortened, for one-line errors that wrap a library's."""
    lines = str(message).strip().splitlines() or [""]
    line = lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def resolve_data_files(data_files: str | list[str]) -> list[Path]:
    """Expand files, globs and directories (sorted within each entry, entries in the given order)."""
    entries = [data_files] if isinstance(data_files, str) else list(data_files)
    if not entries:
        raise ValueError(f"data.data_files is empty; pass {LOCAL_HINT}")
    files: list[Path] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in FORMATS and p.is_file())
            if not found:
                raise FileNotFoundError(f"no .parquet/.jsonl/.json files in directory {path}; check --data.data_files")
        elif glob.has_magic(str(path)):
            found = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
            if not found:
                raise FileNotFoundError(f"no files match {entry}; check --data.data_files")
        elif path.is_file():
            found = [path]
        else:
            raise FileNotFoundError(f"data file not found: {entry}; check --data.data_files")
        files += found
    for path in files:
        if path.suffix not in FORMATS:
            raise ValueError(f"{path} is not a .parquet, .jsonl or .json file; data.data_files takes those formats")
        if not os.access(path, os.R_OK):
            raise FileNotFoundError(f"cannot read {path} (permission denied); check its permissions")
    if len({FORMATS[p.suffix] for p in files}) > 1:
        raise ValueError("data.data_files mixes parquet and json files; convert them to one format")
    return files


def check_text_column(path: Path) -> None:
    """Fail with one line if `path` cannot be read or has no `text` column (cheap: schema or first line)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            columns = pq.read_schema(path).names
        except Exception as e:  # pyarrow raises several types for a damaged file; all mean "unreadable"
            reason = _one_line(e, 120)
            raise ValueError(f"{path} is not a readable parquet file ({reason}); check --data.data_files") from None
    else:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"")
        if not first:
            raise ValueError(f"{path} is empty; data files need articles with the columns id, url, title, text")
        try:
            record = json.loads(first)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            reason = _one_line(e, 120)
            raise ValueError(f"{path} is not JSON lines (line 1: {reason}); check --data.data_files") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path} is not JSON lines with one article object per line; check --data.data_files")
        columns = list(record)
    if "text" not in columns:
        raise ValueError(
            f"{path} has no 'text' column (it has: {', '.join(columns) or 'none'}); "
            "data files need the columns id, url, title, text"
        )


def file_identity(files: list[Path]) -> list[tuple[str, int, int]]:
    """(absolute path, size, mtime in ns) per file: cheap, and changes when a file is rewritten."""
    return [(str(p.resolve()), (st := p.stat()).st_size, st.st_mtime_ns) for p in files]


def digest(obj: Any) -> str:
    """A short content hash of a JSON-able object, for cache directory names."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fraction_range(n: int, start_fraction: float, end_fraction: float) -> range:
    """Articles [round(n*start), round(n*end)): the same boundaries as HF's `train[45%:50%]` slicing."""
    return range(round(n * start_fraction), round(n * end_fraction))


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """The smallest unsigned type that holds every id below vocab_size."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def load_tokenizer(path: Path):
    """A `tokenizers.Tokenizer` from a tokenizer.json that has the end-of-text token."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception for unparsable files
        reason = _one_line(e, 120)
        raise ValueError(f"{path} is not a tokenizers JSON file ({reason}); check --data.tokenizer") from None
    if tokenizer.token_to_id(EOT) is None:
        raise ValueError(f"tokenizer {path} has no {EOT} token; add it as a special token or let one be trained")
    # Article text that happens to contain "<|endoftext|>" must stay text, not become a document boundary.
    tokenizer.encode_special_tokens = True
    return tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_chars: int, progress: bool = True):
    """Train a byte-level BPE tokenizer (with EOT as id 0) on at most `max_chars` characters of `texts`."""
    from datasets.utils import tqdm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # No normalizer and no prefix space: decode(encode(x)) == x for every string.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token, so nothing is ever unknown
        show_progress=progress,
    )
    bar = tqdm(total=max_chars, unit="char", unit_scale=True, desc="Reading tokenizer text", disable=not progress)

    def capped() -> Iterator[str]:
        budget = max_chars
        for text in texts:
            text = (text or "")[:budget]
            budget -= len(text)
            bar.update(len(text))
            yield text
            if budget <= 0:
                break

    try:
        tokenizer.train_from_iterator(capped(), trainer=trainer)
    finally:
        bar.total = bar.n  # the split may hold less text than the cap
        bar.close()
    tokenizer.encode_special_tokens = True
    return tokenizer


def _encode_batch(batch: dict[str, list], tokenizer, eot_id: int, dtype: str) -> dict[str, list]:
    # Not part of the serialized tokenizer, so the copy pickled into a map worker has lost it.
    tokenizer.encode_special_tokens = True
    texts = [t or "" for t in batch["text"]]
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return {
        "ids": [np.array(e.ids + [eot_id], dtype=dtype) for e in encodings],
        "n_chars": [len(t) for t in texts],
    }


@contextlib.contextmanager
def single_threaded_tokenizers(enabled: bool = True) -> Iterator[None]:
    """Within the block, the Rust tokenizer encodes on one thread (TOKENIZERS_PARALLELISM=false).
    Forked map workers need this: each would otherwise warn and oversubscribe the cores."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    if enabled:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def tokenize_to_file(
    articles, tokenizer, out: Path, vocab_size: int, num_proc: int, work_dir: Path, desc: str = "Tokenizing"
) -> dict[str, int]:
    """Tokenize `articles` (a datasets.Dataset with a `text` column) with `datasets.map`, append EOT to
    every article, and write the concatenation to `out` as raw uint16/uint32. Returns the counts."""
    from datasets import Features, Sequence, Value

    dtype = np.dtype(token_dtype(vocab_size)).name
    eot_id = tokenizer.token_to_id(EOT)
    work_dir.mkdir(parents=True, exist_ok=True)
    with single_threaded_tokenizers(num_proc > 1):  # one process keeps the tokenizer's own threads
        mapped = articles.select_columns(["text"]).map(
            _encode_batch,
            batched=True,
            num_proc=num_proc if num_proc > 1 else None,
            remove_columns=["text"],
            fn_kwargs={"tokenizer": tokenizer, "eot_id": eot_id, "dtype": dtype},
            features=Features({"ids": Sequence(Value(dtype)), "n_chars": Value("int64")}),
            cache_file_name=str(work_dir / f"{out.stem}.arrow"),  # scratch, deleted with work_dir
            load_from_cache_file=False,
            new_fingerprint=digest([str(out), os.getpid()]),  # the tokenizer object hashes poorly; we cache ourselves
            desc=desc,
        )
    n_tokens = 0
    with open(out, "wb") as f:
        for chunk in mapped.data.table.column("ids").chunks:
            values = chunk.flatten().to_numpy(zero_copy_only=False)
            values.astype(dtype, copy=False).tofile(f)
            n_tokens += len(values)
    n_chars = int(np.sum(mapped.data.table.column("n_chars").to_numpy())) if len(mapped) else 0
    return {"documents": len(mapped), "characters": n_chars, "tokens": n_tokens}


class TokenStream(np.memmap):
    """A read-only memory-mapped token file that pickles as its path, not its contents: DataLoader
    workers started with spawn or forkserver (macOS; Linux from Python 3.14) map the file
    themselves instead of each receiving a copy of the whole split."""

    @classmethod
    def open(cls, path: str | Path, dtype: str) -> TokenStream:
        stream = cls(path, dtype=dtype, mode="r")
        stream._whole_file = True  # views do not inherit it, so they pickle by value as usual
        return stream

    def __reduce__(self):
        if self.__dict__.get("_whole_file"):
            return (TokenStream.open, (self.filename, self.dtype.str))
        return super().__reduce__()


def summary_line(split: str, stats: dict[str, int], cached: bool) -> str:
    """One line per split: documents, characters, tokens and tokens per character."""
    ratio = stats["tokens"] / max(stats["characters"], 1)
    return (
        f"wikipedia {split}: {stats['documents']:,} documents, {stats['characters']:,} characters, "
        f"{stats['tokens']:,} tokens, {ratio:.3f} tokens/char{' (cached)' if cached else ''}"
    )


class WikipediaDataModule(WindowDataModule):
    """Wikipedia language modelling with a byte-level BPE tokenizer, as in seed 002.

    Preparation (`prepare_data`, rank 0 only) trains the tokenizer if none is
    given, tokenizes both splits and caches the result under a key made from
    every setting that changes it and the data files' path, size and mtime; a
    second run with the same settings only memory-maps the cache. Cache layout:
    `tokenizers/KEY/tokenizer.json`, `tokens/KEY/{train,val}.bin` + `meta.json`,
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
        vocab_size: the model's vocabulary size: the size of a trained tokenizer, or at least
            the size of a given one. Every token id is below it.
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
        seed: shuffling seed; the train order depends only on (seed, epoch).
        hub_timeout: seconds to wait for the hub before failing with an offline error.
    """

    def __init__(
        self,
        dataset: str = "wikimedia/wikipedia",
        dataset_config: str = "20231101.en",
        data_files: str | list[str] | None = None,
        train_fraction: float = 0.45,
        val_fraction: float = 0.05,
        vocab_size: int = 10_000,
        tokenizer: str | None = None,
        tokenizer_max_chars: int = 300_000_000,
        block_size: int = 1024,
        batch_size: int = 32,
        stride: int | None = None,
        val_stride: int | None = None,
        num_proc: int | None = None,
        cache_dir: str | None = None,
        num_workers: int = 0,
        seed: int = 1337,
        hub_timeout: float = 3.0,
    ):
        super().__init__(block_size, batch_size, stride or block_size, val_stride, num_workers, seed)
        if not (0.0 < train_fraction < 1.0 and 0.0 < val_fraction < 1.0 and train_fraction + val_fraction <= 1.0):
            raise ValueError(
                f"data.train_fraction={train_fraction} and data.val_fraction={val_fraction} must be in (0, 1) "
                "with a sum of at most 1"
            )
        if not isinstance(vocab_size, int) or not 2**8 + 1 <= vocab_size <= 2**32:
            raise ValueError(f"data.vocab_size must be an integer >= 257 (256 bytes + {EOT}), got {vocab_size!r}")
        if not isinstance(tokenizer_max_chars, int) or tokenizer_max_chars < 1:
            raise ValueError(f"data.tokenizer_max_chars must be a positive integer, got {tokenizer_max_chars!r}")
        if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
            raise ValueError(f"data.num_proc must be a positive integer, got {num_proc!r}")
        if tokenizer is not None and not Path(tokenizer).expanduser().is_file():
            raise FileNotFoundError(f"tokenizer file not found: {tokenizer}; check --data.tokenizer")
        self.save_hyperparameters()
        self.dataset = dataset
        self.dataset_config = dataset_config
        self.data_files = resolve_data_files(data_files) if data_files is not None else None
        self.train_fraction = train_fraction
        self.val_fraction = val_fraction
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
    def tokenizer(self):
        """The `tokenizers.Tokenizer` (special tokens in text are encoded as plain text)."""
        return load_tokenizer(self.tokenizer_path)

    @cached_property
    def tokenizer_sha256(self) -> str:
        return sha256_file(self.tokenizer_path)

    @property
    def eot_id(self) -> int:
        return self.tokenizer.token_to_id(EOT)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        # End-of-text tokens stay visible, so generated samples show document boundaries.
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ----- articles -----

    @cached_property
    def _all_articles(self):
        """Every article of the source, in order, as a datasets.Dataset (only its `text` column is used)."""
        if self.data_files is not None:
            return self._load_local()
        return self._load_hub()

    def _load_local(self):
        from datasets import load_dataset
        from datasets.exceptions import DatasetGenerationError

        for path in self.data_files:
            check_text_column(path)
        builder = FORMATS[self.data_files[0].suffix]
        try:
            return load_dataset(
                builder,
                data_files=[str(p) for p in self.data_files],
                split="train",
                cache_dir=str(self.cache_dir / "hf"),
                num_proc=self.num_proc if len(self.data_files) > 1 else None,
            )
        except (DatasetGenerationError, ValueError, OSError) as e:
            what = self.data_files[0] if len(self.data_files) == 1 else f"the {len(self.data_files)} data files"
            reason = _one_line(e.__cause__ or e, 200)
            raise ValueError(f"could not read {what} ({reason}); check --data.data_files") from None

    def _load_hub(self):
        import datasets
        import huggingface_hub
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        where = f"{self.dataset} ({self.dataset_config})"
        offline = huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE
        if not offline:
            # One short request instead of load_dataset's retry loop, which takes ~25 s to give up.
            try:
                huggingface_hub.HfApi().dataset_info(self.dataset, timeout=self.hub_timeout)
            except (RepositoryNotFoundError, GatedRepoError):
                raise ValueError(
                    f"dataset {self.dataset} is not on the Hugging Face hub or not accessible; check --data.dataset"
                ) from None
            except Exception as e:  # any failure of this probe means "cannot reach the hub"
                raise ConnectionError(
                    f"cannot reach the Hugging Face hub to load {where}: {_one_line(e, 120)}; "
                    f"work offline with local shards: {LOCAL_HINT} (or HF_HUB_OFFLINE=1 for a copy in the HF cache)"
                ) from None
        try:
            return datasets.load_dataset(self.dataset, self.dataset_config, split="train", num_proc=self.num_proc)
        except ConnectionError as e:
            reason = "offline mode (HF_HUB_OFFLINE) is on and it is not in the local HF cache"
            reason = reason if offline else _one_line(e, 120)
            raise ConnectionError(f"cannot load {where}: {reason}; use local shards: {LOCAL_HINT}") from None
        except ValueError as e:  # e.g. an unknown config, whose message lists hundreds of others
            raise ValueError(f"cannot load {where}: {_one_line(e, 200)}; check --data.dataset_config") from None

    def article_range(self, split: str) -> range:
        """Indices of the articles of `split` in the source."""
        n = len(self._all_articles)
        train, val = self.train_fraction, self.val_fraction
        articles = fraction_range(n, 0.0, train) if split == "train" else fraction_range(n, train, train + val)
        if not articles:
            fraction = self.train_fraction if split == "train" else self.val_fraction
            raise ValueError(
                f"the {split} split is empty: {split}_fraction={fraction} of {n} articles rounds to 0; "
                f"use more data or a larger --data.{split}_fraction"
            )
        return articles

    def articles(self, split: str):
        """The articles of `split` as a datasets.Dataset: a contiguous, unshuffled slice of the source."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        r = self.article_range(split)
        return self._all_articles.select(range(r.start, r.stop))  # contiguous: a zero-copy slice

    # ----- token streams -----

    @cached_property
    def stream_dir(self) -> Path:
        """Cache directory of the token streams for these settings and this tokenizer."""
        key = digest([
            CACHE_VERSION, self.source, self.train_fraction, self.val_fraction, self._vocab_size, self.tokenizer_sha256,
        ])
        return self.cache_dir / "tokens" / key

    def _read_meta(self) -> dict[str, Any] | None:
        """The cache's metadata if the cache is complete and consistent, else None."""
        meta_path = self.stream_dir / "meta.json"
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in SPLITS:
            path = self.stream_dir / f"{split}.bin"
            if not path.is_file() or path.stat().st_size != meta["splits"][split]["tokens"] * itemsize:
                return None
        return meta

    @cached_property
    def meta(self) -> dict[str, Any]:
        """Counts and dtype of the prepared streams; prepares them first if needed."""
        meta = self._read_meta()
        if meta is not None:
            return meta
        self._check_tokenizer_fits()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        (self.cache_dir / "tmp").mkdir(exist_ok=True)
        # Everything is built in a scratch directory and renamed into place in one step, so an
        # interrupted preparation never leaves a directory that looks like a finished cache.
        work = Path(tempfile.mkdtemp(prefix=f"{self.stream_dir.name}-", dir=self.cache_dir / "tmp"))
        try:
            meta = {
                "version": CACHE_VERSION,
                "dtype": np.dtype(token_dtype(self._vocab_size)).name,
                "eot_id": self.eot_id,
                "vocab_size": self._vocab_size,
                "tokenizer": self.tokenizer_identity(),
                "source": self.source,
                "splits": {},
            }
            for split in SPLITS:
                r = self.article_range(split)
                stats = tokenize_to_file(
                    self.articles(split), self.tokenizer, work / f"{split}.bin", self._vocab_size, self.num_proc,
                    work / "scratch", desc=f"Tokenizing {split}",
                )
                meta["splits"][split] = {"articles": [r.start, r.stop], **stats}
                self.built.append(split)
            shutil.rmtree(work / "scratch", ignore_errors=True)
            (work / "meta.json").write_text(json.dumps(meta, indent=1))
            self.stream_dir.parent.mkdir(parents=True, exist_ok=True)
            if self.stream_dir.exists():  # damaged (a file lost or truncated): _read_meta rejected it
                shutil.rmtree(self.stream_dir)
            try:
                os.rename(work, self.stream_dir)
            except OSError:  # another process finished the same cache first; theirs is identical
                if self._read_meta() is None:
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return meta

    def prepare_data(self) -> None:
        """Train the tokenizer and tokenize both splits unless the cache has them; print a summary per split."""
        from lightning.pytorch.utilities import rank_zero_info

        meta = self.meta
        for split in SPLITS:
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
        """Write `path` all at once, and never over a copy another process finished first: a run that
        already hashed that copy must keep seeing the same bytes."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, path)  # unlike a rename, fails instead of replacing an existing file
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links
                if not path.exists():
                    os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
