"""The model's architecture as one dataclass, from which every size, count and check is derived."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_attn.attention import get_attention
from lit_attn.attention.registry import AttentionSpec
from lit_attn.bounds import PositiveFloat, PositiveInt, Probability, bounded, check_bounds
from lit_attn.pattern import FLAG as PATTERN_FLAG
from lit_attn.pattern import layer_cycle, layer_label

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
FFNS = ("gelu", "swiglu", "relu2", "identity", "none")
NO_MLP = ("identity", "none")  # FFNs without weights
VocabSize = bounded("VocabSize", int, 2)  # a language model predicts one of two tokens at least
WindowSize = bounded("WindowSize", int, 2)  # a window of one position would attend to the token alone


@dataclass
class GPTConfig:
    """Architecture of a decoder-only GPT; `Transformer(config)` builds it.

    Args:
        vocab_size: number of token ids (linked from the datamodule by the CLI).
        attention: registered attention name (mha, gqa, mqa, sqa, ssqa, xsqa, xsmqa, noq, qsa, qsa_fixed, ...).
        attention_options: extra keyword options for the chosen attention.
        layer_pattern: each layer's attention (lit_attn.pattern, docs/attentions.md): letters S (local: the
            attention with window local_window) and L (global) repeated over the layers, as SSSL; or a JSON list of
            layers, each an attention name or {"attention": NAME, "options": {...}}, one per layer or per repeating
            cycle; null: every layer has `attention` with `attention_options`.
        local_window: the window of the S layers of a letter pattern (required by S layers); null without them.
        n_layer: number of transformer blocks.
        n_embd: width of the residual stream.
        n_head: total heads; the head size is n_embd / n_head.
        n_query_heads: query heads, overriding the attention's preset.
        n_kv_heads: key/value heads, overriding the attention's preset.
        block_size: context length (linked to the datamodule by the CLI).
        norm: layernorm | rmsnorm.
        pos: learned | rope.
        ffn: gelu | swiglu | relu2 | identity | none. relu2: the MLP with ReLU(h)^2 for GELU (modded-nanogpt,
            nanochat); identity: no MLP, the block's second branch adds its normalised input (Zoology's identity
            state mixer after its pre-norm); none: no second branch and no second norm.
        ffn_hidden: FFN width; default 4*n_embd (gelu, relu2) or 8/3*n_embd rounded up to 64 (swiglu); null without
            an MLP.
        bias: biases in linear layers and LayerNorms; the LM head has one only if untied.
        qkv_bias: bias on the q/k/v projections (default: same as `bias`).
        tie_embeddings: share the token embedding with the LM head.
        final_norm: normalise before the LM head.
        qk_norm: RMS-normalise every head's queries and keys (no learned gain) before RoPE and their scores, in
            every layer: a model-wide choice, as the norm and the FFN are. Each attention that has queries and keys
            applies it (its constructor takes qk_norm, lit_attn.attention.registry); one that cannot is refused,
            with the reason (in a layer pattern, the layer is named). auto: every layer whose attention can
            applies it and the others do not (a recipe meant for every attention).
        logit_softcap: cap * tanh(logits / cap) on the LM head's logits (Gemma 2, modded-nanogpt), wherever the
            model's logits are used (loss, evaluation, sampling); null: no cap.
        dropout: dropout on the residual branches (the attention's and the FFN's outputs), and on the
            embeddings and attention weights unless embd_dropout / attn_dropout set their own.
        attn_dropout: dropout on the attention weights; null: `dropout`.
        embd_dropout: dropout on the embeddings (token plus position); null: `dropout`.
    """

    vocab_size: VocabSize
    attention: str = "mha"
    attention_options: dict[str, Any] | None = None
    # list first: jsonargparse reads a JSON list as a list, and plain letters (SSSL) as the string
    layer_pattern: list[str | dict[str, Any]] | str | None = None
    local_window: WindowSize | None = None
    n_layer: PositiveInt = 4
    n_embd: PositiveInt = 128
    n_head: PositiveInt = 8
    n_query_heads: PositiveInt | None = None
    n_kv_heads: PositiveInt | None = None
    block_size: PositiveInt = 128
    norm: str = "layernorm"
    pos: str = "learned"
    ffn: str = "gelu"
    ffn_hidden: PositiveInt | None = None
    bias: bool = True
    qkv_bias: bool | None = None
    tie_embeddings: bool = True
    final_norm: bool = True
    qk_norm: bool | Literal["auto"] = False
    logit_softcap: PositiveFloat | None = None
    # Dropout changes training, not what the weights mean: a run may resume with another value.
    dropout: Probability = field(default=0.0, metadata={"architecture": False})
    attn_dropout: Probability | None = field(default=None, metadata={"architecture": False})
    embd_dropout: Probability | None = field(default=None, metadata={"architecture": False})

    def __post_init__(self) -> None:
        check_bounds(GPTConfig, vars(self))  # each numeric field's range is its type (lit_attn.bounds)
        for name, allowed in (("norm", NORMS), ("pos", POSITIONS), ("ffn", FFNS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose {' or '.join(allowed)}")
        if self.ffn_hidden is not None and self.ffn in NO_MLP:
            raise ValueError(f"ffn {self.ffn} has no MLP to size: set ffn_hidden to null, got {self.ffn_hidden}")
        self.heads  # noqa: B018  (the attention checks its head counts and options, with the fix in the message)
        self._cycle()  # so does every layer's, with the layer named

    @property
    def spec(self) -> AttentionSpec:
        return get_attention(self.attention)

    def attention_args(self) -> dict[str, Any]:
        """Keyword arguments of the attention's builder and descriptions: common ones, options, preset."""
        return self.spec.arguments(self.attention_options, common_attention_args(vars(self)))

    def _cycle(self) -> list[GPTConfig]:
        """The configs of one cycle of the layer pattern (layer i has cycle[i % len(cycle)]), each with that layer's
        attention and options and no pattern, layers of one kind sharing one; [self] without a pattern."""
        cycle = layer_cycle(self.layer_pattern, self.n_layer, self.attention, self.attention_options,
                            self.local_window, self.block_size)
        if self.layer_pattern is None:
            return [self]
        kinds: dict[str, GPTConfig] = {}
        for i, (attention, options) in enumerate(cycle):
            key = repr((attention, options))
            if key not in kinds:
                try:
                    kinds[key] = dataclasses.replace(self, attention=attention, attention_options=options,
                                                     layer_pattern=None, local_window=None)
                except ValueError as e:
                    raise ValueError(f"{PATTERN_FLAG} layer {i} ({layer_label(attention, options)}): {e}") from None
        return [kinds[repr(layer)] for layer in cycle]

    @property
    def layers(self) -> tuple[GPTConfig, ...]:
        """One config per layer, each with that layer's attention and options and no pattern (layers of one kind
        share one); without a pattern, this config for every layer."""
        cycle = self._cycle()
        return tuple(cycle[i % len(cycle)] for i in range(self.n_layer))

    def layer_kinds(self) -> list[tuple[GPTConfig, int]]:
        """Each kind of layer (its config, as in `layers`) and how many layers have it, in order of first use."""
        cycle, counts = self._cycle(), {}
        for i, layer in enumerate(cycle):
            counts[id(layer)] = counts.get(id(layer), 0) + self.n_layer // len(cycle) + (i < self.n_layer % len(cycle))
        return [(layer, counts[id(layer)]) for layer in {id(layer): layer for layer in cycle}.values()]

    @property
    def heads(self) -> tuple[int, int]:
        """(query heads, key/value heads) the attention really uses."""
        return self.spec.heads(**self.attention_args())

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_width(self) -> int:
        """The FFN's hidden width: explicit, else 4*n_embd (gelu, relu2) or 8/3*n_embd rounded up to 64 (swiglu); 0
        without an MLP (identity, none)."""
        if self.ffn in NO_MLP:
            return 0
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return 64 * math.ceil(8 * self.n_embd / 3 / 64) if self.ffn == "swiglu" else 4 * self.n_embd

    @property
    def attention_dropout(self) -> float:
        """The dropout on the attention weights: attn_dropout, else dropout."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def embedding_dropout(self) -> float:
        """The dropout on the embeddings: embd_dropout, else dropout."""
        return self.dropout if self.embd_dropout is None else self.embd_dropout

    @classmethod
    def architecture_fields(cls) -> tuple[str, ...]:
        """Fields that must match a checkpoint for its weights to mean the same thing."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("architecture", True))

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any], **overrides: Any) -> GPTConfig:
        """The config inside a model's hyperparameters (training settings are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in {**hparams, **overrides}.items() if k in names})


def common_attention_args(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The common arguments (registry.COMMON_ARGS) the model gives its attention, from its architecture
    settings (GPTConfig's fields, by name): its dropout is the attention weights' (attn_dropout, else dropout);
    qk_norm is false where the settings predate it ("auto" is resolved per attention by the registry)."""
    common = {name: settings[name] for name in ("n_embd", "n_head", "n_query_heads", "n_kv_heads", "block_size",
                                                "bias", "qkv_bias")}
    attn_dropout = settings.get("attn_dropout")
    dropout = settings["dropout"] if attn_dropout is None else attn_dropout
    return {**common, "dropout": dropout, "rope": settings["pos"] == "rope",
            "qk_norm": settings.get("qk_norm") or False}


# The Sparse Query Attention paper's layout (its parameter counts: MHA 11,966,224 ... xSMQA 10,196,752):
# d=256, 8 layers, 16 heads, SwiGLU 768, RoPE, RMSNorm, vocab 10k, context 1024; no bias on q/k/v,
# biases on the attention output and SwiGLU, an untied LM head and no final norm.
SPARSE_QUERY_LAYOUT = GPTConfig(
    vocab_size=10_000, n_layer=8, n_embd=256, n_head=16, block_size=1024, norm="rmsnorm", pos="rope", ffn="swiglu",
    ffn_hidden=768, bias=True, qkv_bias=False, tie_embeddings=False, final_norm=False,
)
