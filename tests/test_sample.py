"""lit_attn.tools.sample: text from short-trained char and BPE checkpoints, and a hand-built BPE checkpoint."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY_FIT as TINY
from helpers import write_bpe_tokenizer

from lit_attn.cli.lightning_cli import cli
from lit_attn.load import load_run
from lit_attn.tools import sample as sampler


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sample")
    corpus = tmp / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 200, encoding="utf-8")
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={tmp / 'runs'}", "--run=char", *TINY]) == 0
    return tmp / "runs" / "char" / "checkpoints" / "last.ckpt"


def test_char_sample_has_requested_length(char_ckpt, capsys):
    assert sampler.main(["--ckpt_path", str(char_ckpt), "--prompt", "the ", "--max_new_tokens", "25",
                         "--temperature", "0.8", "--top_k", "5", "--seed", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out.startswith("the ") and len(out) == 4 + 25
    vocab = torch.load(char_ckpt, weights_only=True)["CharDataModule"]["vocab"]
    assert set(out) <= set(vocab)
    # Same seed, same text; greedy needs no seed.
    run = load_run(char_ckpt)
    assert sampler.sample(run, "the ", 25, 0.8, 5, seed=1)[0] == out[4:]
    assert len(sampler.sample(run, "", 7, 0.0)[1]) == 7


def test_load_run_reads_a_run_directory_or_a_checkpoint_file(char_ckpt, tmp_path, capsys, monkeypatch):
    from docs_commands import ROOT, python_blocks

    from lit_attn import GPTConfig, Transformer

    run_dir = char_ckpt.parents[1]
    by_dir, by_file = load_run(run_dir), load_run(char_ckpt)
    saved = torch.load(char_ckpt, weights_only=True)
    assert by_dir.path == by_file.path == char_ckpt and by_dir.step == saved["global_step"] > 0
    assert isinstance(by_dir.network, Transformer) and not by_dir.network.training
    assert by_dir.config == by_dir.network.config and isinstance(by_dir.config, GPTConfig)
    assert by_dir.codec.vocab == saved["CharDataModule"]["vocab"]
    x = torch.tensor([by_dir.codec.encode("the fox")])
    torch.testing.assert_close(by_dir.network(x), by_file.network(x), rtol=0, atol=0)
    # docs/model.md's example, run where it puts the run.
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "RUN").symlink_to(run_dir)
    monkeypatch.chdir(tmp_path)
    exec(python_blocks(ROOT / "docs" / "model.md", "A trained run, without Lightning")[0], {})
    assert capsys.readouterr().out.startswith("the ")


def test_char_errors(char_ckpt, tmp_path, capsys):
    assert sampler.main(["--ckpt_path", str(char_ckpt), "--prompt", "QZ!"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: prompt characters not in the vocabulary")
    assert sampler.main(["--ckpt_path", str(tmp_path / "missing.ckpt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(char_ckpt.read_bytes()[:2000])
    assert sampler.main(["--ckpt_path", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint") and "corrupt" in err and len(err.splitlines()) == 1
    ckpt = torch.load(char_ckpt, weights_only=True)
    del ckpt["CharDataModule"]
    novocab = tmp_path / "novocab.ckpt"
    torch.save(ckpt, novocab)
    assert sampler.main(["--ckpt_path", str(novocab)]) == 2
    assert "no vocabulary or tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("edit,message", [
    ({"n_layer": 10**9}, "n_layer=1000000000, the weights have 1 blocks"),
    ({"n_embd": 2**40}, "n_embd=1099511627776, token embedding"),
    ({"pos": "rope", "block_size": 10**12}, "block_size=1000000000000 needs"),
    ({"ffn_hidden": 10**9}, "blocks.0.ffn.in_proj.weight"),
])
def test_crafted_sizes_are_refused_before_allocating(edit, message, char_ckpt, tmp_path, capsys):
    ckpt = torch.load(char_ckpt, weights_only=True)
    ckpt["hyper_parameters"].update(edit)
    if "pos" in edit:  # a RoPE model has no position table: the sizes alone must be checked
        del ckpt["state_dict"]["transformer.pos_emb.weight"]
    crafted = tmp_path / "crafted.ckpt"
    torch.save(ckpt, crafted)
    assert sampler.main(["--ckpt_path", str(crafted), "--max_new_tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the checkpoint's hyper_parameters do not describe its weights")
    assert message in err[0], err[0]


def test_non_checkpoint_pickles_are_one_line(tmp_path, capsys):
    for name, obj in [("raw", {"w": torch.zeros(2)}), ("list", [1, 2]), ("tensor", torch.zeros(3))]:
        path = tmp_path / f"{name}.ckpt"
        torch.save(obj, path)
        assert sampler.main(["--ckpt_path", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not a lit-attn checkpoint" in err[0], err


def test_bpe_sample(tmp_path, capsys):
    path = tmp_path / "tokenizer.json"
    tok = write_bpe_tokenizer(path)
    hp = {"vocab_size": tok.get_vocab_size(), "attention": "gqa", "n_layer": 1, "n_embd": 32, "n_head": 4,
          "block_size": 16, "_instantiator": "lightning.pytorch.cli.instantiate_module"}
    from lit_attn import GPT

    model = GPT(**{k: v for k, v in hp.items() if k != "_instantiator"})
    ckpt_path = tmp_path / "bpe.ckpt"
    torch.save({"hyper_parameters": hp, "state_dict": model.state_dict(),
                "WikipediaDataModule": {"tokenizer": {"path": str(path), "sha256": "x", "size": 300}}}, ckpt_path)
    assert sampler.main(["--ckpt_path", str(ckpt_path), "--prompt", "hello world", "--max_new_tokens", "12",
                         "--seed", "0"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out.startswith("hello world")
    text, ids = sampler.sample(load_run(ckpt_path), "hello world", 12, 1.0, None, seed=0)
    assert len(ids) == 12 and text == tok.decode(ids) and out == "hello world" + text


def test_bpe_sample_from_a_trained_wikipedia_run(tmp_path, capsys):
    """A few real training steps of the Wikipedia pipeline on local parquet, then sampling."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    words = "the of and river city music science history king war island language north".split()
    rows = [{"id": str(i), "url": f"https://x/{i}", "title": f"T{i}",
             "text": " ".join(words[(i * 7 + j) % len(words)] for j in range(40 + i % 30)) + " café."}
            for i in range(200)]
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "shards" / "a.parquet")
    assert cli(["fit", "--data=datamodules.WikipediaDataModule", f"--data.data_files={tmp_path / 'shards'}",
                "--data.vocab_size=300", "--data.num_proc=1", f"--data.cache_dir={tmp_path / 'cache'}",
                "--data.train_fraction=0.8", "--data.val_fraction=0.2",
                f"--runs_dir={tmp_path / 'runs'}", "--run=bpe", *TINY]) == 0
    ckpt = tmp_path / "runs" / "bpe" / "checkpoints" / "last.ckpt"
    capsys.readouterr()  # drop the training run's console output
    assert sampler.main(["--ckpt_path", str(ckpt), "--prompt", "the river", "--max_new_tokens", "12",
                         "--temperature", "0.8", "--seed", "0"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    tokenizer = Tokenizer.from_file(torch.load(ckpt, weights_only=True)["WikipediaDataModule"]["tokenizer"]["path"])
    new_text, ids = sampler.sample(load_run(ckpt), "the river", 12, 0.8, None, seed=0)
    assert len(ids) == 12 and all(0 <= i < 300 for i in ids)  # 12 tokens of the run's 300-token vocabulary
    assert new_text == tokenizer.decode(ids) and text == "the river" + new_text  # same seed, same text


@pytest.mark.parametrize("argv,message", [
    ([], "error: the following arguments are required: ckpt_path"),
    (["--ckpt_path", "x", "--max_new_tokens", "abc"], "error: --max_new_tokens='abc' is invalid: expected int"),
    (["--ckpt_path", "x", "--top_k", "1.5"], "error: --top_k='1.5' is invalid: expected int"),
    (["--ckpt_path", "x", "--bogus", "1"], "error: unrecognized arguments: --bogus 1"),
])
def test_flag_errors_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        sampler.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(message), err


def test_help_and_text_like_prompts(capsys):
    with pytest.raises(SystemExit) as e:
        sampler.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--ckpt_path" in out and "--top_k" in out
    for prompt in ["12", "null", "[1, 2]", "true", ""]:  # prompts stay text, never parsed as values
        assert sampler.parse_args(["--ckpt_path", "x", "--prompt", prompt]).prompt == [prompt]


def test_cached_sampling_equals_uncached_and_seeds_reproduce(char_ckpt):
    run = load_run(char_ckpt)
    greedy = sampler.sample(run, "the ", 20, temperature=0)
    assert len(greedy[1]) == 20 and sampler.sample(run, "the ", 20, temperature=0, use_cache=False) == greedy
    drawn = sampler.sample(run, "the ", 20, 1.0, seed=3, top_p=0.9)
    assert drawn == sampler.sample(run, "the ", 20, 1.0, seed=3, top_p=0.9)
    many = sampler.sample_many(run, ["the ", "fox", "dog"], 10, temperature=0)  # two lengths: two batches
    assert many == [sampler.sample(run, p, 10, temperature=0) for p in ("the ", "fox", "dog")]
    with pytest.raises(ValueError, match=r"--top_p must be in \(0, 1\]"):
        sampler.sample(run, "the ", 5, top_p=0.0)


def test_main_streams_one_prompt_and_prints_several(char_ckpt, capsys):
    args = ["--ckpt_path", str(char_ckpt), "--max_new_tokens", "8", "--temperature", "0"]
    assert sampler.main([*args, "--prompt", "the "]) == 0
    one = capsys.readouterr().out
    assert sampler.main([*args, "--prompt", "the ", "--no_cache"]) == 0
    assert capsys.readouterr().out == one and one.startswith("the ") and len(one) == len("the ") + 8 + 1
    assert sampler.main([*args, "--prompt", "the ", "fox"]) == 0
    assert capsys.readouterr().out.split("\n\n") == [one.rstrip("\n"), "fox" + sampler.sample(
        load_run(char_ckpt), "fox", 8, temperature=0)[0] + "\n"]


def test_top_p_and_the_stop_token():
    from lit_attn import GPTConfig, Transformer
    from lit_attn.transformer import sample_next

    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]])
    assert all(sample_next(logits, 1.0, top_p=0.5).item() == 0 for _ in range(20))  # the top token alone has > 0.5
    assert {sample_next(logits, 1.0, top_p=0.9).item() for _ in range(200)} == {0, 1}
    model = Transformer(GPTConfig(vocab_size=20, n_layer=1, n_embd=16, n_head=2, block_size=16))
    prompt = torch.tensor([[0, 1, 2], [3, 4, 5]])
    first = model.generate(prompt, 1, temperature=0)[:, -1]
    stopped = model.generate(prompt, 10, temperature=0, stop_token=int(first[0]))
    if first[0] == first[1]:
        assert stopped.shape == (2, 4)  # both sequences stopped at once
    else:
        assert stopped[0, 3:].eq(first[0]).all()  # a stopped sequence repeats its stop token


def _zip_without_checkpoint(path):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a", "b")


BAD_CHECKPOINTS = {
    "empty": (lambda p: p.write_bytes(b""), "is unreadable, probably truncated or corrupt"),
    "random bytes": (lambda p: p.write_bytes(bytes(range(256)) * 8), "is unreadable, probably truncated or corrupt"),
    "text": (lambda p: p.write_text("not a checkpoint\n"), "is unreadable, probably truncated or corrupt"),
    "foreign zip": (_zip_without_checkpoint, "is unreadable, probably truncated or corrupt"),
    "directory": (lambda p: p.mkdir(), "checkpoint not found"),
    "a list": (lambda p: torch.save([1, 2], p), "is not a lit-attn checkpoint (it holds a list)"),
    "junk entries": (lambda p: torch.save({"state_dict": 5, "hyper_parameters": "x"}, p), "error: "),
}


@pytest.mark.parametrize("kind", BAD_CHECKPOINTS)
def test_bad_checkpoint_files_are_one_line(kind, tmp_path, capsys):
    make, message = BAD_CHECKPOINTS[kind]
    path = tmp_path / "bad.ckpt"
    make(path)
    assert sampler.main(["--ckpt_path", str(path), "--prompt", "ab"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ") and message in captured.err, captured
    assert "Traceback" not in captured.err


def test_more_new_tokens_than_the_memory_holds_are_refused_before_generating(char_ckpt, monkeypatch, capsys):
    from lit_attn.transformer import Transformer

    monkeypatch.setattr(sampler, "available_memory", lambda: 2**30)
    monkeypatch.setattr(Transformer, "generate", lambda *a, **k: pytest.fail("tokens were generated"))
    assert sampler.main(["--ckpt_path", str(char_ckpt), "--prompt", "the", "--max_new_tokens", str(10**12)]) == 2
    most = 2**30 // sampler.BYTES_PER_TOKEN - 3  # the prompt's 3 characters
    assert capsys.readouterr().err == (f"error: --max_new_tokens {10**12}: generating that many tokens after 1 "
                                       f"prompt(s) needs about 59604.6 GiB of memory, 1.0 GiB is available; pass "
                                       f"--max_new_tokens {most} or less\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["--max_new_tokens", "-1"], "error: --max_new_tokens must be >= 0, got -1"),
    (["--top_k", "0"], "error: --top_k must be >= 1, got 0"),
    (["--top_p", "1.5"], "error: --top_p must be in (0, 1], got 1.5"),
    (["--temperature", "-1"], "error: --temperature must be >= 0, got -1.0"),
    (["--device", "foo"], "error: --device foo: not a torch device; use cpu, cuda or cuda:N"),
    pytest.param(["--device", "cuda"], "error: --device cuda: this machine has no CUDA GPU; use --device cpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")),
])
@pytest.mark.parametrize("prompt", ["", "the "])
def test_bad_values_are_one_line_on_stderr(argv, message, prompt, char_ckpt, capsys):
    """One error line, alone on stderr; stdout holds at most the prompt, its line ended."""
    assert sampler.main(["--ckpt_path", str(char_ckpt), "--prompt", prompt, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out in ("", prompt + "\n"), captured
