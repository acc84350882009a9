"""Conformance checks for an attention: `check_attention("name")` runs them all (also on your own class).

Each check raises AssertionError saying what is wrong and how to fix it; so does an attention that cannot
be found or built, or whose own code raises (that error is the AssertionError's `__cause__`). The checks
build the attention alone (no model, no training) at small sizes, on the CPU, in a second or two.
`check_before_training` is the cheap part a fit runs on a class named by its import path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from lit_attn.attention import get_attention
from lit_attn.attention.registry import COMMON_ARGS, AttentionSpec

__all__ = ["check_attention", "check_before_training", "check_builds", "check_cached_decoding", "check_causal",
           "check_counts", "check_gradients", "check_rope", "check_shape_and_dtype", "raised_by"]

SIZES = {"n_embd": 32, "n_head": 4, "block_size": 16}
# What check_before_training shrinks a model's attention to: its head layout, at this head size and context.
TRAINING_CHECK_HEAD_SIZE = 8
TRAINING_CHECK_CONTEXT = 32


def check_attention(name: str, options: dict[str, Any] | None = None, **sizes: Any) -> None:
    """Run every check on attention `name` (registered or an import path) built with `sizes` (n_embd, n_head,
    block_size, ... overriding small defaults; any common argument, e.g. qk_norm=True) and its own `options`."""
    spec, args = _spec_and_arguments(name, options, {**SIZES, **sizes, "rope": False})
    check_builds(spec, args)
    check_shape_and_dtype(spec, args)
    check_causal(spec, args)
    check_gradients(spec, args)
    check_rope(spec, options, {**SIZES, **sizes})
    check_cached_decoding(spec, args)
    check_counts(spec, args)


def check_before_training(name: str, options: dict[str, Any] | None, common: dict[str, Any]) -> None:
    """What a fit checks before it builds the model: attention `name` builds from the model's arguments
    (`common`, as `lit_attn.attention.build_attention` takes them, and its `options`), and, shrunk to the
    model's head layout at head size TRAINING_CHECK_HEAD_SIZE and context TRAINING_CHECK_CONTEXT, passes
    check_shape_and_dtype and check_causal. Cheap: a few forwards of one tiny layer."""
    spec, args = _spec_and_arguments(name, options, common)
    check_builds(spec, args)
    head_size = max(1, min(args["n_embd"] // args["n_head"], TRAINING_CHECK_HEAD_SIZE))
    tiny = spec.arguments(options, {**{k: args[k] for k in COMMON_ARGS}, "n_embd": args["n_head"] * head_size,
                                    "block_size": min(args["block_size"], TRAINING_CHECK_CONTEXT)})
    check_shape_and_dtype(spec, tiny)
    check_causal(spec, tiny)


def _spec_and_arguments(name: str, options: dict[str, Any] | None,
                        common: dict[str, Any]) -> tuple[AttentionSpec, dict[str, Any]]:
    try:
        spec = get_attention(name)
        return spec, spec.arguments(options, common)
    except (ValueError, TypeError) as e:  # not found, not a class, unknown or missing options
        raise AssertionError(str(e)) from e


@contextlib.contextmanager
def raised_by(spec: AttentionSpec, what: str) -> Iterator[None]:
    """Turn an error raised inside the attention's own code (`what`: its constructor, its forward) into an
    AssertionError naming the attention, with the error as its cause."""
    try:
        yield
    except Exception as e:
        message = " ".join(str(e).split()) or "(no message)"
        raise AssertionError(f"attention {spec.name!r}: {what} raised {type(e).__name__}: {message} (an error in "
                             "the attention's own code)") from e


def _build(spec: AttentionSpec, args: dict[str, Any], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with raised_by(spec, "its constructor"):
        return spec.build(**args).eval()


def _forward(spec: AttentionSpec, module: nn.Module, *inputs: Any) -> Any:
    with raised_by(spec, "its forward"):
        return module(*inputs)


def _input(args: dict[str, Any], batch: int = 2, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, args["block_size"], args["n_embd"], generator=generator)  # (B, T, C)


def check_builds(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """The attention builds on the meta device, where the model measures its heads and parameters, and does not
    declare its decoding cache the former way (cache_layout)."""
    former = spec.former_interface()
    assert former is None, former
    with raised_by(spec, "its constructor (on the meta device, where the model measures it)"):
        spec.heads(**args)
        spec.params(**args)


def check_shape_and_dtype(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """forward(x) maps (B, T, C) to (B, T, C) in x's dtype, with finite values, in float32 and bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        module, x = _build(spec, args).to(dtype), _input(args).to(dtype)
        with torch.no_grad():
            y = _forward(spec, module, x)
        assert isinstance(y, torch.Tensor), (
            f"attention {spec.name!r}: forward(x) returned a {type(y).__name__}, not a tensor; return the output "
            "alone, a tensor of the input's shape (B, T, C)")
        assert y.shape == x.shape, (
            f"attention {spec.name!r}: forward(x) of shape {tuple(x.shape)} returned {tuple(y.shape)}; it must "
            f"return a tensor of the input's shape (B, T, C): {_shape_fix(x.shape, y.shape)}")
        assert y.dtype == dtype, (f"attention {spec.name!r}: a {dtype} input gave a {y.dtype} output; return the "
                                  "input's dtype (cast back after any full-precision part)")
        assert torch.isfinite(y.float()).all(), f"attention {spec.name!r}: the {dtype} output has NaN or inf values"


def _shape_fix(x: torch.Size, y: torch.Size) -> str:
    if len(y) != 3:
        return "merge the heads back into one channel axis (y.transpose(1, 2).reshape(B, T, C))"
    if y[1] != x[1]:
        return f"one output per position (T={x[1]}, got {y[1]}): keep the time axis, and slice any mask to T"
    if y[2] != x[2]:
        return f"project the heads back to n_embd channels (C={x[2]}, got {y[2]})"
    return "keep the batch axis"


def check_causal(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """Changing the tokens from any position on never changes the outputs before it: one forward of a batch
    whose row j (1 <= j < T) replaces the tokens from position j on, row 0 the unchanged input."""
    x = _input(args, batch=1)
    T = x.size(1)
    position = torch.arange(T)
    replaced = (position[None, :] >= position[:, None]) & (position[:, None] >= 1)  # (row, position)
    rows = torch.where(replaced[..., None], _input(args, batch=T, seed=2), x)  # (T, T, C)
    module = _build(spec, args)
    with torch.no_grad():
        y = _forward(spec, module, rows)
    leak = (y - y[:1]).abs().amax(dim=2).masked_fill(replaced, 0)  # (row, position): earlier positions only
    tolerance = 1e-5 * (1 + float(y[0].abs().max()))
    if leak.max() > tolerance:
        row = int((leak > tolerance).any(dim=1).nonzero()[0])
        first = int((leak[row] > tolerance).nonzero()[0])
        raise AssertionError(
            f"attention {spec.name!r} is not causal: changing the tokens after position {row - 1} changed the "
            f"output at position {first} (by {float(leak[row].max()):.3g}); mask the scores so position i only "
            "attends to j <= i (e.g. F.scaled_dot_product_attention(q, k, v, is_causal=True))")


def check_gradients(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """A loss on the output sends a finite, non-zero gradient to every parameter."""
    module = _build(spec, args).train()
    x = _input(args).requires_grad_(True)
    y = _forward(spec, module, x)
    with raised_by(spec, "its backward"):
        y.square().mean().backward()
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
        same = torch.allclose(_forward(spec, plain, x), _forward(spec, rotary, x))
    assert not same, (f"attention {spec.name!r} ignores rope: built with rope=True its output equals the one "
                      "without; rotate q and k by position (lit_attn.attention.RotaryEmbedding(head_size, block_size)"
                      " applied to (B, H, T, hs) queries and keys), or register it with rope=False")


def check_cached_decoding(spec: AttentionSpec, args: dict[str, Any], prompt: int = 5) -> None:
    """With a declared decoding state: a prefill, then one token at a time, gives the full forward's outputs."""
    with raised_by(spec, "its decoding_state"):
        layout = spec.state(**args)
    if layout is None:
        return  # decoding recomputes the prefix: nothing to compare
    module, x = _build(spec, args), _input(args)
    B, T, _ = x.shape
    with raised_by(spec, "its decoding_state's new(batch, length, dtype, device)"):
        state = layout.new(B, T, x.dtype, x.device)
    steps = []
    with torch.no_grad():
        full = _forward(spec, module, x)
        for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, T))]:
            state.step(torch.arange(start, end), end)
            steps.append(_forward(spec, module, x[:, start:end], state))
    got = torch.cat(steps, dim=1)
    wrong = (got - full).abs().amax(dim=(0, 2)) > 1e-4 * (1 + full.abs().amax())
    if wrong.any():
        first = int(wrong.nonzero()[0])
        raise AssertionError(
            f"attention {spec.name!r}: cached decoding differs from the full forward at position {first} "
            f"(prefill of {prompt}, then one token per step); keep each token's entries in the state at its "
            "`state.positions`, attend over the kept positions <= its own, and check decoding_state's layout")


def check_counts(spec: AttentionSpec, args: dict[str, Any]) -> None:
    """Declared heads, parameters and FLOPs (where the class overrides them) equal those measured from the module."""
    context = args["block_size"]
    with raised_by(spec, "its forward (on the meta device, where the model counts its FLOPs)"):
        heads, params, flops = spec.derived(context, **args)
    declared = {"heads": spec.heads(**args), "parameter_count": spec.params(**args),
                "flop_split": spec.flops(context, **args)}
    for what, measured in zip(declared, (heads, params, flops)):
        assert declared[what] == measured, (
            f"attention {spec.name!r}: its {what}() says {declared[what]}, the module measures {measured} "
            f"(n_embd={args['n_embd']}, n_head={args['n_head']}, context {context}); fix the formula or drop it "
            "to use the measured value")
