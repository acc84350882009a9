"""Conformance checks for an attention: `check_attention("name")` runs them all (also on your own class).

Each check raises AssertionError saying what is wrong and how to fix it. The checks build the
attention alone (no model, no training) at small sizes, on the CPU, in a second or two.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_attn.attention import get_attention
from lit_attn.attention.registry import AttentionSpec

__all__ = ["check_attention", "check_cached_decoding", "check_causal", "check_counts", "check_gradients",
           "check_rope", "check_shape_and_dtype"]

SIZES = {"n_embd": 32, "n_head": 4, "block_size": 16}


def check_attention(name: str, options: dict[str, Any] | None = None, **sizes: Any) -> None:
    """Run every check on attention `name` (registered or an import path) built with `sizes` (n_embd, n_head,
    block_size, ... overriding small defaults) and its own `options`."""
    spec = get_attention(name)
    args = spec.arguments(options, {**SIZES, **sizes, "rope": False})
    check_shape_and_dtype(spec, args)
    check_causal(spec, args)
    check_gradients(spec, args)
    check_rope(spec, options, {**SIZES, **sizes})
    check_cached_decoding(spec, args)
    check_counts(spec, args)


def _build(spec: AttentionSpec, args: dict[str, Any], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return spec.build(**args).eval()


def _input(args: dict[str, Any], batch: int = 2, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, args["block_size"], args["n_embd"], generator=generator)  # (B, T, C)


def check_shape_and_dtype(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """forward(x) maps (B, T, C) to (B, T, C) in x's dtype, in float32 and bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        module, x = _build(spec, args).to(dtype), _input(args).to(dtype)
        with torch.no_grad():
            y = module(x)
        assert isinstance(y, torch.Tensor) and y.shape == x.shape, (
            f"attention {spec.name!r}: forward(x) of shape {tuple(x.shape)} returned "
            f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}; it must return a tensor of "
            "the input's shape (B, T, C): project the heads back to n_embd channels")
        assert y.dtype == dtype, (f"attention {spec.name!r}: a {dtype} input gave a {y.dtype} output; return the "
                                  "input's dtype (cast back after any full-precision part)")
        assert torch.isfinite(y.float()).all(), f"attention {spec.name!r}: the {dtype} output has NaN or inf values"


def check_causal(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """Changing a token never changes the outputs at earlier positions."""
    module, x = _build(spec, args), _input(args)
    T = x.size(1)
    with torch.no_grad():
        y = module(x)
        for t in (0, T // 2, T - 2):
            changed = x.clone()
            changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
            leak = (module(changed)[:, : t + 1] - y[:, : t + 1]).abs().amax(dim=(0, 2))  # (t + 1,)
            if leak.max() > 1e-5:
                first = int((leak > 1e-5).nonzero()[0])
                raise AssertionError(
                    f"attention {spec.name!r} is not causal: changing the tokens after position {t} changed the "
                    f"output at position {first} (by {float(leak.max()):.3g}); mask the scores so position i only "
                    "attends to j <= i (e.g. F.scaled_dot_product_attention(q, k, v, is_causal=True))")


def check_gradients(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """A loss on the output sends a finite, non-zero gradient to every parameter."""
    module = _build(spec, args).train()
    x = _input(args).requires_grad_(True)
    module(x).square().mean().backward()
    dead = [n for n, p in module.named_parameters() if p.requires_grad
            and (p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.abs().sum() > 0)]
    assert not dead, (f"attention {spec.name!r}: no (or a non-finite) gradient reaches {', '.join(dead)}; use every "
                      "parameter in forward, or register unused tensors as buffers")
    assert x.grad is not None and x.grad.abs().sum() > 0, f"attention {spec.name!r}: the output does not depend on x"


def check_rope(spec: AttentionSpec, options: dict[str, Any] | None, common: dict[str, Any]) -> None:
    """Built with rope=True, the output differs from the same weights with rope=False; an attention that
    registered rope=False must refuse rope=True."""
    if not spec.rope:
        try:
            spec.arguments(options, {**common, "rope": True})
        except ValueError:
            return
        raise AssertionError(f"attention {spec.name!r} says it cannot use rotary embeddings but accepts rope=True")
    plain = _build(spec, spec.arguments(options, {**common, "rope": False}))
    rotary = _build(spec, spec.arguments(options, {**common, "rope": True}))
    rotary.load_state_dict(plain.state_dict(), strict=False)  # the same weights; rope buffers of its own
    x = _input(spec.arguments(options, {**common, "rope": False}))
    with torch.no_grad():
        same = torch.allclose(plain(x), rotary(x))
    assert not same, (f"attention {spec.name!r} ignores rope: built with rope=True its output equals the one "
                      "without; rotate q and k by position (lit_attn.attention.RotaryEmbedding(head_size, block_size)"
                      " applied to (B, H, T, hs) queries and keys), or register it with rope=False")


def check_cached_decoding(spec: AttentionSpec, args: dict[str, Any], prompt: int = 5) -> None:
    """With a declared cache: a prefill, then one token at a time, gives the full forward's outputs."""
    layout = spec.cache(**args)
    if layout is None:
        return  # decoding recomputes the prefix: nothing to compare
    module, x = _build(spec, args), _input(args)
    B, T, _ = x.shape
    cache = {key: torch.zeros(B, T, *shape) for key, shape in layout.items()}
    with torch.no_grad():
        full = module(x)
        steps = [module(x[:, :prompt], cache, torch.arange(prompt))]
        steps += [module(x[:, t: t + 1], cache, torch.tensor([t])) for t in range(prompt, T)]
    got = torch.cat(steps, dim=1)
    wrong = (got - full).abs().amax(dim=(0, 2)) > 1e-4 * (1 + full.abs().amax())
    if wrong.any():
        first = int(wrong.nonzero()[0])
        raise AssertionError(
            f"attention {spec.name!r}: cached decoding differs from the full forward at position {first} "
            f"(prefill of {prompt}, then one token per step); write each token's {', '.join(layout)} into the cache "
            "at its `positions`, attend over the cached positions <= its own, and check cache_layout's shapes")


def check_counts(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """Declared heads, parameters and FLOPs (where the class overrides them) equal those measured from the module."""
    context = args["block_size"]
    heads, params, flops = spec.derived(context, **args)
    declared = {"heads": spec.heads(**args), "parameter_count": spec.params(**args),
                "flop_split": spec.flops(context, **args)}
    for what, measured in zip(declared, (heads, params, flops)):
        assert declared[what] == measured, (
            f"attention {spec.name!r}: its {what}() says {declared[what]}, the module measures {measured} "
            f"(n_embd={args['n_embd']}, n_head={args['n_head']}, context {context}); fix the formula or drop it "
            "to use the measured value")
