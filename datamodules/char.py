"""Character-level text: any UTF-8 file or URL, or a default corpus every Python has."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lit_attn.bounds import NonNegativeInt, OpenUnitInterval, PositiveInt, Seed, UnitInterval, check_bounds
from lit_attn.codec import CharCodec

from .windows import WindowDataModule, check_context

DEFAULT_CACHE = Path(os.environ.get("LIT_ATTN_CACHE", Path.home() / ".cache" / "lit_attn"))


def default_corpus() -> str:
    """CPython's own help texts (`pydoc_data.topics`: English prose and code examples), which ship
    with every CPython installation, so the default run needs no download. Topics are joined in
    sorted order so the corpus is deterministic."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file, with one-line errors for missing, binary, non-UTF-8 or empty files."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}; check --data.path")
    data = path.read_bytes()
    if b"\x00" in data:
        raise ValueError(f"{path} looks binary (it contains NUL bytes); --data.path needs a UTF-8 text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (invalid byte at offset {e.start}); convert it, e.g. with iconv -t UTF-8"
        ) from None
    if not text:
        raise ValueError(f"{path} is empty; --data.path needs a non-empty text file")
    return text


def download(url: str, cache_dir: Path, timeout: float = 30.0) -> Path:
    """Fetch `url` once into `cache_dir` (atomically) and return the local path."""
    name = Path(urllib.request.urlparse(url).path).name or "download.txt"
    target = cache_dir / f"{hashlib.sha1(url.encode()).hexdigest()[:12]}-{name}"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConnectionError(
            f"could not download {url} ({reason}); check the network, or download it yourself and pass --data.path FILE"
        ) from None
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    return target


class CharVocabulary:
    """A character vocabulary (`vocab`: the characters in token-id order), its codec, and the vocabulary saved
    in the datamodule's checkpoint state (samples and probes decode the run with it) and checked on resume."""

    vocab: str
    VOCAB_HINT = "resume with the same --data.path/--data.url"  # what to do when a checkpoint's differs

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @cached_property
    def codec(self) -> CharCodec:
        """Text <-> token ids over the vocabulary (lit_attn.codec.CharCodec)."""
        return CharCodec(self.vocab)

    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"vocab": self.vocab}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("vocab")
        if saved is not None and saved != self.vocab:
            raise ValueError(f"the checkpoint was trained on a different vocabulary ({len(saved)} characters) than "
                             f"this data ({self.vocab_size}); {self.VOCAB_HINT}")
        super().load_state_dict(state)


class CharDataModule(CharVocabulary, WindowDataModule):
    """Character-level language modelling on one text.

    The vocabulary is every distinct character of the whole text; the text is split train | val | test in that
    order: the last test_fraction of the characters is the test split (none by default), the val_fraction before
    it validates, and the rest trains.

    Args:
        path: a UTF-8 text file.
        url: a text file to download once into `cache_dir` (used if `path` is not given).
            With neither, the default corpus (`default_corpus`) is used.
        block_size: context length (the CLI links it from model.block_size).
        batch_size: windows per batch (per device).
        val_fraction: fraction of the text held out for validation, just before the test split.
        test_fraction: trailing fraction of the text held out for a test split, scored once at the end of fit
            (0: none; `test` then scores the validation split).
        stride: train windows start every `stride` characters (1 = every offset).
        val_stride: validation window spacing; default block_size (non-overlapping).
        num_workers: DataLoader worker processes.
        seed: shuffling seed; the train order depends only on (seed, epoch). None: the run's
            seed_everything (main.py writes the number into the run's config).
        cache_dir: where downloads are kept (default ~/.cache/lit_attn, or $LIT_ATTN_CACHE).
    """

    def __init__(
        self,
        path: str | None = None,
        url: str | None = None,
        block_size: PositiveInt = 128,
        batch_size: PositiveInt = 16,
        val_fraction: OpenUnitInterval = 0.1,
        test_fraction: UnitInterval = 0.0,
        stride: PositiveInt = 1,
        val_stride: PositiveInt | None = None,
        num_workers: NonNegativeInt = 0,
        seed: Seed | None = None,
        cache_dir: str | None = None,
    ):
        check_bounds(CharDataModule.__init__, locals())
        if val_fraction + test_fraction >= 1:
            raise ValueError(f"--data.val_fraction {val_fraction} and --data.test_fraction {test_fraction} leave no "
                             f"text to train on; their sum must be below 1")
        super().__init__(block_size, batch_size, stride, val_stride, num_workers, seed)
        if path is not None and not Path(path).expanduser().is_file():
            raise FileNotFoundError(f"text file not found: {path}; check --data.path")
        self.save_hyperparameters()
        self.path = path
        self.url = url
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else DEFAULT_CACHE / "text"

    @cached_property
    def text(self) -> str:
        if self.path is not None:
            return read_text(self.path)
        if self.url is not None:
            return read_text(download(self.url, self.cache_dir))
        return default_corpus()

    @property
    def data_identity(self) -> str:
        """The text's file name (its URL, or "default corpus"), the first 12 hex digits of the SHA-256 of its
        content, and the validation split (and the test split, where there is one)."""
        source = Path(self.path).name if self.path else self.url or "default corpus (pydoc topics)"
        digest = hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:12]
        test = f", test_fraction={self.test_fraction}" if self.has_test_split else ""
        return f"{type(self).__name__}({source}, sha256 {digest}, val_fraction={self.val_fraction}{test})"

    @property
    def has_test_split(self) -> bool:
        return self.test_fraction > 0

    @cached_property
    def _encoded(self) -> tuple[str, np.ndarray]:
        # UTF-32 turns the text into one integer per character without a Python loop.
        codepoints = np.frombuffer(self.text.encode("utf-32-le"), dtype=np.uint32)
        vocab, ids = np.unique(codepoints, return_inverse=True)
        if len(vocab) < 2:
            source = self.path or self.url or "the corpus"
            raise ValueError(
                f"{source} has only one distinct character ({chr(vocab[0])!r}); a language model needs at least two; "
                f"use a real text with --data.path"
            )
        # The text is first read here, when the CLI asks for the vocabulary before it builds the model:
        # a context longer than the validation split, which every stage serves, or than the test split, which
        # the end of fit scores, is refused before that.
        n_train, n_val_end = self._bounds(len(ids))
        check_context(n_val_end - n_train, self.block_size, "val")
        if self.has_test_split:
            check_context(len(ids) - n_val_end, self.block_size, "test")
        dtype = np.uint16 if len(vocab) <= 2**16 else np.uint32
        return "".join(map(chr, vocab.tolist())), ids.astype(dtype)

    def _bounds(self, n_tokens: int) -> tuple[int, int]:
        """Where the val and the test split start: the train split is the first (1 - val_fraction -
        test_fraction) of the text, the test split its last test_fraction."""
        return (int(n_tokens * (1.0 - self.val_fraction - self.test_fraction)),
                int(n_tokens * (1.0 - self.test_fraction)))

    @property
    def vocab(self) -> str:
        """The characters, in token-id order."""
        return self._encoded[0]

    def load_tokens(self, split: str) -> np.ndarray:
        ids = self._encoded[1]
        n_train, n_val_end = self._bounds(len(ids))
        return {"train": ids[:n_train], "val": ids[n_train:n_val_end], "test": ids[n_val_end:]}[split]

