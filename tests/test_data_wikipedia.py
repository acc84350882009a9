import json
import pickle
import random
import time
from pathlib import Path

import datasets
import huggingface_hub
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import ROOT, one_line_error, run_main

import datamodules.wikipedia as wiki
import datamodules.wikipedia_prep as prep
from datamodules import WikipediaDataModule, WindowDataModule

N_ARTICLES = 300
VOCAB = 400


def make_articles(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Wikipedia-like rows (id, url, title, text) with varied text: headings, paragraphs, numbers,
    odd whitespace and non-Latin scripts, emoji and combining characters."""
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 10))) for _ in range(1500)]
    words += ["café", "naïve", "Straße", "日本語", "東京都", "Москва", "Ελλάδα", "القاهرة", "São Paulo", "🚀", "👩‍👩‍👧",
              "e\u0301", "½", "1,234.5", "(born 1952)", "—", "«quoted»", "x²"]
    rows = []
    for i in range(n):
        paragraphs = []
        for p in range(rng.randint(1, 4)):
            sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))
            paragraphs.append((f"== Section {p} ==\n" if p else "") + sentence.capitalize()
                              + rng.choice([".", "!", "?"]))
        text = rng.choice(["\n\n", "\n", "\n\n\n"]).join(paragraphs)
        if i % 50 == 7:
            text = "  " + text + "\t \n"  # stray whitespace must survive the round trip
        if i == 11:
            text += " The string <|endoftext|> in an article is text, not a boundary."
        rows.append({"id": str(i), "url": f"https://en.wikipedia.org/wiki?curid={i}", "title": f"Article {i}",
                     "text": text})
    return rows


def write_parquet(rows: list[dict], directory: Path, shards: int = 3) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(shards):
        part = rows[k * len(rows) // shards : (k + 1) * len(rows) // shards]
        paths.append(directory / f"train-{k:05d}-of-{shards:05d}.parquet")
        pq.write_table(pa.Table.from_pylist(part), paths[-1])
    return paths


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def rows():
    return make_articles(N_ARTICLES)


@pytest.fixture(scope="module")
def shards(rows, tmp_path_factory):
    return write_parquet(rows, tmp_path_factory.mktemp("wiki") / "20231101.en")


@pytest.fixture(scope="module")
def prepared(shards, tmp_path_factory):
    """Parquet shards prepared once with two tokenizing processes."""
    dm = WikipediaDataModule(data_files=str(shards[0].parent / "*.parquet"), vocab_size=VOCAB, block_size=32,
                             batch_size=4, num_proc=2, cache_dir=str(tmp_path_factory.mktemp("cache")))
    dm.prepare_data()
    return dm


def make(files, cache_dir, **kwargs) -> WikipediaDataModule:
    kwargs = {"vocab_size": VOCAB, "block_size": 32, "batch_size": 4, "num_proc": 1} | kwargs
    return WikipediaDataModule(data_files=[str(f) for f in files], cache_dir=str(cache_dir), **kwargs)


def test_vocab_size_is_known_before_anything_is_read(shards, tmp_path):
    dm = make(shards, tmp_path / "cache")
    assert dm.vocab_size == VOCAB
    assert not (tmp_path / "cache").exists() and dm.train_set is None
    assert WikipediaDataModule().vocab_size == 10_000  # the hub default: no network needed for the model size


def test_fractions_select_contiguous_article_ranges(prepared, shards, tmp_path):
    assert prepared.articles("train")["id"] == [str(i) for i in range(135)]  # round(300 * 0.45)
    assert prepared.articles("val")["id"] == [str(i) for i in range(135, 150)]  # up to round(300 * 0.50)
    other = make(shards, tmp_path, train_fraction=0.5, val_fraction=0.25)
    assert other.articles("train")["id"] == [str(i) for i in range(150)]
    assert other.articles("val")["id"] == [str(i) for i in range(150, 225)]
    meta = prepared.meta["splits"]
    assert meta["train"]["articles"] == [0, 135] and meta["val"]["articles"] == [135, 150]


def test_a_test_fraction_holds_out_the_articles_after_validation(prepared, shards):
    held_out = make(prepared.data_files, prepared.cache_dir, test_fraction=0.1)
    assert held_out.articles("test")["id"] == [str(i) for i in range(150, 180)]  # round(300 * 0.5) to (300 * 0.6)
    held_out.prepare_data()
    # the same tokenizer (it learns from the train split alone) and val split; streams of their own, with test's
    assert held_out.built == ["train", "val", "test"] and held_out.tokenizer_path == prepared.tokenizer_path
    assert held_out.stream_dir != prepared.stream_dir and held_out.meta["splits"]["test"]["articles"] == [150, 180]
    assert np.array_equal(held_out.load_tokens("val"), prepared.load_tokens("val"))
    held_out.setup("test")
    x, _ = next(iter(held_out.test_dataloader()))
    assert torch.equal(x[0], torch.from_numpy(np.asarray(held_out.load_tokens("test")[:32], dtype=np.int64)))
    assert "test_fraction=0.1" in held_out.data_identity and "test_fraction" not in prepared.data_identity
    message = one_line_error(make, shards, prepared.cache_dir, train_fraction=0.5, val_fraction=0.25,
                             test_fraction=0.3)
    assert message.startswith("--data.train_fraction 0.5, --data.val_fraction 0.25 and --data.test_fraction 0.3 add "
                              "up to more than 1")


def test_tokenizer_round_trips_text_exactly(prepared, rows):
    samples = [r["text"] for r in rows[:40]] + [
        "", " ", "  two leading spaces", "trailing\t \n", "日本語のテキスト、東京都。", "Москва — столица",
        "emoji 🚀 and a family 👩‍👩‍👧", "combining e\u0301 vs precomposed é", "العربية من اليمين", "\x00\x07 controls",
        "a literal <|endoftext|> stays text",
    ]
    for text in samples:
        ids = prepared.encode(text)
        assert prepared.decode(ids) == text
        assert all(0 <= i < prepared.vocab_size for i in ids)
    assert prepared.eot_id not in prepared.encode("a literal <|endoftext|> stays text")
    assert prepared.tokenizer.get_vocab_size() <= VOCAB and prepared.eot_id == 0


def test_streams_join_articles_with_one_eot_and_no_padding(prepared, rows):
    for split, r in (("train", range(0, 135)), ("val", range(135, 150))):
        stream = np.asarray(prepared.load_tokens(split))
        assert stream.dtype == np.uint16 and stream.max() < VOCAB
        ends = np.flatnonzero(stream == prepared.eot_id)
        assert len(ends) == len(r) and ends[-1] == len(stream) - 1  # every article is followed by exactly one EOT
        pieces = np.split(stream, ends + 1)[:-1]
        assert all(len(p) > 1 for p in pieces)  # never two EOTs in a row
        assert [prepared.decode(p[:-1].tolist()) for p in pieces] == [rows[i]["text"] for i in r]
        assert len(stream) == sum(len(prepared.encode(rows[i]["text"])) + 1 for i in r)  # nothing else: no padding
        assert prepared.meta["splits"][split]["tokens"] == len(stream)
    assert prepared.tokenizer.padding is None
    prepared.setup("fit")
    assert prepared.stride == 32  # default: block_size, non-overlapping windows
    x, y = next(iter(prepared.train_dataloader()))
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1]) and int(y.min()) >= 0


def test_streams_pickle_as_a_file_reference(prepared):
    stream = prepared.load_tokens("train")
    restored = pickle.loads(pickle.dumps(stream))  # what a spawned DataLoader worker receives
    assert len(pickle.dumps(stream)) < 1000 < stream.nbytes
    assert np.array_equal(restored, stream) and restored.dtype == stream.dtype
    assert np.array_equal(pickle.loads(pickle.dumps(stream[5:9])), stream[5:9])  # a view still pickles by value


def test_second_prepare_is_a_cache_hit(prepared, shards):
    files = sorted(p for p in prepared.cache_dir.rglob("*") if p.is_file() and "hf" not in p.parts)
    before = {p: p.stat().st_mtime_ns for p in files}
    assert prepared.built == ["tokenizer", "train", "val"]
    again = WikipediaDataModule(data_files=str(shards[0].parent / "*.parquet"), vocab_size=VOCAB, block_size=32,
                                batch_size=4, num_proc=2, cache_dir=str(prepared.cache_dir))
    again.prepare_data()
    assert again.built == []  # no tokenizer training, no tokenization
    assert "_all_articles" not in again.__dict__  # the articles were not even loaded
    assert {p: p.stat().st_mtime_ns for p in files} == before
    assert np.array_equal(again.load_tokens("train"), prepared.load_tokens("train"))


def test_changed_settings_or_files_miss_the_cache(prepared, rows, tmp_path):
    # Another val_fraction reuses the tokenizer but tokenizes again.
    other = make(prepared.data_files, prepared.cache_dir, val_fraction=0.1)
    other.prepare_data()
    assert other.built == ["train", "val"] and other.tokenizer_path == prepared.tokenizer_path
    # A rewritten data file changes the key: everything is rebuilt.
    files = write_parquet(rows, tmp_path / "copy")
    first = make(files, tmp_path / "cache")
    first.prepare_data()
    write_parquet(make_articles(100, seed=1) + rows[100:], tmp_path / "copy")
    second = make(files, tmp_path / "cache")
    second.prepare_data()
    assert second.built == ["tokenizer", "train", "val"] and second.stream_dir != first.stream_dir
    assert not np.array_equal(second.load_tokens("train"), first.load_tokens("train"))


def test_jsonl_and_a_given_tokenizer_give_the_same_streams(prepared, rows, tmp_path):
    jsonl = write_jsonl(rows, tmp_path / "all.jsonl")
    dm = make([jsonl], tmp_path / "cache", tokenizer=str(prepared.tokenizer_path))
    dm.prepare_data()
    assert dm.built == ["train", "val"]  # the given tokenizer is used as is
    for split in ("train", "val"):
        assert np.array_equal(dm.load_tokens(split), prepared.load_tokens(split))
    assert dm.state_dict()["tokenizer"] == prepared.state_dict()["tokenizer"]


def test_large_vocab_is_stored_as_uint32(shards, tmp_path):
    dm = make(shards, tmp_path, vocab_size=70_000)
    assert dm.vocab_size == 70_000
    assert dm.load_tokens("val").dtype == np.uint32  # load_tokens prepares on demand too
    assert dm.tokenizer.get_vocab_size() < 70_000  # the small corpus runs out of merges first


def test_tokenizer_identity_travels_with_checkpoint_state(prepared, tmp_path):
    state = prepared.state_dict()
    assert state["tokenizer"]["sha256"] == wiki.sha256_file(prepared.tokenizer_path)
    prepared.load_state_dict(state)  # same tokenizer: fine
    other = make(prepared.data_files, prepared.cache_dir, vocab_size=300)
    one_line_error(other.load_state_dict, state, match="different tokenizer")


def test_base_state_travels_alongside(prepared, monkeypatch):
    # The base class keeps what the train loader's position is counted in, in the same state; it must pass through.
    seen = []
    monkeypatch.setattr(WindowDataModule, "state_dict", lambda self: {"data": {"batch_size": 8, "stride": 1}})
    monkeypatch.setattr(WindowDataModule, "load_state_dict", lambda self, state: seen.append(state))
    state = prepared.state_dict()
    assert state["data"] == {"batch_size": 8, "stride": 1} and "tokenizer" in state
    prepared.load_state_dict(state)
    assert seen == [state]


def test_tokenizer_reads_at_most_max_chars():
    pulled = []

    def texts():
        for i in range(1000):
            pulled.append(i)
            yield f"article {i:03d} " * 8  # 96 characters

    tok = wiki.train_tokenizer(texts(), vocab_size=300, max_chars=1000, progress=False)
    assert len(pulled) == 11  # 10 whole articles and 40 characters of the 11th
    assert tok.token_to_id(wiki.EOT) == 0


def test_interrupted_preparation_leaves_no_valid_cache(shards, tmp_path, monkeypatch):
    real = prep.tokenize_to_file

    def interrupted(articles, tokenizer, out, *args, **kwargs):
        if out.stem == "val":
            raise KeyboardInterrupt  # as if killed after the train stream was written
        return real(articles, tokenizer, out, *args, **kwargs)

    monkeypatch.setattr(prep, "tokenize_to_file", interrupted)  # moved to wikipedia_prep
    with pytest.raises(KeyboardInterrupt):
        make(shards, tmp_path).prepare_data()
    assert not (tmp_path / "tokens").exists() or not any((tmp_path / "tokens").iterdir())
    assert not any((tmp_path / "tmp").iterdir())  # scratch cleaned up
    assert not list(tmp_path.rglob("*.part"))
    monkeypatch.setattr(prep, "tokenize_to_file", real)
    dm = make(shards, tmp_path)
    dm.prepare_data()
    assert dm.built == ["train", "val"]  # the finished tokenizer was kept, the streams were redone


def test_a_finished_cache_file_is_never_replaced(tmp_path):
    path = tmp_path / "tokenizers" / "key" / "tokenizer.json"
    WikipediaDataModule._write_atomic(path, b"first")
    WikipediaDataModule._write_atomic(path, b"second")  # e.g. another node that trained concurrently
    assert path.read_bytes() == b"first" and [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]


def test_bad_inputs_are_one_line_errors(rows, shards, tmp_path):
    def check(exc, match, build, *, prepare=False):
        one_line_error(lambda: build().prepare_data() if prepare else build(), error=exc, match=match)

    check(FileNotFoundError, "data file not found: .*missing.parquet; check --data.data_files",
          lambda: make([tmp_path / "missing.parquet"], tmp_path))
    check(FileNotFoundError, "no files match .*nothing", lambda: make([tmp_path / "nothing*.parquet"], tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    check(ValueError, "is not a .parquet, .jsonl or .json file", lambda: make([tmp_path / "notes.txt"], tmp_path))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all" * 10)
    check(ValueError, "broken.parquet is not a readable parquet file",
          lambda: make([tmp_path / "broken.parquet"], tmp_path), prepare=True)
    pq.write_table(pa.Table.from_pylist([{"id": "1", "url": "u", "title": "t", "body": "b"}]),
                   tmp_path / "body.parquet")
    check(ValueError, r"body.parquet has no 'text' column \(it has: id, url, title, body\)",
          lambda: make([tmp_path / "body.parquet"], tmp_path), prepare=True)
    (tmp_path / "body.jsonl").write_text('{"id": "1", "body": "b"}\n')
    check(ValueError, "body.jsonl has no 'text' column", lambda: make([tmp_path / "body.jsonl"], tmp_path),
          prepare=True)
    (tmp_path / "garbage.jsonl").write_text("this is not json\n")
    check(ValueError, "garbage.jsonl is not JSON lines", lambda: make([tmp_path / "garbage.jsonl"], tmp_path),
          prepare=True)
    broken = write_jsonl(rows[:20], tmp_path / "broken.jsonl")
    broken.write_text(broken.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    check(ValueError, r"could not read .*broken.jsonl \(JSON parse error", lambda: make([broken], tmp_path),
          prepare=True)
    (tmp_path / "empty.jsonl").write_text("")
    check(ValueError, "empty.jsonl is empty", lambda: make([tmp_path / "empty.jsonl"], tmp_path), prepare=True)
    few = write_jsonl(rows[:5], tmp_path / "few.jsonl")
    check(ValueError, "the val split is empty: val_fraction=0.05 of 5 articles rounds to 0",
          lambda: make([few], tmp_path), prepare=True)
    check(ValueError, "--data.train_fraction 0.9 and --data.val_fraction 0.2 add up to more than 1",
          lambda: make(shards, tmp_path, train_fraction=0.9, val_fraction=0.2))
    check(FileNotFoundError, "tokenizer file not found",
          lambda: make(shards, tmp_path, tokenizer=str(tmp_path / "t.json")))
    tok = wiki.train_tokenizer(iter([r["text"] for r in rows]), vocab_size=500, max_chars=10**6, progress=False)
    (tmp_path / "big.json").write_text(tok.to_str())
    check(ValueError, "has 500 tokens, more than data.vocab_size=400; pass --data.vocab_size 500",
          lambda: make(shards, tmp_path, tokenizer=str(tmp_path / "big.json")).vocab_size)
    (tmp_path / "junk.json").write_text("{}")
    check(ValueError, "junk.json is not a tokenizers JSON file",
          lambda: make(shards, tmp_path, tokenizer=str(tmp_path / "junk.json")).vocab_size)


def test_unreachable_hub_fails_fast_with_one_line(tmp_path, monkeypatch):
    # A closed local port stands in for the hub: refused at once, and nothing leaves the machine.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    dm = WikipediaDataModule(cache_dir=str(tmp_path), num_proc=1)
    slept: list[float] = []  # a retry loop waits between its attempts (measured in requests, not wall time)
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda seconds: (slept.append(seconds), real_sleep(seconds))[1])
    hub = r"cannot reach the Hugging Face hub to load wikimedia/wikipedia \(20231101.en\).*--data.data_files"
    one_line_error(dm.prepare_data, error=ConnectionError, match=hub)
    assert sum(slept) < 1, f"waits between attempts: {slept}"  # no retry loop


def run_cli(*args, cwd: Path, env: dict[str, str] | None = None):
    """main.py with caches of its own under `cwd`, so no run reads or fills the user's."""
    isolated = {"LIT_ATTN_CACHE": str(cwd / "cache"), "HF_HOME": str(cwd / "hf")}
    return run_main(*args, cwd=cwd, env=isolated | (env or {}))


TINY = ["--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=32",
        "--trainer.enable_progress_bar=false"]


@pytest.mark.slow
def test_offline_hub_run_is_one_error_line(tmp_path):
    result = run_cli("fit", "--config", str(ROOT / "configs" / "sqa_wikipedia.yaml"), *TINY, cwd=tmp_path,
                     env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot load wikimedia/wikipedia (20231101.en): offline mode")
    assert "--data.data_files" in last
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_fit_on_local_parquet_in_subprocess(shards, tmp_path):
    result = run_cli(
        "fit", "--config", str(ROOT / "configs" / "wikipedia_local.yaml"), f"--data.data_files={shards[0].parent}",
        f"--data.vocab_size={VOCAB}", "--data.num_proc=2", *TINY, "--trainer.max_steps=3",
        "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2", cwd=tmp_path,  # runs go under tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wikipedia train: 135 documents" in result.stderr and "wikipedia val: 15 documents" in result.stderr
    ckpt = next((tmp_path / "runs").rglob("last.ckpt"))
    state = torch.load(ckpt, map_location="cpu", weights_only=True)  # the tokenizer identity is plain data
    tokenizer = state["WikipediaDataModule"]["tokenizer"]
    assert tokenizer["sha256"] == wiki.sha256_file(Path(tokenizer["path"])) and tokenizer["size"] <= VOCAB
    assert state["hyper_parameters"]["vocab_size"] == VOCAB
