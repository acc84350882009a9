"""The GPT network as a plain nn.Module built from a GPTConfig: embeddings, blocks, LM head, generation."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import GPTConfig


def make_norm(kind: str, dim: int, bias: bool) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=bias)
    return nn.RMSNorm(dim, eps=1e-5)


class FeedForward(nn.Module):
    """GELU MLP or SwiGLU; the output projection is `out_proj` (scaled residual init)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.swiglu = config.ffn == "swiglu"
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
        else:
            h = F.gelu(h)
        return self.dropout(self.out_proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = make_norm(config.norm, config.n_embd, config.bias)
        self.attn = config.spec.build(**config.attention_args())
        self.norm2 = make_norm(config.norm, config.n_embd, config.bias)
        self.ffn = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Transformer(nn.Module):
    """Decoder-only transformer whose attention comes from the registry by name."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.block_size = config.block_size
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
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

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size)."""
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(self.positions[:T])
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None
    ) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to idx (B, T); temperature 0 is greedy."""
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            # forward, not __call__: a compiled model would recompile for every new length
            logits = self.forward(idx[:, -self.block_size :])[:, -1, :].float()  # (B, V)
            if temperature == 0:
                next_id = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, next_id], dim=1)
        self.train(was_training)
        return idx


def strip_compile_prefix(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    for key in [k for k in state_dict if "_orig_mod." in k]:
        state_dict[key.replace("_orig_mod.", "")] = state_dict.pop(key)


def network_weights(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The Transformer's weights in a GPT checkpoint's state_dict (keys without the `transformer.` prefix)."""
    prefix = "transformer."
    if not any(k.startswith(prefix) for k in state_dict):
        return dict(state_dict)  # written before the network was a submodule
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
