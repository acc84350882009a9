"""Time per batch, tokens/s, total training time, FLOPs and MFU, on top of Lightning's ThroughputMonitor."""

from __future__ import annotations

import time
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only
from rich import get_console
from rich.table import Table

from lit_attn.analytic import gpt_train_flops_per_token
from lit_attn.config import GPTConfig
from lit_attn.lightning_compat import (
    ThroughputMonitorHooks,
    is_last_step,
    log_metrics,
    should_log_now,
    throughput_window,
)
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


class TimingMonitor(ThroughputMonitorHooks):
    """ThroughputMonitor for (x, y) token batches, with time per batch, totals and a console summary.

    Logged on rank zero every `log_every_n_steps`, once `window_size` batches were seen:
    train/time_per_batch (seconds, window mean) and train/tokens_per_sec (all devices);
    train/device/flops_per_sec and train/device/mfu too when the device's peak FLOP/s is
    known. Lightning's other keys (running counts, per-second rates that repeat these) are
    not logged. At the end of fit: a console table, the same table as TensorBoard text
    ("timing"), and its numbers in `summary`.

    The training window and totals are kept in checkpoints: a resumed run continues them
    (its time excludes the time it was stopped), so its curves have the same steps as an
    uninterrupted run's and the end-of-fit totals cover the whole run.

    Args:
        window_size: batches in the rolling window of the per-second metrics.
        peak_flops: one device's peak FLOP/s for MFU, for devices Lightning's table
            lacks (or to use a dense figure where its table quotes sparse ones).
        flops: "measured" (measure_flops on a meta copy of the model; falls back to
            "analytic" if the model cannot run on meta) or "analytic" (lit_attn.analytic).
    """

    def __init__(
        self,
        window_size: int = 20,
        peak_flops: float | None = None,
        flops: Literal["measured", "analytic"] = "measured",
    ):
        if flops not in ("measured", "analytic"):
            raise ValueError(f"flops must be 'measured' or 'analytic', got {flops!r}")
        super().__init__(batch_size_fn=batch_samples, length_fn=batch_tokens, window_size=window_size)
        self.peak_flops = peak_flops
        self.flops = flops
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
        super().setup(trainer, pl_module, stage)
        if self.peak_flops is not None:
            self.available_flops = int(self.peak_flops)
            for throughput in self.throughputs.values():
                throughput.available_flops = self.available_flops

    def _needs_sync(self, trainer: L.Trainer, stage: RunningStage, iter_num: int) -> bool:
        """Whether this batch's timestamp must wait for the GPU.

        Lightning syncs every batch, which stops the host from queueing the next step while
        the GPU works. The logged rates only read the first and last timestamp of each
        window (and the summary the last one), so only those batches are synced.
        """
        if stage != RunningStage.TRAINING:
            return True
        every = trainer.log_every_n_steps or 1
        window = self.kwargs.get("window_size", 100)
        last = is_last_step(trainer, iter_num, epoch_end=True)
        return iter_num % every == 0 or (iter_num + window - 1) % every == 0 or last

    def record_batch(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        stage = trainer.state.stage
        flops = None
        if stage == RunningStage.TRAINING:
            per_sample = self._per_sample(pl_module, batch[0].size(1))
            flops = None if per_sample is None else per_sample * batch_samples(batch)
            self._flops_per_batch = flops
        # Lightning's per-batch update would also sync CUDA on every batch; see _needs_sync.
        if trainer.strategy.root_device.type == "cuda" and self._needs_sync(trainer, stage, iter_num):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - self.start_times[stage]
        batches, samples, lengths = self.counts
        lengths[stage] += batch_tokens(batch)
        samples[stage] += batch_samples(batch)
        batches[stage] += 1
        self.throughputs[stage].update(
            time=elapsed, batches=batches[stage], samples=samples[stage], lengths=lengths[stage],
            flops=flops,
        )

    # ---- logging ----

    @rank_zero_only
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_t0 = time.perf_counter()
        self.summary = {}

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Count FLOPs before the clock starts, so the first batch's time does not include it.
        block_size = pl_module.hparams.get("block_size")
        if block_size:
            self._per_sample(pl_module, int(block_size))
        super().on_train_start(trainer, pl_module)
        resumed, self._resumed = self._resumed, {}
        if resumed.get("time"):
            throughput = self.throughputs[RunningStage.TRAINING]
            flops = resumed["flops"] if len(resumed["flops"]) == len(resumed["time"]) else [None] * len(resumed["time"])
            for t, b, n, length, f in zip(resumed["time"], resumed["batches"], resumed["samples"], resumed["lengths"],
                                          flops):
                throughput.update(time=t, batches=b, samples=n, lengths=length, flops=f)
            stage = RunningStage.TRAINING
            batches, samples, lengths = self.counts
            batches[stage], samples[stage] = resumed["batches"][-1], resumed["samples"][-1]
            lengths[stage] = resumed["lengths"][-1]
            self.start_times[stage] = time.perf_counter() - resumed["time"][-1]  # the clock continues where it stopped

    def state_dict(self) -> dict[str, Any]:
        """The training window (and with it the totals), for a resumed run to continue; rank zero's."""
        throughput = self.throughputs.get(RunningStage.TRAINING)
        window = {} if throughput is None else throughput_window(throughput)
        if not window or len(window["lengths"]) != len(window["time"]):
            return {}
        window["flops"] = [f // throughput.world_size for f in window["flops"]]  # per device, as update() takes them
        return window

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resumed = dict(state)

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: no validation rates are logged, and on_validation_end excludes validation time."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Training seconds so far beside each val/loss point (the clock the summary's training time
        # reads): the x-axis of loss against training time, validation excluded, which wall time cannot give.
        throughput = self.throughputs.get(RunningStage.TRAINING)
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        window = throughput_window(throughput) if fitting and throughput is not None else {}
        if window:
            pl_module.log("val/train_time", float(window["time"][-1]), rank_zero_only=True)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Replaces Lightning's adjustment, which stops excluding at the last validation batch:
        # text samples and checkpoints after it would count as training time. Everything from
        # the validation's start until the next training batch starts is excluded instead.
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and RunningStage.VALIDATING in self.start_times:
            self._paused_at = self.start_times[RunningStage.VALIDATING]

    @rank_zero_only
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._paused_at is not None and RunningStage.TRAINING in self.start_times:
            self.start_times[RunningStage.TRAINING] += time.perf_counter() - self._paused_at
            self._paused_at = None

    def compute_and_log(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        # Replaces Lightning's, which logs every key Throughput.compute() returns: the running
        # counts (straight lines) and batches/samples/tokens per second (the same two numbers
        # in other units, and once more summed over devices under DDP).
        if trainer.state.stage != RunningStage.TRAINING or not should_log_now(trainer):
            return
        window = self.throughputs[RunningStage.TRAINING].compute()
        metrics = {}
        if "device/batches_per_sec" in window:
            metrics["train/time_per_batch"] = 1.0 / window["device/batches_per_sec"]
        if "device/items_per_sec" in window:
            metrics["train/tokens_per_sec"] = window["device/items_per_sec"] * trainer.world_size
        if self.available_flops:  # FLOP/s alone says little without the peak it is a fraction of
            metrics |= {f"train/{k}": window[k] for k in ("device/flops_per_sec", "device/mfu") if k in window}
        if metrics:
            log_metrics(trainer, metrics, step=iter_num)

    def summarize(self, trainer: L.Trainer) -> dict[str, float]:
        """End-of-fit totals (computed once per fit; {} if no training batch ran). Rank zero only."""
        throughput = self.throughputs.get(RunningStage.TRAINING)
        if self.summary or throughput is None or not throughput_window(throughput):
            return self.summary
        totals = throughput.compute()
        train_time, batches = float(totals["time"]), int(totals["batches"])
        world = trainer.world_size
        s: dict[str, float] = {
            "train_time": train_time,
            "fit_time": time.perf_counter() - self._fit_t0,
            "batches": batches,
            "time_per_batch": train_time / batches,
            "samples_per_sec": totals["samples"] * world / train_time,
            "tokens_per_sec": totals.get("lengths", 0) * world / train_time,
        }
        if self._flops_per_batch is not None:
            s["flops_per_batch"] = self._flops_per_batch
            s["device_flops_per_sec"] = self._flops_per_batch * batches / train_time
            if self.available_flops:
                s["mfu"] = s["device_flops_per_sec"] / self.available_flops
        self.summary = s
        return s

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        s = self.summarize(trainer)
        if not s:
            return
        title, rows = self._title(trainer), self._rows(trainer, s)
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

    @staticmethod
    def _title(trainer: L.Trainer) -> str:
        return f"Timing: {trainer.world_size} device(s), precision {trainer.precision}"

    def _rows(self, trainer: L.Trainer, s: dict[str, float]) -> list[tuple[str, str]]:
        """(label, value) rows shared by the console table and the TensorBoard text."""
        rows = [
            ("training time (excl. validation)", f"{s['train_time']:.2f} s"),
            ("fit wall time", f"{s['fit_time']:.2f} s"),
            ("batches (per device)", f"{int(s['batches'])}"),
            ("time per batch (mean)", f"{s['time_per_batch']:.4f} s"),
            ("tokens/s (all devices)", f"{s['tokens_per_sec']:,.0f}"),
            ("samples/s (all devices)", f"{s['samples_per_sec']:,.1f}"),
        ]
        if "flops_per_batch" in s:
            rows.append(("FLOPs/batch/device (fwd+bwd)", f"{s['flops_per_batch']:.3e} ({self.flops_source})"))
            rows.append(("FLOP/s per device (achieved)", f"{s['device_flops_per_sec']:.3e}"))
        else:
            rows.append(("FLOPs/batch/device (fwd+bwd)", "n/a: no count for this attention"))
        device = trainer.strategy.root_device.type
        rows.append(("MFU", f"{s['mfu']:.2%}" if "mfu" in s else f"n/a: peak FLOP/s of {device} unknown"))
        return rows
