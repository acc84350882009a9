"""Time per batch, tokens/s, total training time, FLOPs and MFU, from Lightning's `Throughput`."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput, get_available_flops, measure_flops
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only
from rich import get_console
from rich.table import Table

from lit_attn.analytic import gpt_train_flops_per_token
from lit_attn.bounds import NonNegativeInt, PositiveFloat, bounded, check_bounds
from lit_attn.config import GPTConfig
from lit_attn.training.fit_state import is_last_step, last_step_index, logs_at
from lit_attn.transformer import Transformer


def batch_samples(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Windows in an (x, y) batch of token ids."""
    return batch[0].size(0)


def batch_tokens(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Input tokens in an (x, y) batch (windows are never padded, so every token is real)."""
    return batch[0].numel()


def measured_flops_per_sample(config: GPTConfig, context: int) -> int:
    """Training FLOPs of one window of `context` tokens, counted by `measure_flops` on a meta-device network.

    The network is built from the model's config on the meta device, so it costs no
    memory or compute and leaves the trained model (and the RNG) untouched. Every
    counted matmul has the batch as a factor, so one window is measured and scaled.
    """
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = Transformer(config)
        x = torch.zeros(1, context, dtype=torch.long)
    return int(measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum))


_ZERO = {"time": 0.0, "batches": 0, "samples": 0, "lengths": 0}
WINDOW_KEYS = ("time", "batches", "samples", "lengths", "flops")


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls of a Trainer `precision` ("bf16-mixed", "16-true", ...) run in: the one whose
    peak FLOP/s MFU is a fraction of."""
    dtypes = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64, "transformer-engine": torch.int8}
    return next((dtype for key, dtype in dtypes.items() if key in precision), torch.float32)


def log_metrics(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """Send metrics to every logger at `step`."""
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


WindowSize = bounded("WindowSize", int, 2)  # a rate needs two batch ends


class TimingMonitor(L.Callback):
    """Training throughput of (x, y) token batches: time per batch, tokens/s, FLOP/s, MFU, totals, a console summary.

    The first `warmup_batches` training batches of a run (compilation, first allocations, caches
    warming up: many times slower than the rest) are left out of every rate: train/time_per_batch
    (seconds, window mean) and train/tokens_per_sec (all devices), logged on rank zero every
    `log_every_n_steps` once the rolling window's `window_size` batch ends all lie at or after the end
    of the warm-up; train/device/flops_per_sec and train/device/mfu too when the device's peak FLOP/s
    is known. Lightning's other keys (running counts, per-second rates that repeat these) are not
    logged. At the end of fit: a console table, the same table as TensorBoard text ("timing"), and its
    numbers in `summary`: the training time is the whole run's, the means (time per batch, tokens/s,
    samples/s, FLOP/s, MFU) are over the batches after the warm-up, and the table says how many
    batches that left out.

    The training window, totals and the end of the warm-up are kept in checkpoints: a resumed run
    continues them (its time excludes the time it was stopped; its warm-up is the run's first
    batches, not the resumed attempt's), so its curves have the same steps as an uninterrupted
    run's and the end-of-fit totals cover the whole run.

    Args:
        window_size: batch ends in the rolling window of the per-second metrics.
        peak_flops: one device's peak FLOP/s for MFU, for devices Lightning's table
            lacks (or to use a dense figure where its table quotes sparse ones).
        flops: "measured" (measure_flops on a meta copy of the model; falls back to
            "analytic" if the model cannot run on meta) or "analytic" (lit_attn.analytic).
        warmup_batches: training batches at the start of the run left out of every rate and mean.
    """

    clock = staticmethod(time.perf_counter)  # seconds; every time it measures is read here (tests set a fake one)

    def __init__(
        self,
        window_size: WindowSize = 20,
        peak_flops: PositiveFloat | None = None,
        flops: Literal["measured", "analytic"] = "measured",
        warmup_batches: NonNegativeInt = 10,
    ):
        check_bounds(TimingMonitor.__init__, locals())
        if flops not in ("measured", "analytic"):
            raise ValueError(f"flops must be 'measured' or 'analytic', got {flops!r}")
        self.window_size = window_size
        self.warmup_batches = warmup_batches
        self.available_flops: int | None = None  # one device's peak FLOP/s: peak_flops, else Lightning's table
        self.throughput: Throughput | None = None  # the training rates over the rolling window (rank zero)
        # The window as given to the throughput (FLOPs per device, where counted), for checkpoints.
        self.window: dict[str, deque] = {key: deque(maxlen=window_size) for key in WINDOW_KEYS}
        self.totals = {"batches": 0, "samples": 0, "lengths": 0}  # training batches, windows, tokens so far
        self._clock_t0 = 0.0  # clock() at which the training clock read 0
        self._validation_t0: float | None = None  # when the latest validation started
        self._stepped_at = 0  # the global step at the previous training batch's end
        # The training clock and counts when the last warm-up batch ended (all zero without a warm-up):
        # {"time", "batches", "samples", "lengths"}; None until then.
        self._warmup_end: dict[str, float] | None = _ZERO.copy() if warmup_batches == 0 else None
        self.peak_flops, self.flops = peak_flops, flops
        self.flops_source: str | None = None  # how flops_per_sample was obtained, for the summary
        self._flops_per_sample: dict[int, int | None] = {}  # context length -> training FLOPs of one window
        self._flops_per_batch: int | None = None
        self._fit_t0 = 0.0
        self._paused_at: float | None = None  # when a validation interrupted training
        self._resumed: dict[str, list] = {}  # the training window of the checkpoint being resumed
        self.summary: dict[str, float] = {}

    # ---- FLOPs ----

    def _per_sample(self, pl_module: L.LightningModule, context: int) -> int | None:
        config = getattr(pl_module, "config", None)
        if not isinstance(config, GPTConfig):
            return None  # not a lit-attn GPT: no FLOP count, so no MFU
        if context not in self._flops_per_sample:
            value, source = None, None
            if self.flops == "measured":
                try:
                    value, source = measured_flops_per_sample(config, context), "measured on meta"
                except Exception as e:  # a module that cannot run on meta: say so, then try the formula
                    reason = f"{type(e).__name__}: {e}"
                    rank_zero_info(f"TimingMonitor: measure_flops on meta failed ({reason}); using the analytic count")
            if value is None:
                value, source = gpt_train_flops_per_token(config, context) * context, "analytic"
            self._flops_per_sample[context] = value
            self.flops_source = source
        return self._flops_per_sample[context]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        dtype = compute_dtype(str(trainer.precision))
        peak = self.peak_flops
        self.available_flops = int(peak) if peak else get_available_flops(trainer.strategy.root_device, dtype)
        self.throughput = Throughput(available_flops=self.available_flops, world_size=trainer.world_size,
                                     window_size=self.window_size)

    def _needs_sync(self, trainer: L.Trainer, stage: RunningStage, iter_num: int) -> bool:
        """Whether this batch's timestamp must wait for the GPU.

        Lightning syncs every batch, which stops the host from queueing the next step while
        the GPU works. The logged rates only read the first and last timestamp of each
        window (and the summary the last one and the warm-up's end), so only those batches are synced.
        """
        if stage != RunningStage.TRAINING:
            return True
        every = trainer.log_every_n_steps or 1
        window = self.window_size
        last = is_last_step(trainer, iter_num, epoch_end=True)
        return iter_num % every == 0 or (iter_num + window - 1) % every == 0 or last or iter_num == self.warmup_batches

    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        """Add a training batch that just ended to the totals and the window."""
        per_sample = self._per_sample(pl_module, batch[0].size(1))
        flops = None if per_sample is None else per_sample * batch_samples(batch)
        self._flops_per_batch = flops
        if trainer.strategy.root_device.type == "cuda" and self._needs_sync(trainer, RunningStage.TRAINING, iter_num):
            torch.cuda.synchronize()  # the timestamp below is the GPU's end of the batch
        elapsed = self.clock() - self._clock_t0
        totals = self.totals
        totals["lengths"] += batch_tokens(batch)
        totals["samples"] += batch_samples(batch)
        totals["batches"] += 1
        if totals["batches"] == self.warmup_batches:
            self._warmup_end = {"time": elapsed, **totals}
        self._add(elapsed, totals["batches"], totals["samples"], totals["lengths"], flops)

    def _add(self, elapsed: float, batches: int, samples: int, lengths: int, flops: int | None) -> None:
        self.throughput.update(time=elapsed, batches=batches, samples=samples, lengths=lengths, flops=flops)
        for key, value in zip(WINDOW_KEYS, (elapsed, batches, samples, lengths, flops)):
            if value is not None:  # as the Throughput keeps them: no FLOPs where none were counted
                self.window[key].append(value)

    # ---- logging ----

    @rank_zero_only
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_t0 = self.clock()
        self.summary = {}
        self._warmup_end = _ZERO.copy() if self.warmup_batches == 0 else None

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Count FLOPs before the clock starts, so the first batch's time does not include it.
        block_size = pl_module.hparams.get("block_size")
        if block_size:
            self._per_sample(pl_module, int(block_size))
        self.throughput.reset()
        for values in self.window.values():
            values.clear()
        self.totals = {"batches": 0, "samples": 0, "lengths": 0}
        self._stepped_at = trainer.global_step
        self._clock_t0 = self.clock()
        resumed, self._resumed = self._resumed, {}
        if resumed.get("time"):
            flops = resumed["flops"] if len(resumed["flops"]) == len(resumed["time"]) else [None] * len(resumed["time"])
            for t, b, n, length, f in zip(resumed["time"], resumed["batches"], resumed["samples"], resumed["lengths"],
                                          flops):
                self._add(t, b, n, length, f)
            self.totals = {key: resumed[key][-1] for key in ("batches", "samples", "lengths")}
            self._clock_t0 = self.clock() - resumed["time"][-1]  # the clock continues where it stopped
            self._warmup_end = _resumed_warmup_end(resumed, self.warmup_batches)

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._record(trainer, pl_module, batch, trainer.fit_loop.total_batch_idx + 1)
        # Rates after an optimizer step only (not mid-accumulation): the window's time then includes it.
        stepped, self._stepped_at = trainer.global_step != self._stepped_at, trainer.global_step
        if stepped:
            self._log_rates(trainer)

    def state_dict(self) -> dict[str, Any]:
        """The training window (and with it the totals) and the warm-up's end, for a resumed run; rank zero's."""
        window = {key: list(values) for key, values in self.window.items()}
        if not window["time"] or len(window["lengths"]) != len(window["time"]):
            return {}
        if self._warmup_end is not None:
            window["warmup_end"] = dict(self._warmup_end)
        return window

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resumed = dict(state)

    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation_t0 = self.clock()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Training seconds so far beside each val/loss point (the clock the summary's training time
        # reads): the x-axis of loss against training time, validation excluded, which wall time cannot give.
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and self.window["time"]:
            pl_module.log("val/train_time", float(self.window["time"][-1]), rank_zero_only=True)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Everything from the validation's start until the next training batch starts is excluded
        # (ThroughputMonitor stops at the last validation batch: text samples and checkpoints after
        # it would count as training time).
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and self._validation_t0 is not None:
            self._paused_at = self._validation_t0

    @rank_zero_only
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._paused_at is not None:
            self._clock_t0 += self.clock() - self._paused_at
            self._paused_at = None

    def _log_rates(self, trainer: L.Trainer) -> None:
        """Log the window's rates at a logging step (ThroughputMonitor would log every key Throughput.compute()
        returns: the running counts, straight lines, and batches/samples/tokens per second, the same two
        numbers in other units, and once more summed over devices under DDP)."""
        # At a training batch's end: the step that just ran is global_step - 1, where train/loss is.
        if not logs_at(trainer, trainer.global_step - 1):
            return
        edges = self.window["batches"]
        if len(edges) < self.window_size or edges[0] < self.warmup_batches:
            return  # the window still holds warm-up batches (or is not full yet)
        window = self.throughput.compute()
        metrics = {}
        if "device/batches_per_sec" in window:
            metrics["train/time_per_batch"] = 1.0 / window["device/batches_per_sec"]
        if "device/items_per_sec" in window:
            metrics["train/tokens_per_sec"] = window["device/items_per_sec"] * trainer.world_size
        if self.available_flops:  # FLOP/s alone says little without the peak it is a fraction of
            metrics |= {f"train/{k}": window[k] for k in ("device/flops_per_sec", "device/mfu") if k in window}
        if metrics:
            log_metrics(trainer, metrics, step=last_step_index(trainer))

    def summarize(self, trainer: L.Trainer) -> dict[str, float]:
        """End-of-fit totals (computed once per fit; {} if no training batch ran). Rank zero only.

        train_time and batches are the whole run's; warmup_batches and warmup_time what the means leave out;
        the means (time_per_batch, samples/tokens per second, device FLOP/s, MFU) are over the batches after
        the warm-up, and absent when there were none.
        """
        if self.summary or self.throughput is None or not self.window["time"]:
            return self.summary
        totals = self.throughput.compute()
        train_time, batches = float(totals["time"]), int(totals["batches"])
        end = self._warmup_end or {"time": train_time, "batches": batches, "samples": 0, "lengths": 0}
        s: dict[str, float] = {
            "train_time": train_time,
            "fit_time": self.clock() - self._fit_t0,
            "batches": batches,
            "warmup_batches": int(end["batches"]),
            "warmup_time": float(end["time"]),
        }
        if self._flops_per_batch is not None:
            s["flops_per_batch"] = self._flops_per_batch
        measured, seconds = batches - end["batches"], train_time - end["time"]
        if measured > 0 and seconds > 0:
            world = trainer.world_size
            s["time_per_batch"] = seconds / measured
            s["samples_per_sec"] = (totals["samples"] - end["samples"]) * world / seconds
            s["tokens_per_sec"] = (totals.get("lengths", 0) - end["lengths"]) * world / seconds
            if self._flops_per_batch is not None:
                s["device_flops_per_sec"] = self._flops_per_batch * measured / seconds
                if self.available_flops:
                    s["mfu"] = s["device_flops_per_sec"] / self.available_flops
        self.summary = s
        return s

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        s = self.summarize(trainer)
        if not s:
            return
        title = f"Timing: {trainer.world_size} device(s), precision {trainer.precision}"
        rows = self._rows(trainer, s)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                lines = [f"**{title}**", "", "| | value |", "|---|---:|", *(f"| {k} | {v} |" for k, v in rows)]
                # At the step count, as a summary after it: an interrupted attempt's then falls at or after
                # the resumed run's purge step and gives way to the finished run's.
                logger.experiment.add_text("timing", "\n".join(lines), trainer.global_step)
        table = Table(title=title, title_justify="left")
        table.add_column("")
        table.add_column("value", justify="right")
        for row in rows:
            table.add_row(*row)
        get_console().print(table)

    def _rows(self, trainer: L.Trainer, s: dict[str, float]) -> list[tuple[str, str]]:
        """(label, value) rows shared by the console table and the TensorBoard text."""
        none = f"n/a: all {int(s['batches'])} batches were warm-up"
        rows = [
            ("training time, whole run", f"{s['train_time']:.2f} s (excl. validation)"),
            ("wall time, this fit", f"{s['fit_time']:.2f} s"),
            ("batches, whole run (per device)", f"{int(s['batches'])}"),
            ("warm-up, left out of the means below", f"first {int(s['warmup_batches'])} batches, "
                                                     f"{s['warmup_time']:.2f} s"),
            ("time per batch (mean)", f"{s['time_per_batch']:.4f} s" if "time_per_batch" in s else none),
            ("tokens/s (all devices)", f"{s['tokens_per_sec']:,.0f}" if "tokens_per_sec" in s else none),
            ("samples/s (all devices)", f"{s['samples_per_sec']:,.1f}" if "samples_per_sec" in s else none),
        ]
        if "flops_per_batch" in s:
            rows.append(("FLOPs/batch/device (fwd+bwd)", f"{s['flops_per_batch']:.3e} ({self.flops_source})"))
            achieved = s.get("device_flops_per_sec")
            rows.append(("FLOP/s per device (achieved)", none if achieved is None else f"{achieved:.3e}"))
        else:
            rows.append(("FLOPs/batch/device (fwd+bwd)", "n/a: no count for this attention"))
        device = trainer.strategy.root_device.type
        unknown = f"n/a: peak FLOP/s of {device} unknown"
        rows.append(("MFU", f"{s['mfu']:.2%}" if "mfu" in s else none if self.available_flops else unknown))
        return rows


def _resumed_warmup_end(resumed: dict[str, Any], warmup_batches: int) -> dict[str, float] | None:
    """The warm-up's end for a resumed run: the checkpoint's, if it ended after `warmup_batches` batches; else the
    first batch end of the checkpointed window at or after that (a checkpoint of another warm-up setting, or of a
    version that kept none: the means then leave out those few batches more); None while the warm-up goes on."""
    if warmup_batches == 0:
        return _ZERO.copy()
    saved = resumed.get("warmup_end")
    if saved and saved.get("batches") == warmup_batches:
        return dict(saved)
    index = next((i for i, b in enumerate(resumed["batches"]) if b >= warmup_batches), None)
    return None if index is None else {k: resumed[k][index] for k in ("time", "batches", "samples", "lengths")}
