"""The ranges the project's own signatures cannot state, and the memory check of the model's size.

The project's options state their ranges in their types (lit_attn.bounds), which the parser checks.
`RANGES` holds those of Lightning's options (the Trainer's, whose signature is not ours, including rules that
read several forms of one value: trainer.devices, the batch shares) by dotted config key; `check_ranges(cfg)`
runs them and the memory check, which spans the model's sizes, the vocabulary and the precision, on the parsed
configuration before anything is built or written, so a value that makes no sense ends in one line naming its
flag instead of a traceback, or a run that reports nonsense.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from lit_attn.bounds import (
    Bounded,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    Seed,
    UnitInterval,
    bounded,
)

ACCEPTED = object()  # what a Rule's `other` returns for a non-numeric value that the library itself reads
NODES_MAX = 65_536  # a sanity bound on --trainer.num_nodes, above any cluster job's size


@dataclass(frozen=True)
class Rule:
    """What one option accepts. Integers are checked against `ints` (else `reals`), floats against `reals`;
    NaN and infinities never pass. `other` reads a value of any other type (a string, a mapping) into one
    to check, or returns ACCEPTED; it raises ValueError (or returns None) for one it refuses."""

    hint: str
    ints: type[Bounded] | None = None
    reals: type[Bounded] | None = None
    none: bool = False
    bools: bool = False
    also: tuple[int, ...] = ()
    items: type[Bounded] | None = None  # a list whose every item is in this range
    other: Callable[[Any], Any] | None = None
    what: str = ""  # what the value must be, where the generated description would not say it

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.none
        if isinstance(value, bool):
            return self.bools
        if isinstance(value, int):
            interval = self.ints if self.ints is not None else self.reals
            return value in self.also or (interval is not None and interval.contains(value))
        if isinstance(value, float):
            return self.reals is not None and self.reals.contains(value)
        if isinstance(value, (list, tuple)):
            return self.items is not None and len(value) > 0 and all(map(self.items.contains, value))
        if self.other is None:
            return False
        try:
            read = self.other(value)
        except (ValueError, TypeError):
            return False
        return read is ACCEPTED or (read is not None and not isinstance(read, (str, Mapping)) and self.accepts(read))

    def describe(self) -> str:
        if self.what:
            return self.what
        parts = []
        parts += [rule.describe() for rule in (self.ints, self.reals) if rule is not None]
        parts += [str(v) for v in self.also]
        if self.items is not None:
            parts.append(f"a list of items, each {self.items.describe()}")
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def read_devices(value: Any) -> Any:
    """trainer.devices given as text, read as Lightning reads it: 'auto', '2', '-1', or indices '0,1'."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text == "auto":
        return ACCEPTED
    if "," in text:
        return [int(part) for part in text.split(",") if part.strip()]
    return int(text)


def _duration(value: Any) -> Any:
    """A time-based interval ('DD:HH:MM:SS', a timedelta or its keyword mapping): Lightning reads it."""
    return ACCEPTED if isinstance(value, (str, Mapping, timedelta)) else None


def _positive_time(value: Any) -> Any:
    """trainer.max_time ('DD:HH:MM:SS', a timedelta or its keyword mapping) if it is longer than zero."""
    if isinstance(value, str):
        days, hours, minutes, seconds = (int(part) for part in value.split(":"))
        value = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(value, Mapping):
        value = timedelta(**value)
    return ACCEPTED if isinstance(value, timedelta) and value.total_seconds() > 0 else None


NodeCount = bounded("NodeCount", int, 1, NODES_MAX)
WindowShare = bounded("WindowShare", float, 0, 1, open_low=True)  # a share of an epoch's batches: (0, 1]


def _count(hint: str, low: type[Bounded] = PositiveInt, **kw: Any) -> Rule:
    return Rule(hint, ints=low, **kw)


def _batches(hint: str, low: type[Bounded]) -> Rule:
    # Lightning reads an integer as a number of batches and a float as a share of them.
    return Rule(hint, ints=low, reals=WindowShare if low is PositiveInt else UnitInterval, none=True)


# The ranges of options whose signatures are Lightning's (the Trainer's, LightningCLI's seed_everything), by
# dotted config key. The project's own options say theirs in their types (lit_attn.bounds), which the parser
# checks; sizes have no upper bound there: check_memory refuses a model this machine cannot hold.
RANGES: dict[str, Rule] = {
    "seed_everything": Rule("the global seed; true: a random one; numpy's seed range", ints=Seed, bools=True,
                            none=True),
    # ---- trainer ----
    "trainer.devices": Rule("devices per node", ints=PositiveInt, also=(-1,), items=NonNegativeInt, other=read_devices,
                            what="an integer >= 1, -1 (every device), 'auto' or a list of device indices >= 0"),
    "trainer.num_nodes": _count("machines; the cluster's launcher checks the real count", NodeCount),
    "trainer.fast_dev_run": _count("batches of a trial run; false: off", NonNegativeInt, bools=True),
    "trainer.max_epochs": _count("-1: no limit; null: Lightning's default", also=(-1,), none=True),
    "trainer.min_epochs": _count("epochs trained at least", NonNegativeInt, none=True),
    "trainer.max_steps": _count("optimizer steps to train; -1: no step limit", also=(-1,)),
    "trainer.max_time": Rule("training time limit; null: none", none=True, other=_positive_time,
                             what="a duration longer than zero, 'DD:HH:MM:SS'"),
    "trainer.min_steps": _count("steps trained at least", NonNegativeInt, none=True),
    "trainer.limit_train_batches": _batches("batches per epoch (an integer) or a share of them (a float)",
                                            PositiveInt),
    "trainer.limit_val_batches": _batches("batches per validation or a share of them; 0: no validation",
                                          NonNegativeInt),
    "trainer.limit_test_batches": _batches("batches tested or a share of them", NonNegativeInt),
    "trainer.limit_predict_batches": _batches("batches predicted or a share of them", NonNegativeInt),
    "trainer.overfit_batches": Rule("batches to overfit or a share of them; 0: off", ints=NonNegativeInt,
                                    reals=UnitInterval),
    "trainer.val_check_interval": Rule(
        "training batches between validations, or a share of an epoch", ints=PositiveInt,
        reals=WindowShare, none=True, other=_duration,
        what="an integer >= 1, a number in (0, 1] or a duration 'DD:HH:MM:SS'"),
    "trainer.check_val_every_n_epoch": _count("null: validate by val_check_interval alone", none=True),
    "trainer.num_sanity_val_steps": _count("validation batches before training; -1: all", NonNegativeInt, also=(-1,),
                                           none=True),
    "trainer.log_every_n_steps": _count("steps between logged metrics", none=True),
    "trainer.accumulate_grad_batches": _count("batches whose gradients add up to one step"),
    "trainer.gradient_clip_val": Rule("the gradient norm clipped to; 0 or null: no clipping", reals=NonNegativeFloat,
                                      none=True),
    "trainer.reload_dataloaders_every_n_epochs": _count("0: never", NonNegativeInt),
}


def flag(key: str) -> str:
    """The command-line flag of a config key: data.init_args.X is --data.X."""
    return "--" + key.replace("data.init_args.", "data.", 1)


def refusal(key: str, value: Any) -> str | None:
    """The one-line message for `value` of option `key`, or None if the table has no objection."""
    rule = RANGES[key]
    if rule.accepts(value):
        return None
    return f"{flag(key)} must be {rule.describe()} ({rule.hint}), got {value!r}"


def data_class(cfg: Any) -> type | None:
    """The class `data.class_path` names; None where there is none or it cannot be found (the parser says so)."""
    class_path = cfg.get("data.class_path") if "data.class_path" in cfg else None
    if not isinstance(class_path, str):
        return None
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if isinstance(cls, type) else None


def check_ranges(cfg: Any, stage: str = "fit") -> None:
    """Raise ValueError, in one line naming the flag, for the first option outside its range (in table
    order), then for a model too large for this machine's memory. `cfg` is the jsonargparse Namespace of
    one subcommand; options it lacks are skipped."""
    for key in RANGES:
        if key in cfg and (message := refusal(key, cfg.get(key))) is not None:
            raise ValueError(message)
    check_memory(cfg, stage)


# ---- memory ----


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _bytes_per_value(precision: Any) -> int:
    text = str(precision)
    if text.startswith(("16-true", "bf16-true")):
        return 2
    return 8 if text.startswith("64") else 4


def model_size(config: Any) -> tuple[int, int]:
    """(parameters, bytes of buffers) of `Transformer(config)`, without allocating it.

    Counted on meta-device builds of one and of two layers, since every layer is the same (with a layer pattern,
    for each kind of layer); building
    all of them, even on meta, takes seconds per thousand. An attention that cannot be built on meta
    has its parameters counted by `lit_attn.analytic` and its buffers left out.
    """
    from lit_attn.analytic import gpt_params
    from lit_attn.transformer import Transformer

    if config.layer_pattern is not None:  # layers differ: the mean of uniform models of each layer's attention
        sizes = [(model_size(layer), count) for layer, count in config.layer_kinds()]
        return (sum(size[0] * count for size, count in sizes) // config.n_layer,
                sum(size[1] * count for size, count in sizes) // config.n_layer)
    counts = []
    for layers in (1, 2):
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                network = Transformer(dataclasses.replace(config, n_layer=layers))
        except ValueError:
            raise  # a setting the model refuses: the same one-line error the real build would give
        except Exception:
            return gpt_params(config)["total"], 0
        counts.append((sum(p.numel() for p in network.parameters()),
                       sum(b.numel() * b.element_size() for b in network.buffers())))
    (p1, b1), (p2, b2) = counts
    return p1 + (config.n_layer - 1) * (p2 - p1), b1 + (config.n_layer - 1) * (b2 - b1)


def check_memory(cfg: Any, stage: str = "fit") -> None:
    """Raise ValueError if the model's weights (and, to fit, its gradients and AdamW's two moments) alone
    exceed this machine's physical memory. The vocabulary is the data's; where it is not known before the
    data is read, 2 tokens (the least a model has) keep the estimate a lower bound."""
    from lit_attn.config import GPTConfig

    limit = physical_memory()
    model = cfg.get("model")
    if limit is None or model is None:
        return
    vocab = cfg.get("data.init_args.vocab_size") if "data.init_args.vocab_size" in cfg else None
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 2 else 2
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    config = GPTConfig(**{k: v for k, v in dict(model).items() if k in fields and k != "vocab_size"},
                       vocab_size=vocab)
    training = stage == "fit"
    # Weights and gradients, plus AdamW's two moments unless another optimizer is configured.
    values = (2 if cfg.get("optimizer") else 4) if training else 1
    params, buffers = model_size(config)
    need = params * values * _bytes_per_value(cfg.get("trainer.precision")) + buffers
    if need > limit:
        sizes = f"--model.n_layer ({config.n_layer}), --model.n_embd ({config.n_embd})"
        sizes += f", --data.vocab_size ({vocab})" if vocab > 2 else ""
        sizes += f" or --model.block_size ({config.block_size})"
        what = "weights, gradients and optimizer state" if training else "weights"
        raise ValueError(
            f"the model needs {_size(need)} ({params:,} parameters: their {what}; {_size(buffers)} of buffers), "
            f"more than this machine's {_size(limit)} of memory; lower {sizes}"
        )


def _size(n: float) -> str:
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = 0
    while n >= 1024 and power < len(units) - 1:
        n, power = n / 1024, power + 1
    return f"{n:,.0f} bytes" if power == 0 else f"{n:,.1f} {units[power]}"
