import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from helpers import tiny_gpt

from lit_attn import GPT, GPTConfig, Transformer
from lit_attn.config import SPARSE_QUERY_LAYOUT
from lit_attn.training.model import lr_factor

# The Sparse Query Attention paper's parameter counts for its layout.
PAPER_COUNTS = {"mha": 11_966_224, "gqa": 11_179_792, "mqa": 10_983_184, "sqa": 10_655_504,
                "ssqa": 10_917_648, "xsqa": 10_393_360, "xsmqa": 10_196_752}
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,count", PAPER_COUNTS.items())
def test_sparse_query_paper_parameter_counts(name, count):
    layout = dataclasses.replace(SPARSE_QUERY_LAYOUT, attention=name)
    assert n_params(Transformer(layout)) == count
    assert n_params(Transformer(dataclasses.replace(layout, final_norm=True))) == count + 256


def test_sparse_query_config_file_is_the_paper_layout():
    model_cfg = yaml.safe_load((CONFIGS / "sqa_wikipedia.yaml").read_text())["model"]
    assert GPTConfig.from_hparams(model_cfg, vocab_size=10_000) == SPARSE_QUERY_LAYOUT
    for name, count in PAPER_COUNTS.items():
        assert n_params(GPT(vocab_size=10000, **(model_cfg | {"attention": name}))) == count


def test_gpt_takes_every_config_field_as_a_flat_argument():
    """--model.* flags: jsonargparse follows GPT's **architecture into GPTConfig, with its docstring's help."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(GPT, "model")
    actions = {a.dest.removeprefix("model."): a for a in parser._actions if a.dest.startswith("model.")}
    fields = [f.name for f in dataclasses.fields(GPTConfig)]
    assert set(fields) | {"lr", "weight_decay", "betas", "total_steps", "compile"} <= set(actions)
    assert actions["n_kv_heads"].default is None and actions["n_layer"].default == 4
    assert actions["n_layer"].help == "number of transformer blocks."
    assert actions["lr"].help == "AdamW's learning rate, e.g. 1e-3."
    model = tiny_gpt(16, lr=3e-3)
    assert model.config == GPTConfig(vocab_size=16, n_layer=1, n_embd=16, n_head=2, block_size=8)
    assert dict(model.hparams) == dataclasses.asdict(model.config) | {
        "lr": 3e-3, "weight_decay": 0.1, "betas": (0.9, 0.95), "decay_all": False, "optimizer": "adamw",
        "muon_lr": 0.02, "muon_momentum": 0.95, "muon_weight_decay": 0.0, "schedule": "cosine",
        "warmup_fraction": 0.05, "min_lr_ratio": 0.1, "cooldown_fraction": 0.2, "total_steps": None, "compile": False,
        "sparse_targets": False}
    assert GPTConfig.architecture_fields() == tuple(
        f for f in fields if f not in ("dropout", "attn_dropout", "embd_dropout"))
    with pytest.raises(ValueError, match="unknown setting.*n_layers"):
        GPT(vocab_size=16, n_layers=2)


def test_tied_embeddings_share_one_matrix():
    net = GPT(vocab_size=64, n_layer=1, n_embd=32, n_head=4, block_size=8).transformer
    assert net.lm_head.weight is net.tok_emb.weight and net.lm_head.bias is None


def test_residual_projections_get_scaled_init():
    torch.manual_seed(0)
    net = Transformer(GPTConfig(vocab_size=64, n_layer=8, n_embd=256, n_head=4, block_size=8))
    assert net.blocks[0].attn.out_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert net.blocks[0].ffn.in_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("kwargs,message", [
    (dict(norm="batchnorm"), "unknown norm 'batchnorm'"),
    (dict(pos="alibi"), "unknown pos 'alibi'"),
    (dict(ffn="relu"), "unknown ffn 'relu'"),
    (dict(lr=0.0), "lr must be a number > 0"),
    (dict(lr=-1e-3), "lr must be a number > 0"),
    (dict(dropout=1.0), r"dropout must be a number in \[0, 1\)"),
    (dict(betas=(0.9, 1.0)), r"betas must be two numbers, each in \[0, 1\), got \[0.9, 1.0\]"),
    (dict(warmup_fraction=1.5), r"warmup_fraction must be a number in \[0, 1\], got 1.5"),
    (dict(attention="nope"), "unknown attention 'nope'"),
    (dict(optimizer="sgd"), "unknown optimizer 'sgd'; choose adamw or muon"),
    (dict(muon_lr=0.0), "muon_lr must be a number > 0"),
    (dict(schedule="trapezoidal", warmup_fraction=0.5, cooldown_fraction=0.6),
     "--model.warmup_fraction 0.5 and --model.cooldown_fraction 0.6 overlap"),
])
def test_invalid_model_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_gpt(16, **kwargs)


def test_sequence_longer_than_block_size_is_an_error():
    model = tiny_gpt(16)
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_lr_schedule_warms_up_then_decays_to_floor():
    f = [lr_factor(s, 100, 0.25, 0.1) for s in range(100)]
    assert f[0] == pytest.approx(1 / 25) and f[24] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(f[:25], f[1:25]))  # rising during warm-up
    assert all(a >= b for a, b in zip(f[25:], f[26:]))  # falling afterwards
    assert f[-1] == pytest.approx(0.1, abs=1e-3)
    assert lr_factor(500, 100, 0.25, 0.1) == pytest.approx(0.1)  # stays at the floor


# Trapezoidal over 100 steps to a floor of 0.1: warm-up 0.1 (steps 0-9), cool-down 0.2 (from step 80, to the
# floor at step 100): (step + 1) / 10, then 1, then 1 - 0.9 * (step - 80) / 20.
@pytest.mark.parametrize("step,expected", [(0, 0.1), (4, 0.5), (9, 1.0), (10, 1.0), (79, 1.0), (80, 1.0),
                                           (90, 0.55), (99, 0.145), (100, 0.1), (500, 0.1)])
def test_trapezoidal_schedule_by_hand(step, expected):
    assert lr_factor(step, 100, 0.1, 0.1, cooldown_fraction=0.2) == pytest.approx(expected, abs=1e-12)


def test_trapezoidal_without_warm_up_or_plateau_is_one_linear_decay():
    assert [lr_factor(s, 10, 0.0, 0.0, cooldown_fraction=1.0) for s in (0, 5, 9)] == pytest.approx([1.0, 0.5, 0.1])


def test_weight_decay_only_on_matrices():
    model = tiny_gpt(16, total_steps=10)
    opt = model.configure_optimizers()["optimizer"]
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] > 0 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0 and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_generate_extends_the_prompt():
    model = tiny_gpt(16)
    prompt = torch.zeros(2, 3, dtype=torch.long)
    out = model.generate(prompt, max_new_tokens=12, temperature=0.8, top_k=5)
    assert out.shape == (2, 15) and torch.equal(out[:, :3], prompt)
    greedy = model.generate(prompt, max_new_tokens=12, temperature=0)
    assert torch.equal(greedy, model.generate(prompt, max_new_tokens=12, temperature=0))
    assert model.training  # generate() restores the mode


@pytest.mark.parametrize("attention", ["mha", "sqa", "noq"])
def test_a_few_steps_fit_a_batch(attention):
    model = GPT(vocab_size=32, attention=attention, n_layer=2, n_embd=32, n_head=4, block_size=16, pos="rope",
                norm="rmsnorm", ffn="swiglu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, 32, (4, 17))
    losses = []
    for _ in range(30):
        loss = model._loss(model(idx[:, :-1]), idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_validate_then_fit_in_one_process(tmp_path):
    import lightning as L

    from datamodules import CharDataModule

    corpus = tmp_path / "c.txt"
    corpus.write_text("abcdefgh ijk\n" * 200)
    dm = CharDataModule(path=str(corpus), block_size=16, batch_size=8)
    model = GPT(vocab_size=dm.vocab_size, n_layer=1, n_embd=16, n_head=2, block_size=16)
    kw = dict(limit_val_batches=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False)
    L.Trainer(**kw).validate(model, datamodule=dm)
    L.Trainer(max_steps=3, val_check_interval=2, **kw).fit(model, datamodule=dm)
    assert model.trainer.callback_metrics["val/loss"].isfinite()


def test_positions_are_a_buffer_outside_the_checkpoint():
    model = tiny_gpt(16)
    assert torch.equal(model.transformer.positions, torch.arange(8))
    assert not any("positions" in key for key in model.state_dict())


@pytest.mark.slow  # seconds: the full suite runs it, the quick loop stays under 2 minutes
def test_compiled_model_trains_like_eager_and_checkpoints_interchange(tmp_path, monkeypatch):
    """compile=True: same train/val numbers as eager; checkpoints load across compile on/off and
    from torch.compile(model) wrappers ("_orig_mod." keys), giving the same logits.

    Dynamo and AOTAutograd run for real; the backend is "aot_eager" instead of inductor, whose
    C++ code generation would cost this test ~25 s (benchmarks/bench_compile.py runs inductor).
    """
    import lightning as L

    from datamodules import CharDataModule

    real_compile = torch.nn.Module.compile
    monkeypatch.setattr(Transformer, "compile", lambda self: real_compile(self, backend="aot_eager"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 100)
    kw = dict(vocab_size=0, n_layer=1, n_embd=32, n_head=4, block_size=16, pos="rope")
    runs = {}
    for compile in (False, True):
        dm = CharDataModule(path=str(corpus), block_size=16, batch_size=4)
        torch.manual_seed(0)
        model = GPT(**(kw | {"vocab_size": dm.vocab_size}), compile=compile)
        trainer = L.Trainer(max_steps=3, limit_val_batches=1, val_check_interval=3, log_every_n_steps=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu")
        trainer.fit(model, datamodule=dm)
        trainer.save_checkpoint(tmp_path / f"compile={compile}.ckpt")
        runs[compile] = (model, {k: float(v) for k, v in trainer.callback_metrics.items()})
    (eager, eager_metrics), (compiled, compiled_metrics) = runs[False], runs[True]
    assert compiled.transformer._compiled_call_impl is not None and eager.transformer._compiled_call_impl is None
    assert eager_metrics.keys() == compiled_metrics.keys() and "val/loss" in eager_metrics
    for key, value in eager_metrics.items():
        assert compiled_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key

    idx = torch.randint(0, eager.hparams.vocab_size, (2, 16))
    with torch.no_grad():
        eager.eval(), compiled.eval()
        for saved, source, compile in ((True, compiled, False), (False, eager, True)):
            loaded = GPT.load_from_checkpoint(tmp_path / f"compile={saved}.ckpt", compile=compile).eval()
            assert (loaded.transformer._compiled_call_impl is not None) == compile
            torch.testing.assert_close(loaded(idx), source(idx), rtol=1e-5, atol=1e-5)
        wrapped = torch.compile(eager, backend="aot_eager").state_dict()
        assert all(k.startswith("_orig_mod.") for k in wrapped)
        fresh = GPT(**(kw | {"vocab_size": eager.hparams.vocab_size})).eval()
        fresh.load_state_dict(wrapped)
        torch.testing.assert_close(fresh(idx), eager(idx))


def test_a_compiled_decoding_step_compiles_once():
    """The cache's buffers keep their shape whatever the length, so every decoding step is one graph."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = Transformer(GPTConfig(vocab_size=50, attention="gqa", n_layer=2, n_embd=32, n_head=4, block_size=32,
                                  pos="rope")).eval()
    step = torch.compile(model, backend="aot_eager", dynamic=False)  # dynamo for real; inductor would cost ~20 s
    idx = torch.randint(0, 50, (2, 20))
    cache = model.new_cache(2)
    with torch.no_grad():
        model(idx[:, :8], cache, torch.arange(8))
        steps = [step(idx[:, t : t + 1], cache, torch.tensor([t])) for t in range(8, 20)]
        full = model(idx)
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 8:], rtol=1e-5, atol=1e-5)


def test_sparse_targets_give_the_same_loss_and_gradients_with_the_head_on_labelled_positions_only():
    """A recall batch: 3 targets of 4 x 8 positions; the head's matmul runs on those 3 rows only."""
    torch.manual_seed(0)
    dense, sparse = tiny_gpt(16), tiny_gpt(16, sparse_targets=True)
    sparse.load_state_dict(dense.state_dict())
    x = torch.randint(0, 16, (4, 8))
    y = torch.full((4, 8), -100)
    y[0, 3], y[2, 7], y[3, 0] = 5, 9, 1
    losses = [model.training_step((x, y), 0) for model in (dense, sparse)]
    torch.testing.assert_close(losses[0], losses[1])
    for loss in losses:
        loss.backward()
    for (name, a), b in zip(dense.named_parameters(), sparse.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    assert sparse.transformer(x, select=y != -100).shape == (3, 16)
