"""The Lightning training code: the LightningModule, the command line, runs and checkpoints."""
