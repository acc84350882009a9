"""How many cores other processes kept busy while a run trained on the CPU.

Timings taken on cores that other work also uses are not the machine's: two fits that each take torch's
default of one thread per core run several times slower side by side than alone. HParamsSummary warns once
while such a run trains and writes the mean into its record ("CPU shared"), which `lit-attn compare` and the
cost card repeat as a note. Linux only (/proc/stat); elsewhere nothing is measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

PROC_STAT = Path("/proc/stat")
WINDOW_S = 30.0  # seconds between samples: a short burst of other work does not count as sharing
SPARE = 0.5  # cores of other work tolerated beyond those the run's threads leave free


def machine_cpu_seconds(stat: Path = PROC_STAT) -> float | None:
    """CPU seconds every process has used since boot (user, nice, system, irq, softirq), or None without /proc."""
    try:
        fields = stat.read_text(encoding="ascii", errors="replace").split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class CpuShare:
    """Samples the machine's and this process's CPU time at most every `window_s` seconds.

    `threads`: torch threads per process of the run; `processes`: the run's processes on this machine (DDP
    ranks, assumed to use the CPU as this one does). `others_cores` is the mean, over the sampled time, of
    the cores that processes outside the run kept busy.
    """

    def __init__(self, threads: int, processes: int = 1, cores: int | None = None, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic,
                 machine: Callable[[], float | None] = machine_cpu_seconds,
                 own: Callable[[], float] = time.process_time) -> None:
        self.threads, self.processes = threads, processes
        self.cores = cores or os.cpu_count() or 1
        self.window_s = window_s
        self._clock, self._machine, self._own = clock, machine, own
        self._last: tuple[float, float, float] | None = None
        self.other_core_seconds = 0.0
        self.seconds = 0.0

    def _read(self) -> tuple[float, float, float] | None:
        machine = self._machine()
        return None if machine is None else (self._clock(), machine, self._own())

    def start(self) -> None:
        self._last = self._read()

    def tick(self, last: bool = False) -> float | None:
        """The cores other processes used since the last sample, once `window_s` has passed (or, `last`, any
        time at all); else None."""
        if self._last is None or self._clock() - self._last[0] < (0.0 if last else self.window_s):
            return None
        now = self._read()
        seconds = now[0] - self._last[0] if now is not None else 0.0
        if seconds <= 0:
            return None
        others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2]) * self.processes)
        self._last = now
        self.other_core_seconds += others
        self.seconds += seconds
        return others / seconds

    @property
    def others_cores(self) -> float | None:
        return self.other_core_seconds / self.seconds if self.seconds else None

    def crowded(self, others_cores: float) -> bool:
        """Whether other work took cores this run's threads needed."""
        return others_cores > self.cores - self.threads * self.processes + SPARE

    def warning(self, others_cores: float) -> str:
        per = f"{self.threads} torch thread{'' if self.threads == 1 else 's'}"
        run = per if self.processes == 1 else f"{self.processes} processes of {per} each"
        return (f"CPU shared: other processes kept {others_cores:.1f} of this machine's {self.cores} cores busy "
                f"over the last {self.window_s:.0f} s while this run uses {run}; its steps run slower than on "
                "the machine alone and its timings are not the machine's. Run fewer processes at once, or give "
                "each fewer threads (OMP_NUM_THREADS; lit-attn sweep --parallel N splits the cores).")

    def record(self) -> str | None:
        """The run's "CPU shared": "no", or the mean cores others used when they crowded it ("1.9 of 2 cores");
        None without /proc/stat. Under one window of training, the share is too noisy to say: not measured."""
        others = self.others_cores
        if others is None:
            return None
        if self.seconds < self.window_s:
            return f"not measured (under {self.window_s:.0f} s of training)"
        return f"{others:.1f} of {self.cores} cores" if self.crowded(others) else "no"
