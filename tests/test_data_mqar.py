"""MQARDataModule: Zoology's multi-query associative recall, its distribution, splits, loaders and errors."""

import hashlib

import numpy as np
import pytest
import torch
from helpers import TINY_FIT, one_line_error

from datamodules import MQARDataModule
from datamodules.mqar import distinct, draw_gaps, mqar_examples, power_law
from lit_attn.transformer import IGNORE_INDEX

V = 64  # a small vocabulary makes ranges and collisions visible


def small(**overrides) -> MQARDataModule:
    settings = dict(input_seq_len=32, num_kv_pairs=4, num_train_examples=2000, num_test_examples=300,
                    vocab_size=V, block_size=32, batch_size=16)
    return MQARDataModule(**(settings | overrides))


def queries(inputs: np.ndarray, labels: np.ndarray, pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys, values and, per pair, the position of its key's query, checking there is exactly one."""
    keys, values = inputs[:, 0 : 2 * pairs : 2], inputs[:, 1 : 2 * pairs : 2]
    labelled = labels != IGNORE_INDEX
    assert (labelled.sum(axis=1) == pairs).all()  # nothing but the queries is labelled
    hits = labelled[:, None, :] & (inputs[:, None, :] == keys[:, :, None])  # (examples, pairs, positions)
    assert (hits.sum(axis=2) == 1).all()  # each key queried exactly once
    return keys, values, hits.argmax(axis=2)


def test_examples_follow_zoology_layout():
    rng = np.random.default_rng(1)
    inputs, labels = mqar_examples(rng, 5000, 32, 4, V, power_a=0.01)
    assert inputs.shape == labels.shape == (5000, 32) and inputs.dtype == labels.dtype == np.int64
    keys, values, pos = queries(inputs, labels, 4)
    assert ((1 <= keys) & (keys < V // 2)).all() and ((V // 2 <= values) & (values < V)).all()
    assert (np.diff(np.sort(keys, axis=1), axis=1) > 0).all()  # keys distinct within an example
    assert (np.diff(np.sort(values, axis=1), axis=1) > 0).all()  # values too, as Zoology draws them
    rows = np.arange(len(inputs))[:, None]
    assert (inputs[rows, pos] == keys).all() and (labels[rows, pos] == values).all()
    # queries sit at even offsets after the pairs, never at the last position
    assert ((pos >= 8) & (pos % 2 == 0) & (pos <= 30)).all()
    # the filler is uniform over the whole vocabulary, 0 included
    filler = np.ones_like(inputs, dtype=bool)
    filler[:, :8] = False
    filler[rows, pos] = False
    counts = np.bincount(inputs[filler], minlength=V)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


def _digest(*arrays) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


def test_the_default_draw_is_the_one_archived_runs_trained_on():
    """The random-filler draw and the data's fingerprint, pinned: a change would make archived runs irreproducible
    (and their checkpoints refuse to resume). A new numpy whose Generator streams changed fails here too."""
    inputs, labels = mqar_examples(np.random.default_rng(5), 200, 64, 4, 8192, power_a=0.01)
    assert inputs[0, :12].tolist() == [2745, 5247, 3946, 5421, 779, 7704, 2607, 4930, 2745, 5669, 3673, 7512]
    assert _digest(inputs, labels) == "1054828f7ba4d9b35888d97d6555fb1fadc9081c9bc9e6b07e3a5ac9040f88a5"
    dm = MQARDataModule(num_train_examples=500, num_test_examples=100)
    train, test = dm.train_examples(), dm.test_slices()[0]
    assert _digest(train.inputs.numpy(), train.labels.numpy(), test.inputs.numpy(), test.labels.numpy()) == (
        "7f92053f8a6aa7f4b3ceb57645c353903228a3365a9a5f52b7b42741a89a052e")
    assert MQARDataModule().fingerprint() == "6511bc77355743bd7628973e71339aa9"


def test_zero_filler_puts_0_wherever_there_is_no_key_value_or_query():
    """random_filler=False (Zoology's Figure 2): the same keys, values and queries as the default draw, 0 elsewhere."""
    zero, random = small(random_filler=False).test_slices()[0], small().test_slices()[0]
    inputs, labels = zero.inputs.numpy(), zero.labels.numpy()
    keys, values, pos = queries(inputs, labels, 4)
    rows = np.arange(len(inputs))[:, None]
    placed = np.zeros_like(inputs, dtype=bool)
    placed[:, :8] = True  # the pairs
    placed[rows, pos] = True  # the queries
    assert (inputs[~placed] == 0).all() and (inputs[placed] != 0).all()
    assert np.array_equal(labels, random.labels.numpy())
    assert np.array_equal(inputs[placed], random.inputs.numpy()[placed])
    assert (random.inputs.numpy()[~placed] != 0).mean() > 0.9  # the default's filler is drawn
    assert small(random_filler=False).fingerprint() != small().fingerprint()
    assert "random_filler=False" in small(random_filler=False).data_identity
    assert "random_filler" not in small().data_identity


@pytest.mark.parametrize("power_a", [0.01, 0.5])
def test_gap_histogram_matches_the_power_law(power_a):
    # The first pair's gap is the first draw, distributed as p itself (later draws exclude earlier gaps).
    n, space = 20_000, 12
    inputs, labels = mqar_examples(np.random.default_rng(2), n, 8 + 2 * space, 4, 256, power_a)
    _, _, pos = queries(inputs, labels, 4)
    observed = np.bincount((pos[:, 0] - 8) // 2, minlength=space)
    expected = n * power_law(space, power_a)
    np.testing.assert_allclose(expected / n, power_a * np.arange(1, space + 1) ** (power_a - 1)
                               / (power_a * np.arange(1, space + 1) ** (power_a - 1)).sum())
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < 40, (chi2, observed, expected.round())  # 11 degrees of freedom: p < 1e-4 above 40


def test_gaps_are_distinct_and_drawn_in_turn():
    p = power_law(6, 0.01)
    gaps = draw_gaps(np.random.default_rng(3), 50_000, p, 2, chunk=4096)
    assert (gaps[:, 0] != gaps[:, 1]).all()
    # the second draw given the first is p renormalized over the rest: P(second = 0) = sum_g p_g p_0 / (1 - p_g)
    expected = sum(p[g] * p[0] / (1 - p[g]) for g in range(1, 6))
    assert abs((gaps[:, 1] == 0).mean() - expected) < 0.01


def test_distinct_is_uniform_over_ordered_draws():
    picks = distinct(np.random.default_rng(4), 60_000, 4, 2)
    assert (picks[:, 0] != picks[:, 1]).all()
    counts = np.bincount(picks[:, 0] * 4 + picks[:, 1], minlength=16).reshape(4, 4)
    off = counts[~np.eye(4, dtype=bool)]
    assert abs(off / len(picks) - 1 / 12).max() < 0.01  # each of the 12 ordered pairs equally often


def test_train_and_test_are_disjoint_and_seeded():
    dm = small(vocab_size=9, input_seq_len=8, num_kv_pairs=2, block_size=8, num_train_examples=3000)
    train, test = dm.train_examples(), dm.test_slices()[0]
    seen = {row.tobytes() for row in train.inputs.numpy()}
    assert len(seen) > 100 and not any(row.tobytes() in seen for row in test.inputs.numpy())
    assert len(train) < 3000  # with 8 tokens collisions happen, and those train examples went
    again, other = small().train_examples(), small(seed=1).train_examples()
    first = small().train_examples()
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.labels, again.labels)
    assert not torch.equal(first.inputs, other.inputs)
    assert len(first) == 2000  # no collisions at V=64, length 32


def test_test_slices_and_validation_batches():
    dm = small(test_settings=[[32, 4], [64, 8], [16, 2]], block_size=64, num_test_examples=40, vocab_size=128)
    assert dm.slice_names == ["T32_kv4", "T64_kv8", "T16_kv2"]
    slices = dm.test_slices()
    assert [tuple(s.inputs.shape) for s in slices] == [(40, 32), (40, 64), (40, 16)]
    dm.setup("validate")
    batches = list(dm.val_dataloader())
    assert len(batches) == 9  # 16 + 16 + 8 per slice: a batch never spans two slices
    for x, y, index in batches:
        assert x.dtype == y.dtype == index.dtype == torch.long and x.shape == y.shape
        assert index.shape == (len(x),) and index.unique().numel() == 1
        assert x.shape[1] == dm.test_settings[index[0]][0]
    assert [int(i[0]) for _, _, i in batches] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.equal(torch.cat([x for x, _, i in batches if i[0] == 1]), slices[1].inputs)


def test_a_heldout_set_is_drawn_apart_and_kept_out_of_training():
    dm = small(vocab_size=9, input_seq_len=8, num_kv_pairs=2, block_size=8, num_train_examples=3000,
               num_heldout_examples=40, batch_size=16)
    plain = small(vocab_size=9, input_seq_len=8, num_kv_pairs=2, block_size=8, num_train_examples=3000)
    (held,), (test,) = dm.heldout_slices(), dm.test_slices()
    assert tuple(held.inputs.shape) == (40, 8) and not torch.equal(held.inputs, test.inputs[:40])
    train = dm.train_examples()
    seen = {row.tobytes() for row in train.inputs.numpy()}
    assert not any(row.tobytes() in seen for row in held.inputs.numpy())  # never trained on
    assert len(train) < len(plain.train_examples())  # the train examples equal to a held-out one went
    assert torch.equal(test.inputs, plain.test_slices()[0].inputs)  # validation is as without a held-out set
    dm.setup("test")
    batches = list(dm.test_dataloader())
    assert [len(x) for x, _, _ in batches] == [16, 16, 8]
    assert torch.equal(torch.cat([x for x, _, _ in batches]), held.inputs)
    plain.setup("test")  # without a held-out set, test scores the validation examples
    assert torch.equal(torch.cat([x for x, _, _ in plain.test_dataloader()]), test.inputs)
    assert dm.fingerprint() != plain.fingerprint()
    assert "num_heldout_examples=40" in dm.data_identity and "heldout" not in plain.data_identity


def test_train_loader_uses_the_resumable_sampler():
    from datamodules import WindowSampler

    dm = small()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert isinstance(dm.sampler, WindowSampler)
    x, y = next(iter(loader))
    assert x.shape == y.shape == (16, 32) and x.dtype == y.dtype == torch.long
    order = dm.sampler.order(0)
    assert torch.equal(x, dm.train_set.inputs[order[:16]])
    resumed = small()
    resumed.setup("fit")
    resumed_loader = resumed.train_dataloader()
    resumed_loader.load_state_dict({"epoch": 0, "index": 32, "seed": 0, "num_replicas": 1})
    x2, _ = next(iter(resumed_loader))
    assert torch.equal(x2, dm.train_set.inputs[order[32:48]])
    assert small().fingerprint() == dm.fingerprint() != small(power_a=0.5).fingerprint()


@pytest.mark.parametrize(("overrides", "match"), [
    (dict(num_kv_pairs=9), "lower --data.num_kv_pairs to at most 8 or raise --data.input_seq_len"),
    (dict(input_seq_len=31), "positive even integer"),
    (dict(vocab_size=8), "raise --data.vocab_size to at least 10"),
    (dict(vocab_size=32), "--data.vocab_size 32 must be greater than --data.input_seq_len 32 .as in Zoology.; "
                          "raise --data.vocab_size or lower --data.input_seq_len"),
    (dict(test_settings=[[32, 4], [64, 4]], block_size=64),
     r"--data.vocab_size 64 must be greater than --data.test_settings\[1\] input_seq_len 64"),
    (dict(test_settings=[[32, 4], [16, 8]]), r"test_settings\[1\] input_seq_len 16 cannot hold 8"),
    (dict(test_settings=[[32]]), "pairs, e.g."),
    (dict(test_settings=[64, 4]), "pairs, e.g."),
    (dict(test_settings=[]), "pairs, e.g."),
    (dict(test_settings=[[64, 4]], vocab_size=128), "raise --model.block_size to at least 64"),
    (dict(block_size=16), "--model.block_size 16 is shorter"),
])
def test_bad_options_are_one_line_errors(overrides, match):
    one_line_error(small, match=match, **overrides)


def test_too_few_examples_for_a_batch():
    dm = small(num_train_examples=10)
    one_line_error(dm.setup, "fit", match="fewer than one batch of --data.batch_size 16")


def test_fit_from_the_command_line(tmp_path):
    from lit_attn.cli.lightning_cli import cli

    args = ["fit", "--data", "MQARDataModule", "--data.num_kv_pairs=2", "--data.input_seq_len=16",
            "--data.num_train_examples=256", "--data.num_test_examples=8", "--data.num_heldout_examples=8",
            "--data.batch_size=8",
            "--data.test_settings=[[16, 2], [8, 2]]", f"--runs_dir={tmp_path}", "--run=mqar", *TINY_FIT,
            "--trainer.limit_val_batches=2", "--samples.max_new_tokens=4", "--params.print_table=false"]
    assert cli(args) == 0  # one validation batch per slice, of 16 and of 8 tokens
    assert torch.load(tmp_path / "mqar" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    config = (tmp_path / "mqar" / "config.yaml").read_text()
    assert "datamodules.MQARDataModule" in config and "vocab_size: 8192" in config
    from lit_attn.tools.events import run_scalars

    scored = run_scalars(tmp_path / "mqar")  # the held-out set, once at the end: recall of its queried values
    assert [len(scored[tag]) for tag in ("test/loss", "test/acc")] == [1, 1] and 0 <= scored["test/acc"][0].value <= 1


@pytest.mark.slow
def test_stop_and_resume_gives_the_weights_of_one_run(tmp_path):
    from lit_attn.cli.lightning_cli import cli

    def fit(run: str, steps: int, *extra: str) -> dict:
        args = ["fit", "--data=MQARDataModule", "--data.num_kv_pairs=2", "--data.input_seq_len=16",
                "--data.num_train_examples=64", "--data.num_test_examples=8", "--data.batch_size=8",
                "--data.vocab_size=512", f"--runs_dir={tmp_path}", f"--run={run}", *TINY_FIT,
                f"--trainer.max_steps={steps}", "--model.total_steps=6", "--model.dropout=0.1",
                "--trainer.val_check_interval=3", "--samples.max_new_tokens=0", "--params.print_table=false", *extra]
        assert cli(args) == 0
        return torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]

    straight = fit("straight", 6)
    fit("resumed", 3)  # stops mid-epoch (8 batches an epoch)
    resumed = fit("resumed", 6, "--ckpt_path=last")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
