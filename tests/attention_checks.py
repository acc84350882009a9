"""What every registered attention must satisfy, as functions of its name: the per-attention tests
run them for every built-in one, and a test that registers an attention of its own runs them too."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import lightning as L
import torch

from callbacks.params import count_parameters
from datamodules import CharDataModule
from lit_attn import GPT, GPTConfig, Transformer
from lit_attn.analytic import attention_params, cache_values_per_token, gpt_params
from lit_attn.attention import get_attention

LAYOUTS = [
    dict(norm=n, pos=p, ffn=f, bias=b, tie_embeddings=t, final_norm=fn)
    for n, p, f, b, t, fn in itertools.product(
        ["layernorm", "rmsnorm"], ["learned", "rope"], ["gelu", "swiglu"], [True, False], [True, False], [True, False]
    )
]
# Blocks without an MLP (ffn identity: a second norm and branch; none: neither), in both norms and with/without biases
LAYOUTS += [dict(norm=n, pos=p, ffn=f, bias=b, tie_embeddings=True, final_norm=True)
            for n, p, f, b in itertools.product(["layernorm", "rmsnorm"], ["learned", "rope"], ["identity", "none"],
                                                [True, False])]




def assert_model_causal(name: str) -> None:
    pos = "rope" if get_attention(name).rope else "learned"
    model = Transformer(GPTConfig(vocab_size=50, attention=name, n_layer=2, n_embd=32, n_head=4, block_size=24,
                                  pos=pos)).eval()
    idx = torch.randint(0, 50, (2, 24))
    idx2 = idx.clone()
    t = 10
    idx2[:, t + 1 :] = (idx[:, t + 1 :] + 1) % 50
    logits, logits2 = model(idx), model(idx2)
    torch.testing.assert_close(logits[:, : t + 1], logits2[:, : t + 1])
    assert not torch.allclose(logits[:, t + 1 :], logits2[:, t + 1 :])


def assert_counts_match(name: str) -> None:
    """The registry's parameter count (via lit_attn.analytic) equals the built model's, per component,
    for every layout."""
    for layout in [lay for lay in LAYOUTS if lay["pos"] == "learned" or get_attention(name).rope]:
        config = GPTConfig(vocab_size=37, attention=name, n_layer=2, n_embd=32, n_head=4, block_size=16, **layout)
        model = GPT(**dataclasses.asdict(config))
        measured, analytic = count_parameters(model), gpt_params(config)
        for key in ("embeddings", "attention", "ffn", "norms", "head", "total"):
            assert measured[key] == analytic[key], (name, layout, key)
        assert measured["other"] == 0
        per_layer = attention_params(config)
        assert all(sum(p.numel() for p in b.attn.parameters()) == per_layer for b in model.transformer.blocks)






def assert_cache_layout(name: str) -> None:
    """The decoding cache per token is a positive size that grows with the layers."""
    config = GPTConfig(vocab_size=10, attention=name, n_layer=1, n_embd=32, n_head=4)
    one = cache_values_per_token(config)
    if one is None:  # no cache declared: decoding recomputes the prefix
        assert not Transformer(config).cached_decoding
        return
    assert one > 0 and cache_values_per_token(dataclasses.replace(config, n_layer=3)) == 3 * one


def short_fit(name: str, corpus: Path, steps: int = 40, **model_kw) -> tuple[float, float, GPT, dict]:
    """(val loss before, after, model, its initial state_dict) of a short Trainer.fit on a char corpus."""
    L.seed_everything(0)
    data = CharDataModule(path=str(corpus), block_size=16, batch_size=64, stride=4)
    data.setup("fit")
    model = GPT(**({"vocab_size": data.vocab_size, "attention": name, "n_layer": 1, "n_embd": 8, "n_head": 1,
                    "block_size": 16, "lr": 1e-2} | model_kw))

    def val_loss(batches: int = 4) -> float:
        model.eval()
        with torch.no_grad():
            losses = [model._loss(model(x), y) for (x, y), _ in zip(data.val_dataloader(), range(batches))]
        model.train()
        return torch.stack(losses).mean().item()

    initial = {k: v.clone() for k, v in model.state_dict().items()}
    before = val_loss()
    L.Trainer(max_steps=steps, limit_val_batches=0, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, accelerator="cpu").fit(model, datamodule=data)
    return before, val_loss(), model, initial


def assert_decoding_matches(name: str, pos: str = "rope", prompt: int = 5, total: int = 12) -> None:
    """Prefill a prompt into the cache, then decode token by token: the logits at every position equal the
    full forward's, for a batch of 2; cached and uncached greedy generation give the same tokens, also
    past block_size, where both crop the context to the last block_size tokens."""
    torch.manual_seed(0)
    model = Transformer(GPTConfig(vocab_size=40, attention=name, n_layer=2, n_embd=32, n_head=4, block_size=total,
                                  pos=pos)).eval()
    idx = torch.randint(0, 40, (2, total))
    with torch.no_grad():
        full = model(idx)  # (B, T, V)
        cache = model.new_cache(2)
        steps = [model(idx[:, :prompt], cache, torch.arange(prompt))]
        steps += [model(idx[:, t : t + 1], cache, torch.tensor([t])) for t in range(prompt, total)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    start = idx[:, :prompt]
    cached = model.generate(start, total + 4 - prompt, temperature=0)  # 4 tokens past block_size
    uncached = model.generate(start, total + 4 - prompt, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached), name
