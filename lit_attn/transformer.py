"""The GPT network as a plain nn.Module built from a GPTConfig: embeddings, blocks, LM head, generation."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lit_attn.attention.state import DecodingState, filled_length
from lit_attn.config import GPTConfig
from lit_attn.decoding import LAYOUT_MIN_TOKENS, decoding_layout
from lit_attn.pattern import FLAG as PATTERN_FLAG
from lit_attn.pattern import layer_label

IGNORE_INDEX = -100  # a target position excluded from the loss and metrics (F.cross_entropy's default)


def make_norm(kind: str, dim: int, bias: bool) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=bias)
    return nn.RMSNorm(dim, eps=1e-5)


class FeedForward(nn.Module):
    """GELU MLP, ReLU² MLP (relu2: ReLU(h)^2) or SwiGLU; the output projection is `out_proj` (scaled residual
    init)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.swiglu = config.ffn == "swiglu"
        self.relu2 = config.ffn == "relu2"
        hidden = config.ffn_width
        # SwiGLU's gate and up projections are fused into one matmul.
        self.in_proj = nn.Linear(config.n_embd, hidden * (2 if self.swiglu else 1), bias=config.bias)
        self.out_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.relu2:
            h = F.relu(h).square()
        else:
            h = F.gelu(h)
        return self.dropout(self.out_proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + drop(attn(norm1(x))), then x + ffn(norm2(x)) (drop: the residual dropout);
    with ffn identity the second branch adds drop(norm2(x)), with ffn none there is none (norm2 and ffn are None).
    `layer_idx` (the block's index from 0) goes to the attention, for depth-dependent initialisation; the
    attention is that layer's (`config.layers`: the layer pattern's, else the model's)."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.norm1 = make_norm(config.norm, config.n_embd, config.bias)
        layer = config.layers[layer_idx] if config.layer_pattern is not None else config
        try:
            self.attn = layer.spec.build(**{**layer.attention_args(), "layer_idx": layer_idx})
        except ValueError as e:
            if config.layer_pattern is None:
                raise
            label = layer_label(layer.attention, layer.attention_options)
            raise ValueError(f"{PATTERN_FLAG} layer {layer_idx} ({label}): {e}") from None
        self.resid_dropout = nn.Dropout(config.dropout)  # on the attention's output
        has_branch = config.ffn != "none"
        self.norm2 = make_norm(config.norm, config.n_embd, config.bias) if has_branch else None
        # identity: the branch is norm2(x) itself, with the residual dropout a FeedForward applies to its output
        self.ffn = (nn.Dropout(config.dropout) if config.ffn == "identity" else FeedForward(config)) \
            if has_branch else None

    def forward(self, x: torch.Tensor, state: DecodingState | None = None) -> torch.Tensor:
        h = self.norm1(x)
        # An attention that declares no decoding state is only ever called as forward(x).
        attended = self.attn(h) if state is None else self.attn(h, state)
        x = x + self.resid_dropout(attended)
        return x if self.ffn is None else x + self.ffn(self.norm2(x))


class Transformer(nn.Module):
    """Decoder-only transformer whose attentions come from the registry by name (one per layer with a pattern)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.block_size = config.block_size
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None
        self.drop = nn.Dropout(config.embedding_dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm_f = make_norm(config.norm, config.n_embd, config.bias) if config.final_norm else nn.Identity()
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.bias and not config.tie_embeddings)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) keep the residual stream's variance flat.
        for name, p in self.named_parameters():
            if name.endswith("out_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        # Built once: a fresh arange per step would be a host-side op in the hot path.
        self.register_buffer("positions", torch.arange(config.block_size), persistent=False)
        # Checkpoints of a model wrapped by torch.compile(model) carry "_orig_mod." in their keys.
        self.register_load_state_dict_pre_hook(strip_compile_prefix)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, cache: list[DecodingState] | None = None,
                positions: torch.Tensor | None = None, select: torch.Tensor | None = None,
                length: int | None = None) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size); with a (B, T) bool `select`, (N, vocab_size) logits
        of the N selected positions only (the LM head, the largest matmul at a large vocabulary, skips the rest).

        With a decoding `cache` (`new_cache`: one state per layer), idx holds the tokens at `positions` (T,) of the
        sequence, increasing, following the ones already seen: each layer's state keeps what it needs of them and
        it attends over the `length` filled positions (default positions[-1] + 1, read once from the tensor), so
        a step costs one token's work over the context so far instead of the whole context's.
        """
        x = self.hidden(idx, cache, positions, length)
        return self.logits(x if select is None else x[select])  # (B, T, V) or (N, V)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (..., C) -> logits (..., V): the LM head, then cap * tanh(logits / cap) with
        logit_softcap (every use of the model's logits goes through here)."""
        logits = self.lm_head(x)
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def hidden(self, idx: torch.Tensor, cache: list[DecodingState] | None = None,
               positions: torch.Tensor | None = None, length: int | None = None) -> torch.Tensor:
        """The final hidden states (B, T, C) that `forward` feeds the LM head; arguments as in `forward`."""
        B, T = idx.shape
        if cache is not None:
            if positions is None or positions.shape != (T,):
                raise ValueError(f"decoding with a cache needs the {T} tokens' positions, got {positions}")
            length = filled_length(positions, length)  # once here, not in every layer
        elif T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(self.positions[:T] if positions is None else positions)
        x = self.drop(x)
        if cache is None:
            for block in self.blocks:
                x = block(x)
        else:
            for block, state in zip(self.blocks, cache, strict=True):
                state.step(positions, length)
                x = block(x, state)
        return self.norm_f(x)

    @property
    def cached_decoding(self) -> bool:
        """Whether every layer's attention declares a decoding state; without, decoding recomputes the prefix."""
        return all(layout is not None for layout in self._layouts())

    def _layouts(self) -> list[Any]:
        """Each layer's decoding-state layout (None: its attention declares none); layers of one kind share one."""
        layers, layouts = self.config.layers, {}
        for layer in layers:
            if id(layer) not in layouts:
                layouts[id(layer)] = layer.spec.state(**layer.attention_args())
        return [layouts[id(layer)] for layer in layers]

    def new_cache(self, batch: int, length: int | None = None, dtype: torch.dtype | None = None
                  ) -> list[DecodingState]:
        """Empty decoding states for `batch` sequences of up to `length` tokens (default block_size), one per layer,
        each from its attention's declared layout (`decoding_state`), in the weights' dtype and device by default."""
        if not self.cached_decoding:
            missing = next(layer.attention for layer, layout in zip(self.config.layers, self._layouts())
                           if layout is None)
            raise ValueError(f"attention {missing!r} declares no decoding state (no decoding_state); "
                             "decode without one (use_cache=False)")
        length = self.block_size if length is None else length
        if not 1 <= length <= self.block_size:
            raise ValueError(f"a cache holds 1 to block_size={self.block_size} tokens, got {length}")
        weight = self.tok_emb.weight
        return [layout.new(batch, length, dtype or weight.dtype, weight.device) for layout in self._layouts()]

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
        top_p: float | None = None, use_cache: bool = True, stop_token: int | None = None,
        generator: torch.Generator | None = None, on_token: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Append up to `max_new_tokens` sampled tokens to idx (B, T); temperature 0 is greedy.

        top_k / top_p keep the k most likely tokens / the smallest set with probability >= p.
        With `use_cache` the prompt is processed once and every new token costs one token's work
        (an attention that declares no cache recomputes the prefix instead); past block_size tokens
        the context is cropped to the last block_size, as without the cache, so the window is
        processed again each step (cached and uncached logits agree).
        Generation stops early once every sequence produced `stop_token` (later tokens of a
        sequence that stopped repeat it). `on_token` gets each step's new tokens (B,).
        """
        was_training = self.training
        self.eval()
        # The layout's copy of the weights costs about three steps' weight traffic and saves more per step.
        long = max_new_tokens >= LAYOUT_MIN_TOKENS
        with decoding_layout(self, rows=idx.size(0)) if long else contextlib.nullcontext():
            out = self._generate(idx, max_new_tokens, temperature, top_k, top_p, use_cache, stop_token, generator,
                                 on_token)
        self.train(was_training)
        return out

    def _generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                  top_p: float | None, use_cache: bool, stop_token: int | None, generator: torch.Generator | None,
                  on_token: Callable[[torch.Tensor], None] | None) -> torch.Tensor:
        B, n = idx.shape  # n: tokens so far
        out = idx.new_empty(B, n + max_new_tokens)  # filled in place: no concatenation per step
        out[:, :n] = idx
        use_cache = use_cache and self.cached_decoding
        cache, cached = None, 0  # tokens of out already in the cache
        done = torch.zeros(B, dtype=torch.bool, device=idx.device)
        for _ in range(max_new_tokens):
            if use_cache and n <= self.block_size:
                if cache is None:  # as long as this generation reaches, not block_size: less to zero
                    cache = self.new_cache(B, min(self.block_size, n + max_new_tokens - 1))
                # The length is known here: passing it spares every step a read of the positions.
                x = self.hidden(out[:, cached:n], cache, self.positions[cached:n], length=n)
                cached = n
            else:
                # hidden, not __call__: a compiled model would recompile for every new length
                x = self.hidden(out[:, max(0, n - self.block_size) : n])
            logits = self.logits(x[:, -1]).float()  # (B, V): the last position's only
            next_id = sample_next(logits, temperature, top_k, top_p, generator)  # (B, 1)
            if stop_token is not None:
                next_id = torch.where(done[:, None], stop_token, next_id)
                done |= next_id[:, 0] == stop_token
            out[:, n : n + 1] = next_id
            n += 1
            if on_token is not None:
                on_token(next_id[:, 0])
            if stop_token is not None and bool(done.all()):
                break
        return out[:, :n]


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) logits -> (B, 1) token ids: argmax at temperature 0, else a draw after top-k and top-p filtering."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token once the ones before it already reach top_p (the most likely always stays).
        drop = cumulative - sorted_logits.softmax(-1) >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


def strip_compile_prefix(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    for key in [k for k in state_dict if "_orig_mod." in k]:
        state_dict[key.replace("_orig_mod.", "")] = state_dict.pop(key)

