"""The passkey retrieval text: a 5-digit key hidden at a depth of filler sentences, then the question whose answer
is the key. Text and token ids only (any codec with encode): `lit-attn probe` scores greedy retrieval of it and
`datamodules.PasskeyDataModule` trains on it, from this one definition.
"""

from __future__ import annotations

import random
from typing import Any

FILLER = ("The grass is green. ", "The sky is blue. ", "The sun is yellow. ", "Here we go. ", "There and back again. ")
NEEDLE = "The pass key is {key}. Remember it. "
QUESTION = "What is the pass key? The pass key is"
DIGITS = "0123456789"
KEY_RANGE = (10_000, 99_999)  # 5-digit keys, both ends included


def passkey_chars() -> str:
    """Every character a passkey prompt or answer can hold, sorted: a char vocabulary that covers the task."""
    return "".join(sorted(set("".join(FILLER) + NEEDLE.format(key="") + QUESTION + DIGITS)))


def passkey_answer(key: str) -> str:
    """The text that answers the question: a space, then the key."""
    return " " + key


def passkey_key(seed: int, length: int, depth: float, trial: int) -> str:
    """The 5-digit key of one probe trial: the same for the same seed and cell, whatever else the grid holds."""
    return str(random.Random(f"{seed}:{length}:{depth}:{trial}").randint(*KEY_RANGE))


def check_passkey_text(codec: Any) -> None:
    """ValueError naming the characters of the passkey prompts that a char vocabulary lacks."""
    vocab = getattr(codec, "vocab", None)
    if vocab is None:  # BPE encodes any text
        return
    missing = sorted(set(passkey_chars()) - set(vocab))
    if missing:
        raise ValueError(f"the run's character vocabulary lacks {''.join(missing)!r}, which the passkey prompts "
                         f"use (a char run knows only its training text's characters); probe extrapolation only")


def passkey_minimum(codec: Any) -> int:
    """About the fewest tokens a passkey prompt and its answer take: no filler (BPE sizes vary a little by key)."""
    return len(codec.encode(NEEDLE.format(key="12345") + QUESTION)) + len(codec.encode(passkey_answer("12345")))


def passkey_prompt(codec: Any, length: int, depth: float, key: str) -> tuple[list[int], int] | None:
    """(prompt ids, answer tokens): filler text holding the key sentence at `depth` (0 = first, 1 = just before
    the question), then the question, so that prompt and answer fill `length` tokens; None if they cannot.

    The filler is whole sentences repeated, cut at its start to fit; the key sentence goes in at the
    sentence boundary nearest `depth`.
    """
    needle, question = codec.encode(NEEDLE.format(key=key)), codec.encode(QUESTION)
    answer = len(codec.encode(passkey_answer(key)))
    room = length - answer - len(needle) - len(question)
    if room < 0:
        return None
    sentences = [codec.encode(s) for s in FILLER]
    filler: list[int] = []
    starts = []  # where each sentence starts, counted from the filler's end
    i = 0
    while len(filler) < room:
        sentence = sentences[-1 - i % len(sentences)]  # built backwards: the filler ends with a whole sentence
        filler = sentence + filler
        starts.append(len(filler))
        i += 1
    filler = filler[len(filler) - room:]
    boundaries = sorted({0, room, *(room - s for s in starts if s <= room)})
    cut = min(boundaries, key=lambda b: (abs(b - depth * room), b))
    return filler[:cut] + needle + filler[cut:] + question, answer
