"""Loading a trained run without Lightning: `load_run(path)` is its network, config and codec.

A lit-attn checkpoint is a torch.save'd dict, read here with weights_only=True (a crafted file cannot run code)
after checking the SHA-256 digest that lit_attn.training.checkpoint writes into its zip comment. Every error is
one line (ValueError, or FileNotFoundError for a missing file).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import torch

from lit_attn.codec import BPECodec, CharCodec, codec_from_checkpoint
from lit_attn.config import GPTConfig
from lit_attn.transformer import Transformer

# torch.save writes a zip archive, which ends with a 22-byte End Of Central Directory record whose
# last 2 bytes give the length of an archive comment that follows it (0 from torch).
EOCD, EOCD_SIZE = b"PK\x05\x06", 22
DIGEST_TAG = b"lit-attn sha256:"
COMMENT_SIZE = len(DIGEST_TAG) + 64  # the tag and the hex digest
_DIGEST_AT = EOCD_SIZE + len(DIGEST_TAG)  # where the hex digest starts, counted from the EOCD
_CHUNK = 8 << 20
REQUIRED = ("global_step", "state_dict")  # what main.py fit reads from a checkpoint it resumes
MODEL = ("state_dict", "hyper_parameters")  # what the network is rebuilt from
NETWORK_PREFIX = "transformer."  # the network's keys in a checkpoint's state_dict: GPT.transformer


class Run(NamedTuple):
    """A trained run as `load_run` reads it."""

    network: Transformer  # in eval mode, on the device asked for
    config: GPTConfig  # network.config
    codec: CharCodec | BPECodec  # text <-> the network's token ids
    step: int  # the optimizer steps it was trained for (the checkpoint's global_step)
    path: Path  # the checkpoint file read


def load_run(path: str | Path, device: str | torch.device = "cpu") -> Run:
    """The network (in eval mode on `device`), config and codec of a checkpoint file, or of a run directory's
    latest checkpoint (RUN/checkpoints/last.ckpt)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint(path, require=MODEL)
    codec = codec_from_checkpoint(ckpt)
    network = network_from_checkpoint(ckpt, path, device)
    step = ckpt.get("global_step")
    return Run(network, network.config, codec, step if isinstance(step, int) else 0, path)


def check_format(ckpt: dict[str, Any], path: str | Path) -> None:
    """ValueError (one line) for a checkpoint in the format of an older lit-attn, which this one cannot read."""
    state = ckpt.get("state_dict")
    if isinstance(state, dict) and state and not any(str(k).startswith(NETWORK_PREFIX) for k in state):
        raise ValueError(f"{path} is in the format of lit-attn before 2026-11-23 (its state_dict has no "
                         f"'{NETWORK_PREFIX}' keys); retrain the run, or load it with an older lit-attn")


def network_from_checkpoint(ckpt: dict[str, Any], path: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """The network rebuilt from the checkpoint's hyper_parameters, with its weights, in eval mode."""
    check_format(ckpt, path)
    state = ckpt["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"the checkpoint's state_dict is {type(state).__name__!r}, not weights; it is damaged or was "
                         "edited: use another checkpoint")
    weights = {k[len(NETWORK_PREFIX):]: v for k, v in state.items() if str(k).startswith(NETWORK_PREFIX)}
    try:
        config = GPTConfig.from_hparams(ckpt["hyper_parameters"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"the checkpoint's hyper_parameters do not describe a model ({str(e).splitlines()[0]}); "
                         "it is damaged or was edited: use another checkpoint") from None
    _check_sizes(config, weights)
    network = Transformer(config)
    try:
        network.load_state_dict(weights)
    except RuntimeError as e:
        raise ValueError(f"the checkpoint's weights do not fit its hyper_parameters "
                         f"({str(e).splitlines()[0]})") from None
    return network.to(device).eval()


def _check_sizes(config: GPTConfig, weights: dict[str, Any]) -> None:
    """Refuse hyper_parameters that do not describe the weights beside them, before allocating anything.

    A damaged or crafted checkpoint could ask for a billion layers or a context whose
    buffers do not fit in memory; the weights themselves were already loaded, so they fit.
    """

    def damaged(what: str) -> ValueError:
        return ValueError(f"the checkpoint's hyper_parameters do not describe its weights ({what}); "
                          f"it is damaged or was edited: use another checkpoint")

    layers = {key.split(".")[1] for key in weights if key.startswith("blocks.")}
    if config.n_layer != len(layers):
        raise damaged(f"n_layer={config.n_layer!r}, the weights have {len(layers)} blocks")
    emb = weights.get("tok_emb.weight")
    if emb is None or [config.vocab_size, config.n_embd] != list(emb.shape):
        shape = None if emb is None else list(emb.shape)
        raise damaged(f"vocab_size={config.vocab_size!r}, n_embd={config.n_embd!r}, token embedding {shape}")
    try:
        with torch.device("meta"):  # shapes only: no memory, no compute
            meta = Transformer(config)
    except (TypeError, ValueError) as e:
        raise damaged(str(e).splitlines()[0]) from None
    shapes = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    for key, tensor in weights.items():
        if shapes.get(key) != tuple(tensor.shape):
            raise damaged(f"{key}: {tuple(tensor.shape)} in the weights, {shapes.get(key, 'absent')} from the settings")
    buffers = sum(b.numel() * b.element_size() for b in meta.buffers())
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    if buffers > max(2 * weight_bytes, 1 << 30):  # e.g. RoPE tables for block_size=10**12
        raise damaged(f"block_size={config.block_size!r} needs {buffers / 2**30:.1f} GiB of buffers")


def verify_checkpoint(path: str | Path) -> bool | None:
    """True if the file matches the SHA-256 digest written with it, False if it does not,
    None if it has no digest (plain torch.save, or written before digests): unverifiable."""
    with open(path, "rb") as f:
        body = f.seek(0, os.SEEK_END) - COMMENT_SIZE
        if body < EOCD_SIZE:
            return None
        f.seek(body - EOCD_SIZE)
        tail = f.read()
        comment_size = int.from_bytes(tail[EOCD_SIZE - 2:EOCD_SIZE], "little")
        if tail[:4] != EOCD or comment_size != COMMENT_SIZE or tail[EOCD_SIZE:_DIGEST_AT] != DIGEST_TAG:
            return None
        f.seek(0)
        digest, left = hashlib.sha256(), body - 2
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):  # in chunks: checkpoints can be GBs
            digest.update(chunk)
            left -= len(chunk)
        digest.update(b"\0\0")  # the comment length as torch wrote it, before the digest was appended
        return digest.hexdigest().encode() == tail[_DIGEST_AT:]


def load_checkpoint(path: str | Path, require: tuple[str, ...] = REQUIRED) -> dict[str, Any]:
    """Load a lit-attn checkpoint file as plain data, with weights_only=True: a crafted file cannot run code.

    The SHA-256 digest written with it is checked first; a file without one loads unverified. Raises
    FileNotFoundError if it is missing, and a one-line ValueError if it does not match its digest, is
    truncated or corrupt, holds anything but tensors and plain data, or is not a dict with every key in
    `require` (a tool, which needs no training state, passes require=MODEL).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}; check --ckpt_path")
    raise_if_corrupt(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses any global outside an allowlist of tensor and container types,
        # before calling it: whatever the file holds, nothing in it ran.
        lines = [line.strip() for line in str(e).splitlines() if "unsupported global" in line.lower()]
        if lines:
            raise ValueError(
                f"refusing to load {path}: it holds objects other than tensors and plain data ({lines[0]}); "
                f"only load checkpoints you trust"
            ) from None
        raise ValueError(
            f"checkpoint {path} is unreadable, probably truncated or corrupt; {_advice(path, 'use another checkpoint')}"
        ) from None
    except Exception as e:  # zip or pickle damage shows up as many exception types
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"checkpoint {path} is unreadable, probably truncated or corrupt ({reason}); "
            f"{_advice(path, 'use another checkpoint')}"
        ) from None
    what = _not_a_checkpoint(ckpt, require)
    if what is not None:
        raise ValueError(
            f"{path} is not a lit-attn checkpoint (it holds {what}); "
            f"pass a .ckpt written by main.py fit (runs/RUN/checkpoints/)"
        )
    return ckpt


def raise_if_corrupt(path: Path) -> None:
    """ValueError (one line, naming an intact checkpoint beside it if any) if the file does not match its digest."""
    if verify_checkpoint(path) is False:
        raise ValueError(
            f"checkpoint {path} is corrupt (its contents do not match the SHA-256 digest written with it); "
            f"{_advice(path, 'no intact checkpoint is beside it; start the run afresh with another --run name')}"
        )


def _advice(path: Path, otherwise: str) -> str:
    """Where to resume from instead of `path`: its newest intact sibling, else `otherwise`."""
    found = _newest_intact_sibling(path)
    if found is None:
        return otherwise
    other, step = found
    return f"the newest intact checkpoint beside it is {other} (step {step}): resume with --ckpt_path {other}"


def _newest_intact_sibling(path: Path) -> tuple[Path, int] | None:
    """(file, global_step) of the checkpoint with the highest step among the other *.ckpt files in
    path's directory that match their digest or have none and load; None if there is none."""
    steps = [(step, other) for other in path.parent.glob("*.ckpt")
             if other.name != path.name and (step := checkpoint_step(other)) is not None]
    # Hashing reads whole files (GBs each): verify from the newest down and stop at the first intact one.
    for step, other in sorted(steps, reverse=True):
        with contextlib.suppress(OSError):
            if verify_checkpoint(other) is not False:
                return other, step
    return None


def checkpoint_step(path: str | Path) -> int | None:
    """The file's global_step if it loads as a lit-attn checkpoint, else None (tensors are not read)."""
    try:
        # mmap reads the pickle and leaves tensor data on disk: cheap even for a GB checkpoint.
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    if _not_a_checkpoint(ckpt, REQUIRED) is None and isinstance(ckpt["global_step"], int):
        return ckpt["global_step"]
    return None


def _not_a_checkpoint(obj: Any, require: tuple[str, ...]) -> str | None:
    """What `obj` is, in words, unless it is a dict with every key in `require` (then None)."""
    if isinstance(obj, dict):
        missing = [key for key in require if key not in obj]
        if not missing:
            return None
        if obj and all(isinstance(value, torch.Tensor) for value in obj.values()):
            return "a dict of tensors"
        return f"a dict without {missing[0]!r}"
    name = type(obj).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
