"""Console hygiene for the command line: third-party warnings that say nothing about a run are hidden."""

from __future__ import annotations

import warnings

# (category, message regex, module regex) of each hidden warning. Each is matched by its message
# and by the module it is attributed to, so the same words from anywhere else still show.
KNOWN_WARNINGS: list[tuple[type[Warning], str, str]] = [
    # Newer torch (2.13 does) deprecates making a LeafSpec; Lightning 2.6's copy of tree_flatten
    # still makes one, warning once per process about code no user of this project can change.
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree$"),
]


def quiet_known_warnings() -> None:
    """Hide the KNOWN_WARNINGS (every other warning is left as it was); calling it again changes nothing."""
    for category, message, module in KNOWN_WARNINGS:
        # filterwarnings replaces an identical filter rather than adding a second one.
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
