"""lit_attn.hf: every exportable layout gives transformers' logits and greedy tokens, round-trips bit for bit,
and everything else is refused in one line."""

from __future__ import annotations

import pytest
import torch
from helpers import one_line_error

pytest.importorskip("transformers")
import transformers  # noqa: E402
from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: E402, F401  (their lazy import, seconds, here)

from lit_attn import GPT  # noqa: E402
from lit_attn.attention import register_attention, unregister_attention  # noqa: E402
from lit_attn.attention.grouped import GroupedAttention  # noqa: E402
from lit_attn.codec import CharCodec  # noqa: E402
from lit_attn.config import GPTConfig  # noqa: E402
from lit_attn.hf import EXPORTABLE, from_hf, gpt_config, load_hf_weights, to_hf_model  # noqa: E402
from lit_attn.transformer import Transformer  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog.\nNaïve café, 日本語: 12 + 30 = 42!"
CODEC = CharCodec("".join(sorted(set(TEXT))))
GPT2 = dict(attention="mha")
LLAMA = dict(pos="rope", norm="rmsnorm", ffn="swiglu")
# name -> (settings, the HF class): GPT-2 tied/untied, Llama with each grouped head layout, tied and untied.
LAYOUTS = {
    "gpt2-tied": (GPT2, "GPT2LMHeadModel"),
    "gpt2-untied": (GPT2 | dict(tie_embeddings=False, bias=False), "GPT2LMHeadModel"),
    "gpt2-untied-bias": (GPT2 | dict(tie_embeddings=False, qkv_bias=False), "GPT2LMHeadModel"),
    "llama-mha": (LLAMA | dict(attention="mha", bias=False), "LlamaForCausalLM"),
    "llama-gqa-untied": (LLAMA | dict(attention="gqa", tie_embeddings=False, bias=False), "LlamaForCausalLM"),
    "llama-mqa": (LLAMA | dict(attention="mqa", qkv_bias=True, bias=False), "LlamaForCausalLM"),
    "llama-sqa-untied": (LLAMA | dict(attention="sqa", tie_embeddings=False, qkv_bias=False), "LlamaForCausalLM"),
    "llama-ssqa": (LLAMA | dict(attention="ssqa"), "LlamaForCausalLM"),
    "llama-xsqa": (LLAMA | dict(attention="xsqa", bias=False, ffn_hidden=40), "LlamaForCausalLM"),
    "llama-xsmqa-untied": (LLAMA | dict(attention="xsmqa", tie_embeddings=False, bias=False), "LlamaForCausalLM"),
    "llama-heads": (LLAMA | dict(attention="gqa", n_kv_heads=4, bias=False), "LlamaForCausalLM"),
}


def _model(**settings) -> Transformer:
    """A 2-layer model of width 32 with 8 heads of 4 channels, every weight drawn at a scale that makes logits
    differ (biases and norm gains too); the untied LM head's bias, which GPT-2 and Llama lack, stays zero."""
    config = GPTConfig(**(dict(vocab_size=48, n_layer=2, n_embd=32, n_head=8, block_size=24) | settings))
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "lm_head.bias":
                p.normal_(0.0 if p.dim() > 1 else 1.0, 0.15)
    return model


def _ids() -> torch.Tensor:
    text = torch.tensor([CODEC.encode(TEXT[:24]), CODEC.encode(TEXT[-24:])])
    return torch.cat([torch.randint(0, 48, (2, 24)), text])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transformers_computes_the_same_logits_and_greedy_tokens(layout):
    settings, cls = LAYOUTS[layout]
    model = _model(**settings)
    hf = to_hf_model(model)
    assert type(hf).__name__ == cls and not hf.training
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=0)
    prompt = ids[:, :6]
    ours = model.generate(prompt, 14, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=14, min_new_tokens=14, do_sample=False)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_export_import_export_round_trips_every_weight_bit_for_bit(layout, tmp_path):
    model = _model(**LAYOUTS[layout][0])
    first = to_hf_model(model)
    first.save_pretrained(tmp_path, safe_serialization=True)
    back = from_hf(tmp_path)
    second = to_hf_model(back).state_dict()
    assert first.state_dict().keys() == second.keys()
    assert all(torch.equal(t, second[k]) for k, t in first.state_dict().items())
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))
    assert back.config.heads == model.config.heads and back.config.ffn_width == model.config.ffn_width


def test_an_imported_config_names_the_preset_its_heads_match():
    config = from_hf(to_hf_model(_model(**LAYOUTS["llama-xsmqa-untied"][0]))).config
    assert (config.attention, config.n_query_heads, config.n_kv_heads) == ("xsmqa", None, None)
    config = from_hf(to_hf_model(_model(**LAYOUTS["llama-heads"][0]))).config
    assert (config.attention, config.n_query_heads, config.n_kv_heads) == ("gqa", 8, 4)
    config = from_hf(to_hf_model(_model(**LLAMA | dict(attention="sqa", n_kv_heads=1)))).config
    assert (config.attention, config.n_query_heads, config.n_kv_heads) == ("sqa", 4, 1)


class _Custom(GroupedAttention):
    """A user's attention: it could compute anything, so it is not exported."""


@pytest.mark.parametrize("settings, reason", [
    (dict(attention="noq"), "attention 'noq' is not plain"),
    (dict(attention="qsa"), "attention 'qsa' is not plain"),
    (dict(attention="gqa"), "GPT-2 has multi-head attention only"),
    (LLAMA | dict(final_norm=False), "final_norm=false"),
    (dict(pos="rope"), "pos rope, norm layernorm, ffn gelu"),
    (LLAMA | dict(norm="layernorm"), "pos rope, norm layernorm, ffn swiglu"),
    (dict(attention="custom_hf"), "attention 'custom_hf' is not plain"),
    (dict(ffn="identity"), "ffn identity .*always have an MLP"),
    (LLAMA | dict(ffn="none"), "ffn none .*always have an MLP"),
])
def test_what_has_no_hugging_face_class_is_refused_in_one_line(settings, reason):
    register_attention("custom_hf", _Custom, fixed={"preset": "mha"})
    try:
        config = GPTConfig(vocab_size=16, n_layer=1, n_embd=16, n_head=4, block_size=8, **settings)
        message = one_line_error(to_hf_model, Transformer(config), match=reason)
    finally:
        unregister_attention("custom_hf")
    assert message.startswith("cannot export to Hugging Face: ") and message.endswith(EXPORTABLE)


def test_a_non_zero_lm_head_bias_is_refused_and_a_zero_one_exported():
    model = _model(**GPT2 | dict(tie_embeddings=False))
    to_hf_model(model)
    with torch.no_grad():
        model.lm_head.bias[3] = 0.5
    one_line_error(to_hf_model, model, match="the LM head has a non-zero bias")


@pytest.mark.parametrize("config, reason", [
    (dict(model="gpt2", activation_function="gelu_new"), "exact \\(erf\\) GELU.*tanh-approximated"),
    (dict(model="gpt2", activation_function="gelu", layer_norm_epsilon=1e-6), "layer_norm_epsilon=1e-06"),
    (dict(model="llama", rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), "base 500000"),
    (dict(model="llama", hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(model="llama", num_attention_heads=3, num_key_value_heads=2), "no lit-attn equivalent"),
    (dict(model="gpt_neox"), "model_type 'gpt_neox'"),
])
def test_hugging_face_configs_lit_attn_cannot_compute_are_refused_in_one_line(config, reason):
    kind = config.pop("model")
    cls = transformers.AutoConfig.for_model(kind).__class__
    if kind == "llama":
        config = dict(hidden_size=24, num_attention_heads=2, head_dim=8, rms_norm_eps=1e-5) | config
    hf = cls(**config)
    message = one_line_error(gpt_config, hf, match=reason)
    assert message.startswith("cannot import from Hugging Face: ")


def test_init_from_starts_a_fresh_fit_from_the_hf_weights(tmp_path):
    import lightning as L
    from helpers import write_corpus

    from datamodules import CharDataModule

    data = CharDataModule(path=str(write_corpus(tmp_path / "corpus.txt")), block_size=24, batch_size=2)
    settings = dict(vocab_size=data.vocab_size, n_layer=2, n_embd=32, n_head=8, block_size=24)
    settings |= LAYOUTS["llama-sqa-untied"][0]
    hf = to_hf_model(_model(**settings))
    hf.save_pretrained(tmp_path / "hf")
    gpt = GPT(**settings, init_from=str(tmp_path / "hf"), total_steps=10)
    assert "init_from" not in gpt.hparams, "loading the checkpoint of a run must not read the directory again"
    ids = _ids()
    with torch.no_grad():
        assert not torch.allclose(gpt.eval()(ids), hf(ids).logits), "read when a fit starts, not before"
    quiet = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 enable_model_summary=False, num_sanity_val_steps=0)
    L.Trainer(max_steps=0, **quiet).fit(gpt, data)  # 0 steps: the network as the fit starts it
    with torch.no_grad():
        torch.testing.assert_close(gpt.eval()(ids), hf(ids).logits, atol=1e-5, rtol=0)
    wrong = settings | dict(n_embd=64, attention="mha", tie_embeddings=True)
    message = one_line_error(GPT, **wrong, init_from=str(tmp_path / "hf"))
    assert message == (f"--model.init_from {tmp_path / 'hf'}: its llama weights need --model.attention sqa "
                       "--model.n_embd 32 --model.tie_embeddings false")
    moved = GPT(**settings, init_from=str(tmp_path / "moved"), total_steps=10)  # validate/test never read it
    with pytest.raises(ValueError, match="moved is not a transformers model directory"):
        L.Trainer(max_steps=0, **quiet).fit(moved, data)


def test_init_from_fills_biases_the_hf_model_lacks_and_refuses_to_drop_non_zero_ones(tmp_path):
    settings = dict(vocab_size=48, n_layer=2, n_embd=32, n_head=8, block_size=24)
    to_hf_model(_model(**settings)).save_pretrained(tmp_path / "gpt2")
    without = Transformer(GPTConfig(**settings, bias=False))
    message = one_line_error(load_hf_weights, without, tmp_path / "gpt2")
    assert message == (f"--model.init_from {tmp_path / 'gpt2'}: its transformer.h.0.ln_1.bias is non-zero and this "
                       "model has no blocks.0.norm1.bias (--model.bias true)")
    llama = settings | LLAMA | dict(attention="gqa")
    hf = to_hf_model(_model(**llama, bias=False))
    hf.save_pretrained(tmp_path / "llama")
    with_bias = Transformer(GPTConfig(**llama, bias=True))
    load_hf_weights(with_bias, tmp_path / "llama")
    assert not with_bias.blocks[0].attn.qkv.bias.any() and not with_bias.blocks[1].ffn.out_proj.bias.any()
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(with_bias(ids), hf(ids).logits, atol=1e-5, rtol=0)


def test_an_imported_llama_with_output_biases_but_no_mlp_biases_keeps_them():
    hf = to_hf_model(_model(**LAYOUTS["llama-mqa"][0]))  # attention_bias true, mlp_bias false
    assert (hf.config.attention_bias, hf.config.mlp_bias) == (True, False)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.bias.normal_()
    back = from_hf(hf)
    assert back.config.bias and not back.blocks[0].ffn.in_proj.bias.any()
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(back(ids), hf(ids).logits, atol=1e-5, rtol=0)
