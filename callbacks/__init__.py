"""Training callbacks; the defaults are wired in by configs/default.yaml.

Monitoring (this package's issue 4 part): TimingMonitor (time per batch, tokens/s,
FLOPs, MFU), ParameterCounts (measured and analytic counts), TextSamples (generations
at each validation), HParamsSummary (TensorBoard hparams tab), UseStepProgressBar.
"""

from .hparams import HParamsSummary
from .params import ParameterCounts
from .progress import StepProgressBar, UseStepProgressBar
from .samples import TextSamples
from .timing import TimingMonitor

__all__ = ["HParamsSummary", "ParameterCounts", "StepProgressBar", "TextSamples", "TimingMonitor", "UseStepProgressBar"]
