"""The checks a command runs on its attention before it builds the model, each refusal one line that names
the attention, the problem and the fix.

`check_attention_setting` (before the range and memory checks, which build the attention on the meta
device): the attention is found; its options have the constructor's types (annotations, else the defaults'
types; seeds in numpy's range) and are all there; a class named by its import path builds on the meta device.
`check_user_attention` (a fit, after them): such a class (the model's, or a layer's in a layer pattern) passes
lit_attn.testing's causality, shape, dtype and finite-output checks at a tiny size, unless
`--skip_attention_check true`. Registered attentions are left to the test suite. An error raised in the user's
own code is shown with the user's frames above the line.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import sysconfig
import traceback
import typing
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml
from jsonargparse import ArgumentParser, Namespace

import lit_attn
from lit_attn.attention import attention_names, get_attention
from lit_attn.attention.registry import AttentionSpec
from lit_attn.bounds import check_bounds
from lit_attn.cli.toolcli import SEED_MAX
from lit_attn.config import GPTConfig, common_attention_args
from lit_attn.pattern import layer_cycle
from lit_attn.testing import check_before_training, check_builds

SKIP_FLAG = "--skip_attention_check"
OPTIONS_FLAG = "--model.attention_options"


def check_attention_setting(cfg: Any) -> None:
    """Refuse (ValueError) an attention that cannot be found, options it would not take or that have the wrong
    type, and a class named by its import path that cannot be built with the model's sizes; the options are
    replaced by their values as the constructor's types read them (e.g. "7" for an int: 7)."""
    model = cfg.get("model")
    if model is None:
        return
    try:
        spec = get_attention(model.attention)
    except ValueError as e:
        if e.__cause__ is not None:  # the user's module raised while it was imported
            _refuse(e, "")
        raise
    model.attention_options = checked_options(spec, model.attention_options)
    if not _sized(cfg):
        return  # the parser refuses the size
    args = spec.arguments(model.attention_options, _common(model))  # unknown and missing options
    if _is_users(model.attention):
        _refuse_failed(check_builds, spec, args)


def check_user_attention(cfg: Any, stage: str) -> None:
    """Before a fit: refuse (ValueError) a class named by its import path that fails the conformance checks
    of `lit_attn.testing.check_before_training`, unless cfg.skip_attention_check."""
    model = cfg.get("model")
    if stage != "fit" or model is None or cfg.get("skip_attention_check"):
        return
    if _is_users(model.attention):
        _refuse_failed(check_before_training, model.attention, model.attention_options, _common(model), skippable=True)
    if model.get("layer_pattern") is not None:  # a layer's own attention, named by its import path
        cycle = layer_cycle(model.layer_pattern, model.n_layer, model.attention, model.attention_options,
                            model.get("local_window"), model.block_size)
        for name, options in {repr(layer): layer for layer in cycle if _is_users(layer[0])}.values():
            if name.lower() != model.attention.lower():
                _refuse_failed(check_before_training, name, options, _common(model), skippable=True)


def check_before_launch(args: Sequence[str], attentions: Sequence[str]) -> None:
    """What each fit of the command line `args` (after `fit`) would check of each of `attentions` before
    building its model; for a tool that launches the fits (a sweep), before it starts any."""
    settings, skip = fit_settings(args)
    for name in attentions:
        cfg = Namespace(model=Namespace(**{**settings, "attention": name}), skip_attention_check=skip)
        check_attention_setting(cfg)
        if _sized(cfg):
            check_user_attention(cfg, "fit")


def _is_users(name: str) -> bool:
    """Whether `name` is an import path, not a registered attention (which the test suite checks)."""
    return name.lower() not in attention_names()


def _sized(cfg: Any) -> bool:
    """Whether the model's sizes are in their types' ranges (a value outside is refused by the parser, not here)."""
    model = cfg.get("model")
    try:
        check_bounds(GPTConfig, model.as_dict() if isinstance(model, Namespace) else dict(model))
    except ValueError:
        return False
    return True


def _common(model: Any) -> dict[str, Any]:
    return common_attention_args(model.as_dict() if isinstance(model, Namespace) else model)


# ---- options ----


def checked_options(spec: AttentionSpec, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`options` as the constructor's types read them; ValueError (one line naming the key) for a value of
    another type, NaN, or a seed (an option named seed or *_seed) outside 0..SEED_MAX. Options the
    constructor does not name are left to `AttentionSpec.arguments`."""
    if not options:
        return options  # type: ignore[return-value]
    parameters = inspect.signature(spec.cls).parameters
    try:
        hints = typing.get_type_hints(spec.cls.__init__)
    except Exception:  # an annotation that does not resolve: the defaults' types are checked instead
        hints = {}
    checked = {}
    for key, value in options.items():
        parameter = parameters.get(key)
        if parameter is None or key in spec.fixed:
            checked[key] = value
            continue
        expected = hints.get(key, _default_type(parameter.default))
        checked[key] = _checked(spec.name, key, value, expected, parameter.default)
    return checked


def _default_type(default: Any) -> Any:
    """The type an unannotated option takes: its default's (an integer default takes any number)."""
    if type(default) is int:
        return int | float
    return type(default) if type(default) in (bool, float, str) else Any


def _checked(attention: str, key: str, value: Any, expected: Any, default: Any) -> Any:
    where = f"{OPTIONS_FLAG} key {key!r} of attention {attention!r}"
    if key == "seed" or key.endswith("_seed"):
        if value is None and default is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
            raise ValueError(f"{where} is a seed: it must be an integer in [0, {SEED_MAX}], got {value!r}")
        return value
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{where} is NaN; give a number")
    if expected is Any or expected is inspect.Parameter.empty:
        return value
    if value is None and default is not None and not _admits_none(expected):
        raise ValueError(f"{where} must be {_type_name(expected)} (its constructor's type), got None")
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_argument("--value", type=expected)
    except Exception:  # a type jsonargparse cannot read: left to the constructor
        return value
    try:
        read = parser.parse_object({"value": value}).value
    except Exception:
        raise ValueError(f"{where} must be {_type_name(expected)} (its constructor's type), got {value!r}") from None
    return read if _plain(read) else value


def _admits_none(expected: Any) -> bool:
    return expected in (type(None), object) or type(None) in typing.get_args(expected)


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return value is None or isinstance(value, (bool, int, float, str))


def _type_name(expected: Any) -> str:
    return expected.__name__ if isinstance(expected, type) else str(expected).replace("typing.", "")


# ---- refusals ----


def _refuse_failed(check: Any, *args: Any, skippable: bool = False, **kwargs: Any) -> None:
    try:
        check(*args, **kwargs)
    except AssertionError as e:
        _refuse(e, f" (checked before training; {SKIP_FLAG} true skips the check)" if skippable else "")


def _refuse(e: Exception, suffix: str) -> NoReturn:
    """Raise the check's message as one line; an error from the user's own code is shown with its frames first."""
    cause = e.__cause__
    while cause is not None and not _own_frames(cause) and cause.__cause__ is not None:
        cause = cause.__cause__
    frames = _own_frames(cause) if cause is not None else []
    if frames:
        print("".join(traceback.format_list(frames)).rstrip(), file=sys.stderr, flush=True)
    raise ValueError(" ".join(str(e).split()) + suffix) from cause


# Where the frames that are not the user's come from: this project, torch, Python's own library.
_NOT_USERS = tuple(str(Path(p).resolve()) for p in (Path(lit_attn.__file__).parent, Path(torch.__file__).parent,
                                                      sysconfig.get_paths()["stdlib"]))


def _own_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of `error`'s traceback in the user's code."""
    return [frame for frame in traceback.extract_tb(error.__traceback__)
            if not frame.filename.startswith("<") and not str(Path(frame.filename).resolve()).startswith(_NOT_USERS)]


# ---- a fit's command line, read before it is launched ----


def fit_settings(args: Sequence[str]) -> tuple[dict[str, Any], bool]:
    """(model settings, whether to skip the check) of `lit-attn fit ARGS`, as the fit reads them: the
    defaults, configs/default.yaml, each --config file and each --model.KEY flag in order, --skip_attention_check.
    A cheap reading for a check before launching fits; the fit itself checks its fully parsed config."""
    settings = {f.name: f.default for f in dataclasses.fields(GPTConfig) if f.default is not dataclasses.MISSING}
    skip = False

    def apply(config: Any) -> None:
        nonlocal skip
        if isinstance(config, Mapping):
            if isinstance(config.get("model"), Mapping):
                settings.update({k: v for k, v in config["model"].items() if k != "init_args"})
            if "skip_attention_check" in config:
                skip = bool(config["skip_attention_check"])

    apply(yaml.safe_load(Path(str(resources.files("configs") / "default.yaml")).read_text()))
    args = list(args)
    for i, arg in enumerate(args):
        flag, has_value, value = arg.partition("=")
        if not flag.startswith("--"):
            continue
        if not has_value:
            following = args[i + 1] if i + 1 < len(args) else None
            value = following if following is not None and not following.startswith("--") else None
        if flag == "--config" and value is not None:
            try:
                apply(yaml.safe_load(Path(value).read_text()))
            except (OSError, yaml.YAMLError, UnicodeDecodeError):
                pass  # the fit reports it
        elif flag.startswith("--model.") and value is not None:
            settings[flag[len("--model."):]] = _yaml(value)
        elif flag == SKIP_FLAG:
            skip = value is None or _yaml(value) is True
    return settings, skip


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
