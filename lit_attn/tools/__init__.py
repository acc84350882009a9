"""The tools on top of the training code: sweep, compare, cost card, sample, probe, evaluate, export."""
