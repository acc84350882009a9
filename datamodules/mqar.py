"""Multi-query associative recall (MQAR): the synthetic recall task of Zoology (Arora, Eyuboglu et al. 2023,
"Zoology: Measuring and improving recall in efficient language models"), drawn as its `multiquery_ar` draws it.

An example of input_seq_len tokens opens with num_kv_pairs key-value pairs, k1 v1 k2 v2 ..., keys drawn
without replacement from [1, V/2) and values without replacement from [V/2, V). Pair j is queried once,
at position 2*num_kv_pairs + 2*(g_j - 1): its key is the input there and its value the label there, so the
model must name the value when it reads the key. The gaps g_1, g_2, ... are drawn in turn, without
replacement, from {1, ..., (input_seq_len - 2*num_kv_pairs) // 2} with p(g) ∝ a*g^(a-1), a = power_a (a = 1 is
uniform; Zoology's 0.01 puts most queries near the pairs). Every other position (the filler) holds a token drawn
uniformly from the whole vocabulary [0, V) (Zoology's default, random_non_queries=True), or 0 with random_filler
False (Zoology's Figure 2, random_non_queries=False); its label is IGNORE_INDEX.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lit_attn.bounds import NonNegativeInt, PositiveFloat, PositiveInt, Seed, check_bounds
from lit_attn.config import VocabSize
from lit_attn.transformer import IGNORE_INDEX

from .examples import ExampleDataModule, SliceBatches

# First words of the random streams; a test slice's stream is (seed, TEST, slice index), a held-out one's
# (seed, HELDOUT, slice index).
TRAIN, TEST, HELDOUT = 0, 1, 2


def check_setting(input_seq_len: int, num_kv_pairs: int, vocab_size: int, where: str = "") -> None:
    """Raise a one-line ValueError unless examples of this length, pair count and vocabulary can be drawn."""
    if not isinstance(num_kv_pairs, int) or num_kv_pairs < 1:
        raise ValueError(f"{where}num_kv_pairs must be a positive integer, got {num_kv_pairs!r}")
    if not isinstance(input_seq_len, int) or input_seq_len < 1 or input_seq_len % 2:
        raise ValueError(f"{where}input_seq_len must be a positive even integer (as in Zoology), "
                         f"got {input_seq_len!r}")
    if 4 * num_kv_pairs > input_seq_len:
        raise ValueError(
            f"{where}input_seq_len {input_seq_len} cannot hold {num_kv_pairs} key-value pairs and their queries "
            f"(it needs 4*num_kv_pairs = {4 * num_kv_pairs} tokens); lower {where}num_kv_pairs to at most "
            f"{input_seq_len // 4} or raise {where}input_seq_len"
        )
    if vocab_size // 2 - 1 < num_kv_pairs:
        raise ValueError(
            f"--data.vocab_size {vocab_size} has {max(vocab_size // 2 - 1, 0)} keys ([1, {vocab_size // 2})), "
            f"fewer than {where}num_kv_pairs {num_kv_pairs}; raise --data.vocab_size to at least {2 * num_kv_pairs + 2}"
        )
    if vocab_size <= input_seq_len:  # Zoology's generator asserts vocab_size > input_seq_len
        raise ValueError(f"--data.vocab_size {vocab_size} must be greater than {where}input_seq_len {input_seq_len} "
                         f"(as in Zoology); raise --data.vocab_size or lower {where}input_seq_len")


def power_law(space: int, power_a: float) -> np.ndarray:
    """p(g) ∝ power_a * g**(power_a - 1) for the gaps g = 1..space, as index g - 1."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def distinct(rng: np.random.Generator, n: int, population: int, k: int) -> np.ndarray:
    """(n, k) int64: per row, k distinct numbers of [0, population) in random order (uniform over ordered draws).

    Floyd's algorithm, one column for all rows at a time: O(n*k^2), independent of the population.
    """
    chosen = np.empty((n, k), dtype=np.int64)
    for i, top in enumerate(range(population - k, population)):
        t = rng.integers(0, top + 1, size=n)
        taken = (chosen[:, :i] == t[:, None]).any(axis=1)
        chosen[:, i] = np.where(taken, top, t)  # `top` is new to the row: earlier picks were < top
    return np.take_along_axis(chosen, np.argsort(rng.random((n, k)), axis=1), axis=1)


def draw_gaps(rng: np.random.Generator, n: int, p: np.ndarray, k: int, chunk: int = 8192) -> np.ndarray:
    """(n, k) int64 gap indices (g - 1): k draws in turn without replacement, each ∝ p over those left.

    The order of the k largest of log p + Gumbel noise is exactly that sequence of draws (Plackett-Luce),
    which is what numpy's `choice(replace=False, p=p)` draws row by row in Zoology.
    """
    out = np.empty((n, k), dtype=np.int64)
    log_p = np.log(p)
    for start in range(0, n, chunk):  # bounds the (rows, space) noise matrix for long sequences
        scores = log_p + rng.gumbel(size=(min(chunk, n - start), len(p)))
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < len(p) else np.argsort(-scores, axis=1)
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[start : start + len(top)] = np.take_along_axis(top, order, axis=1)
    return out


def mqar_examples(rng: np.random.Generator, n: int, input_seq_len: int, num_kv_pairs: int, vocab_size: int,
                  power_a: float, random_filler: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """`n` MQAR examples: inputs and labels, (n, input_seq_len) int64, labels IGNORE_INDEX off the queries; the
    filler drawn from [0, vocab_size), or 0 if not `random_filler`."""
    check_setting(input_seq_len, num_kv_pairs, vocab_size)
    half, context = vocab_size // 2, 2 * num_kv_pairs
    keys = 1 + distinct(rng, n, half - 1, num_kv_pairs)
    values = half + distinct(rng, n, vocab_size - half, num_kv_pairs)
    gaps = draw_gaps(rng, n, power_law((input_seq_len - context) // 2, power_a), num_kv_pairs)
    # The filler is the last draw: keys, values and gaps come out the same with zero filler as with random.
    inputs = (rng.integers(0, vocab_size, size=(n, input_seq_len), dtype=np.int64) if random_filler
              else np.zeros((n, input_seq_len), dtype=np.int64))
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
    rows, queries = np.arange(n)[:, None], context + 2 * gaps
    inputs[rows, queries] = keys
    labels = np.full((n, input_seq_len), IGNORE_INDEX, dtype=np.int64)
    labels[rows, queries] = values
    return inputs, labels


def drop_rows_in(inputs: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Indices of the rows of `inputs` that are not a row of `other` (same width), in order."""
    if other.shape[1] != inputs.shape[1] or not len(other):
        return np.arange(len(inputs))
    seen = {row.tobytes() for row in other}
    mixer = np.random.default_rng(0).integers(1, 2**62, size=inputs.shape[1], dtype=np.uint64) | np.uint64(1)
    # A wrapping dot product narrows the candidates to rows whose hash a test row has; bytes decide.
    def hashes(rows: np.ndarray) -> np.ndarray:
        return (rows.astype(np.uint64) * mixer).sum(axis=1, dtype=np.uint64)

    candidates = np.flatnonzero(np.isin(hashes(inputs), hashes(other)))
    clash = [i for i in candidates if inputs[i].tobytes() in seen]
    return np.setdiff1d(np.arange(len(inputs)), clash)


class MQARExamples(Dataset):
    """Examples as (x, y) int64 pairs of input_seq_len tokens; `__getitems__` gathers a whole batch."""

    def __init__(self, inputs: np.ndarray, labels: np.ndarray):
        self.inputs, self.labels = torch.from_numpy(inputs), torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.labels[i]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.inputs[index], self.labels[index]


class MQARDataModule(ExampleDataModule):
    """MQAR examples for lit_attn.GPT: train batches (x, y), validation batches (x, y, slice_index).

    Train and test are drawn from separate random streams of `seed`, and train examples equal to a test
    example are dropped, so no test example is seen in training. With num_heldout_examples, a held-out test set
    of the same slices is drawn from a stream of its own (and kept out of training too): the validation examples
    choose (early stopping, a grid's best point), the held-out ones are scored once, at the end of fit.
    Everything is drawn in memory, in seconds.

    Args:
        input_seq_len: tokens per training example.
        num_kv_pairs: key-value pairs per training example.
        num_train_examples: training examples (before dropping any that equal a test example).
        num_test_examples: test examples per test slice.
        num_heldout_examples: held-out test examples per test slice, scored once at the end of fit (0: none).
        vocab_size: V, greater than every input_seq_len; keys come from [1, V/2), values from [V/2, V), filler
            from [0, V).
        power_a: a of the query gaps' power law p(g) ∝ a*g^(a-1) (1 = uniform).
        random_filler: the positions that are not a key, a value or a query hold tokens drawn from [0, V) (Zoology's
            default); False: they hold 0, as in Zoology's Figure 2 (its random_non_queries=False).
        test_settings: test slices as [input_seq_len, num_kv_pairs] pairs, e.g. [[64, 4], [128, 8]];
            default one slice of the training setting. Validation batches carry the slice's index.
        block_size: the model's context (the CLI links it from model.block_size); at least every
            slice's input_seq_len.
        batch_size: examples per batch (per device), train and test.
        num_workers: DataLoader worker processes.
        seed: the data's seed: the examples and the train order. None: the run's seed_everything.
    """

    def __init__(
        self,
        input_seq_len: PositiveInt = 64,
        num_kv_pairs: PositiveInt = 4,
        num_train_examples: PositiveInt = 100_000,
        num_test_examples: PositiveInt = 3_000,
        num_heldout_examples: NonNegativeInt = 0,
        vocab_size: VocabSize = 8192,
        power_a: PositiveFloat = 0.01,
        random_filler: bool = True,
        test_settings: list[tuple[int, int]] | None = None,
        block_size: PositiveInt = 64,
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        seed: Seed | None = 0,
    ):
        check_bounds(MQARDataModule.__init__, locals())
        super().__init__(block_size, batch_size, num_workers, seed)
        self.save_hyperparameters()
        check_setting(input_seq_len, num_kv_pairs, vocab_size, "--data.")
        settings = [(input_seq_len, num_kv_pairs)] if test_settings is None else [
            tuple(s) if isinstance(s, (list, tuple)) else (s,) for s in test_settings]
        if not settings or any(len(s) != 2 for s in settings):
            raise ValueError(f"--data.test_settings must be [input_seq_len, num_kv_pairs] pairs, "
                             f"e.g. [[64, 4], [128, 8]], got {test_settings!r}")
        for i, (length, pairs) in enumerate(settings):
            check_setting(length, pairs, vocab_size, f"--data.test_settings[{i}] ")
        longest = max([input_seq_len, *(length for length, _ in settings)])
        if block_size < longest:
            raise ValueError(f"--model.block_size {block_size} is shorter than the longest MQAR sequence "
                             f"({longest} tokens); raise --model.block_size to at least {longest}")
        self.input_seq_len, self.num_kv_pairs, self.power_a = input_seq_len, num_kv_pairs, float(power_a)
        self.random_filler = random_filler
        self.num_train_examples, self.num_test_examples = num_train_examples, num_test_examples
        self.num_heldout_examples = num_heldout_examples
        self._vocab_size, self.test_settings = vocab_size, settings
        self._test: list[MQARExamples] | None = None
        self._heldout: list[MQARExamples] | None = None

    @staticmethod
    def memory_needed(input_seq_len: int = 64, num_train_examples: int = 100_000, num_test_examples: int = 3_000,
                      test_settings: list[tuple[int, int]] | None = None, num_heldout_examples: int = 0,
                      **_: Any) -> tuple[int, str]:
        """(bytes, the flags that set them) that drawing the examples needs at its peak: the train examples'
        inputs and labels and the two uint64 copies the duplicate check makes of them, and every test setting's
        test and held-out inputs and labels (int64 each)."""
        lengths = [s[0] for s in test_settings if isinstance(s, (list, tuple)) and s] if test_settings else []
        lengths = [n for n in lengths if isinstance(n, int)] or [input_seq_len]
        evaluated = num_test_examples + (num_heldout_examples if isinstance(num_heldout_examples, int) else 0)
        need = num_train_examples * input_seq_len * 4 * 8 + evaluated * sum(lengths) * 2 * 8
        return need, (f"--data.num_train_examples {num_train_examples} and --data.num_test_examples "
                      f"{num_test_examples} of {input_seq_len}-token sequences")

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def _draw(self, stream: tuple[int, ...], n: int, length: int, pairs: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, *stream])
        return mqar_examples(rng, n, length, pairs, self.vocab_size, self.power_a, self.random_filler)

    @property
    def slice_names(self) -> list[str]:
        """One name per test slice, by slice index: "T{input_seq_len}_kv{num_kv_pairs}", e.g. "T64_kv4"."""
        return [f"T{length}_kv{pairs}" for length, pairs in self.test_settings]

    def test_slices(self) -> list[MQARExamples]:
        """One MQARExamples per test setting, in `test_settings` order (drawn once)."""
        if self._test is None:
            self._test = [MQARExamples(*self._draw((TEST, i), self.num_test_examples, length, pairs))
                          for i, (length, pairs) in enumerate(self.test_settings)]
        return self._test

    @property
    def has_test_split(self) -> bool:
        return self.num_heldout_examples > 0

    def heldout_slices(self) -> list[MQARExamples]:
        """One MQARExamples of num_heldout_examples per test setting, from the held-out stream (drawn once)."""
        if self._heldout is None:
            self._heldout = [MQARExamples(*self._draw((HELDOUT, i), self.num_heldout_examples, length, pairs))
                             for i, (length, pairs) in enumerate(self.test_settings)]
        return self._heldout

    def train_examples(self) -> MQARExamples:
        """The training examples, less any that equal a test or held-out example."""
        inputs, labels = self._draw((TRAIN,), self.num_train_examples, self.input_seq_len, self.num_kv_pairs)
        keep = np.arange(len(inputs))
        for part in self.test_slices() + (self.heldout_slices() if self.has_test_split else []):
            keep = keep[drop_rows_in(inputs[keep], part.inputs.numpy())]
        return MQARExamples(inputs[keep], labels[keep])

    def build_train_set(self) -> Dataset:
        return self.train_examples()

    def build_val_set(self) -> Dataset:
        return SliceBatches(self.test_slices(), self.batch_size)

    def build_test_set(self) -> Dataset:
        return SliceBatches(self.heldout_slices(), self.batch_size)

    @property
    def data_identity(self) -> str:
        # Random filler, the default, goes unnamed: runs from before the option existed name the same data alike.
        return super().data_identity.replace("random_filler=True, ", "")

    def drawing(self) -> tuple[str, tuple]:
        # Zero filler and a held-out set alone add to the settings: the default's fingerprint, and its runs' resumes,
        # stay as they were.
        return "mqar", (self.seed, self.input_seq_len, self.num_kv_pairs, self.num_train_examples,
                        self.num_test_examples, self.vocab_size, self.power_a, self.test_settings,
                        *(() if self.random_filler else ("zero filler",)),
                        *((("heldout", self.num_heldout_examples),) if self.has_test_split else ()))
