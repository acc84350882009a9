"""`lit-attn export`: a trained run as a transformers directory that reproduces its logits and token ids;
what it refuses, and that it never writes over anything unasked."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest
import torch
from docs_commands import ROOT, python_blocks
from helpers import TINY_FIT, snapshot, write_corpus

pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from lit_attn.cli.command import main as lit_attn  # noqa: E402
from lit_attn.codec import EOT, BPECodec, CharCodec  # noqa: E402
from lit_attn.config import GPTConfig  # noqa: E402
from lit_attn.load import load_run  # noqa: E402
from lit_attn.tools.export import hf_tokenizer  # noqa: E402
from lit_attn.training.checkpoint import save_checkpoint  # noqa: E402
from lit_attn.transformer import Transformer  # noqa: E402


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: "), err
    return err


@pytest.fixture(scope="module")
def char_run(tmp_path_factory) -> Path:
    """A tiny trained character run (GPT-2 layout, 4 steps) on text with non-ASCII characters."""
    from lit_attn.cli.lightning_cli import cli

    where = tmp_path_factory.mktemp("export")
    corpus = write_corpus(where / "corpus.txt")
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={where / 'runs'}", "--run=char", *TINY_FIT,
                "--data.batch_size=4", "--params.print_table=false"]) == 0
    return where / "runs" / "char"


@pytest.mark.slow
def test_the_export_of_a_trained_char_run_reproduces_its_logits_and_ids(char_run, tmp_path, capsys):
    out = tmp_path / "hf" / "char"
    assert lit_attn(["export", "--run", str(char_run), "--out", str(out), "--ckpt", "best"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"wrote {out}: config.json, generation_config.json")
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]
    ours, _, codec, *_ = load_run(next((char_run / "checkpoints").glob("best*.ckpt")))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    text = (char_run.parents[1] / "corpus.txt").read_text(encoding="utf-8")[-16:]  # "... naïve ...\n" and more
    ids = tokenizer(text)["input_ids"]
    assert ids == codec.encode(text) and tokenizer.decode(ids) == text
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(model(x).logits, ours(x), atol=1e-5, rtol=0)
    # The page's Python snippet runs against the export, where the page puts it.
    (tmp_path / "hf" / "llama-1").symlink_to(out)
    here = Path.cwd()
    os.chdir(tmp_path)
    try:
        exec(python_blocks(ROOT / "docs" / "export.md", "Export a run")[0], {})
    finally:
        os.chdir(here)
    assert capsys.readouterr().out.startswith("the ")


def _fake_run(root: Path, vocab: str = "ab \n", **settings) -> Path:
    """A run directory whose last.ckpt holds a fresh model of `settings` (no training: what the tool reads)."""
    config = GPTConfig(**(dict(vocab_size=len(vocab), n_layer=1, n_embd=16, n_head=4, block_size=8) | settings))
    weights = {f"transformer.{k}": v for k, v in Transformer(config).state_dict().items()}
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    save_checkpoint({"global_step": 0, "state_dict": weights, "hyper_parameters": dataclasses.asdict(config),
                     "CharDataModule": {"vocab": vocab}}, run / "checkpoints" / "last.ckpt")
    return run


@pytest.mark.parametrize("settings, error", [
    (dict(attention="noq"), "error: cannot export to Hugging Face: attention 'noq' is not plain grouped"),
    (dict(pos="rope"), "error: cannot export to Hugging Face: pos rope, norm layernorm, ffn gelu; exportable: "),
])
def test_a_run_without_a_transformers_class_is_refused_in_one_line_and_writes_nothing(settings, error, tmp_path,
                                                                                       capsys):
    run = _fake_run(tmp_path, **settings)
    assert lit_attn(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 2
    assert _error(capsys).startswith(error)
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_run_and_checkpoint_mistakes_are_one_line(tmp_path, capsys):
    assert lit_attn(["export", "--run", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert _error(capsys).startswith(f"error: --run {tmp_path / 'nope'}: no such run (")
    run = _fake_run(tmp_path)
    assert lit_attn(["export", "--run", str(run), "--out", str(tmp_path / "out"), "--ckpt", "best"]) == 2
    assert "has no best checkpoint (last.ckpt names none that exists); use --ckpt last" in _error(capsys)
    assert lit_attn(["export", "--run", str(run), "--out", str(run / "config.yaml")]) == 2
    assert _error(capsys).endswith("is a file; give a directory (it is created if missing)")


def test_a_llama_layout_run_exports_through_the_tool(tmp_path, capsys):
    run = _fake_run(tmp_path, vocab="xyz \n", attention="xsmqa", pos="rope", norm="rmsnorm", ffn="swiglu",
                    tie_embeddings=False, bias=False)
    assert lit_attn(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim) == (1, 1, 4)
    ours = load_run(run).network
    x = torch.tensor([AutoTokenizer.from_pretrained(tmp_path / "out")("zyx \nxy")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ours(x), atol=1e-5, rtol=0)


def test_tokenizers_encode_to_the_codecs_ids(tmp_path):
    text = "Straße naïve café 日本語 <|endoftext|> tabs\tand  spaces\n\nnew lines"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([text] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=[EOT],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    chars = CharCodec("".join(sorted(set(text))))
    for name, codec in (("bpe", BPECodec(bpe)), ("char", chars)):
        hf_tokenizer(codec, 64).save_pretrained(tmp_path / name)
        loaded = AutoTokenizer.from_pretrained(tmp_path / name)
        assert loaded(text)["input_ids"] == codec.encode(text), name
        assert loaded.decode(codec.encode(text)) == codec.decode(codec.encode(text)), name
    assert loaded.model_max_length == 64
    assert AutoTokenizer.from_pretrained(tmp_path / "bpe").eos_token_id == BPECodec(bpe).eot_id
    with pytest.raises(Exception, match="UNK"):  # a character the run never saw, as CharCodec refuses it
        loaded("~")


def _export(run: Path, out: Path, *flags: str) -> int:
    return lit_attn(["export", "--run", str(run), "--out", str(out), *flags])


def test_overwrite_replaces_an_earlier_export_and_nothing_else(tmp_path, capsys):
    run = _fake_run(tmp_path)
    out = tmp_path / "hf"
    assert _export(run, out) == 0
    exported = snapshot(out)
    assert _export(run, out) == 2
    assert _error(capsys) == f"error: --out {out} is not empty; pass --overwrite to replace an earlier export there, " \
                             "or give another --out"
    (out / "generation_config.json").write_text("{}")  # an earlier export's file, replaced whole
    assert _export(run, out, "--overwrite") == 0
    assert {k: v[2] for k, v in snapshot(out).items()} == {k: v[2] for k, v in exported.items()}
    assert sorted(os.listdir(tmp_path)) == ["hf", "run"], "no staging directory is left behind"
    # A directory holding anything but an export's files, or an export's files without the model, is no export.
    (out / "notes.txt").write_text("mine")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    for where, held in ((out, "holds notes.txt"), (partial, "lacks config.json or the weights")):
        before = snapshot(where)
        assert _export(run, where, "--overwrite") == 2
        assert _error(capsys) == f"error: --out {where} is not an earlier export ({held}); --overwrite replaces " \
                                 "only an export: give another --out"
        assert snapshot(where) == before


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_every_exported_file_has_the_mode_the_umask_gives(umask, tmp_path):
    run = _fake_run(tmp_path)
    old = os.umask(umask)
    try:
        assert _export(run, tmp_path / "hf") == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """safetensors' error for a full disk (its message, as on a full tmpfs) after part of the file is written."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"part")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    run = _fake_run(tmp_path)
    assert _export(run, tmp_path / "hf") == 2
    assert _error(capsys) == f"error: cannot write --out {tmp_path / 'hf'}: No space left on device; give another --out"
    assert sorted(os.listdir(tmp_path)) == ["run"]


@pytest.mark.slow
@pytest.mark.tmpfs
def test_an_export_onto_a_full_filesystem_is_one_line_and_leaves_nothing(tmp_path, tmpfs, capsys):
    run = _fake_run(tmp_path, n_embd=64, n_head=4)  # about 0.2 MB of weights
    disk = tmpfs("64k")
    assert _export(run, disk / "hf") == 2
    assert _error(capsys) == f"error: cannot write --out {disk / 'hf'}: No space left on device; give another --out"
    assert os.listdir(disk) == []
