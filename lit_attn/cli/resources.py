"""What this machine and launch can give, checked before anything is created.

An option that asks for a count of something the machine has (processes, devices, nodes, workers, memory
for generated tokens or drawn examples, the length of a file name) is compared with what this machine
has, and refused in one line that says what is available. `RESOURCES` maps every numeric option to the
resource it counts, or to None where it counts none. Multi-node sizes are checked here for type and sanity
only (ranges.RANGES); the cluster's launcher checks the rest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lit_attn.cli import ranges
from lit_attn.cli.ranges import ACCEPTED, _size, data_class, physical_memory
from lit_attn.cli.toolcli import cpu_cores

# Bytes per generated token of a text sample: the int64 output tensor, its list of ids and the decoded text.
SAMPLED_TOKEN_BYTES = 8 + 8 + 4

# The numeric options that count something the machine has, by dotted config key, and what they count.
# Every other numeric option is listed as None: a count of steps, batches or tokens of the data,
# a size the memory check judges (ranges.check_memory), or a setting that is not a count.
RESOURCES: dict[str, str | None] = {
    "trainer.devices": "CPU cores or GPUs",
    "trainer.num_nodes": "machines (the cluster's launcher)",
    "data.init_args.num_workers": "CPU cores",
    "data.init_args.num_proc": "CPU cores",
    "samples.max_new_tokens": "memory",
    "data.init_args.num_train_examples": "memory (MQAR examples are drawn into memory)",
    "data.init_args.num_test_examples": "memory (MQAR examples are drawn into memory)",
    "data.init_args.num_heldout_examples": "memory (MQAR examples are drawn into memory)",
    "data.init_args.num_val_examples": "memory (passkey validation examples are drawn into memory)",
    "trainer.accumulate_grad_batches": "training batches of an epoch (checked once the data is read)",
    "trainer.fast_dev_run": "training batches of an epoch (checked once the data is read)",
}
NOT_RESOURCES = (
    "seed_everything", "model.lr", "model.weight_decay", "model.betas", "model.warmup_fraction",
    "model.min_lr_ratio", "model.cooldown_fraction", "model.muon_lr", "model.muon_momentum",
    "model.muon_weight_decay", "model.logit_softcap", "model.total_steps", "model.n_layer", "model.n_embd",
    "model.n_head",
    "model.n_query_heads", "model.n_kv_heads", "model.block_size", "model.ffn_hidden", "model.dropout",
    "model.attn_dropout", "model.embd_dropout", "model.local_window",
    "data.init_args.block_size", "data.init_args.batch_size", "data.init_args.val_fraction",
    "data.init_args.test_fraction", "data.init_args.train_fraction", "data.init_args.stride",
    "data.init_args.val_stride", "data.init_args.seed",
    "data.init_args.vocab_size", "data.init_args.input_seq_len", "data.init_args.num_kv_pairs",
    "data.init_args.power_a", "data.init_args.tokenizer_max_chars", "data.init_args.hub_timeout",
    "trainer.max_epochs", "trainer.min_epochs", "trainer.max_steps", "trainer.max_time", "trainer.min_steps",
    "trainer.limit_train_batches", "trainer.limit_val_batches", "trainer.limit_test_batches",
    "trainer.limit_predict_batches", "trainer.overfit_batches", "trainer.val_check_interval",
    "trainer.check_val_every_n_epoch", "trainer.num_sanity_val_steps", "trainer.log_every_n_steps",
    "trainer.gradient_clip_val", "trainer.reload_dataloaders_every_n_epochs", "checkpoint.every_n_train_steps",
    "checkpoint.every_minutes", "exact_resume.seed", "nan_guard.check_every_n_steps", "samples.temperature",
    "samples.top_k", "samples.seed", "timing.window_size", "timing.warmup_batches", "timing.peak_flops",
)
RESOURCES.update(dict.fromkeys(NOT_RESOURCES))

# Path options of the command line, by dotted config key: what each names. None of them may be empty
# (an empty --runs_dir would write into the working directory).
PATHS: dict[str, str] = {
    "runs_dir": "a directory",
    "run": "a run name",
    "ckpt_path": "a checkpoint file",
    "data.init_args.path": "a text file",
    "data.init_args.url": "an address",
    "data.init_args.cache_dir": "a directory",
    "data.init_args.tokenizer": "a tokenizer file",
    "data.init_args.data_files": "data files",
    "data.init_args.dataset": "a dataset",
    "data.init_args.dataset_config": "a dataset configuration",
}


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launched_by_cluster() -> bool:
    """Whether a cluster launcher started this process (SLURM, torchrun, LSF, or the variables
    Lightning reads for a manual multi-node launch): only then do the other nodes' processes exist."""
    from lightning.fabric.plugins.environments import LSFEnvironment, SLURMEnvironment, TorchElasticEnvironment

    # Kubeflow and a manual launch (Lightning's environment) are told by these variables alone.
    if any(name in os.environ for name in ("NODE_RANK", "MASTER_ADDR", "WORLD_SIZE")):
        return True
    return any(env.detect() for env in (SLURMEnvironment, TorchElasticEnvironment, LSFEnvironment))


def _accelerator(value: Any) -> str | None:
    """'cpu' or 'cuda' for the accelerator a Trainer would pick from `value`; None for another or an object."""
    if not isinstance(value, str):
        return None
    value = value.lower()
    if value == "auto":
        if gpu_count():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return None if mps is not None and mps.is_available() else "cpu"
    return {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(value)


def _devices(value: Any) -> Any:
    """trainer.devices as Lightning reads it: an int, a list of indices, or None for 'auto' (nothing to check)."""
    if isinstance(value, str):
        try:
            read = ranges.read_devices(value)
        except ValueError:
            return None  # the range table refuses it
        return None if read is ACCEPTED else read
    return list(value) if isinstance(value, (list, tuple)) else value


def check_devices(cfg: Any) -> None:
    if "trainer.devices" not in cfg:
        return
    devices, kind = _devices(cfg.get("trainer.devices")), _accelerator(cfg.get("trainer.accelerator", "auto"))
    if devices is None or isinstance(devices, bool) or kind is None:
        return
    shown = devices if isinstance(devices, int) else "[" + ", ".join(map(str, devices)) + "]"
    if kind == "cpu":
        cores = cpu_cores()
        if isinstance(devices, list):
            raise ValueError(f"--trainer.devices {shown}: device indices pick GPUs, and the CPU accelerator has "
                             f"none; give a number of processes, e.g. --trainer.devices 1 (this machine has "
                             f"{cores} CPU cores)")
        if devices > cores:
            raise ValueError(f"--trainer.devices {devices}: this machine has {cores} CPU cores; use "
                             f"--trainer.devices <= {cores}, or a GPU machine")
        return
    gpus = gpu_count()
    if gpus == 0:
        return  # no GPU at all: Lightning's own message says so (parsed_config.trainer_error_message)
    if isinstance(devices, int) and devices > gpus:
        raise ValueError(f"--trainer.devices {devices}: this machine has {gpus} GPU(s); use "
                         f"--trainer.devices <= {gpus}")
    if isinstance(devices, list) and any(i >= gpus for i in devices):
        raise ValueError(f"--trainer.devices {shown}: this machine has {gpus} GPU(s), indices 0 to {gpus - 1}")


def check_nodes(cfg: Any) -> None:
    nodes = cfg.get("trainer.num_nodes") if "trainer.num_nodes" in cfg else None
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 1 and not launched_by_cluster():
        raise ValueError(
            f"--trainer.num_nodes {nodes}: this process was not started by a cluster launcher (srun, torchrun, "
            f"or NODE_RANK and MASTER_ADDR set on every node), so the other {nodes - 1} machine(s) would never "
            f"join; launch it on every node (docs/training.md, multi-node) or use --trainer.num_nodes 1"
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_workers(cfg: Any) -> None:
    from datamodules.windows import WindowDataModule

    cls = data_class(cfg)
    if cls is None or not issubclass(cls, WindowDataModule):
        return  # another datamodule's options are its own
    cores = cpu_cores()
    for name, what in (("num_workers", "DataLoader worker processes"), ("num_proc", "tokenizing processes")):
        key = f"data.init_args.{name}"
        count = _int(cfg.get(key)) if key in cfg else None
        if count is not None and count > cores:
            raise ValueError(f"--data.{name} {count}: {count} {what}, but this process may use {cores} CPU cores; "
                             f"use --data.{name} <= {cores}")


def check_memory_for_data(cfg: Any) -> None:
    """A datamodule that draws its examples into memory says how much (`memory_needed(**init_args)`)."""
    cls, limit = data_class(cfg), physical_memory()
    needed = getattr(cls, "memory_needed", None)
    if needed is None or limit is None or "data.init_args" not in cfg:
        return
    need, flags = needed(**{k: v for k, v in dict(cfg.get("data.init_args")).items() if v is not None})
    if need > limit:
        raise ValueError(f"{flags}: the examples need {_size(need)} of memory, more than this machine's "
                         f"{_size(limit)}; draw fewer examples")


def check_samples(cfg: Any) -> None:
    """Samples are generated after every validation, in `validate` as in `fit`."""
    tokens = _int(cfg.get("samples.max_new_tokens")) if "samples.max_new_tokens" in cfg else None
    limit = physical_memory()
    if tokens is None or limit is None:
        return
    if tokens * SAMPLED_TOKEN_BYTES > limit:
        raise ValueError(f"--samples.max_new_tokens {tokens}: a sample of {tokens:,} tokens needs "
                         f"{_size(tokens * SAMPLED_TOKEN_BYTES)} of memory, more than this machine's {_size(limit)}; "
                         f"use --samples.max_new_tokens <= {limit // SAMPLED_TOKEN_BYTES:,} (64: the default)")


def _existing(path: Path) -> Path:
    """`path` or its nearest existing parent (where a new name would be created)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def name_max(directory: Path) -> int:
    """The longest file name the filesystem of `directory` (or its nearest existing parent) takes."""
    try:
        return os.pathconf(_existing(directory), "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_paths(cfg: Any) -> None:
    for key, what in PATHS.items():
        if key == "run":
            continue  # runs.check_names refuses an empty name as one that is not plain
        if key in cfg and isinstance(value := cfg.get(key), str) and not value.strip():
            flag = "--" + key.replace("data.init_args.", "data.", 1)
            raise ValueError(f"{flag} is empty; name {what}, or leave the option out for its default")
    runs_dir = Path(cfg.get("runs_dir")).expanduser() if isinstance(cfg.get("runs_dir"), str) else None
    run = cfg.get("run") if "run" in cfg else None
    if runs_dir is not None:
        longest = name_max(runs_dir)
        parts = [("--runs_dir", part) for part in runs_dir.parts]
        parts += [("--run", run)] if isinstance(run, str) else []
        for flag, part in parts:
            if len(os.fsencode(part)) > longest:
                raise ValueError(f"{flag}: the name {part[:20]!r}... is {len(os.fsencode(part))} bytes long; the "
                                 f"filesystem of {_existing(runs_dir)} takes names of at most {longest} bytes")
    cache = cfg.get("data.init_args.cache_dir") if "data.init_args.cache_dir" in cfg else None
    if isinstance(cache, str) and cache.strip():
        path = Path(cache).expanduser()
        if path.exists() and not path.is_dir():
            raise ValueError(f"--data.cache_dir {cache} is a file; name a directory (it is created if missing)")


def check_resources(cfg: Any) -> None:
    """Raise ValueError, in one line naming the flag and what this machine has, for an option that asks
    for more than this machine and launch can give. `cfg` is one subcommand's parsed config."""
    check_paths(cfg)
    check_devices(cfg)
    check_nodes(cfg)
    check_workers(cfg)
    check_samples(cfg)
    check_memory_for_data(cfg)
