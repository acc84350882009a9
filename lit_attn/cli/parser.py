"""What main.py's parser prints: a bad flag in one line, and a short `--help` of the options users set,
with the defaults that really run.

LightningCLI's own help lists every Trainer and callback argument (hundreds of lines) and shows a
data class's options only under `--data.help CLASS`. The short help lists the common options, each
with its default as resolved from configs/default.yaml and the classes; `--help_all` prints the full one.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from typing import Any

from jsonargparse import ArgumentParser
from lightning.pytorch.cli import LightningArgumentParser

from lit_attn.attention.registry import describe_names, describe_options
from lit_attn.cli.option_types import range_refusal, register_bounded_types
from lit_attn.cli.toolcli import one_line_parse_error

# The options a user sets, by section; each is a flag of the subcommand (data.* of the data class).
COMMON = {
    "Run": ("config", "run", "runs_dir", "ckpt_path", "untrained", "seed_everything"),
    "Model": ("model.attention", "model.attention_options", "model.layer_pattern", "model.local_window",
              "model.n_layer", "model.n_embd", "model.n_head", "model.n_query_heads", "model.n_kv_heads",
              "model.block_size", "model.pos", "model.norm", "model.ffn",
              "model.dropout", "model.lr", "model.weight_decay", "model.warmup_fraction", "model.min_lr_ratio"),
    "Data": ("data", "data.path", "data.batch_size", "data.val_fraction", "data.seed"),
    "Training": ("trainer.max_steps", "trainer.max_epochs", "trainer.val_check_interval",
                 "trainer.limit_val_batches", "trainer.precision", "trainer.accelerator", "trainer.devices",
                 "trainer.num_nodes", "trainer.gradient_clip_val", "trainer.accumulate_grad_batches",
                 "trainer.log_every_n_steps"),
    "Always on": ("checkpoint.every_n_train_steps", "timing.peak_flops", "samples.max_new_tokens"),
}

# What each subcommand does (LightningCLI would show the Trainer method's docstring).
DESCRIPTIONS = {
    "fit": "Train a GPT: a new run, or resume one with --run NAME --ckpt_path last (or auto), from the run's own "
           "config (flags override it); a run already at its end is left as it is (one line, exit status 0).",
    "validate": "Evaluate a run's checkpoint on the validation data (--run NAME); results go to RUN/eval/validate-N.",
    "test": "Evaluate a run's checkpoint on the test data (--run NAME); results go to RUN/eval/test-N.",
    "predict": "Run a checkpoint over the prediction data (--run NAME); outputs go to RUN/eval/predict-N.",
}

# Help texts that the project states better than the libraries it takes them from.
# Built when help is shown: an attention registered by the user's own code is listed too.
ATTENTION_HELP = {"model.attention": lambda: f"The attention: {describe_names()}",
                  "model.attention_options": describe_options}
OWN_HELP = {
    "seed_everything": "Seed of the initialization and dropout, and of the data order unless --data.seed is set; "
                       "true draws one (written into the run's config).",
    "data.seed": "Data-order seed; none: the run's seed_everything. Set it to fix the order across seeds.",
    "data.path": "A UTF-8 text file; none: the default corpus (CPython's pydoc topics).",
    "run": "Run name: RUNS_DIR/RUN holds its events, config and checkpoints; none: ATTENTION-DATE-TIME.",
    "config": "A YAML config file (repeatable: later files override earlier ones, flags override files).",
    "data": "The data module: CharDataModule (character-level text) or WikipediaDataModule (BPE).",
}

CKPT_PATH_HELP = (
    "Checkpoint to start from: 'last' (the run's latest checkpoint; needs --run), 'auto' (fit: resume the run "
    "if it has a checkpoint, else start it; one command for jobs a scheduler restarts), or a file path. "
    "validate/test/predict with --run default to 'last'."
)


def _first_sentence(text: str | None) -> str:
    text = " ".join((text or "").split())
    if " (type:" in text:
        text = text[: text.index(" (type:")]
    end = re.search(r"(?<!\be\.g)(?<!\bi\.e)\. ", text)  # "e.g. 1e-3" ends no sentence
    return text[: end.start() + 1] if end else text


def _data_actions(data_class: str | None) -> dict[str, argparse.Action]:
    """The data class's constructor options as data.NAME actions (help text from its docstring)."""
    if not data_class:
        return {}
    module, _, name = data_class.rpartition(".")
    try:
        cls = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return {}
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "data")
    return {a.dest: a for a in parser._actions if a.dest.startswith("data.")}


def _default(defaults: Any, key: str) -> Any:
    if key == "data":
        return defaults.get("data.class_path")
    return defaults.get(f"data.init_args.{key[5:]}" if key.startswith("data.") else key)


def short_help(parser: ArgumentParser, prog: str) -> str:
    """The common options of a subcommand parser, with their resolved defaults."""
    defaults = parser.get_defaults()
    actions = {a.dest: a for a in parser._actions}
    actions.update(_data_actions(defaults.get("data.class_path")))
    lines = [f"usage: {prog} [--config FILE] [--OPTION VALUE ...]", ""]
    stage = prog.split()[-1]
    if stage in DESCRIPTIONS:
        lines += [DESCRIPTIONS[stage], ""]
    lines.append("Common options, with the defaults this command runs with (configs/default.yaml and the classes):")
    for section, keys in COMMON.items():
        shown = [key for key in keys if key in actions or key == "data"]
        if not shown:
            continue
        lines += ["", f"{section}:"]
        for key in shown:
            action = actions.get(key)
            help_text = OWN_HELP.get(key) or _first_sentence(getattr(action, "help", ""))
            if key in ATTENTION_HELP:
                help_text = ATTENTION_HELP[key]()
            if key == "ckpt_path":
                help_text = CKPT_PATH_HELP
            value = _default(defaults, key)
            value = "none" if value is None else value
            suffix = "" if key in ("config", "ckpt_path") else f" [default: {value}]"
            body = textwrap.wrap(help_text + suffix, 78)
            lines.append(f"  --{key}")
            lines += [f"      {line}" for line in body]
    lines += ["", "Every option: --help_all. A data class's own options: --data.help CharDataModule.",
              "Flags override --config files, which override configs/default.yaml."]
    return "\n".join(lines) + "\n"


class FullHelp(argparse.Action):
    """--help_all: LightningCLI's complete help, every Trainer and callback option included."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help(full=True)
        parser.exit()


# Examples for flags whose parse errors would otherwise only name a type.
FLAG_EXAMPLES = {
    "model.attention_options": """a JSON mapping, e.g. --model.attention_options '{"normalization": "softmax"}'""",
    "model.betas": "two numbers, e.g. --model.betas '[0.9, 0.95]'",
}


def _block(lines: list[str], key: str) -> list[str] | None:
    """The lines of jsonargparse's report under `Parser key "KEY":` (its deeper-indented ones), stripped."""
    start = next((i for i, line in enumerate(lines) if line.strip() == f'Parser key "{key}":'), None)
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start + 1:]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line.strip())
    return block


def data_parse_error(message: str) -> str | None:
    """jsonargparse's report on a bad `--data.NAME` value (a multi-line report on `--data`, the data class,
    ending in the value as `NestedArg(key=..., val=...)` for a flag) as one line naming the flag; None for another
    report. A value out of its type's range is said so from a config file's data section too."""
    lines = message.strip().splitlines()
    if not lines or lines[0].strip() != 'Parser key "data":':
        return None
    found = re.search(r"class_path '([\w.]+)'", message)
    cls = found.group(1).rpartition(".")[2] if found else "the data class"
    nested = re.search(r"NestedArg\(key='([^']+)', val=(.*)\)\s*$", message)
    inner = re.findall(r'Parser key "([^"]+)":', "\n".join(lines[1:]))
    key = nested.group(1) if nested is not None else (inner[0] if inner else None)
    if key is None:
        return None
    if nested is not None and re.search(rf"Option '{re.escape(key)}' is not accepted", message):
        return f"--data.{key} is not an option of {cls}; --data.help {cls} lists them"
    block = _block(lines, key)
    if block is None:
        return None
    action = _data_actions(found.group(1) if found else None).get(f"data.{key}")
    hint = _first_sentence(getattr(action, "help", ""))
    if (refused := range_refusal("\n".join(block), f"data.{key}", hint)) is not None:
        return refused
    if nested is None:
        return None
    union = next((line for line in block if line.startswith("Subtypes: [")), None)
    types = (re.findall(r"<class '(?:[\w.]+\.)?(\w+)'>|([\w.]+\[[^<]*?\]\])", union[len("Subtypes: "):])
             if union else re.findall(r"Expected a <class '(?:[\w.]+\.)?(\w+)'>", "\n".join(block)))
    names = [t if isinstance(t, str) else (t[0] or t[1]) for t in types]
    names = [{"NoneType": "null"}.get(n, n) for n in names]
    expected = " or ".join(dict.fromkeys(names)) or "another value"
    return f"--data.{key}={nested.group(2)} is invalid: expected {expected} ({cls})"


def parse_error_line(parser: ArgumentParser, message: str) -> str:
    """jsonargparse's report on a bad flag as one line naming the flag; a value out of its type's range
    (lit_attn.bounds) is said with the option's help as the hint."""
    key = re.match(r'Parser key "([^"]+)"', message.strip())
    if key is not None and key.group(1) != "data":
        action = next((a for a in parser._actions if a.dest == key.group(1)), None)
        if (refused := range_refusal(message, key.group(1), _first_sentence(getattr(action, "help", "")))):
            return refused
    return data_parse_error(message) or one_line_parse_error(message, examples=FLAG_EXAMPLES)


class LitAttnParser(LightningArgumentParser):
    """Reports a bad flag in one line (jsonargparse prints usage and a multi-line report); a subcommand's
    --help lists the common options with their real defaults (--help_all: every option). The range types of
    lit_attn.bounds are registered before any signature is read."""

    short_help = False  # set on the subcommand parsers

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        register_bounded_types()
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        ckpt = self._option_string_actions.get("--ckpt_path")
        if ckpt is not None:
            ckpt.help = CKPT_PATH_HELP
        if self.short_help and not getattr(self, "_full_help", False):
            return short_help(self, self.prog)
        return super().format_help()

    def print_help(self, file=None, full: bool = False) -> None:
        self._full_help = full
        super().print_help(file)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("LIT_ATTN_DEBUG") or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)
        line = parse_error_line(getattr(ex, "subcommand_parser", None) or self, message)
        sys.stderr.write(f"error: {line} (--help lists the flags)\n")
        sys.exit(2)
