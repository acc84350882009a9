"""`python -m lit_attn ...`: the `lit-attn` command."""

import sys

from lit_attn.cli.command import main

sys.exit(main())
