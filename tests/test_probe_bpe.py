"""`lit-attn probe` on a BPE run: a tiny Wikipedia-datamodule run trained on local parquet, probed as a user would."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
from helpers import TINY_FIT, history

from lit_attn.load import load_run
from lit_attn.tools import probe
from lit_attn.tools.events import event_files
from lit_attn.tools.probe_tasks import FILLER, NEEDLE, QUESTION, passkey, passkey_key, passkey_prompt
from lit_attn.transformer import Transformer

pytestmark = pytest.mark.slow

GRID = ["--contexts=1,2", "--max_windows=2", "--lengths=1,2", "--depths=0,0.5,1", "--trials=2", "--device=cpu"]
LENGTHS, DEPTHS = [64, 128], [0.0, 0.5, 1.0]  # GRID's, in tokens, for block_size 64
KEY = re.compile(r"The pass key is (\d{5})\. Remember it\. ")


def _articles(n: int) -> list[dict[str, str]]:
    """`n` articles of the probe's own sentences with keys and answers (seed 0), so the tokenizer learns them."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        parts = []
        for _ in range(25):
            key = rng.randint(10_000, 99_999)
            parts.append(NEEDLE.format(key=key) + QUESTION + f" {key}. " if rng.random() < 0.2 else rng.choice(FILLER))
        rows.append({"id": str(i), "url": f"https://x/{i}", "title": f"T{i}", "text": "".join(parts).strip()})
    return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A BPE run as `lit-attn fit` makes one: WikipediaDataModule on local parquet, its tokenizer (400 tokens)
    trained by the datamodule, pos=rope, block_size 64, one training step."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lit_attn.cli.lightning_cli import cli

    where = tmp_path_factory.mktemp("probe_bpe")
    (where / "shards").mkdir()
    pq.write_table(pa.Table.from_pylist(_articles(120)), where / "shards" / "a.parquet")
    assert cli(["fit", "--data=datamodules.WikipediaDataModule", f"--data.data_files={where / 'shards'}",
                "--data.vocab_size=400", "--data.num_proc=1", f"--data.cache_dir={where / 'cache'}",
                "--data.train_fraction=0.8", "--data.val_fraction=0.2", "--data.batch_size=4",
                f"--runs_dir={where / 'runs'}", "--run=bpe", *TINY_FIT, "--model.pos=rope", "--model.block_size=64",
                "--trainer.max_steps=1", "--trainer.val_check_interval=1", "--params.print_table=false"]) == 0
    return where / "runs" / "bpe"


def _probe(run: Path, *flags: str) -> int:
    return probe.main([f"--run={run.name}", f"--runs_dir={run.parent}", *GRID, *flags])


def _tokenizer(run: Path):
    """The run's tokenizer.json, read with `tokenizers` itself (not through the probe's codec)."""
    from tokenizers import Tokenizer

    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return Tokenizer.from_file(ckpt["WikipediaDataModule"]["tokenizer"]["path"])


def test_probes_of_a_bpe_run_are_deterministic_and_leave_its_training_record_alone(run, capsys):
    trained, training_files = history(run), event_files(run)
    assert _probe(run) == 0
    out = capsys.readouterr().out
    first = {name: json.loads((run / "probe" / name / f"{name}.json").read_text()) for name in probe.PROBES}
    assert _probe(run) == 0
    second = {name: json.loads((run / "probe" / name / f"{name}.json").read_text()) for name in probe.PROBES}
    assert first == second, "the same checkpoint, flags and seed give the same numbers"
    assert history(run) == trained and event_files(run) == training_files, "the training record changed"
    assert all((run / "probe" / name / f"{name}.png").is_file() for name in probe.PROBES)

    extra = first["extrapolation"]
    assert extra["step"] == 1 and extra["block_size"] == 64
    assert [(c["multiple"], c["context"]) for c in extra["contexts"]] == [(1, 64), (2, 128)]
    assert [c["windows"] for c in extra["contexts"]] == [4, 2]  # --max_windows=2 of the 2x context's tokens
    for c in extra["contexts"]:
        assert math.isfinite(c["loss"]) and c["loss"] > 0 and all(math.isfinite(b["loss"]) for b in c["buckets"])
    assert f"loss(2x)/loss(1x) = {extra['contexts'][1]['ratio']:.3f}" in out

    key = first["passkey"]
    assert key["lengths"] == LENGTHS and key["depths"] == DEPTHS
    cells = [a for row in key["accuracy"] for a in row]
    assert [len(row) for row in key["accuracy"]] == [3, 3] and all(0.0 <= a <= 1.0 for a in cells)  # no n/a
    assert key["mean"] == pytest.approx(sum(cells) / 6)
    assert all(isinstance(e, str) for row in key["examples"] for e in row)


def test_the_model_reads_each_passkey_prompt_as_the_run_tokenizer_encodes_its_text(run, monkeypatch):
    tokenizer, generate, calls = _tokenizer(run), Transformer.generate, []

    def spy(self, idx, max_new_tokens, **kwargs):
        calls.append((idx.tolist(), max_new_tokens))
        return generate(self, idx, max_new_tokens, **kwargs)

    monkeypatch.setattr(Transformer, "generate", spy)
    assert _probe(run, "--probes=passkey") == 0
    prompts = [(row, n) for rows, n in calls for row in rows]
    assert len(prompts) == len(LENGTHS) * len(DEPTHS) * 2  # every trial of every cell
    assert sorted({len(row) + n for row, n in prompts}) == LENGTHS  # prompt and answer fill each length
    for row, n in prompts:
        text = tokenizer.decode(row)
        assert tokenizer.encode(text).ids == row, "the prompt is not the tokenizer's encoding of its text"
        (key,) = KEY.findall(text)
        assert text.endswith(QUESTION) and n == len(tokenizer.encode(" " + key).ids)
    # What the fix is for: the sentences encoded one by one and joined are not the text's tokens under BPE.
    codec = load_run(run).codec
    joined, _ = passkey_prompt(codec, 64, 0.5, "31415")
    assert tokenizer.encode(tokenizer.decode(joined)).ids != joined


class Oracle:
    """A stand-in model that answers each passkey prompt with its key plus `off`, in the run's BPE tokens."""

    def __init__(self, codec, off: int):
        self.codec, self.off, self.tok_emb = codec, off, torch.nn.Embedding(1, 1)

    def generate(self, idx, max_new_tokens, **kwargs):
        rows = []
        for row in idx.tolist():
            (key,) = KEY.findall(self.codec.decode(row))
            answer = self.codec.encode(f" {int(key) + self.off}") + [self.codec.eot_id] * max_new_tokens
            rows.append(row + answer[:max_new_tokens])
        return torch.tensor(rows)


@pytest.mark.parametrize("off, accuracy", [(0, 1.0), (1, 0.0)])
def test_answers_are_decoded_and_scored_as_text(run, off, accuracy):
    codec = load_run(run).codec
    result = passkey(Oracle(codec, off), codec, LENGTHS, DEPTHS, trials=3, seed=0)
    assert result["accuracy"] == [[accuracy] * 3] * 2 and result["mean"] == accuracy
    if off == 0:  # each cell shows its first trial's answer: the key's text, whole
        assert result["examples"] == [[" " + passkey_key(0, n, d, 0) for d in DEPTHS] for n in LENGTHS]
