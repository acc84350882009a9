"""The run's settings and final results in TensorBoard's HPARAMS tab, one row per run."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

from lit_attn.pattern import pattern_label
from lit_attn.training.fit_state import last_step_index

from .cpu_share import CpuShare
from .timing import TimingMonitor

# TensorBoard metric tag -> (column title, where its value comes from: trainer.callback_metrics,
# TimingMonitor.summary or the parameter count). The dashboard ticks the first five columns.
METRICS = {
    "whole_run/val_loss": ("val loss", "callback", "val/loss"),
    "whole_run/val_acc": ("val acc", "callback", "val/acc"),
    "whole_run/n_params": ("parameters", "params", "n_params"),
    "whole_run/time_per_batch": ("time/batch (s)", "timing", "time_per_batch"),
    "whole_run/tokens_per_sec": ("tokens/s", "timing", "tokens_per_sec"),
    "whole_run/train_time": ("train time (s)", "timing", "train_time"),
    "whole_run/mfu": ("MFU", "timing", "mfu"),
    "whole_run/stopped_early_at_step": ("stopped early at step", "stop", "step"),
}
STOPPED_EARLY = "Stopped early"  # the hparams column of an EarlyStopping's stop: its reason, as Lightning words it

# The run's whole_run/* scalars are in the run's own event file (no sub-run doubles the run list): the metric
# columns' group is the run itself, and TIME SERIES shows them last (`whole_run` sorts after `train` and `val`).
METRICS_GROUP = ""

# The columns that tell runs apart, in the tab's order. The dashboard ticks the hparams that `differs`,
# so these carry the flag; the rest of the short list sorts
# next, before the model's own lowercase hyperparameters (the tab sorts names, capitals first).
SHOWN = ("Attention", "Data", "Hq", "Hkv", "Layers", "Width")
SHORT_LIST = (*SHOWN, "Context", "Parameters", "Precision", "Devices", "Machine", "CPU shared", "Batch size", "Seed",
              "Data seed")
# Model hyperparameters that the short list already shows under another name.
RENAMED = {"attention": "Attention", "n_layer": "Layers", "n_embd": "Width", "block_size": "Context"}


class HParamsSummary(L.Callback):
    """At the end of fit (rank zero): one TensorBoard hparams record for the run.

    Columns ticked by default: attention, the data (the datamodule's data_identity: its file's name and content
    hash, or its dataset and split), the query and key/value heads the attention really uses (Hq, Hkv), layers and
    width; then context, parameters (tied ones once), precision,
    devices, the machine (machine_name: "A + B" for a run resumed on other hardware), on the CPU whether
    other processes crowded it (cpu_share; warned once while training), batch size (per device),
    seed_everything and the data order's seed; then the model's other hyperparameters. Values are
    strings as written ("8", not "8.0000"), booleans stay booleans. Metrics: the last
    validation's loss and accuracy (reduced over all ranks by the model's metrics), the
    parameter count, and from TimingMonitor time per batch, tokens/s, training time and MFU
    (when known), written as whole_run/* scalars beside the run's curves, where the tab reads them. A fit that an
    EarlyStopping callback ended (its `stopping_threshold` reached, its patience run out) adds the step it stopped
    at (whole_run/stopped_early_at_step) and the column "Stopped early" with Lightning's reason.
    Everything is at `last_step_index`, the step of the last validation's val/loss. hparams.yaml is
    left as Lightning wrote it (with the datamodule's `data`).
    """

    def __init__(self) -> None:
        self._n_params = 0
        self._validation: dict[str, float] = {}  # the last validation's whole_run/* sources (val/loss, val/acc)
        self._machines: list[str] = []  # what the run trained on, each attempt's in turn (kept in checkpoints)
        self._cpu: CpuShare | None = None  # on the CPU: how much of it other processes used
        self._cpu_totals = (0.0, 0.0)  # earlier attempts' (other processes' core-seconds, seconds sampled)
        self._stops_before: dict[int, tuple[Any, ...]] = {}  # each EarlyStopping's stop as a resumed fit found it

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Counted before the strategy wraps the model: FSDP would show only this rank's shards.
        self._n_params = sum(p.numel() for p in pl_module.parameters())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation = _callback_values(trainer.callback_metrics)

    # A run resumed after its last validation validates no more: the checkpoint carries that
    # validation's results, so its final record has them, as an uninterrupted run's has.
    def state_dict(self) -> dict[str, Any]:
        cpu = self._cpu_totals if self._cpu is None else (self._cpu.other_core_seconds, self._cpu.seconds)
        return dict(self._validation) | {"machines": list(self._machines), "cpu_share": list(cpu)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._validation = {k: float(v) for k, v in state.items() if k not in ("machines", "cpu_share")}
        self._machines = list(state.get("machines", []))  # an older checkpoint's: none recorded
        self._cpu_totals = tuple(state.get("cpu_share", (0.0, 0.0)))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A checkpoint restores an EarlyStopping's last stop: only one made in this fit counts as this fit's end.
        self._stops_before = {id(cb): _stop_state(cb) for cb in _early_stoppings(trainer)}
        name = machine_name(trainer.strategy.root_device)
        if name not in self._machines:
            self._machines.append(name)
        if trainer.strategy.root_device.type == "cpu":
            self._cpu = CpuShare(torch.get_num_threads(), processes=max(1, trainer.world_size // trainer.num_nodes))
            self._cpu.other_core_seconds, self._cpu.seconds = self._cpu_totals
            self._cpu.start()
            self._cpu_warned = False

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        others = self._cpu.tick() if self._cpu is not None else None
        if others is not None and not self._cpu_warned and self._cpu.crowded(others):
            rank_zero_info(self._cpu.warning(others))
            self._cpu_warned = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._cpu is not None:
            self._cpu.tick(last=True)  # the time since the last sample counts too, however short the run

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not loggers:
            return
        stop = self.early_stop(trainer)
        metrics = collect_metrics(trainer, {**self._validation, **trainer.callback_metrics}, self._n_params,
                                  None if stop is None else trainer.global_step)
        params = collect_params(trainer, pl_module, self._n_params, self._machines,
                                self._cpu.record() if self._cpu is not None else None)
        if stop is not None:
            params[STOPPED_EARLY] = stop
        step = last_step_index(trainer)
        for logger in loggers:
            writer = logger.experiment  # open until the loggers finalize, after on_fit_end
            for summary in record(params, metrics):
                writer.file_writer.add_summary(summary, step)
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, step)
            writer.flush()


    def early_stop(self, trainer: L.Trainer) -> str | None:
        """The reason an EarlyStopping callback gave for ending this fit (Lightning's message), or None."""
        if not trainer.should_stop:
            return None
        for cb in _early_stoppings(trainer):
            state = _stop_state(cb)
            if state[0] != EarlyStoppingReason.NOT_STOPPED and state != self._stops_before.get(id(cb)):
                return " ".join(str(cb.stopping_reason_message or state[0].name).split())
        return None


def _early_stoppings(trainer: L.Trainer) -> list[EarlyStopping]:
    return [cb for cb in getattr(trainer, "callbacks", ()) if isinstance(cb, EarlyStopping)]


def _stop_state(cb: EarlyStopping) -> tuple[Any, ...]:
    """What an EarlyStopping records of its stop: (reason, epoch, message)."""
    return cb.stopping_reason, cb.stopped_epoch, cb.stopping_reason_message


def _callback_values(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite values of the whole_run/* metrics that come from trainer.callback_metrics, as floats."""
    keys = [key for _, source, key in METRICS.values() if source == "callback"]
    values = {k: float(metrics[k]) for k in keys if metrics.get(k) is not None}
    return {k: v for k, v in values.items() if math.isfinite(v)}


def collect_metrics(trainer: L.Trainer, callback_metrics: dict[str, Any] | None = None,
                    n_params: int | None = None, stopped_early_at: int | None = None) -> dict[str, float]:
    """whole_run/* values available at the end of fit (absent ones are left out, not faked); `stopped_early_at`:
    the step an EarlyStopping ended the fit at."""
    timing = next((cb for cb in trainer.callbacks if isinstance(cb, TimingMonitor)), None)
    callback = trainer.callback_metrics if callback_metrics is None else callback_metrics
    sources = {"callback": callback, "timing": timing.summarize(trainer) if timing else {},
               "params": {} if n_params is None else {"n_params": n_params},
               "stop": {} if stopped_early_at is None else {"step": stopped_early_at}}
    out = {}
    for tag, (_, source, key) in METRICS.items():
        value = sources[source].get(key)
        if value is not None and math.isfinite(float(value)):
            out[tag] = float(value)
    return out


def machine_name(device: torch.device) -> str:
    """What a run trains on, for telling apart times measured on different hardware: the GPU's name, or the
    CPU's model and torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines() if cpuinfo.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    threads = torch.get_num_threads()
    return f"{model or platform.processor() or 'CPU'}, {threads} thread{'' if threads == 1 else 's'}"


def collect_params(trainer: L.Trainer, pl_module: L.LightningModule, n_params: int,
                   machines: Sequence[str] = (), cpu_shared: str | None = None) -> dict[str, Any]:
    """The hparams columns: the short list (SHORT_LIST) first, then the model's other hyperparameters.
    `machines`: what the run trained on, in turn ("Machine" reads "A + B" for a run resumed elsewhere);
    `cpu_shared`: CpuShare.record()."""
    hparams = {k: v for k, v in pl_module.hparams.items() if not k.startswith("_")}
    attention = hparams.get("attention")
    if attention and hparams.get("layer_pattern") is not None:  # the run's layers, as compare and the cost card name it
        attention = pattern_label(attention, hparams["layer_pattern"], hparams.get("local_window"))
    params: dict[str, Any] = {"Attention": attention,
                              "Data": getattr(trainer.datamodule, "data_identity", None)}
    config = getattr(pl_module, "config", None)
    if config is not None:
        params["Hq"], params["Hkv"] = config.heads
    params.update({"Layers": hparams.get("n_layer"), "Width": hparams.get("n_embd"),
                   "Context": hparams.get("block_size"), "Parameters": f"{n_params:,}",
                   "Precision": str(trainer.precision), "Devices": trainer.world_size,
                   "Machine": " + ".join(machines) or None, "CPU shared": cpu_shared})
    batch_size = getattr(trainer.datamodule, "batch_size", None) if trainer.datamodule is not None else None
    params["Batch size"] = batch_size
    # seed_everything (initialization, dropout) and the data order's seed: what "± seeds" varied
    params["Seed"] = os.environ.get("PL_GLOBAL_SEED")
    params["Data seed"] = getattr(trainer.datamodule, "seed", None) if trainer.datamodule is not None else None
    params.update({k: v for k, v in hparams.items() if k not in RENAMED})
    return {k: _display(v) for k, v in params.items() if v is not None or k not in SHORT_LIST}


def _display(value: Any) -> bool | str:
    """A column value as the tab should show it: booleans as they are, anything else as written
    (the tab prints numbers to five significant figures: 8 would read "8.0000")."""
    return value if isinstance(value, bool) else str(value)


def record(params: dict[str, bool | str], metrics: dict[str, float]) -> list[Summary]:
    """The hparams plugin's experiment, session start and session end summaries for one run.

    The experiment lists the columns (which are shown by default, their titles, the metrics'
    group); without one, TensorBoard would list every hparam as differing and every scalar
    of the run as a metric column.
    """
    hparam_infos = [
        api_pb2.HParamInfo(name=name, differs=name in SHOWN,
                           type=api_pb2.DATA_TYPE_BOOL if isinstance(value, bool) else api_pb2.DATA_TYPE_STRING)
        for name, value in params.items()
    ]
    metric_infos = [
        api_pb2.MetricInfo(name=api_pb2.MetricName(group=METRICS_GROUP, tag=tag), display_name=METRICS[tag][0])
        for tag in METRICS if tag in metrics
    ]
    now = time.time()
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=now)
    for name, value in params.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
        else:
            start.hparams[name].string_value = value
    return [
        _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(
            experiment=api_pb2.Experiment(hparam_infos=hparam_infos, metric_infos=metric_infos,
                                          time_created_secs=now))),
        _summary(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
        _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(
            session_end_info=plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=now))),
    ]


def _summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))])
