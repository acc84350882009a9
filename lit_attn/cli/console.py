"""Console hygiene for the command line: third-party output that says nothing a user can act on is hidden."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator


def interrupted_while_loading(signum: int, frame: object) -> None:
    """SIGINT handler for the seconds torch and Lightning take to import: nothing is written yet."""
    sys.stderr.write("interrupted (Ctrl-C) before training started; nothing was written\n")
    os._exit(130)

# (category, message regex, module regex) of each hidden warning. Each is matched by its message
# and by the module it is attributed to, so the same words from anywhere else still show.
KNOWN_WARNINGS: list[tuple[type[Warning], str, str]] = [
    # Newer torch (2.13 does) deprecates making a LeafSpec; Lightning 2.6's copy of tree_flatten
    # still makes one, warning once per process about code no user of this project can change.
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree$"),
    # A resumed run saves into its own checkpoint directory, which holds its earlier checkpoints by design;
    # the run directory itself (new, or resumed with --ckpt_path) is what main.py checks and reports.
    (UserWarning, r"Checkpoint directory .* exists and is not empty\.",
     r"lightning\.pytorch\.callbacks\.model_checkpoint$"),
]

# Lightning's info lines advertising its cloud products (litlogger, litmodels) on every fit; it has no
# setting for them, so they are dropped from its rank-zero logger, every other line of which still shows.
ADVERT = re.compile(r"^💡 Tip: For seamless cloud ")
LIGHTNING_INFO_LOGGER = "lightning.pytorch.utilities.rank_zero"

# Lines the profiler's native library (kineto) writes straight to file descriptor 2 at every start and stop.
NATIVE_NOISE = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not ADVERT.match(record.getMessage())


_DROP_ADVERTS = _DropAdverts()


def quiet_known_warnings() -> None:
    """Hide the KNOWN_WARNINGS and Lightning's adverts, all else left as it was; calling it again changes nothing."""
    for category, message, module in KNOWN_WARNINGS:
        # filterwarnings replaces an identical filter rather than adding a second one.
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    logger = logging.getLogger(LIGHTNING_INFO_LOGGER)
    if _DROP_ADVERTS not in logger.filters:
        logger.addFilter(_DROP_ADVERTS)


@contextlib.contextmanager
def quiet_native_stderr(noise: re.Pattern[str] = NATIVE_NOISE) -> Iterator[None]:
    """Inside the block, lines written to file descriptor 2 (by C++ code too) that match `noise` are dropped;
    the others are written to stderr when the block ends, in their order."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not noise.match(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
