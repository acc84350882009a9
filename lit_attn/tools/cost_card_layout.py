"""The cost card's analytic side: which model its parameters, FLOPs and cache bytes are counted for.

`runs` is the model the card's runs trained (from their hparams.yaml), `sqa-paper` the Sparse Query Attention
paper's GPT, `small` configs/default.yaml's model. Given run directories the card counts for their model, so the
counts, the cache bytes and the Pareto plots describe the runs whose quality sits beside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lit_attn.analytic import (
    cache_values_per_sequence,
    decode_lengths,
    decode_state_kind,
    gpt_params,
    gpt_train_flops_per_token,
)
from lit_attn.attention.registry import get_attention
from lit_attn.cli.toolcli import parse_attention
from lit_attn.config import SPARSE_QUERY_LAYOUT, GPTConfig
from lit_attn.tools.run_record import model_settings

LAYOUTS = ("runs", "sqa-paper", "small")
DEFAULT_YAML = Path(str(resources.files("configs") / "default.yaml"))
DEFAULT_VOCAB = 103  # the characters of the default corpus (CPython's pydoc topics)
# What an attention sets for itself: runs of different attentions share everything else of their model.
ATTENTION_FIELDS = ("attention", "attention_options", "layer_pattern", "local_window", "n_query_heads", "n_kv_heads")
_ATTENTION_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig) if f.name in ATTENTION_FIELDS}


def base_config(layout: str, vocab_size: int = DEFAULT_VOCAB, default_yaml: Path = DEFAULT_YAML) -> GPTConfig:
    """The GPTConfig whose attention is swapped per row: the paper's layout, or default.yaml's model."""
    if layout == "sqa-paper":
        return SPARSE_QUERY_LAYOUT
    model = (yaml.safe_load(default_yaml.read_text(encoding="utf-8")) or {}).get("model") or {}
    return GPTConfig.from_hparams(model, vocab_size=vocab_size)


def swapped(base: GPTConfig, attention: str) -> GPTConfig:
    """`base` with an --attention entry (NAME or NAME{JSON options}, as the benchmarks name it), and learned
    positions if it takes no RoPE (as the README's attention table counts it), no qk_norm if it cannot apply it
    (the norm changes no count); ValueError for an attention this layout cannot build."""
    name, options = parse_attention(attention)
    spec = get_attention(name)
    pos = base.pos if spec.rope else "learned"
    return dataclasses.replace(base, attention=name, attention_options=options, pos=pos,
                               qk_norm=base.qk_norm and spec.takes_qk_norm())


def run_config(run_dir: Path) -> GPTConfig | str:
    """The model `run_dir` trained, or why it cannot be known (its files lack the vocabulary, or hold no valid
    model)."""
    settings = model_settings(run_dir)
    if "vocab_size" not in settings:
        return f"{run_dir} records no vocab_size (hparams.yaml)"
    try:
        return GPTConfig.from_hparams(settings)
    except (TypeError, ValueError) as e:
        return f"{run_dir} records no valid model ({str(e).splitlines()[0] if str(e) else type(e).__name__})"


def shared_architecture(config: GPTConfig) -> dict[str, Any]:
    """The model's architecture beyond what its attention sets for itself (ATTENTION_FIELDS)."""
    return {k: getattr(config, k) for k in GPTConfig.architecture_fields() if k not in ATTENTION_FIELDS}


def runs_layout(run_dirs: Sequence[Path], attentions: Sequence[str]) -> tuple[GPTConfig, dict[str, GPTConfig]] | str:
    """(the runs' shared model with the default attention, attention -> its runs' model), or why the runs have no
    one layout. `attentions[i]` names the attention of `run_dirs[i]`; the first run of each attention speaks for
    it (the card refuses runs of one attention in unlike settings). ValueError if two runs' models differ beyond
    what the attention sets itself (width, depth, heads, context, vocabulary...)."""
    if not run_dirs:
        return "no run directories (--runs)"
    configs: dict[str, GPTConfig] = {}
    first: tuple[Path, dict[str, Any]] | None = None
    for run_dir, name in zip(run_dirs, attentions):
        config = run_config(run_dir)
        if isinstance(config, str):
            return config
        shared = shared_architecture(config)
        if first is None:
            first = (run_dir, shared)
        elif (key := next((k for k in shared if shared[k] != first[1][k]), None)) is not None:
            raise ValueError(f"the runs' models differ in {key} ({first[1][key]!r} in {first[0]}, {shared[key]!r} in "
                             f"{run_dir}): the card counts for one model; give runs of one layout (a card per "
                             f"width), or --layout sqa-paper or small")
        configs.setdefault(name, config)
    return dataclasses.replace(next(iter(configs.values())), **_ATTENTION_DEFAULTS), configs


def describe(config: GPTConfig) -> str:
    """The layout in a few words, for the card's notes."""
    return (f"{config.n_layer} layers, width {config.n_embd}, {config.n_head} heads, context {config.block_size}, "
            f"vocabulary {config.vocab_size:,}")


def analytic(config: GPTConfig, context: int, bytes_per_value: int) -> dict[str, Any]:
    """Heads, parameters, training FLOPs/token at `context` and the decode state of the model `config`: how it grows
    ("decoding": per token, window, fixed, mixed, or uncached), its bytes per sequence after T/8, T/2 and T tokens
    (T = `context`, the prompt lengths of bench-decode's default --contexts), and its bytes per token where it
    grows per token (per token and window: each past token's, in the window; mixed: what a token adds at T)."""
    hq, hkv = config.heads
    kind = decode_state_kind(config, context)  # None: no state declared, decoding recomputes the prefix
    short, half, full = decode_lengths(context)

    def state_bytes(length: int) -> int | None:
        values = cache_values_per_sequence(config, length)
        return None if values is None else values * bytes_per_value

    per_token = {"per token": state_bytes(1), "window": state_bytes(1), "fixed": None, None: None,
                 "mixed": (state_bytes(full) or 0) - (state_bytes(full - 1) or 0)}[kind]
    return {"n_query_heads": hq, "n_kv_heads": hkv, "parameters": gpt_params(config)["total"],
            "train_flops_per_token": gpt_train_flops_per_token(config, context),
            "cache_bytes_per_token_analytic": per_token, "state_bytes_t8": state_bytes(short),
            "state_bytes_t2": state_bytes(half), "state_bytes_t": state_bytes(full), "decoding": kind or "uncached"}
