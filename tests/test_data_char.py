import numpy as np
import pytest
import torch
from helpers import one_line_error

from datamodules import CharDataModule, TokenWindows, WindowSampler
from datamodules.char import default_corpus
from datamodules.windows import WindowLoader, check_batches, check_context, check_share, collate_windows


def test_vocab_is_known_right_after_construction(corpus):
    dm = CharDataModule(path=str(corpus), block_size=16)
    text = corpus.read_text(encoding="utf-8")
    assert dm.vocab_size == len(set(text))
    assert dm.train_set is None  # nothing was set up to answer that
    assert "日" in dm.vocab and "é" in dm.vocab


def test_encode_decode_round_trip(corpus):
    dm = CharDataModule(path=str(corpus), block_size=16)
    sample = "Straße café 日本語."
    assert dm.decode(dm.encode(sample)) == sample
    with pytest.raises(ValueError, match="not in the vocabulary"):
        dm.encode("€")


def test_splits_are_head_and_tail_of_the_text(corpus):
    dm = CharDataModule(path=str(corpus), block_size=16, val_fraction=0.2)
    text = corpus.read_text(encoding="utf-8")
    train, val = dm.load_tokens("train"), dm.load_tokens("val")
    assert len(train) + len(val) == len(text) and len(val) == len(text) - int(len(text) * 0.8)
    assert dm.decode(train[:50].tolist()) == text[:50]
    assert dm.decode(val[-50:].tolist()) == text[-50:]
    assert train.dtype == np.uint16


@pytest.mark.parametrize("val_fraction,test_fraction,sizes", [
    (0.2, 0.0, (800, 200, 0)),  # no test split: the default, whose split is as it always was
    (0.2, 0.1, (700, 200, 100)),
    (0.15, 0.25, (600, 150, 250)),
])
def test_the_text_splits_train_val_test_in_order(val_fraction, test_fraction, sizes, tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("".join(chr(ord("a") + i % 26) for i in range(1000)))
    dm = CharDataModule(path=str(text), block_size=8, val_fraction=val_fraction, test_fraction=test_fraction)
    splits = [dm.load_tokens(split) for split in ("train", "val", "test")]
    assert tuple(map(len, splits)) == sizes
    assert dm.decode(np.concatenate(splits).tolist()) == text.read_text()  # head to tail, nothing left out
    assert dm.has_test_split == (test_fraction > 0)


def test_the_test_loader_serves_the_test_split_where_there_is_one(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("".join(chr(ord("a") + i % 26) for i in range(1000)))
    held_out = CharDataModule(path=str(text), block_size=8, batch_size=2, test_fraction=0.1)
    held_out.setup("test")
    x, _ = next(iter(held_out.test_dataloader()))
    assert held_out.decode(x[0].tolist()) == text.read_text()[900:908]  # the last tenth
    plain = CharDataModule(path=str(text), block_size=8, batch_size=2)
    plain.setup("test")
    x, _ = next(iter(plain.test_dataloader()))
    assert plain.test_set is None and plain.decode(x[0].tolist()) == text.read_text()[900:908]  # the val split
    assert held_out.fingerprint() != CharDataModule(path=str(text), block_size=8, val_fraction=0.1).fingerprint()


@pytest.mark.parametrize("kwargs,message", [
    (dict(val_fraction=0.5, test_fraction=0.5), "--data.val_fraction 0.5 and --data.test_fraction 0.5 leave no text "
                                                "to train on; their sum must be below 1"),
    (dict(test_fraction=1.5), "test_fraction"),
    (dict(block_size=10, test_fraction=0.01), "the test split has 10 tokens, fewer than block_size+1 = 11; lower "
                                              "--model.block_size to at most 9, raise --data.test_fraction or use "
                                              "more data"),
])
def test_a_test_split_that_cannot_work_is_refused(kwargs, message, tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("abcdefghij" * 100)
    assert message in one_line_error(lambda: CharDataModule(path=str(text), **kwargs).vocab_size)


def test_windows_are_shifted_by_one():
    tokens = np.arange(100, dtype=np.uint16)
    ds = TokenWindows(tokens, block_size=8, stride=1)
    assert len(ds) == 92
    x, y = ds[91]
    assert x.dtype == torch.int64 and torch.equal(x + 1, y) and y[-1].item() == 99
    ds = TokenWindows(tokens, block_size=8, stride=8)
    assert len(ds) == 12 and ds[1][0][0].item() == 8
    with pytest.raises(IndexError):
        ds[12]


def test_block_size_larger_than_split_is_an_error():
    with pytest.raises(ValueError, match="the val split has 10 tokens, fewer than block_size\\+1 = 17"):
        TokenWindows(np.arange(10), block_size=16, split="val")


def test_sampler_order_depends_only_on_seed_and_epoch():
    ds = TokenWindows(np.arange(200), block_size=4)
    a, b = WindowSampler(ds, seed=3), WindowSampler(ds, seed=3)
    assert list(a) == list(b) and len(a) == len(ds) == len(list(a))
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert sorted(a) == list(range(len(ds)))


def test_sampler_resumes_mid_epoch():
    ds = TokenWindows(np.arange(200), block_size=4)
    full = WindowSampler(ds, seed=7)
    full.set_epoch(2)
    order = list(full)
    it = iter(full)
    for _ in range(37):
        next(it)
    state = full.state_dict()
    assert state["epoch"] == 2 and state["index"] == 37
    resumed = WindowSampler(ds, seed=7)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert list(resumed) == order[37:]
    assert len(resumed) == len(order)  # still the full epoch, so schedules do not shift
    assert list(resumed) == order  # the next pass is whole again


@pytest.mark.parametrize("workers", [0, 2])
def test_train_loader_resumes_after_the_batches_it_handed_out(workers):
    """Workers fetch ahead of the batches trained on; the saved position is where training stopped."""
    ds = TokenWindows(np.arange(400), block_size=4, stride=4)  # 99 windows: 12 batches of 8
    def loader():
        return WindowLoader(ds, WindowSampler(ds, seed=5), batch_size=8, drop_last=True, num_workers=workers,
                            collate_fn=collate_windows)

    full = loader()
    full.sampler.set_epoch(1)
    batches = [x for x, _ in full]
    it = iter(full)
    for _ in range(5):
        next(it)
    state = full.state_dict()
    assert state == {"epoch": 1, "index": 40, "seed": 5, "num_replicas": 1}
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)
    rest = [x for x, _ in resumed]
    assert len(rest) == 7 and all(torch.equal(a, b) for a, b in zip(rest, batches[5:]))
    assert resumed.state_dict()["index"] == 96 and len(resumed) == 12  # still the full epoch


def test_sampler_refuses_state_from_another_seed():
    ds = TokenWindows(np.arange(50), block_size=4)
    with pytest.raises(ValueError, match="resume with the same seed"):
        WindowSampler(ds, seed=1).load_state_dict({"epoch": 0, "index": 3, "seed": 2, "num_replicas": 1})


def test_sampler_shards_across_ranks():
    ds = TokenWindows(np.arange(103), block_size=2)  # 101 windows
    shards = [list(WindowSampler(ds, seed=0, num_replicas=2, rank=r)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 50
    assert not set(shards[0]) & set(shards[1])


def test_loaders_serve_batches(corpus):
    dm = CharDataModule(path=str(corpus), block_size=16, batch_size=4)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert len(dm.val_set) == (len(dm.load_tokens("val")) - 17) // 16 + 1  # non-overlapping by default


def test_default_corpus_needs_no_download():
    text = default_corpus()
    assert len(text) > 400_000 and "assert" in text
    dm = CharDataModule(block_size=32)
    assert 50 < dm.vocab_size < 200


def test_vocab_travels_with_checkpoint_state(corpus, tmp_path):
    dm = CharDataModule(path=str(corpus), block_size=16)
    state = dm.state_dict()
    dm.load_state_dict(state)  # same data: fine
    other = tmp_path / "other.txt"
    other.write_text("abcabc" * 100)
    with pytest.raises(ValueError, match="different vocabulary"):
        CharDataModule(path=str(other), block_size=16).load_state_dict(state)


def test_bad_text_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="text file not found"):
        CharDataModule(path=str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        _ = CharDataModule(path=str(empty)).vocab_size
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match="looks binary"):
        _ = CharDataModule(path=str(binary)).vocab_size
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        _ = CharDataModule(path=str(latin1)).vocab_size


def test_unreachable_url_is_one_clear_error(tmp_path):
    dm = CharDataModule(url="http://127.0.0.1:9/corpus.txt", cache_dir=str(tmp_path))
    with pytest.raises(ConnectionError, match=r"could not download .* pass --data.path FILE"):
        _ = dm.vocab_size
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_url_is_downloaded_once(tmp_path, corpus):
    dm = CharDataModule(url=corpus.as_uri(), cache_dir=str(tmp_path / "cache"))
    assert dm.vocab_size == len(set(corpus.read_text(encoding="utf-8")))
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1 and cached[0].name.endswith("corpus.txt")
    corpus.unlink()  # the second module must not need the source again
    assert CharDataModule(url=corpus.as_uri(), cache_dir=str(tmp_path / "cache")).vocab_size == dm.vocab_size


@pytest.mark.parametrize("stride", [1, 3])
def test_batched_gather_equals_stacked_windows(stride, tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50, 500).astype(np.uint16)
    ds = TokenWindows(tokens, block_size=8, stride=stride)
    indices = [5, 0, len(ds) - 1, 17]
    x, y = ds.__getitems__(indices)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, 8) and x.is_contiguous()
    assert torch.equal(x, torch.stack([ds[i][0] for i in indices]))
    assert torch.equal(y, torch.stack([ds[i][1] for i in indices]))
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds)])
    # The loaders use it: a batch is what stacking single windows would give.
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(chr(97 + t % 26) for t in tokens))
    dm = CharDataModule(path=str(corpus), block_size=8, batch_size=4)
    dm.setup("fit")
    xb, yb = next(iter(dm.val_dataloader()))
    assert torch.equal(xb, torch.stack([dm.val_set[i][0] for i in range(4)]))


@pytest.mark.parametrize("n_tokens,block_size,split,message", [
    (17, 16, "val", None),
    (16, 16, "val", "the val split has 16 tokens, fewer than block_size+1 = 17; lower --model.block_size to at most "
                    "15, raise --data.val_fraction or use more data"),
    (1, 8, "train", "the train split has 1 tokens, fewer than block_size+1 = 9; use more data"),
    (100, 10**8, "train", "lower --model.block_size to at most 99 or use more data"),
])
def test_a_context_longer_than_a_split_is_refused(n_tokens, block_size, split, message):
    if message is None:
        check_context(n_tokens, block_size, split)
        return
    assert message in one_line_error(check_context, n_tokens, block_size, split)


@pytest.mark.parametrize("n_windows,batch_size,world,stride,message", [
    (64, 64, 1, 1, None),
    (128, 64, 2, 1, None),
    (63, 64, 1, 1, "the train split has 63 windows, fewer than one batch of --data.batch_size 64: training would "
                   "take no step; lower --data.batch_size to at most 63 or use more data"),
    (100, 64, 2, 4, "fewer than one batch of --data.batch_size 64 on each of 2 processes: training would take no "
                    "step; lower --data.batch_size to at most 50, lower --data.stride, use fewer --trainer.devices "
                    "or use more data"),
    (1, 4, 2, 1, "training would take no step; use fewer --trainer.devices or use more data"),
])
def test_fewer_windows_than_one_batch_are_refused(n_windows, batch_size, world, stride, message):
    if message is None:
        check_batches(n_windows, batch_size, world, stride)
        return
    assert message in one_line_error(check_batches, n_windows, batch_size, world, stride)


@pytest.mark.parametrize("limit,n_batches,refused", [
    (1.0, 3, False), (0.34, 3, False), (0.33, 3, True), (0.0001, 806, True), (0.0, 3, False), (1, 3, False),
    (None, 3, False),
])
def test_a_share_of_batches_that_rounds_to_none_is_refused(limit, n_batches, refused):
    if not refused:
        check_share(limit, n_batches, "--trainer.limit_val_batches")
        return
    message = one_line_error(check_share, limit, n_batches, "--trainer.limit_val_batches")
    assert message.startswith(f"--trainer.limit_val_batches {limit} of {n_batches} batch(es) rounds to none")


def test_a_context_longer_than_the_text_is_refused_when_the_text_is_read(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("abcdefghij" * 10)  # 100 characters: 10 validate
    dm = CharDataModule(path=str(text), block_size=10)
    message = one_line_error(lambda: dm.vocab_size)  # what the CLI asks for before it builds the model
    assert message.startswith("the val split has 10 tokens, fewer than block_size+1 = 11")
    assert CharDataModule(path=str(text), block_size=9).vocab_size == 10


@pytest.mark.parametrize("batch_size,world,stage,limits,message", [
    (4, 1, "fit", {}, None),
    (1100, 1, "fit", {}, "the train split has 1064 windows, fewer than one batch of --data.batch_size 1100: "),
    (600, 2, "fit", {}, "--data.batch_size 600 on each of 2 processes: training would take no step; lower "
                        "--data.batch_size to at most 532"),
    (1, 1, "fit", {"limit_train_batches": 0.0005}, "--trainer.limit_train_batches 0.0005 of 1064 batch(es)"),
    (1, 1, "fit", {"limit_val_batches": 0.1}, "--trainer.limit_val_batches 0.1 of 7 batch(es)"),
    (1, 2, "validate", {"limit_val_batches": 0.2}, "--trainer.limit_val_batches 0.2 of 4 batch(es)"),
    (1, 1, "test", {"limit_test_batches": 0.1}, "--trainer.limit_test_batches 0.1 of 7 batch(es)"),
    (1, 1, "fit", {"limit_train_batches": 0.001, "limit_val_batches": 0.15}, None),
    (1100, 1, "validate", {}, None),  # only training needs a full batch: the validation loader keeps a partial one
])
def test_setup_refuses_data_that_yields_no_batch(batch_size, world, stage, limits, message, tmp_path):
    from types import SimpleNamespace

    text = tmp_path / "c.txt"
    text.write_text("abcdefgh ij\n" * 100)  # 1200 characters: 1080 train (1064 windows), 120 validate (7)
    dm = CharDataModule(path=str(text), block_size=16, batch_size=batch_size, stride=1)
    dm.trainer = SimpleNamespace(world_size=world, **({f"limit_{s}_batches": 1.0 for s in
                                                       ("train", "val", "test", "predict")} | limits))
    if message is None:
        dm.setup(stage)
        return
    assert message in one_line_error(dm.setup, stage)
