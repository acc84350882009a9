"""Per-layer patterns: which attention, with which options, each layer of a GPT has (GPTConfig.layer_pattern).

A pattern is either
- a string over the letters S and L, as nanochat's `window_pattern`: S is the model's attention with a sliding
  window of `local_window` positions (given, not derived from block_size: a model run at another context, as the
  extrapolation probe does, keeps its windows), L the model's attention over the whole causal context; the string
  repeats over the layers (Gemma 2: "SL", Gemma 3: "SSSSSL", nanochat: "SSSL");
- or a list of layers, each an attention name (or import path) or {"attention": NAME, "options": {...}}, whose
  length equals n_layer or divides it (the list then repeats): registered attentions mixed. A layer of the
  model's own attention takes its options over --model.attention_options; another attention takes its own only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lit_attn.attention import get_attention

__all__ = ["FLAG", "WINDOW_FLAG", "layer_cycle", "layer_label", "pattern_label"]

FLAG = "--model.layer_pattern"
WINDOW_FLAG = "--model.local_window"
LETTERS = {"S": f"local: the model's attention with window {WINDOW_FLAG}", "L": "global: full causal attention"}
ENTRY_KEYS = ("attention", "options")
Layer = tuple[str, dict[str, Any] | None]  # (attention name, its options) of one layer


def layer_cycle(pattern: Any, n_layer: int, attention: str, options: Mapping[str, Any] | None,
                local_window: int | None, block_size: int) -> list[Layer]:
    """(attention, options) of the layers of one cycle: layer i has cycle[i % len(cycle)]; ValueError (one line
    naming the flag) for a bad pattern. Without a pattern, one entry: the model's attention and options."""
    if pattern is None:
        if local_window is not None:
            raise ValueError(f"{WINDOW_FLAG} sizes the S layers of {FLAG}, which is not set; set a pattern (e.g. "
                             f"{FLAG} SSSL) or drop {WINDOW_FLAG}")
        return [(attention, None if options is None else dict(options))]
    if isinstance(pattern, str):
        return _letters(pattern, n_layer, attention, options, local_window, block_size)
    if isinstance(pattern, (list, tuple)):
        if local_window is not None:
            raise ValueError(f"{WINDOW_FLAG} sizes the S layers of a letter pattern; a list {FLAG} gives each "
                             "layer's window in its options: drop it")
        return _entries(pattern, n_layer, attention, options)
    raise ValueError(f"{FLAG} must be a string of the letters S and L (e.g. SSSL) or a list of layers (JSON), "
                     f"got {pattern!r}")


def _letters(pattern: str, n_layer: int, attention: str, options: Mapping[str, Any] | None,
             local_window: int | None, block_size: int) -> list[Layer]:
    letters = pattern.strip().upper()
    if not letters:
        raise ValueError(f"{FLAG} is empty; give letters ({_letter_help()}), e.g. SSSL, or leave it out")
    unknown = sorted(set(letters) - set(LETTERS))
    if unknown:
        raise ValueError(f"{FLAG} {pattern!r} has unknown letter(s) {', '.join(unknown)}; its letters are "
                         f"{_letter_help()} (a list of layers, in JSON, mixes attentions)")
    if len(letters) > n_layer:
        raise ValueError(f"{FLAG} {pattern!r} has {len(letters)} letters for {n_layer} layers (--model.n_layer); "
                         "give at most one letter per layer")
    base = dict(options or {})
    if "window" in base:
        raise ValueError(f"{FLAG} sets the S layers' window ({WINDOW_FLAG}) and gives L layers none: drop window "
                         "from --model.attention_options")
    if "S" not in letters:
        if local_window is not None:
            raise ValueError(f"{FLAG} {pattern!r} has no S layer for {WINDOW_FLAG} to size; add one or drop it")
        return [(attention, base or None)] * len(letters)
    if "window" not in get_attention(attention).options():
        raise ValueError(f"{FLAG} {pattern!r}: attention {attention!r} has no window option for its S layers; use "
                         "a softmax attention (mha, gqa, ...) or a list of layers")
    window = local_window
    if window is None:
        raise ValueError(f"{FLAG} {pattern!r} has S layers: give their window with {WINDOW_FLAG} N (the positions "
                         f"each query attends to; nanochat's is half the context: {block_size // 2})")
    if not isinstance(window, int) or isinstance(window, bool) or not 2 <= window < block_size:
        raise ValueError(f"{WINDOW_FLAG} must be an integer from 2 to block_size - 1 = {block_size - 1} (the "
                         f"positions an S layer attends to), got {window!r}")
    layers = {"S": (attention, {**base, "window": window}), "L": (attention, base or None)}
    return [layers[letter] for letter in letters]


def _letter_help() -> str:
    return "; ".join(f"{letter} ({meaning})" for letter, meaning in LETTERS.items())


def _entries(pattern: list | tuple, n_layer: int, attention: str, options: Mapping[str, Any] | None) -> list[Layer]:
    if not pattern:
        raise ValueError(f"{FLAG} is an empty list; give one layer per layer or per repeating cycle, e.g. "
                         f"{FLAG} '[\"gqa\", {{\"attention\": \"mha\", \"options\": {{\"window\": 64}}}}]'")
    if n_layer % len(pattern):
        raise ValueError(f"{FLAG} lists {len(pattern)} layers, which neither equals nor divides --model.n_layer "
                         f"{n_layer}; list one layer per layer, or a cycle whose length divides it")
    return [_entry(i, entry, attention, options) for i, entry in enumerate(pattern)]


def _entry(i: int, entry: Any, attention: str, options: Mapping[str, Any] | None) -> Layer:
    where = f"{FLAG} entry {i}"
    if isinstance(entry, str):
        entry = {"attention": entry}
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an attention name or {{\"attention\": NAME, \"options\": {{...}}}}, "
                         f"got {entry!r}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(str, unknown))}; its keys are attention "
                         "(default: --model.attention) and options")
    name = entry.get("attention", attention)
    own = entry.get("options")
    if not isinstance(name, str):
        raise ValueError(f"{where}: attention must be a name, got {name!r}")
    if own is not None and not isinstance(own, Mapping):
        raise ValueError(f"{where}: options must be a mapping (JSON object), got {own!r}")
    try:
        spec = get_attention(name)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    same = spec == get_attention(attention)  # the model's attention (checked by GPTConfig before its layers)
    merged = {**(options or {}), **(own or {})} if same else dict(own or {})
    return name, merged or None


def layer_label(attention: str, options: Mapping[str, Any] | None) -> str:
    """A layer's kind in a few characters: its attention and options (sorted: a run's files sort them), e.g.
    mha(window=64)."""
    given = ", ".join(f"{k}={v}" for k, v in sorted((options or {}).items()))
    return f"{attention}({given})" if given else attention


def pattern_label(attention: str, pattern: Any, local_window: int | None = None) -> str:
    """A patterned model's name for tables and plots: the attention, its letters and their window, e.g. mha/SSSL/w64,
    or its list of layers with repeats counted, e.g. 3*gated_deltanet+mha; the attention alone without a pattern."""
    if pattern is None:
        return attention
    if isinstance(pattern, str):
        return f"{attention}/{pattern.strip().upper()}" + ("" if local_window is None else f"/w{local_window}")
    labels = [layer_label(*_plain(entry, attention)) for entry in pattern]
    runs: list[list] = []
    for label in labels:
        if runs and runs[-1][1] == label:
            runs[-1][0] += 1
        else:
            runs.append([1, label])
    return "+".join(label if n == 1 else f"{n}*{label}" for n, label in runs)


def _plain(entry: Any, attention: str) -> tuple[str, Mapping[str, Any] | None]:
    """An entry's attention and its own options, as written (for labels: no checks)."""
    if isinstance(entry, Mapping):
        options = entry.get("options")
        return str(entry.get("attention", attention)), options if isinstance(options, Mapping) else None
    return str(entry), None
