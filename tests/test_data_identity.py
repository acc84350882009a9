"""What a run records about its data (datamodules' data_identity, logged as hparams.yaml's `data` and the HParams
tab's Data column): the same for settings that only shape the batches, different for other data."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from datamodules import CharDataModule, MQARDataModule, WikipediaDataModule


def _text(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


TEXT = "the quick brown fox jumps over the lazy dog. " * 20

# (how the datamodule is made from a directory, the identity it records)
IDENTITIES = [
    (lambda d: CharDataModule(path=_text(d / "a.txt", TEXT)),
     f"CharDataModule(a.txt, sha256 {_sha(TEXT)}, val_fraction=0.1)"),
    (lambda d: CharDataModule(path=_text(d / "a.txt", TEXT + "!")),
     f"CharDataModule(a.txt, sha256 {_sha(TEXT + '!')}, val_fraction=0.1)"),
    (lambda d: CharDataModule(path=_text(d / "a.txt", TEXT), val_fraction=0.2),
     f"CharDataModule(a.txt, sha256 {_sha(TEXT)}, val_fraction=0.2)"),
    (lambda d: CharDataModule(path=_text(d / "a.txt", TEXT), test_fraction=0.1),
     f"CharDataModule(a.txt, sha256 {_sha(TEXT)}, val_fraction=0.1, test_fraction=0.1)"),
    (lambda d: WikipediaDataModule(), "WikipediaDataModule(data_files=None, dataset=wikimedia/wikipedia, "
     "dataset_config=20231101.en, tokenizer=None, tokenizer_max_chars=300000000, train_fraction=0.45, "
     "val_fraction=0.05, vocab_size=10000)"),
    (lambda d: WikipediaDataModule(dataset_config="20231101.fr", train_fraction=0.9),
     "WikipediaDataModule(data_files=None, dataset=wikimedia/wikipedia, dataset_config=20231101.fr, tokenizer=None, "
     "tokenizer_max_chars=300000000, train_fraction=0.9, val_fraction=0.05, vocab_size=10000)"),
    (lambda d: MQARDataModule(), "MQARDataModule(input_seq_len=64, num_kv_pairs=4, num_test_examples=3000, "
     "num_train_examples=100000, power_a=0.01, test_settings=None, vocab_size=8192)"),
]


@pytest.mark.parametrize(("make", "identity"), IDENTITIES)
def test_the_data_is_named_by_its_file_and_content_or_its_dataset_and_split(make, identity, tmp_path):
    dm = make(tmp_path)
    assert dm.data_identity == identity
    assert dm.hparams_initial["data"] == identity  # what Lightning logs into hparams.yaml
    assert "data" not in dm.hparams  # a checkpoint's datamodule hyperparameters stay its constructor's


def test_the_default_corpus_is_named_and_hashed():
    dm = CharDataModule()
    expected = f"CharDataModule(default corpus (pydoc topics), sha256 {_sha(dm.text)}, val_fraction=0.1)"
    assert dm.data_identity == expected


# Settings that shape the batches, not the data: a run with other values trained on the same data.
SAME_DATA = [dict(batch_size=4), dict(seed=7), dict(stride=3), dict(block_size=8), dict(num_workers=1),
             dict(val_stride=4), dict(cache_dir="elsewhere")]


@pytest.mark.parametrize("change", SAME_DATA, ids=lambda c: next(iter(c)))
def test_batch_settings_leave_the_data_as_it_is(change, tmp_path):
    path = _text(tmp_path / "a.txt", TEXT)
    assert CharDataModule(path=path, **change).data_identity == CharDataModule(path=path).data_identity
    assert MQARDataModule(**{k: v for k, v in change.items() if k in ("batch_size", "seed", "num_workers")}
                          ).data_identity == MQARDataModule().data_identity
