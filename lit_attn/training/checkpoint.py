"""Writing and reading checkpoints safely: atomic writes with a SHA-256 digest, plain-data loads, one-line errors.

`save_checkpoint` (and `AtomicCheckpointIO`, its Lightning plugin) embeds the digest in the zip comment of
torch.save's output, so the file is still an ordinary torch checkpoint; `load_checkpoint` checks it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import pickle
import re
import secrets
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

# torch.save writes a zip archive, which ends with a 22-byte End Of Central Directory record whose
# last 2 bytes give the length of an archive comment that follows it (0 from torch).
_EOCD, _EOCD_SIZE = b"PK\x05\x06", 22
_TAG = b"lit-attn sha256:"
_COMMENT_SIZE = len(_TAG) + 64  # the tag and the hex digest
_DIGEST_AT = _EOCD_SIZE + len(_TAG)  # where the hex digest starts, counted from the EOCD
_CHUNK = 8 << 20
REQUIRED = ("global_step", "state_dict")  # what main.py fit reads from a checkpoint it resumes
# The temporary file a save writes before renaming it onto its target (see _write_atomically).
_TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp")


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write `checkpoint` to `path` atomically, with a SHA-256 digest that `load_checkpoint` checks.

    torch.save's bytes go to a hidden temporary file in path's directory (created if missing), are
    fsynced, then renamed onto `path`. On any error (a full disk, a file-size limit, Ctrl-C) the
    temporary file is removed and the error re-raised: the file previously at `path` is untouched.
    """
    _write_atomically(_serialize(checkpoint), Path(path))


def verify_checkpoint(path: str | Path) -> bool | None:
    """True if the file matches the SHA-256 digest written with it, False if it does not,
    None if it has no digest (plain torch.save, or written before digests): unverifiable."""
    with open(path, "rb") as f:
        body = f.seek(0, os.SEEK_END) - _COMMENT_SIZE
        if body < _EOCD_SIZE:
            return None
        f.seek(body - _EOCD_SIZE)
        tail = f.read()
        comment_size = int.from_bytes(tail[_EOCD_SIZE - 2:_EOCD_SIZE], "little")
        if tail[:4] != _EOCD or comment_size != _COMMENT_SIZE or tail[_EOCD_SIZE:_DIGEST_AT] != _TAG:
            return None
        f.seek(0)
        digest, left = hashlib.sha256(), body - 2
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):  # in chunks: checkpoints can be GBs
            digest.update(chunk)
            left -= len(chunk)
        digest.update(b"\0\0")  # the comment length as torch wrote it, before the digest was appended
        return digest.hexdigest().encode() == tail[_DIGEST_AT:]


def load_checkpoint(path: str | Path, require: tuple[str, ...] = REQUIRED) -> dict[str, Any]:
    """Load a lit-attn checkpoint with weights_only=True: a crafted file cannot run code.

    The SHA-256 digest written by `save_checkpoint` is checked first; a file without one loads
    unverified. Raises FileNotFoundError if it is missing, and a one-line ValueError if it does not
    match its digest, is truncated or corrupt, holds anything but tensors and plain data, or is not a
    dict with every key in `require` (sample.py, which needs no training state, passes
    require=("state_dict", "hyper_parameters")).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}; check --ckpt_path")
    _raise_if_corrupt(path)
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's TorchCheckpointIO, but saving with `save_checkpoint` (a temporary file beside the
    target, never in $TMPDIR, and a SHA-256 digest) and refusing to load a file that does not match
    its digest. Use it as `Trainer(plugins=[AtomicCheckpointIO()])`; remote URLs (s3://...) are
    left to Lightning.

    `written` maps each local file this plugin saved and has not removed to its (st_dev, st_ino),
    which tells it from a file another process put at the same path since.
    """

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, tuple[int, int]] = {}

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write `checkpoint` to `path` atomically, with a digest; TypeError if `storage_options` is given."""
        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg"
                f" is not supported for `{type(self).__name__}`. Please implement your custom `CheckpointIO`"
                " to define how you'd like to use `storage_options`."
            )
        if _is_url(path):
            super().save_checkpoint(checkpoint, path)
            return
        try:
            self.written[str(path)] = _write_atomically(_serialize(checkpoint), Path(path))
        except OSError as e:  # name the checkpoint, not the temporary file
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the file as TorchCheckpointIO does, and forget it."""
        self.written.pop(str(path), None)
        super().remove_checkpoint(path)

    def load_checkpoint(
        self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Check the digest (one-line ValueError on a mismatch), then load as TorchCheckpointIO does."""
        if not _is_url(path) and os.path.isfile(path):
            _raise_if_corrupt(Path(path))
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def _serialize(checkpoint: dict[str, Any]) -> memoryview:
    """torch.save's bytes, with b"lit-attn sha256:<hex digest of those bytes>" as the zip comment."""
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    view = buf.getbuffer()
    # Anything but a zip ending in a comment-less EOCD (a future torch format?) is written as it is.
    if len(view) < _EOCD_SIZE or view[-_EOCD_SIZE:-_EOCD_SIZE + 4] != _EOCD or view[-2:] != b"\0\0":
        return view
    digest = hashlib.sha256(view).hexdigest().encode()
    view.release()  # a BytesIO cannot grow while its buffer is exported
    buf.seek(-2, io.SEEK_END)
    buf.write(_COMMENT_SIZE.to_bytes(2, "little") + _TAG + digest)
    return buf.getbuffer()


def stale_temporaries(directory: str | Path) -> list[Path]:
    """The temporary files of saves into `directory` that never finished (killed mid-save), by name.

    Only for a directory no save is writing into at the time: a save in progress has one too.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _TEMPORARY.fullmatch(p.name) and p.is_file())


def _write_atomically(data: memoryview, path: Path) -> tuple[int, int]:
    """Write `data` to `path` through a temporary file; the written file's (st_dev, st_ino)."""
    # The temporary file sits beside the target so that os.replace is a rename within one
    # filesystem: a copy onto the target (what a rename across filesystems falls back to) would
    # leave it truncated on a full disk or a kill mid-copy.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)  # umask applies
    try:
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)  # the bytes must be on disk before the rename makes them the checkpoint
            stat = os.fstat(fd)
        finally:
            os.close(fd)  # NFS may report a failed write only here
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return stat.st_dev, stat.st_ino


def _fsync_dir(directory: Path) -> None:
    # The rename survives a crash only once the directory entry is on disk; some systems and
    # filesystems cannot open or fsync a directory, which leaves it as durable as they allow.
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _raise_if_corrupt(path: Path) -> None:
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


def _is_url(path: Any) -> bool:
    return "://" in str(path)
