"""Every numeric option has a valid range, checked before anything is built or written: the project's own options
by their types (lit_attn.bounds), read by the parser and by the classes themselves; Lightning's by ranges.RANGES."""

from __future__ import annotations

import math
import types
import typing

import pytest
import torch
from jsonargparse import Namespace

import lit_attn.cli.lightning_cli as main
from datamodules import CharDataModule, MQARDataModule, PasskeyDataModule, WikipediaDataModule
from lit_attn import GPT, GPTConfig, Transformer
from lit_attn.attention import attention_names
from lit_attn.bounds import Bounded, OutOfRange, bounded, check_bounds
from lit_attn.cli.fit_parse import parse_fit
from lit_attn.cli.lightning_cli import cli
from lit_attn.cli.ranges import RANGES, check_memory, check_ranges, flag, model_size

DATA_CLASSES = (CharDataModule, WikipediaDataModule, MQARDataModule, PasskeyDataModule)
PROBES = [0, -1, 1, 2, 10**12, 0.5, 1.0, -0.5, 1e30, -1e30, float("nan"), float("inf"), float("-inf"), True, None]


# ---- the project's options: a range is a type ----


def _bounded(hint) -> tuple[type[Bounded] | None, bool, bool]:
    """(the Bounded type in `hint`, whether null is valid too, whether it is a tuple of them)."""
    if isinstance(hint, type) and issubclass(hint, Bounded):
        return hint, False, False
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return _bounded(next(a for a in args if a is not type(None)))[0], True, False
    if typing.get_origin(hint) is tuple and args and isinstance(args[0], type) and issubclass(args[0], Bounded):
        return args[0], False, True
    return None, False, False


def _hints(cls) -> dict[str, object]:
    hints = {k: v for k, v in typing.get_type_hints(cls.__init__).items() if k not in ("return", "architecture")}
    if cls is GPT:  # its **architecture goes to GPTConfig, whose fields the CLI shows as --model.* flags
        hints |= typing.get_type_hints(GPTConfig)
    return hints


def _typed_options() -> list[tuple[str, type, str, object]]:
    """(flag key, class, parameter name, hint) of every option of the project's classes with a Bounded type."""
    groups = [("model", GPT), *(("data", cls) for cls in DATA_CLASSES), *main.FORCED_CALLBACKS.items()]
    return [(f"{prefix}.{name}", cls, name, hint) for prefix, cls in groups for name, hint in _hints(cls).items()
            if _bounded(hint)[0] is not None and (prefix, name) != ("model", "vocab_size")]  # vocab: the data's


def outside(t: type[Bounded]) -> list:
    """Values just outside the range of `t`, on each side it has."""
    values = []
    if t.low is not None:
        values.append(t.base(t.low if t.open_low else t.low - 1))
    if t.high is not None:
        values.append(t.base(t.high if t.open_high else t.high + 1))
    return values


# data.block_size is set by --model.block_size only (its own flag is refused as such)
TYPED = [(key, cls, name, hint, value) for key, cls, name, hint in _typed_options() if key != "data.block_size"
         for value in outside(_bounded(hint)[0])]


@pytest.mark.parametrize("key,cls,name,hint,value", TYPED, ids=[f"{t[0]}={t[4]}" for t in TYPED])
def test_every_typed_option_refuses_a_value_out_of_range_in_one_line(key, cls, name, hint, value):
    """The parser's refusal (as `lit-attn fit` and a sweep's --grid check read the flag) names the flag, the range
    (its type's) and the value; the class refuses the same value given from Python."""
    t, nullable, many = _bounded(hint)
    given = f"[{value}, {value}]" if many else str(value)
    data = [f"--data={cls.__name__}"] if key.startswith("data.") else []
    with pytest.raises(ValueError) as e:
        parse_fit([*data, f"--{key}={given}"])
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(f"--{key} must be {t.describe()}{' or null' if nullable else ''} ("), line
    assert line.endswith(f", got {value!r}"), line
    with pytest.raises(OutOfRange, match=rf"^{name} must be "):
        owner = GPTConfig if cls is GPT and name in typing.get_type_hints(GPTConfig) else cls.__init__
        check_bounds(owner, {name: [value, value] if many else value})


@pytest.mark.parametrize("yaml,line", [
    ("model:\n  n_layer: 0\n", "--model.n_layer must be an integer >= 1 (number of transformer blocks), got 0"),
    ("data:\n  init_args:\n    batch_size: -3\n", "--data.batch_size must be an integer >= 1 (windows per batch (per "
                                                  "device)), got -3"),
    ("data:\n  class_path: datamodules.MQARDataModule\n  init_args:\n    power_a: 0\n",
     "--data.power_a must be a number > 0 ("),
    ("timing:\n  window_size: 1\n", "--timing.window_size must be an integer >= 2 ("),
])
def test_a_config_files_value_out_of_range_is_named_by_its_flag(yaml, line, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml)
    with pytest.raises(ValueError) as e:
        parse_fit([f"--config={config}"])
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_the_classes_check_their_types_ranges_from_python():
    with pytest.raises(ValueError, match=r"^n_layer must be an integer >= 1, got 0$"):
        GPTConfig(vocab_size=16, n_layer=0)
    with pytest.raises(ValueError, match=r"^attn_dropout must be a number in \[0, 1\) or null, got 1.0$"):
        GPTConfig(vocab_size=16, attn_dropout=1.0)
    with pytest.raises(ValueError, match=r"^betas must be two numbers, each in \[0, 1\), got \[0.9, 1.0\]$"):
        GPT(vocab_size=16, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"^batch_size must be an integer >= 1, got 0$"):
        CharDataModule(batch_size=0)
    with pytest.raises(ValueError, match=r"^window_size must be an integer >= 2, got 1$"):
        main.TimingMonitor(window_size=1)


AtLeast3 = bounded("AtLeast3", int, 3)


def _takes(x: AtLeast3 = 3, y: AtLeast3 | None = None) -> None:  # a signature with a new range type
    check_bounds(_takes, locals())


def test_a_new_type_is_a_range_for_both():
    """A range written once, as a type: the library's check and the parser's read it."""
    from jsonargparse import ArgumentParser

    from lit_attn.cli.option_types import range_refusal, register_bounded_types

    f = _takes

    f(3)
    with pytest.raises(OutOfRange, match="x must be an integer >= 3, got 2"):
        f(2)
    with pytest.raises(OutOfRange, match="y must be an integer >= 3 or null, got 1"):
        f(3, 1)
    assert AtLeast3.read("4") == 4 and type(AtLeast3.read("4")) is int  # what the parser stores: a plain int
    for bad in ("2", "abc", "3.5", "nan", True):
        with pytest.raises(OutOfRange):
            AtLeast3.read(bad)
    register_bounded_types()
    parser = ArgumentParser(exit_on_error=False)
    parser.add_function_arguments(_takes, "f")
    assert parser.parse_args(["--f.x=4", "--f.y=null"]).f == Namespace(x=4, y=None)
    with pytest.raises(Exception) as e:
        parser.parse_args(["--f.y=2"])
    assert range_refusal(str(e.value), "f.y", "a hint.") == "--f.y must be an integer >= 3 or null (a hint), got 2"
    later = bounded("DefinedAfterTheParser", int, 5)  # e.g. by a data class a --data class_path imports
    parser.add_argument("--z", type=later)
    with pytest.raises(Exception) as e:
        parser.parse_args(["--z=4"])
    assert range_refusal(str(e.value), "z") == "--z must be an integer >= 5, got 4"


# ---- Lightning's options: the table ----


def namespace(key: str, value) -> Namespace:
    cfg = Namespace()
    cfg[key] = value
    return cfg


def valid(rule, value) -> bool:
    """What the rule's declared ranges say about a scalar probe: NaN and infinities are never valid."""
    if value is None:
        return rule.none
    if isinstance(value, bool):
        return rule.bools
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if isinstance(value, int) and value in rule.also:
        return True
    t = rule.ints if isinstance(value, int) and rule.ints is not None else rule.reals
    if t is None:
        return False
    above = t.low is None or (value > t.low if t.open_low else value >= t.low)
    below = t.high is None or (value < t.high if t.open_high else value <= t.high)
    return above and below


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
    monkeypatch.setattr("lit_attn.cli.ranges.physical_memory", lambda: None)


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
    ("seed_everything", True, True), ("seed_everything", -1, False), ("seed_everything", 2**32 - 1, True),
])
def test_the_ranges_of_options_that_trained_or_crashed(key, value, ok, ranges_only):
    message = refused(key, value)
    assert (message is None) == ok, message


# ---- every numeric option has a range, in one place ----


def _numeric(tp) -> bool:
    if tp in (int, float) or (isinstance(tp, type) and issubclass(tp, Bounded)):
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType, list, tuple):
        return any(_numeric(arg) for arg in typing.get_args(tp))
    return False  # bool, str, Literal choices and mappings are checked by the parser


def numeric_options() -> set[str]:
    """Every numeric option of `lit-attn fit`, by dotted config key."""
    from lightning.pytorch import Trainer

    groups = [("trainer", Trainer), ("model", GPT), *(("data.init_args", cls) for cls in DATA_CLASSES),
              *main.FORCED_CALLBACKS.items()]
    keys = {f"{prefix}.{name}" for prefix, cls in groups for name, tp in _hints(cls).items() if _numeric(tp)}
    # trainer.max_time: a duration; model.vocab_size: set by the data; test_settings: (length, pairs) pairs, which
    # MQARDataModule checks itself; min_length: between a passkey prompt's length and block_size, checked by
    # PasskeyDataModule
    return ((keys | {"seed_everything", "trainer.max_time"})
            - {"model.vocab_size", "data.init_args.test_settings", "data.init_args.min_length"})


def test_every_numeric_option_has_its_range_in_one_place():
    typed = {key.replace("data.", "data.init_args.", 1) for key, *_ in _typed_options()}
    options = numeric_options()
    assert "trainer.devices" in options and "timing.peak_flops" in options and "model.betas" in options
    assert sorted(options - typed - set(RANGES)) == []  # every option has a range...
    assert sorted(typed & set(RANGES)) == []  # ...in one place: a type, or (Lightning's options) the table
    assert all(key == "seed_everything" or key.startswith("trainer.") for key in RANGES)
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
    monkeypatch.setattr("lit_attn.cli.ranges.physical_memory", lambda: GIB)
    with pytest.raises(ValueError) as e:
        check_memory(model_cfg(model, data))
    message = str(e.value)
    assert "\n" not in message and flag_named in message and "more than this machine's 1.0 GiB of memory" in message


def test_memory_counts_training_state_only_to_fit(monkeypatch):
    # 25.2M parameters: 96 MiB of float32 weights, 385 MiB with their gradients and AdamW's two moments.
    cfg = model_cfg(dict(n_embd=1024, n_layer=2, n_head=4))
    monkeypatch.setattr("lit_attn.cli.ranges.physical_memory", lambda: 300 * 2**20)
    check_memory(cfg, "validate")
    with pytest.raises(ValueError, match="weights, gradients and optimizer state"):
        check_memory(cfg, "fit")


# ---- end to end ----


@pytest.mark.parametrize("args,named", [
    (["--timing.peak_flops=-1"], "--timing.peak_flops must be a number > 0 or null (one device's peak FLOP/s for "
                                 "MFU, for devices Lightning's table lacks (or to use a dense figure where its table "
                                 "quotes sparse ones)), got -1.0"),
    (["--samples.top_k=0"], "--samples.top_k must be an integer >= 1 or null (sample among the k most likely tokens "
                            "only (None = all)), got 0"),
    (["--data.val_fraction=nan"], "--data.val_fraction must be a number in (0, 1) (fraction of the text held out "
                                  "for validation, just before the test split), got nan"),
    (["--trainer.gradient_clip_val=-1"], "--trainer.gradient_clip_val must be"),
    (["--trainer.devices=-2"], "--trainer.devices must be"),
    (["--model.lr=1e400"], "--model.lr must be a number > 0 (AdamW's learning rate, e.g. 1e-3), got inf"),
    (["--model.block_size=100000000", "--model.n_embd=4096", "--model.n_head=4"], "--model.block_size (100000000)"),
])
def test_refused_before_anything_is_created(args, named, tmp_path, capsys):
    runs = tmp_path / "runs"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    try:
        code = cli(["fit", f"--data.path={corpus}", f"--runs_dir={runs}", "--model.n_layer=1", "--model.n_embd=32",
                    "--model.n_head=4", "--model.block_size=16", *args])
    except SystemExit as e:  # the parser's own exit, on a value out of its type's range
        code = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and named in lines[0], err[-1500:]
    assert "Traceback" not in err
    assert not runs.exists()
    assert torch.get_default_device().type == "cpu"  # the meta-device count left the default alone
