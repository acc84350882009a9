"""`python -m lit_attn ...`: the `lit-attn` command."""

import sys

from lit_attn.command import main

sys.exit(main())
