"""The `lit-attn` command: `lit-attn fit|validate|test|predict ...` trains and evaluates (the Lightning CLI);
`lit-attn TOOL ...` runs one of the tools (`lit-attn sweep --help`). `python main.py` and `python -m lit_attn`
are the same command."""

from __future__ import annotations

import importlib
import signal
import sys

from lit_attn.console import interrupted_while_loading

# Tool name on the command line -> module whose main(argv) runs it.
TOOLS = {
    "sweep": "lit_attn.tools.sweep",
    "compare": "lit_attn.tools.compare",
    "cost-card": "lit_attn.tools.cost_card",
    "sample": "lit_attn.tools.sample",
    "bench": "benchmarks.bench",
    "bench-decode": "benchmarks.bench_decode",
}


def main(argv: list[str] | None = None) -> int:
    """Run `lit-attn ARGS` (default: sys.argv[1:]) and return its exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in TOOLS:
        tool = importlib.import_module(TOOLS[args[0]])
        sys.argv[0] = f"lit-attn {args[0]}"
        return tool.main(args[1:]) or 0
    if argv is None:  # Ctrl-C while torch and Lightning load (seconds): nothing is written yet
        signal.signal(signal.SIGINT, interrupted_while_loading)
    from lit_attn.training.cli import cli

    return cli(argv)
