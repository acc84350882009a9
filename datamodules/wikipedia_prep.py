"""Preparing Wikipedia token streams: reading the articles (local shards or the hub), training the
byte-level BPE tokenizer, tokenizing both splits into the content-keyed cache, and the memory-mapped
`TokenStream` over a cached split. `datamodules.wikipedia.WikipediaDataModule` drives these."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lit_attn.codec import EOT, BPECodec, one_line

SPLITS = ("train", "val")
# Bump when the cache layout or the tokenization changes, so old caches are not reused.
CACHE_VERSION = 1
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
LOCAL_HINT = "--data.data_files 'path/to/*.parquet' (or .jsonl) with the columns id, url, title, text"


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
            reason = one_line(e, 120)
            raise ValueError(f"{path} is not a readable parquet file ({reason}); check --data.data_files") from None
    else:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"")
        if not first:
            raise ValueError(f"{path} is empty; data files need articles with the columns id, url, title, text")
        try:
            record = json.loads(first)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            reason = one_line(e, 120)
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


def load_codec(path: Path) -> BPECodec:
    """The BPE codec of a tokenizer.json that has the end-of-text token."""
    codec = BPECodec.from_file(path, fix="check --data.tokenizer")
    if codec.eot_id is None:
        raise ValueError(f"tokenizer {path} has no {EOT} token; add it as a special token or let one be trained")
    return codec


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


def load_local(data_files: list[Path], cache_dir: Path, num_proc: int):
    """Every article of local shards, in file order, as a datasets.Dataset (HF's Arrow copy under cache_dir/hf)."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    for path in data_files:
        check_text_column(path)
    builder = FORMATS[data_files[0].suffix]
    try:
        return load_dataset(
            builder,
            data_files=[str(p) for p in data_files],
            split="train",
            cache_dir=str(cache_dir / "hf"),
            num_proc=num_proc if len(data_files) > 1 else None,
        )
    except (DatasetGenerationError, ValueError, OSError) as e:
        what = data_files[0] if len(data_files) == 1 else f"the {len(data_files)} data files"
        reason = one_line(e.__cause__ or e, 200)
        raise ValueError(f"could not read {what} ({reason}); check --data.data_files") from None


def load_hub(dataset: str, config: str, num_proc: int, timeout: float):
    """Every article of a hub dataset as a datasets.Dataset; fails fast, in one line, when the hub is out of reach."""
    import datasets
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    where = f"{dataset} ({config})"
    offline = huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE
    if not offline:
        # One request bounded by `timeout`: load_dataset's own retry loop is slow to give up on an unreachable hub.
        try:
            huggingface_hub.HfApi().dataset_info(dataset, timeout=timeout)
        except (RepositoryNotFoundError, GatedRepoError):
            raise ValueError(
                f"dataset {dataset} is not on the Hugging Face hub or not accessible; check --data.dataset"
            ) from None
        except Exception as e:  # any failure of this probe means "cannot reach the hub"
            raise ConnectionError(
                f"cannot reach the Hugging Face hub to load {where}: {one_line(e, 120)}; "
                f"work offline with local shards: {LOCAL_HINT} (or HF_HUB_OFFLINE=1 for a copy in the HF cache)"
            ) from None
    try:
        return datasets.load_dataset(dataset, config, split="train", num_proc=num_proc)
    except ConnectionError as e:
        reason = "offline mode (HF_HUB_OFFLINE) is on and it is not in the local HF cache"
        reason = reason if offline else one_line(e, 120)
        raise ConnectionError(f"cannot load {where}: {reason}; use local shards: {LOCAL_HINT}") from None
    except ValueError as e:  # e.g. an unknown config, whose message lists hundreds of others
        raise ValueError(f"cannot load {where}: {one_line(e, 200)}; check --data.dataset_config") from None


def read_meta(stream_dir: Path, splits: tuple[str, ...] = SPLITS) -> dict[str, Any] | None:
    """The cache's metadata if the cache in `stream_dir` is complete and consistent (every one of `splits`), else
    None."""
    meta_path = stream_dir / "meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in splits:
        path = stream_dir / f"{split}.bin"
        tokens = (meta["splits"].get(split) or {}).get("tokens")
        if tokens is None or not path.is_file() or path.stat().st_size != tokens * itemsize:
            return None
    return meta


def build_streams(
    stream_dir: Path, scratch_root: Path, meta: dict[str, Any], articles: Callable[[str], Any],
    ranges: dict[str, range], tokenizer, num_proc: int, built: list[str],
) -> dict[str, Any]:
    """Tokenize every split of `ranges` into a scratch directory under `scratch_root`, then rename it to `stream_dir`
    in one step, so an interrupted preparation never leaves a directory that looks like a finished cache.
    `meta` (dtype, vocab_size, ...) gets the per-split counts; each finished split is appended to `built`."""
    scratch_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{stream_dir.name}-", dir=scratch_root))
    try:
        meta = meta | {"splits": {}}
        for split, r in ranges.items():
            stats = tokenize_to_file(
                articles(split), tokenizer, work / f"{split}.bin", meta["vocab_size"], num_proc,
                work / "scratch", desc=f"Tokenizing {split}",
            )
            meta["splits"][split] = {"articles": [r.start, r.stop], **stats}
            built.append(split)
        shutil.rmtree(work / "scratch", ignore_errors=True)
        (work / "meta.json").write_text(json.dumps(meta, indent=1))
        stream_dir.parent.mkdir(parents=True, exist_ok=True)
        if stream_dir.exists():  # damaged (a file lost or truncated): read_meta rejected it
            shutil.rmtree(stream_dir)
        try:
            os.rename(work, stream_dir)
        except OSError:  # another process finished the same cache first; theirs is identical
            if read_meta(stream_dir, tuple(ranges)) is None:
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return meta


def write_atomic(path: Path, data: bytes) -> None:
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
