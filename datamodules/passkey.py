"""Passkey retrieval as a training task: the probe's prompt (lit_attn.passkey), character by character, with the
loss on the answer only.

An example is `passkey_prompt`'s text at a random length (min_length..block_size characters, prompt and answer
together) with the key sentence at a random depth (uniform in [0, 1], snapped to a sentence boundary), followed by
the answer " 12345". The model reads the example shifted by one, as any language model; the targets are the
answer's 6 characters (the space and the 5 digits) and IGNORE_INDEX everywhere else, so the loss and the accuracy
are the retrieval's alone (and `--model.sparse_targets true` runs the LM head on those 6 positions only). An
example shorter than the window is padded on the right with spaces that nothing reads (attention is causal).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import torch
from torch.utils.data import Dataset

from lit_attn.bounds import NonNegativeInt, PositiveInt, Seed, check_bounds
from lit_attn.codec import CharCodec
from lit_attn.passkey import KEY_RANGE, passkey_answer, passkey_chars, passkey_minimum, passkey_prompt
from lit_attn.transformer import IGNORE_INDEX

from .char import CharVocabulary
from .examples import ExampleDataModule, SliceBatches
from .mqar import MQARExamples

TRAIN, VAL = 0, 1  # first words of the random streams: example i of a split is drawn from (seed, split, i)


def draw_example(codec: CharCodec, rng: np.random.Generator, min_length: int, block_size: int,
                 avoid: frozenset[int] = frozenset()) -> tuple[np.ndarray, np.ndarray, int]:
    """One example: (x, y) int64 of block_size tokens and its key (a 5-digit number not in `avoid`)."""
    length = int(rng.integers(min_length, block_size + 1))
    depth = float(rng.random())
    key = int(rng.integers(KEY_RANGE[0], KEY_RANGE[1] + 1))
    while key in avoid:  # the validation keys: training never sees them
        key = int(rng.integers(KEY_RANGE[0], KEY_RANGE[1] + 1))
    prompt, _ = passkey_prompt(codec, length, depth, str(key))
    answer = codec.encode(passkey_answer(str(key)))
    ids = prompt + answer  # `length` tokens
    x = np.full(block_size, codec.index[" "], dtype=np.int64)
    y = np.full(block_size, IGNORE_INDEX, dtype=np.int64)
    x[: length - 1] = ids[:-1]
    y[len(prompt) - 1 : length - 1] = answer  # the targets of the last prompt token and the answer's own
    return x, y, key


class PasskeyExamples(Dataset):
    """`n` training examples drawn when asked: item i is the same (x, y) every time, from (seed, TRAIN, i)."""

    def __init__(self, codec: CharCodec, n: int, seed: int, min_length: int, block_size: int,
                 avoid: frozenset[int]):
        self.codec, self.n, self.seed, self.avoid = codec, n, seed, avoid
        self.min_length, self.block_size = min_length, block_size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(f"example {i} out of range [0, {self.n})")
        rng = np.random.default_rng([self.seed, TRAIN, i])
        x, y, _ = draw_example(self.codec, rng, self.min_length, self.block_size, self.avoid)
        return torch.from_numpy(x), torch.from_numpy(y)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self[i] for i in indices]
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


class PasskeyDataModule(CharVocabulary, ExampleDataModule):
    """Passkey retrieval examples for lit_attn.GPT: train batches (x, y), validation batches (x, y, slice_index).

    Character-level over the characters of the passkey text (`lit_attn.passkey.passkey_chars`), stored in the
    checkpoint as a char run's vocabulary, so `lit-attn sample` and `lit-attn probe --probes passkey` read the
    run. Train and validation examples come from separate random streams of `seed`, and no training example
    holds a validation key. callbacks.recall logs `val/passkey_acc`, the accuracy on the answer characters, and
    `val/passkey_exact`, the share of validation examples whose whole answer is right (what the probe scores).

    Args:
        min_length: the shortest example, prompt and answer, in characters; default the shortest prompt
            (no filler, 79). Lengths are uniform in min_length..block_size.
        num_train_examples: training examples (an epoch); each is drawn when the loader asks for it.
        num_val_examples: validation examples (drawn once).
        block_size: the model's context (the CLI links it from model.block_size): the longest example.
        batch_size: examples per batch (per device), train and validation.
        num_workers: DataLoader worker processes.
        seed: the data's seed: the examples and the train order. None: the run's seed_everything.
    """

    VOCAB_HINT = "it is not a run of this passkey data"

    recall_metric = "val/passkey_acc"  # the name callbacks.recall logs the answer characters' accuracy under
    exact_metric = "val/passkey_exact"  # and the share of examples with the whole answer right
    slice_names = ("passkey",)  # one validation set: only the overall accuracies are logged

    def __init__(
        self,
        min_length: int | None = None,
        num_train_examples: PositiveInt = 200_000,
        num_val_examples: PositiveInt = 512,
        block_size: PositiveInt = 128,
        batch_size: PositiveInt = 32,
        num_workers: NonNegativeInt = 0,
        seed: Seed | None = 0,
    ):
        check_bounds(PasskeyDataModule.__init__, locals())
        super().__init__(block_size, batch_size, num_workers, seed)
        self.save_hyperparameters()
        shortest = passkey_minimum(self.codec)
        if block_size < shortest:
            raise ValueError(f"--model.block_size {block_size} is shorter than a passkey prompt and its answer "
                             f"({shortest} characters without filler); raise --model.block_size to at least {shortest}")
        min_length = shortest if min_length is None else min_length
        if not isinstance(min_length, int) or not shortest <= min_length <= block_size:
            raise ValueError(f"--data.min_length must be an integer from {shortest} (a prompt without filler) to "
                             f"--model.block_size {block_size}, got {min_length!r}")
        self.min_length = min_length
        self.num_train_examples, self.num_val_examples = num_train_examples, num_val_examples

    @cached_property
    def vocab(self) -> str:
        """The characters, in token-id order."""
        return passkey_chars()

    @cached_property
    def _val(self) -> tuple[MQARExamples, frozenset[int]]:
        drawn = [draw_example(self.codec, np.random.default_rng([self.seed, VAL, i]), self.min_length,
                              self.block_size) for i in range(self.num_val_examples)]
        inputs, labels, keys = (np.stack([d[k] for d in drawn]) for k in range(3))
        return MQARExamples(inputs, labels), frozenset(keys.tolist())

    def val_examples(self) -> MQARExamples:
        """The validation examples, (x, y) pairs of block_size tokens (drawn once)."""
        return self._val[0]

    def train_examples(self) -> PasskeyExamples:
        """The training examples, none holding a validation key."""
        return PasskeyExamples(self.codec, self.num_train_examples, self.seed, self.min_length, self.block_size,
                               self._val[1])

    def build_train_set(self) -> Dataset:
        return self.train_examples()

    def build_val_set(self) -> Dataset:
        return SliceBatches([self.val_examples()], self.batch_size)

    def drawing(self) -> tuple[str, tuple]:
        return "passkey", (self.seed, self.min_length, self.block_size, self.num_train_examples,
                           self.num_val_examples, self.vocab)
