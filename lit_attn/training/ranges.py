"""The valid range of every numeric option of `main.py`, and a memory check of the model's size.

`RANGES` maps a dotted config key to its `Rule`; `check_ranges(cfg)` runs both checks on the
parsed configuration before anything is built or written, so a value that makes no sense
ends in one line naming its flag instead of a traceback, or a run that reports nonsense.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from lit_attn.toolcli import SEED_MAX

ACCEPTED = object()  # what a Rule's `other` returns for a non-numeric value that the library itself reads
NODES_MAX = 65_536  # a sanity bound on --trainer.num_nodes, above any cluster job's size


@dataclass(frozen=True)
class Interval:
    """Finite numbers between `low` and `high` (None: unbounded on that side); open ends exclude the bound."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, x: object) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.open_low else x < self.low):
            return False
        return self.high is None or (x < self.high if self.open_high else x <= self.high)

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.open_low else '['}{low}, {high}{')' if self.open_high else ']'}"
        if self.low is not None:
            return f"{'>' if self.open_low else '>='} {low}"
        if self.high is not None:
            return f"{'<' if self.open_high else '<='} {high}"
        return "finite"


def _number(x: float | None) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


@dataclass(frozen=True)
class Rule:
    """What one option accepts. Integers are checked against `ints` (else `reals`), floats against `reals`;
    NaN and infinities never pass. `other` reads a value of any other type (a string, a mapping) into one
    to check, or returns ACCEPTED; it raises ValueError (or returns None) for one it refuses."""

    hint: str
    ints: Interval | None = None
    reals: Interval | None = None
    none: bool = False
    bools: bool = False
    also: tuple[int, ...] = ()
    items: Interval | None = None  # a list whose every item is in this interval
    length: int | None = None  # ... of exactly this many items
    other: Callable[[Any], Any] | None = None
    what: str = ""  # what the value must be, where the generated description would not say it

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.none
        if isinstance(value, bool):
            return self.bools
        if isinstance(value, int):
            interval = self.ints if self.ints is not None else self.reals
            return value in self.also or (interval is not None and value in interval)
        if isinstance(value, float):
            return self.reals is not None and value in self.reals
        if isinstance(value, (list, tuple)):
            return (self.items is not None and len(value) > 0 and (self.length is None or len(value) == self.length)
                    and all(v in self.items for v in value))
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
        if self.ints is not None:
            parts.append(f"an integer {self.ints}")
        if self.reals is not None:
            parts.append(f"a number {self.reals}" if self.ints is not None else str(self.reals))
        parts += [str(v) for v in self.also]
        if self.items is not None:
            parts.append(f"two numbers {self.items}" if self.length == 2 else f"a list of numbers {self.items}")
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


POSITIVE = Interval(0, open_low=True)
AT_LEAST_0 = Interval(0)
AT_LEAST_1 = Interval(1)
FRACTION = Interval(0, 1)  # [0, 1]
SEED = Interval(0, SEED_MAX)


def _count(hint: str, low: Interval = AT_LEAST_1, **kw: Any) -> Rule:
    return Rule(hint, ints=low, **kw)


def _seed(hint: str, **kw: Any) -> Rule:
    return Rule(f"{hint}; numpy's seed range", ints=SEED, **kw)


def _batches(hint: str, low: int) -> Rule:
    # Lightning reads an integer as a number of batches and a float as a share of them.
    return Rule(hint, ints=Interval(low), reals=Interval(0, 1, open_low=low == 1), none=True)


# Options whose range is known, by dotted config key (data.init_args.* apply to this project's datamodules).
# Sizes have no upper bound here: check_memory refuses a model this machine cannot hold.
RANGES: dict[str, Rule] = {
    "seed_everything": _seed("the global seed; true: a random one", bools=True, none=True),
    # ---- model ----
    "model.lr": Rule("AdamW's learning rate, e.g. 1e-3", reals=POSITIVE),
    "model.weight_decay": Rule("AdamW's weight decay, e.g. 0.1", reals=AT_LEAST_0),
    "model.betas": Rule("AdamW's betas, e.g. [0.9, 0.95]", items=Interval(0, 1, open_high=True), length=2),
    "model.warmup_fraction": Rule("the share of the steps spent warming up, e.g. 0.05", reals=FRACTION),
    "model.min_lr_ratio": Rule("the cosine floor as a fraction of lr, e.g. 0.1", reals=FRACTION),
    "model.total_steps": _count("the LR schedule's length; null: the trainer's estimate", none=True),
    "model.n_layer": _count("transformer blocks"),
    "model.n_embd": _count("the residual stream's width"),
    "model.n_head": _count("attention heads; they split n_embd"),
    "model.n_query_heads": _count("query heads; null: the attention's preset", none=True),
    "model.n_kv_heads": _count("key/value heads; null: the attention's preset", none=True),
    "model.block_size": _count("the context length in tokens"),
    "model.local_window": _count("positions an S layer of model.layer_pattern attends to; null without S layers",
                                 Interval(2), none=True),
    "model.ffn_hidden": _count("the FFN's width; null: from n_embd", none=True),
    "model.dropout": Rule("a probability", reals=Interval(0, 1, open_high=True)),
    "model.attn_dropout": Rule("a probability; null: model.dropout", reals=Interval(0, 1, open_high=True), none=True),
    "model.embd_dropout": Rule("a probability; null: model.dropout", reals=Interval(0, 1, open_high=True), none=True),
    # ---- data (WindowDataModule subclasses) ----
    "data.init_args.block_size": _count("the context length in tokens, set by --model.block_size"),
    "data.init_args.batch_size": _count("windows per batch on each device"),
    "data.init_args.val_fraction": Rule("the share of the data held out", reals=Interval(0, 1, True, True)),
    "data.init_args.train_fraction": Rule("the share of the data trained on", reals=Interval(0, 1, True, True)),
    "data.init_args.stride": _count("tokens between the starts of train windows", none=True),
    "data.init_args.val_stride": _count("tokens between validation windows; null: block_size", none=True),
    "data.init_args.num_workers": _count("DataLoader worker processes; 0: load in the main process", AT_LEAST_0),
    "data.init_args.seed": _seed("the shuffling seed; null: seed_everything's", none=True),
    "data.init_args.vocab_size": _count("tokens in the vocabulary (a BPE one: 257 at least, its own check)",
                                        Interval(2, 2**32)),
    "data.init_args.input_seq_len": _count("tokens of a recall example"),
    "data.init_args.num_kv_pairs": _count("key-value pairs per recall example"),
    "data.init_args.num_train_examples": _count("recall examples to train on"),
    "data.init_args.num_test_examples": _count("recall examples per test setting"),
    "data.init_args.power_a": Rule("the query gaps' power-law exponent a, e.g. 0.01", reals=POSITIVE),
    "data.init_args.tokenizer_max_chars": _count("characters read to train the tokenizer"),
    "data.init_args.num_proc": _count("processes that tokenize; null: the CPU cores, at most 8", none=True),
    "data.init_args.hub_timeout": Rule("seconds to wait for the hub", reals=POSITIVE),
    # ---- trainer ----
    "trainer.devices": Rule("devices per node", ints=AT_LEAST_1, also=(-1,), items=AT_LEAST_0, other=read_devices,
                            what="an integer >= 1, -1 (every device), 'auto' or a list of device indices >= 0"),
    "trainer.num_nodes": _count("machines; the cluster's launcher checks the real count", Interval(1, NODES_MAX)),
    "trainer.fast_dev_run": _count("batches of a trial run; false: off", AT_LEAST_0, bools=True),
    "trainer.max_epochs": _count("-1: no limit; null: Lightning's default", also=(-1,), none=True),
    "trainer.min_epochs": _count("epochs trained at least", AT_LEAST_0, none=True),
    "trainer.max_steps": _count("optimizer steps to train; -1: no step limit", also=(-1,)),
    "trainer.max_time": Rule("training time limit; null: none", none=True, other=_positive_time,
                             what="a duration longer than zero, 'DD:HH:MM:SS'"),
    "trainer.min_steps": _count("steps trained at least", AT_LEAST_0, none=True),
    "trainer.limit_train_batches": _batches("batches per epoch (an integer) or a share of them (a float)", 1),
    "trainer.limit_val_batches": _batches("batches per validation or a share of them; 0: no validation", 0),
    "trainer.limit_test_batches": _batches("batches tested or a share of them", 0),
    "trainer.limit_predict_batches": _batches("batches predicted or a share of them", 0),
    "trainer.overfit_batches": Rule("batches to overfit or a share of them; 0: off", ints=AT_LEAST_0, reals=FRACTION),
    "trainer.val_check_interval": Rule(
        "training batches between validations, or a share of an epoch", ints=AT_LEAST_1,
        reals=Interval(0, 1, open_low=True), none=True, other=_duration,
        what="an integer >= 1, a number in (0, 1] or a duration 'DD:HH:MM:SS'"),
    "trainer.check_val_every_n_epoch": _count("null: validate by val_check_interval alone", none=True),
    "trainer.num_sanity_val_steps": _count("validation batches before training; -1: all", AT_LEAST_0, also=(-1,),
                                           none=True),
    "trainer.log_every_n_steps": _count("steps between logged metrics", none=True),
    "trainer.accumulate_grad_batches": _count("batches whose gradients add up to one step"),
    "trainer.gradient_clip_val": Rule("the gradient norm clipped to; 0 or null: no clipping", reals=AT_LEAST_0,
                                      none=True),
    "trainer.reload_dataloaders_every_n_epochs": _count("0: never", AT_LEAST_0),
    # ---- always-on callbacks ----
    "checkpoint.every_n_train_steps": _count("steps between saves of last.ckpt; 0: only at the end and on a stop",
                                             AT_LEAST_0),
    "checkpoint.every_minutes": Rule("minutes between saves of last.ckpt; null: off", reals=POSITIVE, none=True),
    "exact_resume.seed": _seed("the dropout seed; null: seed_everything's", none=True),
    "nan_guard.check_every_n_steps": _count("steps between loss checks; null: log_every_n_steps", none=True),
    "samples.max_new_tokens": _count("tokens generated per prompt; 0: none", AT_LEAST_0),
    "samples.temperature": Rule("the sampling temperature; 0: greedy", reals=AT_LEAST_0),
    "samples.top_k": _count("sample among the k most likely tokens; null: all", none=True),
    "samples.seed": _seed("the sampling seed"),
    "timing.window_size": _count("batches in the rolling window of the per-second metrics (a rate needs two)",
                                 Interval(2)),
    "timing.warmup_batches": _count("training batches at the start left out of the rates", AT_LEAST_0),
    "timing.peak_flops": Rule("a device's peak FLOP/s, e.g. 9.89e14", reals=POSITIVE, none=True),
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


def _window_data(cfg: Any) -> bool:
    """Whether the data is one of this project's datamodules (the data.init_args rules are theirs)."""
    from datamodules.windows import WindowDataModule

    cls = data_class(cfg)
    return cls is not None and issubclass(cls, WindowDataModule)


def check_ranges(cfg: Any, stage: str = "fit") -> None:
    """Raise ValueError, in one line naming the flag, for the first option outside its range (in table
    order), then for a model too large for this machine's memory. `cfg` is the jsonargparse Namespace of
    one subcommand; options it lacks are skipped."""
    window_data = None
    for key in RANGES:
        if key.startswith("data.init_args."):
            window_data = _window_data(cfg) if window_data is None else window_data
            if not window_data:
                continue
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
