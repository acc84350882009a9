"""The fit: the LightningModule and what a fit needs (its state, logging cadence, logger, checkpoint writes, Lightning's
private API). The command line that starts a fit is lit_attn.cli."""
