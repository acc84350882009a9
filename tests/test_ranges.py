"""Every numeric option has a valid range, checked before anything is built or written."""

from __future__ import annotations

import math
import types
import typing

import pytest
import torch
from jsonargparse import Namespace

import lit_attn.training.cli as main
from datamodules import CharDataModule, MQARDataModule, WikipediaDataModule
from lit_attn import GPT, GPTConfig, Transformer
from lit_attn.attention import attention_names
from lit_attn.training.cli import cli
from lit_attn.training.ranges import RANGES, Interval, check_memory, check_ranges, flag, model_size

DATA_CLASS = "datamodules.CharDataModule"
PROBES = [0, -1, 1, 2, 10**12, 0.5, 1.0, -0.5, 1e30, -1e30, float("nan"), float("inf"), float("-inf"), True, None]


def namespace(key: str, value) -> Namespace:
    """A config holding only `key` (and, for a data option, this project's datamodule)."""
    cfg = Namespace()
    cfg[key] = value
    if key.startswith("data.init_args."):
        cfg["data.class_path"] = DATA_CLASS
    return cfg


def inside(interval: Interval, x: float) -> bool:
    above = interval.low is None or (x > interval.low if interval.open_low else x >= interval.low)
    below = interval.high is None or (x < interval.high if interval.open_high else x <= interval.high)
    return above and below


def valid(rule, value) -> bool:
    """What the rule's declared bounds say about a scalar probe: NaN and infinities are never valid."""
    if value is None:
        return rule.none
    if isinstance(value, bool):
        return rule.bools
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if isinstance(value, int) and value in rule.also:
        return True
    interval = rule.ints if isinstance(value, int) and rule.ints is not None else rule.reals
    return interval is not None and inside(interval, value)


def refused(key: str, value) -> str | None:
    """check_ranges's one-line message for `value` of `key`, or None if it passes."""
    try:
        check_ranges(namespace(key, value))
    except ValueError as e:
        return str(e)
    return None


@pytest.fixture
def ranges_only(monkeypatch):
    """The range checks alone: with the machine's memory unknown, the size of a model is not judged."""
    monkeypatch.setattr("lit_attn.training.ranges.physical_memory", lambda: None)


@pytest.mark.parametrize("key", list(RANGES))
def test_every_probe_is_accepted_or_refused_in_one_line_naming_the_flag(key, ranges_only):
    rule = RANGES[key]
    for value in PROBES:
        message = refused(key, value)
        if valid(rule, value):
            assert message is None, (key, value, message)
        else:
            assert message is not None, (key, value)
            assert "\n" not in message and message.startswith(f"{flag(key)} must be ")
            assert message.endswith(f"got {value!r}") and rule.hint in message


@pytest.mark.parametrize("key,value,ok", [
    ("timing.peak_flops", -1.0, False), ("timing.peak_flops", 0.0, False), ("timing.peak_flops", 9.89e14, True),
    ("timing.peak_flops", None, True), ("timing.peak_flops", float("nan"), False),
    ("timing.window_size", 0, False), ("timing.window_size", -1, False),
    ("timing.window_size", 1, False), ("timing.window_size", 2, True),
    ("samples.max_new_tokens", -1, False), ("samples.max_new_tokens", 0, True),
    ("samples.temperature", -1.0, False), ("samples.temperature", 0.0, True), ("samples.temperature", 0.8, True),
    ("samples.top_k", 0, False), ("samples.top_k", -1, False), ("samples.top_k", None, True),
    ("trainer.gradient_clip_val", -1.0, False), ("trainer.gradient_clip_val", 0.0, True),
    ("trainer.gradient_clip_val", float("inf"), False),
    ("trainer.max_time", "00:00:00:00", False), ("trainer.max_time", "00:00:01:00", True),
    ("trainer.max_time", {"seconds": 0}, False), ("trainer.max_time", {"hours": 1}, True),
    ("trainer.max_time", "1:2", False), ("trainer.max_time", None, True),
    ("trainer.val_check_interval", 0, False), ("trainer.val_check_interval", 0.0, False),
    ("trainer.val_check_interval", 1.5, False), ("trainer.val_check_interval", 1.0, True),
    ("trainer.val_check_interval", 250, True), ("trainer.val_check_interval", "00:01:00:00", True),
    ("trainer.accumulate_grad_batches", 0, False), ("trainer.accumulate_grad_batches", 1, True),
    ("trainer.devices", -2, False), ("trainer.devices", "-2", False), ("trainer.devices", 0, False),
    ("trainer.devices", -1, True), ("trainer.devices", "auto", True), ("trainer.devices", "0,1", True),
    ("trainer.devices", [0, 1], True), ("trainer.devices", [], False), ("trainer.devices", [-1], False),
    ("trainer.devices", "many", False),
    ("trainer.max_steps", 0, False), ("trainer.max_steps", -1, True), ("trainer.max_steps", -2, False),
    ("trainer.max_epochs", 0, False), ("trainer.max_epochs", -1, True),
    ("trainer.limit_train_batches", 0, False), ("trainer.limit_train_batches", 0.0, False),
    ("trainer.limit_train_batches", 0.25, True), ("trainer.limit_val_batches", 0, True),
    ("trainer.limit_val_batches", 1.5, False), ("trainer.limit_val_batches", 50, True),
    ("trainer.num_sanity_val_steps", -1, True), ("trainer.num_sanity_val_steps", -2, False),
    ("model.dropout", 1.0, False), ("model.dropout", 0.0, True), ("model.lr", 0.0, False),
    ("model.attn_dropout", 1.0, False), ("model.attn_dropout", None, True), ("model.embd_dropout", -0.1, False),
    ("model.embd_dropout", 0.1, True),
    ("model.lr", float("inf"), False), ("model.betas", (0.9, 0.95), True), ("model.betas", [0.9, 1.0], False),
    ("model.betas", [0.9], False), ("model.betas", [0.9, float("nan")], False),
    ("model.warmup_fraction", 1.0, True), ("model.warmup_fraction", 1.5, False),
    ("model.block_size", 100_000_000, True),  # in range: the memory check judges the size
    ("data.init_args.batch_size", 0, False), ("data.init_args.val_fraction", 0.0, False),
    ("data.init_args.val_fraction", 1.0, False), ("data.init_args.vocab_size", 1, False),
    ("data.init_args.vocab_size", 64, True), ("data.init_args.power_a", 0.0, False),
    ("data.init_args.seed", None, True), ("data.init_args.seed", 2**32, False),
    ("seed_everything", True, True), ("seed_everything", -1, False), ("seed_everything", 2**32 - 1, True),
    ("checkpoint.every_n_train_steps", 0, True), ("checkpoint.every_minutes", 0.0, False),
    ("nan_guard.check_every_n_steps", 0, False),
])
def test_the_ranges_of_options_that_trained_or_crashed(key, value, ok, ranges_only):
    message = refused(key, value)
    assert (message is None) == ok, message


def test_data_options_of_a_foreign_datamodule_are_left_to_it():
    cfg = namespace("data.init_args.batch_size", 0)
    cfg["data.class_path"] = "lightning.pytorch.demos.boring_classes.BoringDataModule"
    check_ranges(cfg)


# ---- the table covers every numeric option ----


def _numeric(tp) -> bool:
    if tp in (int, float):
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType, list, tuple):
        return any(_numeric(arg) for arg in typing.get_args(tp))
    return False  # bool, str, Literal choices and mappings are checked by the parser


def _parameters(cls) -> dict[str, object]:
    hints = {k: v for k, v in typing.get_type_hints(cls.__init__).items() if k not in ("return", "architecture")}
    if cls is GPT:  # its **architecture goes to GPTConfig, whose fields the CLI shows as --model.* flags
        hints |= typing.get_type_hints(GPTConfig)
    return hints


def numeric_options() -> set[str]:
    from lightning.pytorch import Trainer

    groups = [("trainer", Trainer), ("model", GPT), ("data.init_args", CharDataModule),
              ("data.init_args", WikipediaDataModule), ("data.init_args", MQARDataModule),
              *main.FORCED_CALLBACKS.items()]
    keys = {f"{prefix}.{name}" for prefix, cls in groups for name, tp in _parameters(cls).items() if _numeric(tp)}
    # trainer.max_time: a duration; model.vocab_size: set by the data; test_settings: (length, pairs) pairs, which
    # MQARDataModule checks itself
    return (keys | {"seed_everything", "trainer.max_time"}) - {"model.vocab_size", "data.init_args.test_settings"}


def test_every_numeric_option_has_a_range_and_every_range_an_option():
    options = numeric_options()
    assert "trainer.devices" in options and "timing.peak_flops" in options and "model.betas" in options
    assert sorted(options - set(RANGES)) == []
    assert sorted(set(RANGES) - options) == []


def parsed(monkeypatch, *args: str) -> Namespace:
    """The `fit` config main.py's parser makes of `args`, captured before anything is built."""
    captured = {}

    class Parsed(Exception):
        pass

    def capture(self):
        captured["cfg"] = self.config[self.subcommand]
        raise Parsed

    monkeypatch.setattr(main.LitAttnCLI, "before_instantiate_classes", capture)
    with pytest.raises(Parsed):
        main.main(["fit", *args])
    return captured["cfg"]


@pytest.mark.parametrize("args", [[], ["--data=WikipediaDataModule"], ["--model.pos=rope", "--model.ffn=swiglu"]])
def test_the_defaults_are_in_range(args, monkeypatch):
    check_ranges(parsed(monkeypatch, *args))


# ---- memory ----


@pytest.mark.parametrize("kw", [dict(), dict(pos="rope", n_layer=3), dict(attention="qsa", n_layer=3),
                                *[dict(attention=name, n_layer=2) for name in attention_names()]])
def test_model_size_counts_what_a_real_build_holds(kw):
    config = GPTConfig(vocab_size=50, n_embd=32, n_head=4, block_size=16, **kw)
    network = Transformer(config)
    params = sum(p.numel() for p in network.parameters())
    buffers = sum(b.numel() * b.element_size() for b in network.buffers())
    assert model_size(config) == (params, buffers)


def model_cfg(model: dict, data: dict | None = None) -> Namespace:
    cfg = Namespace(model=Namespace(**(dict(n_layer=1, n_embd=32, n_head=4, block_size=16) | model)))
    if data:
        cfg["data"] = Namespace(class_path="datamodules.WikipediaDataModule", init_args=Namespace(**data))
    return cfg


GIB = 2**30


@pytest.mark.parametrize("model,data,flag_named", [
    (dict(block_size=100_000_000), None, "--model.block_size (100000000)"),  # the position embedding
    (dict(block_size=100_000_000, pos="rope"), None, "--model.block_size (100000000)"),  # its RoPE tables
    (dict(n_embd=1_000_000, n_head=1), None, "--model.n_embd (1000000)"),
    (dict(n_layer=10**12), None, "--model.n_layer (1000000000000)"),
    (dict(), dict(vocab_size=2**32), "--data.vocab_size (4294967296)"),
])
def test_a_model_larger_than_memory_is_refused(model, data, flag_named, monkeypatch):
    monkeypatch.setattr("lit_attn.training.ranges.physical_memory", lambda: GIB)
    with pytest.raises(ValueError) as e:
        check_memory(model_cfg(model, data))
    message = str(e.value)
    assert "\n" not in message and flag_named in message and "more than this machine's 1.0 GiB of memory" in message


def test_memory_counts_training_state_only_to_fit(monkeypatch):
    # 25.2M parameters: 96 MiB of float32 weights, 385 MiB with their gradients and AdamW's two moments.
    cfg = model_cfg(dict(n_embd=1024, n_layer=2, n_head=4))
    monkeypatch.setattr("lit_attn.training.ranges.physical_memory", lambda: 300 * 2**20)
    check_memory(cfg, "validate")
    with pytest.raises(ValueError, match="weights, gradients and optimizer state"):
        check_memory(cfg, "fit")


# ---- end to end ----


@pytest.mark.parametrize("args,named", [
    (["--timing.peak_flops=-1"], "--timing.peak_flops must be > 0 (a device's peak FLOP/s, e.g. 9.89e14), got -1.0"),
    (["--samples.max_new_tokens=-1"], "--samples.max_new_tokens must be"),
    (["--samples.temperature=-1"], "--samples.temperature must be"),
    (["--trainer.gradient_clip_val=-1"], "--trainer.gradient_clip_val must be"),
    (["--trainer.val_check_interval=0"], "--trainer.val_check_interval must be"),
    (["--trainer.accumulate_grad_batches=0"], "--trainer.accumulate_grad_batches must be"),
    (["--trainer.devices=-2"], "--trainer.devices must be"),
    (["--timing.window_size=0"], "--timing.window_size must be"),
    (["--timing.window_size=-1"], "--timing.window_size must be"),
    (["--samples.top_k=0"], "--samples.top_k must be"),
    (["--samples.top_k=-1"], "--samples.top_k must be"),
    (["--model.lr=1e400"], "--model.lr must be > 0 (AdamW's learning rate, e.g. 1e-3), got inf"),
    (["--model.block_size=100000000", "--model.n_embd=4096", "--model.n_head=4"], "--model.block_size (100000000)"),
])
def test_refused_before_anything_is_created(args, named, tmp_path, capsys):
    runs = tmp_path / "runs"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", "--model.n_layer=1", "--model.n_embd=32",
                "--model.n_head=4", "--model.block_size=16", *args])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and named in lines[0], err[-1500:]
    assert "Traceback" not in err
    assert not runs.exists()
    assert torch.get_default_device().type == "cpu"  # the meta-device count left the default alone
