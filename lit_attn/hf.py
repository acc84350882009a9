"""Hugging Face transformers <-> Transformer, with the same logits both ways.

GPT-2 (`GPT2LMHeadModel`): attention mha, pos learned, norm layernorm, ffn gelu (erf GELU: activation_function
"gelu", not GPT-2's published "gelu_new"). Llama (`LlamaForCausalLM`): a grouped attention (mha, gqa, mqa, sqa,
ssqa, xsqa, xsmqa: Llama's head_dim and head counts express Hq query heads of n_embd // n_head channels sharing
Hkv key/value heads), pos rope, norm rmsnorm, ffn swiglu. Both with final_norm, without qk_norm or
logit_softcap. A bias the HF class has and this model lacks is written as zeros; one it lacks (the LM head's,
untied with bias) must be zero. transformers is imported only when a function needs it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import torch

from lit_attn.attention.grouped import GroupedAttention
from lit_attn.attention.heads import PRESETS, resolve_heads
from lit_attn.codec import one_line
from lit_attn.config import NO_MLP, GPTConfig
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
    if config.layer_pattern is not None:
        raise _refuse(f"layer_pattern {config.layer_pattern!r} (transformers' GPT-2 and Llama give every layer the "
                      "same attention)")
    if config.spec.cls is not GroupedAttention or config.attention_options:
        raise _refuse(f"attention {config.attention!r} is not plain grouped query/key/value attention")
    if not config.final_norm:
        raise _refuse("final_norm=false (GPT-2 and Llama always normalise before the LM head)")
    if config.qk_norm:
        raise _refuse("qk_norm=true (transformers' GPT-2 and Llama do not normalise queries and keys)")
    if config.logit_softcap is not None:
        raise _refuse(f"logit_softcap={config.logit_softcap} (transformers' GPT-2 and Llama do not cap their logits)")
    if config.ffn in NO_MLP:
        raise _refuse(f"ffn {config.ffn} (transformers' GPT-2 and Llama blocks always have an MLP)")
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
            layer_norm_epsilon=NORM_EPS, resid_pdrop=config.dropout, embd_pdrop=config.embedding_dropout,
            attn_pdrop=config.attention_dropout, tie_word_embeddings=config.tie_embeddings, **tokens)
    hq, hkv = config.heads
    return tf.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=config.ffn_width,
        num_hidden_layers=config.n_layer, num_attention_heads=hq, num_key_value_heads=hkv,
        head_dim=config.head_size, hidden_act="silu", max_position_embeddings=config.block_size,
        rms_norm_eps=NORM_EPS, rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
        attention_bias=qkv_bias or config.bias, mlp_bias=config.bias, attention_dropout=config.attention_dropout,
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


# ---- import: transformers -> Transformer ----

def _refuse_import(why: str) -> ValueError:
    return ValueError(f"cannot import from Hugging Face: {why}; lit-attn imports {EXPORTABLE}")


def gpt_config(hf: Any) -> GPTConfig:
    """The GPTConfig whose Transformer computes what transformers config `hf` describes; one-line ValueError
    for a config that no GPTConfig computes exactly."""
    kind = getattr(hf, "model_type", None)
    if kind not in ("gpt2", "llama"):
        raise _refuse_import(f"model_type {kind!r}")
    fields = _gpt2_fields(hf) if kind == "gpt2" else _llama_fields(hf)
    try:
        return GPTConfig(vocab_size=hf.vocab_size, n_layer=hf.num_hidden_layers, final_norm=True,
                         tie_embeddings=bool(getattr(hf, "tie_word_embeddings", True)), **fields)
    except (TypeError, ValueError) as e:
        raise _refuse_import(f"its {kind} config has no lit-attn equivalent ({one_line(e, 160)})") from None


def _gpt2_fields(hf: Any) -> dict[str, Any]:
    act = hf.activation_function
    if act != "gelu":
        raise _refuse_import(f"GPT-2 with activation_function {act!r}: lit-attn's ffn gelu is the exact (erf) GELU, "
                             "this checkpoint's is tanh-approximated as in the published gpt2 checkpoints, so its "
                             'logits would differ; only activation_function "gelu" imports')
    for name, want in (("layer_norm_epsilon", NORM_EPS), ("scale_attn_weights", True),
                       ("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False)):
        if getattr(hf, name, want) != want:
            raise _refuse_import(f"GPT-2 with {name}={getattr(hf, name)!r} (lit-attn computes {want!r})")
    hidden = hf.n_inner or 4 * hf.n_embd
    return {"attention": "mha", "n_embd": hf.n_embd, "n_head": hf.n_head, "block_size": hf.n_positions,
            "norm": "layernorm", "pos": "learned", "ffn": "gelu", "bias": True,
            "ffn_hidden": None if hidden == 4 * hf.n_embd else hidden}


def _llama_fields(hf: Any) -> dict[str, Any]:
    rope = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", None))
    if rope.get("rope_type", "default") != "default" or theta != ROPE_BASE:
        raise _refuse_import(f"Llama with RoPE {rope.get('rope_type', 'default')} base {theta} (lit-attn's RoPE "
                             f"is the default kind with base {ROPE_BASE:g})")
    for name, want in (("hidden_act", "silu"), ("rms_norm_eps", NORM_EPS)):
        if getattr(hf, name) != want:
            raise _refuse_import(f"Llama with {name}={getattr(hf, name)!r} (lit-attn computes {want!r})")
    n_embd, hq = hf.hidden_size, hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or n_embd // hq
    if n_embd % head_dim:
        raise _refuse_import(f"Llama with head_dim {head_dim} not dividing hidden_size {n_embd}")
    n_head, hkv = n_embd // head_dim, hf.num_key_value_heads or hq
    attention, heads = next(((name, {}) for name in PRESETS if _preset_heads(name, n_embd, n_head) == (hq, hkv)),
                            ("gqa" if hq == n_head else "sqa", {"n_query_heads": hq, "n_kv_heads": hkv}))
    # Our `bias` is the MLP's and the output projection's, qkv_bias the q/k/v projections' (from_hf takes
    # bias=true where o_proj's biases are non-zero but the MLP has none).
    bias, qkv_bias = bool(hf.mlp_bias), bool(hf.attention_bias)
    return {"attention": attention, **heads, "n_embd": n_embd, "n_head": n_head,
            "block_size": hf.max_position_embeddings, "norm": "rmsnorm", "pos": "rope", "ffn": "swiglu",
            "bias": bias, "qkv_bias": None if qkv_bias == bias else qkv_bias, "ffn_hidden": hf.intermediate_size}


def _preset_heads(preset: str, n_embd: int, n_head: int) -> tuple[int, int] | None:
    try:
        return resolve_heads(preset, n_embd, n_head)
    except ValueError:
        return None


def transformer_weights(hf_state: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
    """`model`'s state_dict holding the HF weights `hf_state` (zeros where the HF model has no bias); a
    one-line ValueError where a non-zero HF weight has no place in `model`."""
    ours = model.state_dict()
    pieces: dict[str, list[torch.Tensor]] = {}
    for part in weight_parts(model.config):
        target = ours.get(part.ours)
        hf = hf_state.get(part.hf)
        if target is None:
            if hf is not None and bool(hf.any()):
                flag = "qkv_bias" if ".qkv." in part.ours else "bias"
                raise ValueError(f"its {part.hf} is non-zero and this model has no {part.ours} "
                                 f"(--model.{flag} true)")
            continue
        rows = target if part.rows is None else target[part.rows[0]:part.rows[1]]
        if hf is None:
            hf = torch.zeros_like(rows)  # a bias the HF model does not have
        hf = hf.t() if part.transpose else hf
        if hf.shape != rows.shape:
            raise _refuse_import(f"{part.hf} has shape {tuple(hf.shape)}, {part.ours} needs {tuple(rows.shape)}")
        pieces.setdefault(part.ours, []).append(hf.to(target.dtype))
    out = {key: torch.cat(parts) if len(parts) > 1 else parts[0].clone() for key, parts in pieces.items()}
    if model.config.tie_embeddings:
        out["lm_head.weight"] = out["tok_emb.weight"]
    for key, tensor in ours.items():
        out.setdefault(key, torch.zeros_like(tensor))  # the LM head's bias: GPT-2 and Llama have none
    return out


def load_hf(source: Any) -> Any:
    """A transformers model: `source` itself, or loaded (float32) from a local model directory, its config
    checked first; one-line ValueErrors."""
    if not isinstance(source, (str, Path)):
        return source
    tf, path = _transformers(), Path(source).expanduser()
    gpt_config(load_hf_config(path))
    shown = tf.utils.logging.is_progress_bar_enabled()
    tf.utils.logging.disable_progress_bar()  # a bar for loading a few tensors is noise
    try:
        return tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"cannot load the transformers model in {source}: {one_line(e, 160)}") from None
    finally:
        if shown:
            tf.utils.logging.enable_progress_bar()


def load_hf_config(path: str | Path) -> Any:
    """The transformers config of the local model directory `path`; one-line ValueErrors."""
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{path} is not a transformers model directory (it has no config.json)")
    try:
        return _transformers().AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"cannot read the transformers config in {path}: {one_line(e, 160)}") from None


def from_hf(source: Any) -> Transformer:
    """The Transformer (eval mode, float32, CPU) with the weights of a transformers GPT-2 or Llama model, or of
    the model directory `source`; its config is derived from the HF config (`gpt_config`)."""
    hf = load_hf(source)
    config, state = gpt_config(hf.config), _cpu_state(hf)
    if any(k.endswith("o_proj.bias") and bool(v.any()) for k, v in state.items()) and not config.bias:
        config = dataclasses.replace(config, bias=True, qkv_bias=None)  # zero MLP biases hold nothing
    model = Transformer(config)
    model.load_state_dict(transformer_weights(state, model))
    return model.eval()


def _cpu_state(hf: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float32) for k, v in hf.state_dict().items()}


def load_hf_weights(model: Transformer, source: str | Path, flag: str = "--model.init_from") -> None:
    """Copy the weights of the transformers model directory `source` into `model`, whose architecture must be
    the one the HF config describes: else a one-line ValueError naming the flags that make it so."""
    check_hf_architecture(model.config, source, flag)
    try:
        model.load_state_dict(transformer_weights(_cpu_state(load_hf(source)), model))
    except ValueError as e:
        raise ValueError(f"{flag} {source}: {e}") from None


def check_hf_architecture(config: GPTConfig, source: str | Path, flag: str = "--model.init_from") -> None:
    """A one-line ValueError naming the flags to pass unless `config` builds the network of the transformers
    model directory `source` (only its config.json is read)."""
    try:
        settings = load_hf_config(source)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
    needed = needed_flags(gpt_config(settings), config)
    if needed:
        flags = " ".join(f"--model.{key} {_flag_value(value)}" for key, value in needed.items())
        raise ValueError(f"{flag} {source}: its {settings.model_type} weights need {flags}")


def needed_flags(expected: GPTConfig, config: GPTConfig) -> dict[str, Any]:
    """The settings to change for `config` to build `expected`'s network: {flag: value}, empty when it does."""
    wanted, have = architecture_flags(expected), architecture_flags(config)
    needed = {}
    for key in wanted:
        if key == "attention" and any(wanted[k] != have.get(k) for k in ("attention", "n_query_heads", "n_kv_heads")):
            # The head layout as the HF config's import names it: a preset, explicit head counts only if needed.
            needed |= {k: getattr(expected, k) for k in ("attention", "n_query_heads", "n_kv_heads")
                       if getattr(expected, k) != getattr(config, k)}
        elif key not in ("attention", "n_query_heads", "n_kv_heads") and wanted[key] != have.get(key):
            needed[key] = wanted[key]
    if "ffn_hidden" in needed:  # the default width follows ffn and n_embd: named only if they leave it wrong
        try:
            trial = dataclasses.replace(config, **{k: v for k, v in needed.items() if k != "ffn_hidden"})
        except (TypeError, ValueError):
            trial = None
        if trial is not None and trial.ffn_width == expected.ffn_width:
            del needed["ffn_hidden"]
    return needed


def architecture_flags(config: GPTConfig) -> dict[str, Any]:
    """The settings that decide the weights' shapes and meaning, resolved (heads, widths); biases are left out:
    one the HF model lacks starts at zero, one it has must have a place unless it is zero."""
    hq, hkv = config.heads
    grouped = config.spec.cls is GroupedAttention and not config.attention_options
    flags = {"attention": "grouped" if grouped else config.attention, "vocab_size": config.vocab_size,
             "n_layer": config.n_layer, "n_embd": config.n_embd, "n_head": config.n_head, "n_query_heads": hq,
             "n_kv_heads": hkv, "norm": config.norm, "pos": config.pos, "ffn": config.ffn,
             "ffn_hidden": config.ffn_width, "tie_embeddings": config.tie_embeddings, "final_norm": config.final_norm,
             "layer_pattern": config.layer_pattern, "qk_norm": config.qk_norm, "logit_softcap": config.logit_softcap}
    if config.pos == "learned":
        flags["block_size"] = config.block_size  # rows of the position embedding (RoPE has no weights)
    return flags


def _flag_value(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
