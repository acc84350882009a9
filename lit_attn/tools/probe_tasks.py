"""The measurements of `lit-attn probe`: validation loss by position past the training context, and passkey
retrieval from filler text. Plain torch on a Transformer; reading runs and writing results is lit_attn.tools.probe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lit_attn.passkey import (  # noqa: F401  (probe.py's and the tests' names, re-exported)
    FILLER,
    NEEDLE,
    QUESTION,
    check_passkey_text,
    passkey_key,
    passkey_minimum,
    passkey_prompt,
)
from lit_attn.transformer import Transformer


def learned_refusal(run: str, block_size: int, what: str) -> str:
    """Why a run with learned absolute positions cannot be probed past its context."""
    return (f"run {run} uses learned absolute positions (pos=learned): it has no embedding past position "
            f"{block_size - 1}; {what} needs pos=rope")


def model_for_context(model: Transformer, length: int) -> Transformer:
    """`model` itself if `length` fits its block_size, else the same weights in a Transformer built for `length`
    positions: RoPE tables and other buffers shaped by block_size are built anew for the longer context.

    ValueError (one line) for learned positions, and for an attention whose parameters depend on block_size
    (qsa's per-position circuits): neither has weights for the positions past the training context.
    """
    config = model.config
    if length <= config.block_size:
        return model
    if config.pos != "rope":
        raise ValueError(f"pos={config.pos} has no embedding past position {config.block_size - 1}; "
                         f"a longer context needs pos=rope")
    longer = dataclasses.replace(config, block_size=length)
    with torch.device("meta"):  # shapes only
        meta = Transformer(longer)
    shapes = {k: v.shape for k, v in meta.state_dict().items()}
    weights = model.state_dict()
    changed = [k for k, v in weights.items() if shapes.get(k) != v.shape]
    parameters = {name for name, _ in meta.named_parameters()}
    per_position = [k for k in changed if k in parameters]
    if per_position:
        raise ValueError(f"attention {config.attention!r} has parameters per position ({per_position[0]} is shaped "
                         f"by block_size={config.block_size}): it has none for the positions past it")
    device = model.tok_emb.weight.device
    with torch.device(device):
        grown = Transformer(longer)
    # Buffers shaped by block_size are rebuilt by the constructor; every weight is loaded.
    missing, unexpected = grown.load_state_dict({k: v for k, v in weights.items() if k not in changed}, strict=False)
    if set(missing) != set(changed) or unexpected:
        raise ValueError(f"the weights do not fit a model of block_size={length} "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return grown.eval()


# ---- extrapolation ----

def context_lengths(block_size: int, multiples: list[int]) -> list[int]:
    """The contexts to evaluate, in tokens: 1x block_size always first (the ratios are to it), then the others."""
    return [block_size * m for m in sorted({1, *multiples})]


@torch.no_grad()
def position_losses(model: Transformer, tokens: torch.Tensor, context: int, batch_size: int,
                    on_batch: Callable[[], None] | None = None) -> torch.Tensor:
    """Mean cross-entropy (nats) at each position 0..context-1 (float64, (context,)) over the non-overlapping
    windows of `context` tokens that `tokens` (1-D) holds, each predicting the token after it."""
    n = (tokens.numel() - 1) // context
    if n < 1:
        raise ValueError(f"the validation text has {tokens.numel()} tokens, too few for one window of {context}")
    inputs = tokens[: n * context].view(n, context)
    targets = tokens[1: n * context + 1].view(n, context)
    device = model.tok_emb.weight.device
    total = torch.zeros(context, dtype=torch.float64, device=device)
    for start in range(0, n, batch_size):
        x, y = inputs[start: start + batch_size].to(device), targets[start: start + batch_size].to(device)
        logits = model(x).float()
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        total += loss.double().sum(0)
        if on_batch is not None:
            on_batch()
    return (total / n).cpu()


def extrapolation_batches(n_tokens: int, block_size: int, multiples: list[int], batch_size: int) -> int:
    """The forward passes `extrapolation` makes on `n_tokens` tokens: what a progress bar counts."""
    contexts = context_lengths(block_size, multiples)
    used = (n_tokens - 1) // contexts[-1] * contexts[-1]
    return sum(-(-(used // c) // batch_size) for c in contexts)


def extrapolation(model: Transformer, block_size: int, tokens: torch.Tensor, multiples: list[int], buckets: int,
                  batch_size: int, on_batch: Callable[[], None] | None = None) -> dict[str, Any]:
    """Validation loss by position bucket at each context (multiples of the training context `block_size`), on
    the same tokens; `model` holds the longest context (`model_for_context`).

    Returns {"block_size", "tokens", "contexts": [{"multiple", "context", "windows", "loss", "ratio",
    "buckets": [{"start", "end", "loss"}, ...]}, ...]}; `ratio` is loss / the loss at 1x.
    """
    contexts = context_lengths(block_size, multiples)
    if contexts[0] < buckets:
        raise ValueError(f"--buckets {buckets} is more than block_size={block_size} positions; use fewer buckets")
    longest = contexts[-1]
    windows = (tokens.numel() - 1) // longest
    if windows < 1:
        raise ValueError(f"the validation text has {tokens.numel()} tokens, fewer than the {longest + 1} that one "
                         f"window of {longest // block_size}x block_size needs; use a longer text (--data.path) "
                         f"or smaller --contexts")
    tokens = tokens[: windows * longest + 1]  # every context reads the same tokens
    results = []
    for context in contexts:
        losses = position_losses(model, tokens, context, batch_size, on_batch)
        parts = torch.arange(context).tensor_split(buckets)
        results.append({
            "multiple": context // block_size, "context": context, "windows": (tokens.numel() - 1) // context,
            "loss": float(losses.mean()),
            "buckets": [{"start": int(p[0]), "end": int(p[-1]) + 1, "loss": float(losses[p].mean())} for p in parts],
        })
    for r in results:
        r["ratio"] = r["loss"] / results[0]["loss"]
    return {"block_size": block_size, "tokens": tokens.numel(), "contexts": results}


# ---- passkey ----

def whole_prompt(codec: Any, length: int, depth: float, key: str) -> tuple[list[int], int] | None:
    """`passkey_prompt`, its text encoded whole by the run's codec: (prompt ids, answer tokens), or None.

    passkey_prompt joins the ids of its sentences encoded one by one. For characters that is the text's own
    encoding; a BPE tokenizer merges across the joins ("." + " The", not "." + " " + "The"), so the joined ids
    are a tokenization the run never trained on. Encoded whole, the text is shorter, so filler is added at its
    start until prompt and answer fill `length` again (or, where a merge at the cut makes that impossible, the
    longest that fits).
    """
    target, best = length, None
    for _ in range(8):
        built = passkey_prompt(codec, target, depth, key)
        if built is None:
            break
        ids, answer = codec.encode(codec.decode(built[0])), built[1]
        if len(ids) + answer <= length and (best is None or len(ids) > len(best[0])):
            best = (ids, answer)
        if len(ids) + answer == length:
            break
        target += length - len(ids) - answer
    return best


def passkey(model: Transformer, codec: Any, lengths: list[int], depths: list[float], trials: int, seed: int,
            on_cell: Callable[[], None] | None = None) -> dict[str, Any]:
    """Greedy retrieval of the key, with the decoding cache, over the grid lengths x depths (in tokens); `model`
    holds the longest length (`model_for_context`).

    Returns {"lengths", "depths", "trials", "seed", "accuracy": [[per depth] per length] (None where a prompt
    does not fit the length), "mean", "examples": one decoded answer per cell}.
    """
    device = model.tok_emb.weight.device
    accuracy: list[list[float | None]] = []
    examples: list[list[str | None]] = []
    for length in lengths:
        row, shown = [], []
        for depth in depths:
            keys = [passkey_key(seed, length, depth, t) for t in range(trials)]
            prompts = [whole_prompt(codec, length, depth, k) for k in keys]
            if any(p is None for p in prompts):
                row.append(None)
                shown.append(None)
            else:
                answers = _retrieve(model, codec, prompts, device)
                row.append(sum(a.strip().startswith(k) for a, k in zip(answers, keys)) / trials)
                shown.append(answers[0])
            if on_cell is not None:
                on_cell()
        accuracy.append(row)
        examples.append(shown)
    cells = [a for row in accuracy for a in row if a is not None]
    return {"lengths": lengths, "depths": depths, "trials": trials, "seed": seed, "accuracy": accuracy,
            "mean": sum(cells) / len(cells) if cells else None, "examples": examples}


def _retrieve(model: Transformer, codec: Any, prompts: list[tuple[list[int], int]], device: torch.device) -> list[str]:
    """The greedy answers (decoded text) to the prompts; prompts of the same size are decoded as one batch."""
    answers = [""] * len(prompts)
    for size in dict.fromkeys((len(ids), n) for ids, n in prompts):
        group = [i for i, (ids, n) in enumerate(prompts) if (len(ids), n) == size]
        idx = torch.tensor([prompts[i][0] for i in group], dtype=torch.long, device=device)
        out = model.generate(idx, size[1], temperature=0.0, use_cache=True)
        for row, i in enumerate(group):
            answers[i] = codec.decode(out[row, size[0]:].tolist())
    return answers
