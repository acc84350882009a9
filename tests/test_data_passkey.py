"""PasskeyDataModule: the probe's passkey text as a training task, its labels, depths, splits and errors, and a run
that `lit-attn probe` and `lit-attn sample` read."""

import json
import re

import pytest
import torch
from helpers import TINY_FIT, history, one_line_error

from callbacks.recall import _all_right
from datamodules import PasskeyDataModule
from lit_attn.codec import codec_from_checkpoint
from lit_attn.passkey import FILLER, NEEDLE, QUESTION, check_passkey_text, passkey_chars
from lit_attn.transformer import IGNORE_INDEX

KEY = re.compile(r"The pass key is (\d{5})\. Remember it\. ")


def small(**overrides) -> PasskeyDataModule:
    return PasskeyDataModule(**({"block_size": 160, "num_train_examples": 2000, "num_val_examples": 300} | overrides))


def read(dm: PasskeyDataModule, x: torch.Tensor, y: torch.Tensor) -> dict:
    """What an example holds: its text, key, labelled positions and the key sentence's place in the filler."""
    text = dm.decode(x.tolist())
    labelled = (y != IGNORE_INDEX).nonzero()[:, 0].tolist()
    found = KEY.search(text)
    question = text.index(QUESTION)
    return {"text": text, "key": found.group(1), "labelled": labelled, "needle": found.start(),
            "room": question - len(found.group(0)), "length": labelled[-1] + 2, "question": question}


def examples(dm: PasskeyDataModule, dataset, n: int) -> list[dict]:
    return [read(dm, *dataset[i]) for i in range(n)]


def test_labels_are_the_answer_alone_and_spell_the_key():
    dm = small()
    for dataset in (dm.val_examples(), dm.train_examples()):
        for i in range(100):
            x, y = dataset[i]
            e = read(dm, x, y)
            start = e["question"] + len(QUESTION) - 1  # the last prompt character predicts the space
            assert e["labelled"] == list(range(start, start + 6))
            assert dm.decode(y[start : start + 6].tolist()) == " " + e["key"]
            assert (x[start + 1 : start + 6] == y[start : start + 5]).all()  # teacher forcing: y is x shifted
            assert x.shape == y.shape == (160,) and x.dtype == y.dtype == torch.int64


def test_lengths_and_key_depths_cover_their_ranges():
    dm = small()
    seen = examples(dm, dm.val_examples(), 300)
    lengths = [e["length"] for e in seen]
    assert min(lengths) <= dm.min_length + 5 and max(lengths) >= 155
    assert min(lengths) >= dm.min_length == 79 and max(lengths) <= 160
    depths = [e["needle"] / e["room"] for e in seen if e["room"] > 40]  # room for several sentence boundaries
    assert min(depths) == 0.0 and max(depths) == 1.0  # first, and just before the question
    assert 0.3 < sum(depths) / len(depths) < 0.7 and len({round(d, 1) for d in depths}) >= 8
    # the filler is the probe's sentences, whole but for the first
    whole = re.compile("(?:" + "|".join(map(re.escape, FILLER)) + ")*")
    for e in seen:
        filler = KEY.sub("", e["text"][: e["question"]])
        assert whole.fullmatch(filler[filler.find(". ") + 2 :] if ". " in filler else "")


def test_the_same_seed_draws_the_same_examples_and_another_seed_others():
    a, b, c = small(), small(), small(seed=1)
    for part in ("val_examples", "train_examples"):
        first, again, other = (getattr(dm, part)() for dm in (a, b, c))
        for i in (0, 7, 199):
            assert all(torch.equal(u, v) for u, v in zip(first[i], again[i]))
            assert torch.equal(first[i][0], first[i][0])
        assert sum(torch.equal(first[i][0], other[i][0]) for i in range(50)) == 0
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    batch = a.train_examples().__getitems__([3, 1])
    assert torch.equal(batch[0][1], a.train_examples()[1][0])


def test_training_never_holds_a_validation_key():
    dm = small(num_val_examples=2000)
    val = {e["key"] for e in examples(dm, dm.val_examples(), 2000)}
    train = {e["key"] for e in examples(dm, dm.train_examples(), 2000)}
    # 2,000 keys each of 90,000: about 44 would be shared by chance
    assert len(val) > 1900 and len(train) > 1900 and not val & train


def test_the_vocabulary_covers_the_passkey_text_and_travels_in_the_checkpoint():
    dm = small()
    assert dm.vocab == passkey_chars() and dm.vocab_size == len(set(dm.vocab)) == 37
    check_passkey_text(dm.codec)
    text = "".join(FILLER) + NEEDLE.format(key="0123456789") + QUESTION
    assert dm.decode(dm.encode(text)) == text
    assert codec_from_checkpoint({"PasskeyDataModule": dm.state_dict()}).vocab == dm.vocab
    with pytest.raises(ValueError, match="different vocabulary"):
        dm.load_state_dict({"vocab": "abc"})


@pytest.mark.parametrize("settings, message", [
    ({"block_size": 64}, "--model.block_size 64 is shorter than a passkey prompt and its answer (79 characters "
                         "without filler); raise --model.block_size to at least 79"),
    ({"min_length": 50}, "--data.min_length must be an integer from 79 (a prompt without filler) to "
                         "--model.block_size 160, got 50"),
    ({"min_length": 161}, "--data.min_length must be an integer from 79"),
])
def test_impossible_settings_are_one_line_errors(settings, message):
    assert one_line_error(small, **settings).startswith(message)


def test_exact_counts_the_examples_whose_labels_are_all_right():
    targets = torch.tensor([IGNORE_INDEX, 5, 6, IGNORE_INDEX, 7, 8, IGNORE_INDEX, IGNORE_INDEX, 9])
    preds = torch.tensor([0, 5, 6, 1, 7, 0, 2, 3, 9])
    rows = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3])  # row 2 has no label: left out
    assert _all_right(preds, targets, rows, 5).tolist() == [1.0, 0.0, 1.0]


@pytest.mark.slow
def test_a_run_logs_passkey_accuracy_and_the_probe_and_sampler_read_it(tmp_path):
    from lit_attn.cli.lightning_cli import cli
    from lit_attn.tools import probe, sample

    flags = [a for a in TINY_FIT if not a.startswith(("--model.block_size", "--trainer.max_steps"))]
    assert cli(["fit", "--data=PasskeyDataModule", "--data.num_val_examples=16", "--data.batch_size=8",
                "--model.block_size=96", "--model.pos=rope", "--model.sparse_targets=true", "--trainer.max_steps=2",
                "--samples.max_new_tokens=0",
                "--samples.prompts=[The ]", "--params.print_table=false", f"--runs_dir={tmp_path}", "--run=pk",
                *flags]) == 0
    h = history(tmp_path / "pk")
    assert [step for step, _ in h["val/passkey_acc"]] == [1]
    assert 0.0 <= h["val/passkey_acc"][0][1] <= 1.0
    assert h["val/passkey_acc"][0][1] == pytest.approx(h["val/acc"][0][1], abs=1e-6)  # only the answer is labelled
    assert [step for step, _ in h["val/passkey_exact"]] == [1]
    assert 0.0 <= h["val/passkey_exact"][0][1] <= h["val/passkey_acc"][0][1]
    assert not [tag for tag in h if tag.startswith("val/mqar_acc")]
    assert probe.main([f"--runs_dir={tmp_path}", "--run=pk", "--probes=passkey", "--lengths=1,2", "--depths=0,1",
                       "--trials=2", "--device=cpu"]) == 0
    result = json.loads((tmp_path / "pk" / "probe" / "passkey" / "passkey.json").read_text())
    assert [len(row) for row in result["accuracy"]] == [2, 2] and result["mean"] is not None
    assert sample.main(["--ckpt_path", str(tmp_path / "pk" / "checkpoints" / "last.ckpt"), "--prompt",
                        "What is the pass key?", "--max_new_tokens=4", "--device=cpu"]) == 0
