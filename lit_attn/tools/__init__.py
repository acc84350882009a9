"""The tools on top of the command line (lit_attn.cli): sweep, compare, cost card, sample, probe, evaluate, export."""
