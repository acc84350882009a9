"""`python main.py fit|validate|test|predict ...`: the same command line as `lit-attn` (see lit_attn/cli/command.py)."""

import sys

from lit_attn.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
