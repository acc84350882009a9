"""Writing checkpoints safely: atomic writes with a SHA-256 digest, and Lightning's checkpoint plugin for them.

`save_checkpoint` (and `AtomicCheckpointIO`, its Lightning plugin) embeds the digest in the zip comment of
torch.save's output, so the file is still an ordinary torch checkpoint; `lit_attn.load.load_checkpoint`, which
reads it (and is imported from here too), checks it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import secrets
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lit_attn.load import COMMENT_SIZE, DIGEST_TAG, EOCD, EOCD_SIZE, raise_if_corrupt

# The temporary file a save writes before renaming it onto its target (see _write_atomically).
_TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp")


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write `checkpoint` to `path` atomically, with a SHA-256 digest that `load_checkpoint` checks.

    torch.save's bytes go to a hidden temporary file in path's directory (created if missing), are
    fsynced, then renamed onto `path`. On any error (a full disk, a file-size limit, Ctrl-C) the
    temporary file is removed and the error re-raised: the file previously at `path` is untouched.
    """
    _write_atomically(_serialize(checkpoint), Path(path))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's TorchCheckpointIO, but saving with `save_checkpoint` and refusing to load a file that does
    not match its digest. Use it as `Trainer(plugins=[AtomicCheckpointIO()])`; remote URLs (s3://...) are
    left to Lightning.

    What it adds to Lightning's save (an fsspec transaction): fsspec writes a local file's temporary copy in
    $TMPDIR and moves it onto the target, which is a copy, not a rename, when $TMPDIR is another filesystem,
    and it fsyncs neither the file nor the directory, so a crash or a full disk can still leave a truncated
    checkpoint; and the digest, which tells a damaged file from a good one before training resumes from it.

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
            raise_if_corrupt(Path(path))
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def _serialize(checkpoint: dict[str, Any]) -> memoryview:
    """torch.save's bytes, with b"lit-attn sha256:<hex digest of those bytes>" as the zip comment."""
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    view = buf.getbuffer()
    # Anything but a zip ending in a comment-less EOCD (a future torch format?) is written as it is.
    if len(view) < EOCD_SIZE or view[-EOCD_SIZE:-EOCD_SIZE + 4] != EOCD or view[-2:] != b"\0\0":
        return view
    digest = hashlib.sha256(view).hexdigest().encode()
    view.release()  # a BytesIO cannot grow while its buffer is exported
    buf.seek(-2, io.SEEK_END)
    buf.write(COMMENT_SIZE.to_bytes(2, "little") + DIGEST_TAG + digest)
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


def _is_url(path: Any) -> bool:
    return "://" in str(path)
