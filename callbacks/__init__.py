"""Training callbacks (timing, parameter counts, samples) arrive with the callbacks issue."""
