"""A trained lit-attn network as an lm-evaluation-harness model (`lm_eval.api.model.LM`), with the run's own codec.

- loglikelihood: log p(continuation | context) summed over the continuation's tokens, and whether greedy decoding
  gives it. Context and continuation are encoded together and split where the context ends (a trailing space of
  the context moves to the continuation, as the harness's Hugging Face model does); a pair longer than
  block_size + 1 tokens loses the context's oldest tokens (left truncation).
- loglikelihood_rolling: a whole text's log-likelihood in disjoint windows of block_size predictions
  (lm_eval.utils.get_rolling_token_windows with context_len 1, then make_disjoint_window), so each token is
  scored once, with up to block_size tokens of context.
- generate_until: greedy decoding with the network's decoding cache (`Transformer.generate`), stopped at the first
  stop string (`until`), the end-of-text token (BPE) or max_gen_toks.

An empty context, and the first window of a text, start from the end-of-text token (BPE) or token id 0 (char
models, as `lit-attn sample` with an empty prompt). Requests are scored in batches, longest first, with a
progress bar. Imports lm_eval: load this module only once lm_eval is known to be installed.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from lit_attn.transformer import Transformer

MAX_GEN_TOKS = 256  # the harness's default for generate_until tasks that set no max_gen_toks


class _Stopped(Exception):
    """Raised from generate's on_token callback once every sequence of the batch hit a stop."""


class LitAttnLM(LM):
    """`model` (a Transformer in eval mode) with `codec` (lit_attn.codec) for lm_eval.simple_evaluate."""

    def __init__(self, model: Transformer, codec: Any, batch_size: int = 16, progress: bool = True,
                 max_gen_toks: int = MAX_GEN_TOKS, info: dict[str, Any] | None = None):
        super().__init__()
        self.model, self.codec = model.eval(), codec
        self.batch_size, self.progress, self.max_gen_toks = batch_size, progress, max_gen_toks
        self.block_size = model.config.block_size
        self.prefix_id = codec.eot_id if codec.eot_id is not None else 0
        self.info = info or {}
        self._device = model.tok_emb.weight.device
        self._warned_sampling = False

    def get_model_info(self) -> dict[str, Any]:
        """What the harness records in its results' "config" about the model."""
        return {"block_size": self.block_size, "vocab_size": self.model.config.vocab_size, **self.info}

    # ---- text <-> ids ----

    def encode(self, text: str, task: str | None = None) -> list[int]:
        """The codec's ids; a one-line ValueError naming the task for characters a char model never saw."""
        try:
            return self.codec.encode(text)
        except ValueError as e:
            where = f"task {task}: " if task else ""
            raise ValueError(f"{where}{e}; a char model scores only the characters of its training text") from None

    def encode_pair(self, context: str, continuation: str, task: str | None = None) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids): encoded together, split where the context's ids end."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation, task)
        head = self.encode(context, task)
        return head, whole[len(head):]

    # ---- scoring ----

    @torch.no_grad()
    def score(self, pairs: list[tuple[list[int], list[int]]], bar: tqdm | None = None) -> list[tuple[float, bool]]:
        """(sum of log p(continuation token), all greedy) per (context ids, continuation ids), batched longest first.

        The model reads the last block_size tokens of context + continuation (minus the final token); an empty
        context is the start token. ValueError for a continuation longer than block_size.
        """
        out: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        rows = []
        for i, (context, continuation) in enumerate(pairs):
            if len(continuation) > self.block_size:
                raise ValueError(f"a continuation of {len(continuation)} tokens does not fit the model's context "
                                 f"(block_size={self.block_size})")
            if continuation:
                whole = ((context or [self.prefix_id]) + continuation)[-(self.block_size + 1):]
                rows.append((i, whole[:-1], continuation))
            elif bar is not None:
                bar.update(1)
        rows.sort(key=lambda r: -len(r[1]))
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start:start + self.batch_size]
            for (i, _, _), result in zip(batch, self._score_batch([(x, y) for _, x, y in batch])):
                out[i] = result
            if bar is not None:
                bar.update(len(batch))
        return out

    def _score_batch(self, batch: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """One forward pass over inputs padded on the right (causal: padding changes no earlier position)."""
        width = max(len(x) for x, _ in batch)
        idx = torch.zeros(len(batch), width, dtype=torch.long)
        select = torch.zeros(len(batch), width, dtype=torch.bool)
        for row, (x, y) in enumerate(batch):
            idx[row, :len(x)] = torch.tensor(x)
            select[row, len(x) - len(y):len(x)] = True
        targets = torch.tensor([t for _, y in batch for t in y], device=self._device)
        logits = self.model(idx.to(self._device), select=select.to(self._device)).float()  # (N, V), row-major
        logp = F.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        greedy = logits.argmax(-1) == targets
        out, at = [], 0
        for _, y in batch:
            out.append((float(logp[at:at + len(y)].sum()), bool(greedy[at:at + len(y)].all())))
            at += len(y)
        return out

    def _bar(self, total: int, what: str, disable: bool = False) -> tqdm:
        return tqdm(total=total, desc=what, disable=disable or not self.progress, file=sys.stderr, leave=False)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*r.args, task=getattr(r, "task_name", None)) for r in requests]
        with self._bar(len(pairs), "loglikelihood", disable_tqdm) as bar:
            return self.score(pairs, bar)

    def rolling_windows(self, ids: list[int]) -> list[tuple[list[int], list[int]]]:
        """The (context, predicted) windows that score every token of `ids` once."""
        windows = get_rolling_token_windows(token_list=ids, prefix_token=self.prefix_id,
                                            max_seq_len=self.block_size, context_len=1)
        return [make_disjoint_window(w) for w in windows]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows = [self.rolling_windows(self.encode(r.args[0], getattr(r, "task_name", None))) for r in requests]
        flat = [w for ws in windows for w in ws]
        with self._bar(len(flat), "loglikelihood_rolling", disable_tqdm) as bar:
            scores = iter(self.score(flat, bar))
        return [sum(next(scores)[0] for _ in ws) for ws in windows]

    # ---- generation ----

    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
        """(stop strings, max new tokens) of a request; sampling settings are noted once: decoding is greedy."""
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else [s for s in until if s]
        if (kwargs.get("do_sample") or (kwargs.get("temperature") or 0) > 0) and not self._warned_sampling:
            print("warning: a task asks for sampling; lit-attn evaluates with greedy decoding", file=sys.stderr)
            self._warned_sampling = True
        return until, int(kwargs.get("max_gen_toks") or self.max_gen_toks)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = [""] * len(requests)
        groups: dict[tuple, list[tuple[int, list[int]]]] = {}  # same stops, budget and prompt length: one batch
        for i, r in enumerate(requests):
            context, gen_kwargs = r.args
            until, budget = self._generation_settings(gen_kwargs)
            ids = self.encode(context, getattr(r, "task_name", None))[-self.block_size:] or [self.prefix_id]
            groups.setdefault((tuple(until), budget, len(ids)), []).append((i, ids))
        with self._bar(len(requests), "generate_until", disable_tqdm) as bar:
            for (until, budget, _), members in groups.items():
                for start in range(0, len(members), self.batch_size):
                    chunk = members[start:start + self.batch_size]
                    for (i, _), text in zip(chunk, self.generate([ids for _, ids in chunk], list(until), budget)):
                        out[i] = text
                    bar.update(len(chunk))
        return out

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], until: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations of equal-length prompts, each cut before its first stop string."""
        idx = torch.tensor(prompts, dtype=torch.long, device=self._device)
        stops = _StopWatch(self.codec, until, len(prompts))
        try:
            self.model.generate(idx, max_new_tokens, temperature=0.0, stop_token=self.codec.eot_id, on_token=stops)
        except _Stopped:
            pass
        return [_cut(self.codec.decode(ids), until) for ids in stops.ids]


class _StopWatch:
    """generate's on_token callback: keeps each sequence's new ids until its end-of-text token or a stop string,
    and ends generation (raises _Stopped) once every sequence has stopped."""

    def __init__(self, codec: Any, until: list[str], batch: int):
        self.codec, self.until = codec, until
        self.ids: list[list[int]] = [[] for _ in range(batch)]
        self.done = [False] * batch

    def __call__(self, tokens: torch.Tensor) -> None:
        for row, token in enumerate(tokens.tolist()):
            if self.done[row]:
                continue
            if token == self.codec.eot_id:
                self.done[row] = True
                continue
            self.ids[row].append(token)
            self.done[row] = any(s in self.codec.decode(self.ids[row]) for s in self.until)
        if all(self.done):
            raise _Stopped


def _cut(text: str, until: list[str]) -> str:
    """`text` up to its first stop string."""
    for stop in until:
        text = text.split(stop)[0]
    return text

