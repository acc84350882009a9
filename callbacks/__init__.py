"""Training callbacks; the command line (lit_attn/cli/lightning_cli.py) always adds the safety and monitoring
ones (configured by the top-level sections of configs/default.yaml).

Monitoring: TimingMonitor (time per batch, tokens/s,
FLOPs, MFU), LearningRateLogger (train/lr), ParameterCounts (measured and analytic
counts), TextSamples (generations at each validation), HParamsSummary (TensorBoard
hparams tab), TensorBoardLayout (the CUSTOM SCALARS layout), UseStepProgressBar (a StepProgressBar on a
terminal, else ValidationLines).
"""

from .hparams import HParamsSummary
from .lr import LearningRateLogger
from .params import ParameterCounts
from .progress import StepProgressBar, UseStepProgressBar, ValidationLines
from .samples import TextSamples
from .tensorboard_layout import TensorBoardLayout
from .timing import TimingMonitor

__all__ = ["HParamsSummary", "LearningRateLogger", "ParameterCounts", "StepProgressBar", "TensorBoardLayout",
           "TextSamples", "TimingMonitor", "UseStepProgressBar", "ValidationLines"]
