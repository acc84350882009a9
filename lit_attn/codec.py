"""Text <-> token ids: one codec abstraction for training data, samples and the sampling tool.

A codec has `encode(text) -> list[int]`, `decode(ids) -> str`, `eot_id` (the end-of-text id,
None when there is none, as for characters) and `vocab_size`. `CharCodec` maps each character
of a vocabulary string to its index; `BPECodec` wraps a `tokenizers` JSON file. A checkpoint
records which one its ids mean (`codec_from_checkpoint`). Tool-level: no Lightning, no datamodules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

EOT = "<|endoftext|>"


class Codec(Protocol):
    eot_id: int | None
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def one_line(message: object, limit: int = 300) -> str:
    """First line of an error message, shortened, for one-line errors that wrap a library's."""
    lines = str(message).strip().splitlines() or [""]
    line = lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


class CharCodec:
    """Characters of `vocab` in token-id order; encoding a character outside it is a ValueError."""

    eot_id = None

    def __init__(self, vocab: str):
        self.vocab = vocab
        self.index = {c: i for i, c in enumerate(vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        missing = sorted(set(text) - self.index.keys())
        if missing:
            raise ValueError(f"characters not in the vocabulary: {''.join(missing)!r}")
        return [self.index[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


class BPECodec:
    """A `tokenizers.Tokenizer`. Special tokens in text are encoded as plain text (an article that
    contains "<|endoftext|>" is not split there), and decoding keeps them visible."""

    def __init__(self, tokenizer):
        # Not part of the serialized tokenizer: set again on every loaded (or unpickled) copy.
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | Path, fix: str = "") -> BPECodec:
        """Load a tokenizer.json; a file that is not one is a one-line ValueError ending in `; fix`."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a plain Exception for unparsable files
            hint = f"; {fix}" if fix else ""
            raise ValueError(f"{path} is not a tokenizers JSON file ({one_line(e, 120)}){hint}") from None
        return cls(tokenizer)

    @property
    def eot_id(self) -> int | None:
        return self.tokenizer.token_to_id(EOT)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        # End-of-text tokens stay visible, so generated samples show document boundaries.
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def codec_from_checkpoint(ckpt: dict[str, Any]) -> CharCodec | BPECodec:
    """The codec of a checkpoint's datamodule state: a CharDataModule's `vocab` string or a
    WikipediaDataModule's `tokenizer` {path, sha256, size}. One-line ValueErrors otherwise."""
    for key, state in ckpt.items():
        if not (isinstance(key, str) and key.endswith("DataModule") and isinstance(state, dict)):
            continue
        if isinstance(state.get("vocab"), str):
            return CharCodec(state["vocab"])
        if isinstance(state.get("tokenizer"), dict):
            path = Path(str(state["tokenizer"].get("path", "")))
            if not path.is_file():
                raise ValueError(
                    f"the checkpoint's tokenizer file {path} does not exist; it must be where the run left it"
                )
            try:
                return BPECodec.from_file(path)
            except ValueError as e:
                raise ValueError(f"tokenizer {e}") from None
    raise ValueError(
        "the checkpoint has no vocabulary or tokenizer (no CharDataModule vocab or WikipediaDataModule tokenizer)"
    )
