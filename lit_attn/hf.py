"""Hugging Face transformers <-> Transformer, with the same logits both ways.

GPT-2 (`GPT2LMHeadModel`): attention mha, pos learned, norm layernorm, ffn gelu (erf GELU: activation_function
"gelu", not GPT-2's published "gelu_new"). Llama (`LlamaForCausalLM`): a grouped attention (mha, gqa, mqa, sqa,
ssqa, xsqa, xsmqa: Llama's head_dim and head counts express Hq query heads of n_embd // n_head channels sharing
Hkv key/value heads), pos rope, norm rmsnorm, ffn swiglu. Both with final_norm. A bias the HF class has and
this model lacks is written as zeros; one it lacks (the LM head's, untied with bias) must be zero. transformers
is imported only when a function needs it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from lit_attn.attention.grouped import PRESETS, GroupedAttention
from lit_attn.config import GPTConfig
from lit_attn.transformer import Transformer

EXPORTABLE = ("GPT-2 (attention mha, pos learned, norm layernorm, ffn gelu) or Llama (attention "
              f"{'/'.join(PRESETS)}, pos rope, norm rmsnorm, ffn swiglu), with final_norm")
INSTALL = 'pip install -e ".[eval]"'
ROPE_BASE, NORM_EPS = 10000.0, 1e-5  # lit_attn/attention/rope.py and transformer.make_norm


class Part(NamedTuple):
    """HF tensor `hf` is rows [start, stop) of our tensor `ours` (all rows: None), transposed for GPT-2's Conv1D."""

    hf: str
    ours: str
    rows: tuple[int, int] | None = None
    transpose: bool = False


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError(f"Hugging Face export and import need transformers: {INSTALL}") from None
    return transformers


def _refuse(why: str) -> ValueError:
    return ValueError(f"cannot export to Hugging Face: {why}; exportable: {EXPORTABLE}")


def hf_family(config: GPTConfig) -> str:
    """'gpt2' or 'llama': the HF architecture that computes what `config` does; a one-line ValueError otherwise."""
    if config.spec.cls is not GroupedAttention or config.attention_options:
        raise _refuse(f"attention {config.attention!r} is not plain grouped query/key/value attention")
    if not config.final_norm:
        raise _refuse("final_norm=false (GPT-2 and Llama always normalise before the LM head)")
    layout = (config.pos, config.norm, config.ffn)
    if layout == ("learned", "layernorm", "gelu"):
        if config.heads != (config.n_head, config.n_head):
            raise _refuse(f"attention {config.attention!r} with pos learned (GPT-2 has multi-head attention only; "
                          "Llama takes grouped heads with pos rope)")
        return "gpt2"
    if layout == ("rope", "rmsnorm", "swiglu"):
        return "llama"
    raise _refuse(f"pos {config.pos}, norm {config.norm}, ffn {config.ffn}")


def hf_config(config: GPTConfig, **extra: Any) -> Any:
    """The transformers config of `config`'s architecture; `extra` sets more fields (e.g. token ids)."""
    tf = _transformers()
    tokens = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None} | extra
    qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
    if hf_family(config) == "gpt2":
        return tf.GPT2Config(
            vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
            n_layer=config.n_layer, n_head=config.n_head, n_inner=config.ffn_width, activation_function="gelu",
            layer_norm_epsilon=NORM_EPS, resid_pdrop=config.dropout, embd_pdrop=config.dropout,
            attn_pdrop=config.dropout, tie_word_embeddings=config.tie_embeddings, **tokens)
    hq, hkv = config.heads
    return tf.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=config.ffn_width,
        num_hidden_layers=config.n_layer, num_attention_heads=hq, num_key_value_heads=hkv,
        head_dim=config.head_size, hidden_act="silu", max_position_embeddings=config.block_size,
        rms_norm_eps=NORM_EPS, rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
        attention_bias=qkv_bias or config.bias, mlp_bias=config.bias, attention_dropout=config.dropout,
        tie_word_embeddings=config.tie_embeddings, **tokens)


def weight_parts(config: GPTConfig) -> list[Part]:
    """Every HF weight of `config`'s export and where it lives in the Transformer's state_dict."""
    family = hf_family(config)
    hq, hkv = config.heads
    q, kv, hidden = hq * config.head_size, hkv * config.head_size, config.ffn_width
    parts: list[Part] = []
    for i in range(config.n_layer):
        o = f"blocks.{i}."
        if family == "gpt2":
            h = f"transformer.h.{i}."
            names = [("ln_1", "norm1"), ("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.out_proj"),
                     ("ln_2", "norm2"), ("mlp.c_fc", "ffn.in_proj"), ("mlp.c_proj", "ffn.out_proj")]
            # GPT-2's Conv1D stores a linear layer's weight as (in, out): ours transposed.
            parts += [Part(f"{h}{a}.{p}", f"{o}{b}.{p}", None, p == "weight" and not a.startswith("ln"))
                      for a, b in names for p in ("weight", "bias")]
            continue
        h = f"model.layers.{i}."
        parts += [Part(f"{h}input_layernorm.weight", f"{o}norm1.weight"),
                  Part(f"{h}post_attention_layernorm.weight", f"{o}norm2.weight")]
        for p in ("weight", "bias"):
            parts += [Part(f"{h}self_attn.q_proj.{p}", f"{o}attn.qkv.{p}", (0, q)),
                      Part(f"{h}self_attn.k_proj.{p}", f"{o}attn.qkv.{p}", (q, q + kv)),
                      Part(f"{h}self_attn.v_proj.{p}", f"{o}attn.qkv.{p}", (q + kv, q + 2 * kv)),
                      Part(f"{h}self_attn.o_proj.{p}", f"{o}attn.out_proj.{p}"),
                      Part(f"{h}mlp.gate_proj.{p}", f"{o}ffn.in_proj.{p}", (0, hidden)),
                      Part(f"{h}mlp.up_proj.{p}", f"{o}ffn.in_proj.{p}", (hidden, 2 * hidden)),
                      Part(f"{h}mlp.down_proj.{p}", f"{o}ffn.out_proj.{p}")]
    if family == "gpt2":
        top = [("transformer.wte.weight", "tok_emb.weight"), ("transformer.wpe.weight", "pos_emb.weight"),
               ("transformer.ln_f.weight", "norm_f.weight"), ("transformer.ln_f.bias", "norm_f.bias")]
    else:
        top = [("model.embed_tokens.weight", "tok_emb.weight"), ("model.norm.weight", "norm_f.weight")]
    return parts + [Part(a, b) for a, b in top] + [Part("lm_head.weight", "lm_head.weight")]


def _piece(tensor: torch.Tensor, part: Part) -> torch.Tensor:
    piece = tensor if part.rows is None else tensor[part.rows[0]:part.rows[1]]
    return piece.t() if part.transpose else piece


def hf_weights(model: Transformer, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """The HF state_dict of `model` for an HF model whose tensors have `shapes` (zeros where we have no bias)."""
    ours = model.state_dict()
    bias = ours.get("lm_head.bias")
    if bias is not None and bool(bias.any()):
        raise _refuse("the LM head has a non-zero bias (bias=true, tie_embeddings=false), which GPT-2 and Llama "
                      "lack; train with --model.bias false or tied embeddings")
    out = {}
    for part in weight_parts(model.config):
        if part.hf not in shapes:
            continue  # a bias the HF model does not have: ours is absent too (zeros are written otherwise)
        source = ours.get(part.ours)
        out[part.hf] = (torch.zeros(shapes[part.hf]) if source is None else _piece(source, part)).contiguous()
    return out


def to_hf_model(model: Transformer, **extra: Any) -> Any:
    """The transformers model (GPT2LMHeadModel or LlamaForCausalLM) computing `model`'s logits, in eval mode,
    on its device and dtype; `extra` goes to the HF config (e.g. eos_token_id)."""
    tf = _transformers()
    config = hf_config(model.config, **extra)
    cls = tf.GPT2LMHeadModel if config.model_type == "gpt2" else tf.LlamaForCausalLM
    hf = cls(config)
    shapes = {k: v.shape for k, v in hf.state_dict().items()}
    weights = {k: v.detach().to("cpu", torch.float32) for k, v in hf_weights(model, shapes).items()}
    missing = set(shapes) - set(weights)
    if missing:
        raise _refuse(f"no weight for the HF tensors {', '.join(sorted(missing)[:3])}")
    hf.load_state_dict(weights)
    weight = model.tok_emb.weight
    return hf.to(device=weight.device, dtype=weight.dtype).eval()
