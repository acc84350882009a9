"""lit_attn.codec: char and BPE codecs, and the codec a checkpoint's datamodule state describes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT, one_line_error

from lit_attn.codec import EOT, BPECodec, CharCodec, codec_from_checkpoint


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """A tiny byte-level BPE tokenizer with <|endoftext|> as id 0, trained as the Wikipedia pipeline does."""
    from datamodules.wikipedia import train_tokenizer

    texts = ["hello world, hello there. the world is wide.", "café naïve 日本語 🚀"] * 50
    path = tmp_path_factory.mktemp("codec") / "tokenizer.json"
    path.write_text(train_tokenizer(iter(texts), vocab_size=300, max_chars=10**5, progress=False).to_str())
    return path


def test_char_round_trip_and_errors():
    codec = CharCodec("\n abcé")
    assert codec.vocab_size == 6 and codec.eot_id is None
    assert codec.encode("abc é\n") == [2, 3, 4, 1, 5, 0]
    assert codec.decode(codec.encode("a cab\n")) == "a cab\n"
    assert codec.encode("") == [] and codec.decode([]) == ""
    with pytest.raises(ValueError, match=r"characters not in the vocabulary: 'xz'"):
        codec.encode("zax")


def test_bpe_round_trip_keeps_special_tokens_as_text(tokenizer_file):
    codec = BPECodec.from_file(tokenizer_file)
    assert codec.eot_id == 0 and codec.vocab_size == codec.tokenizer.get_vocab_size() <= 300
    for text in ["hello world", "", "  two spaces\t\n", "café 日本語 🚀 unseen Ωμέγα", "\x00 control"]:
        ids = codec.encode(text)
        assert codec.decode(ids) == text and all(0 <= i < codec.vocab_size for i in ids)
    literal = f"a literal {EOT} stays text"
    assert codec.eot_id not in codec.encode(literal) and codec.decode(codec.encode(literal)) == literal
    assert codec.decode(codec.encode("end") + [codec.eot_id]) == "end" + EOT  # a boundary stays visible


def test_bpe_without_eot_and_junk_files(tokenizer_file, tmp_path):
    from tokenizers import Tokenizer, models

    plain = tmp_path / "plain.json"
    Tokenizer(models.BPE()).save(str(plain))
    assert BPECodec.from_file(plain).eot_id is None
    (tmp_path / "junk.json").write_text("{}")
    one_line_error(BPECodec.from_file, tmp_path / "junk.json", fix="check it",
                   match=r"junk.json is not a tokenizers JSON file \(.*\); check it$")


def test_codec_from_checkpoint(tokenizer_file, tmp_path):
    char = codec_from_checkpoint({"state_dict": {}, "CharDataModule": {"vocab": "ab", "sampler": {}}})
    assert isinstance(char, CharCodec) and char.vocab == "ab"
    info = {"path": str(tokenizer_file), "sha256": "x", "size": 300}
    bpe = codec_from_checkpoint({"hyper_parameters": {}, "WikipediaDataModule": {"tokenizer": info}})
    assert isinstance(bpe, BPECodec) and bpe.decode(bpe.encode("hello world")) == "hello world"


@pytest.mark.parametrize("state,message", [
    ({"state_dict": {}}, "the checkpoint has no vocabulary or tokenizer"),
    ({"CharDataModule": {"sampler": {}}}, "the checkpoint has no vocabulary or tokenizer"),
    ({"WikipediaDataModule": {"tokenizer": {"path": "/nonexistent/tokenizer.json"}}},
     "the checkpoint's tokenizer file /nonexistent/tokenizer.json does not exist; it must be where the run left it"),
])
def test_codec_from_checkpoint_errors(state, message):
    assert one_line_error(codec_from_checkpoint, state).startswith(message)


def test_codec_from_checkpoint_junk_tokenizer(tmp_path):
    (tmp_path / "junk.json").write_text("{}")
    one_line_error(codec_from_checkpoint, {"WikipediaDataModule": {"tokenizer": {"path": str(tmp_path / "junk.json")}}},
                   match=r"^tokenizer .*junk.json is not a tokenizers JSON file \(")


def test_datamodules_use_the_codecs(tmp_path):
    from datamodules import CharDataModule

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox\n" * 20, encoding="utf-8")
    dm = CharDataModule(path=str(corpus), block_size=8, batch_size=2)
    assert isinstance(dm.codec, CharCodec) and dm.codec.vocab == dm.vocab
    assert codec_from_checkpoint({"CharDataModule": dm.state_dict()}).encode("fox") == dm.encode("fox")


def test_codec_imports_neither_lightning_nor_datamodules():
    # Its own imports (the lit_attn package itself imports the LightningModule GPT).
    tree = ast.parse((ROOT / "lit_attn" / "codec.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("lightning", "pytorch_lightning", "datamodules", "torch")]
    model = (ROOT / "lit_attn" / "training" / "model.py").read_text()
    assert "from .codec" not in model and "lit_attn.codec" not in model  # the model never needs it
