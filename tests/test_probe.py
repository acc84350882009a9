"""`lit-attn probe`: loss by position past the training context, passkey retrieval, and what it refuses."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from helpers import TINY_FIT, events, history, snapshot

from lit_attn.attention import register_attention, unregister_attention
from lit_attn.codec import CharCodec
from lit_attn.config import GPTConfig
from lit_attn.tools import probe
from lit_attn.tools.events import event_files
from lit_attn.tools.probe_tasks import FILLER, NEEDLE, QUESTION, check_passkey_text, model_for_context, passkey_prompt
from lit_attn.transformer import Transformer

SMALL_GRID = ["--contexts=1,2", "--max_windows=2", "--lengths=1,2", "--depths=0,1", "--trials=2", "--device=cpu"]


def _passkey_corpus(path: Path) -> Path:
    """~24 KB of the probe's own sentences and keys, so a char run knows every character its prompts use."""
    rng = random.Random(0)
    parts = []
    for i in range(900):
        key = rng.randint(10_000, 99_999)
        parts.append(NEEDLE.format(key=key) + QUESTION + f" {key}. " if rng.random() < 0.2 else rng.choice(FILLER))
        parts.append("\n" if i % 50 == 49 else "")
    path.write_text("".join(parts), encoding="utf-8")
    return path


def _fit(corpus: Path, runs: Path, run: str, *flags: str) -> Path:
    from lit_attn.cli.lightning_cli import cli

    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", f"--run={run}", *TINY_FIT,
                "--data.batch_size=4", "--params.print_table=false", *flags]) == 0
    return runs / run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two tiny trained char runs: `rope` (block_size 128) and `learned` (block_size 16)."""
    where = tmp_path_factory.mktemp("probe")
    corpus = _passkey_corpus(where / "corpus.txt")
    _fit(corpus, where / "runs", "rope", "--model.pos=rope", "--model.block_size=128")
    _fit(corpus, where / "runs", "learned", "--model.pos=learned")
    return where / "runs"


def _probe(runs: Path, run: str, *flags: str) -> int:
    return probe.main([f"--run={run}", f"--runs_dir={runs}", *flags])


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.slow
def test_probe_is_deterministic_and_writes_beside_the_training_record(runs, capsys):
    run = runs / "rope"
    trained, training_files = history(run), event_files(run)
    assert _probe(runs, "rope", *SMALL_GRID) == 0
    first = {name: json.loads((run / "probe" / name / f"{name}.json").read_text()) for name in probe.PROBES}
    out = capsys.readouterr().out
    assert _probe(runs, "rope", *SMALL_GRID) == 0
    second = {name: json.loads((run / "probe" / name / f"{name}.json").read_text()) for name in probe.PROBES}
    assert first == second, "the same checkpoint, flags and seed give the same numbers"
    assert history(run) == trained and event_files(run) == training_files, "the training record changed"

    extra = first["extrapolation"]
    assert extra["step"] == 4 and extra["block_size"] == 128
    assert [c["context"] for c in extra["contexts"]] == [128, 256]
    for c in extra["contexts"]:
        assert len(c["buckets"]) == 8 and c["buckets"][-1]["end"] == c["context"]
        assert c["loss"] == pytest.approx(sum(b["loss"] for b in c["buckets"]) / 8)  # equal buckets
        assert c["ratio"] == pytest.approx(c["loss"] / extra["contexts"][0]["loss"])
    assert f"loss(2x)/loss(1x) = {extra['contexts'][1]['ratio']:.3f}" in out

    key = first["passkey"]
    assert key["lengths"] == [128, 256] and key["depths"] == [0.0, 1.0]
    assert len(key["accuracy"]) == 2 and all(len(row) == 2 for row in key["accuracy"])
    assert all(0.0 <= a <= 1.0 for row in key["accuracy"] for a in row)
    assert key["mean"] == pytest.approx(sum(sum(row) for row in key["accuracy"]) / 4)

    for name in probe.PROBES:  # one event file per probe (the second probe replaced the first's), with the plot
        (path,) = (run / "probe" / name).glob("events.out.tfevents.*")
        acc = events(path)
        assert acc.Tags()["images"] == [f"probe/{name}/plot"] and (run / "probe" / name / f"{name}.png").is_file()
    assert [e.value for e in events(path).Scalars("probe/passkey/accuracy")] == [pytest.approx(key["mean"])]


@pytest.mark.slow
def test_a_run_with_learned_positions_is_refused_past_its_context(runs, capsys):
    assert _probe(runs, "learned", "--device=cpu") == 2
    assert _error(capsys) == ("error: run learned uses learned absolute positions (pos=learned): it has no embedding "
                              "past position 15; extrapolation needs pos=rope (--probes passkey probes it within "
                              "its context)")
    assert _probe(runs, "learned", "--probes=passkey", "--lengths=2", "--device=cpu") == 2
    assert "passkey length past 1x block_size needs pos=rope" in _error(capsys)
    assert _probe(runs, "learned", "--probes=passkey", "--device=cpu") == 2
    assert "a passkey prompt and its answer need 79" in _error(capsys)
    assert not (runs / "learned" / "probe").exists()


@pytest.mark.parametrize(("flags", "flag", "tokens"), [
    (["--contexts=1,1000000000000"], "--contexts", 128 * 10**12),
    (["--probes=passkey", "--lengths=0.5,1e12"], "--lengths", 128 * 10**12),
])
def test_a_window_larger_than_the_memory_is_refused_before_anything_is_built(flags, flag, tokens, runs, capsys):
    before = snapshot(runs / "rope")
    assert _probe(runs, "rope", "--device=cpu", *flags) == 2
    error = _error(capsys)
    assert error.startswith(f"error: {flag}: a window of {tokens} tokens needs at least ") and \
        error.endswith(f"is available; give smaller {flag}"), error
    assert snapshot(runs / "rope") == before


@pytest.mark.slow
def test_a_text_with_characters_the_run_never_saw_is_one_line(runs, tmp_path, capsys):
    (tmp_path / "other.txt").write_text("The grass is green. Ça va? " * 100, encoding="utf-8")
    assert _probe(runs, "rope", "--probes=extrapolation", f"--data.path={tmp_path / 'other.txt'}") == 2
    assert "characters not in the vocabulary: 'vÇ'" in _error(capsys)


@pytest.mark.parametrize("flag, expected", [
    ("--probes=extrapolation,nope", "--probes extrapolation,nope: choose from extrapolation, passkey"),
    ("--contexts=one", "--contexts 'one': expected comma-separated ints"),
    ("--depths=0,1.5", "--depths must be fractions in [0, 1]"),
    ("--trials=0", "--trials must be >= 1"),
])
def test_bad_flags_are_one_line(flag, expected, tmp_path, capsys):
    assert _probe(tmp_path, "r", flag) == 2
    assert expected in _error(capsys)


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert _probe(tmp_path, "nope", "--device=cpu") == 2
    assert "--run nope: no such run (" in _error(capsys)


def test_the_passkey_prompt_fills_its_length_with_the_key_at_its_depth():
    text = "".join(FILLER) + NEEDLE + QUESTION + "0123456789"
    codec = CharCodec("".join(sorted(set(text) - set("{}"))))
    needle = NEEDLE.format(key="31415")
    for depth in (0.0, 0.5, 1.0):
        ids, answer = passkey_prompt(codec, 300, depth, "31415")
        prompt = codec.decode(ids)
        assert len(ids) + answer == 300 and answer == len(" 31415") and prompt.endswith(QUESTION)
        where = prompt.index(needle)
        assert prompt[:where].endswith(". ") or where == 0  # at a sentence boundary
        if depth == 0.0:
            assert where == 0
        if depth == 1.0:
            assert prompt[where:] == needle + QUESTION
    assert passkey_prompt(codec, 60, 0.5, "31415") is None  # shorter than the key sentence and the question
    with pytest.raises(ValueError, match=r"lacks '\?W'"):
        check_passkey_text(CharCodec(text.replace("?", "").replace("W", "")))


def test_a_longer_rope_model_agrees_with_the_trained_one_within_its_context():
    model = Transformer(GPTConfig(vocab_size=11, n_layer=1, n_embd=16, n_head=2, block_size=8, pos="rope")).eval()
    grown = model_for_context(model, 32)
    assert grown.config.block_size == 32 and model_for_context(model, 8) is model
    idx = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(grown(idx), model(idx), rtol=0, atol=0)
    assert grown(torch.randint(0, 11, (1, 32))).shape == (1, 32, 11)
    learned = Transformer(GPTConfig(vocab_size=11, n_layer=1, n_embd=16, n_head=2, block_size=8))
    with pytest.raises(ValueError, match="pos=learned has no embedding past position 7"):
        model_for_context(learned, 16)


class PerPositionGain(torch.nn.Module):
    """A toy attention with a weight per position, like qsa's per-token circuits: nothing to extrapolate with."""

    def __init__(self, n_embd: int, n_head: int, block_size: int = 8, rope: bool = False):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(block_size, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain[: x.size(1)]


def test_an_attention_with_weights_per_position_is_refused_past_its_context():
    register_attention("probe_per_position", PerPositionGain)
    try:
        config = GPTConfig(vocab_size=11, attention="probe_per_position", n_layer=1, n_embd=16, n_head=2,
                           block_size=8, pos="rope")
        with pytest.raises(ValueError, match=r"^attention 'probe_per_position' has parameters per position "
                                             r"\(blocks.0.attn.gain is shaped by block_size=8\)"):
            model_for_context(Transformer(config), 16)
    finally:
        unregister_attention("probe_per_position")
