"""A fit's command line read as `lit-attn fit` reads it, with its checks, and nothing built, run or written."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from jsonargparse import ArgumentError

from datamodules.windows import WindowDataModule
from lit_attn import GPT
from lit_attn.cli.lightning_cli import DEFAULT_CONFIG, LitAttnCLI
from lit_attn.cli.parser import LitAttnParser, parse_error_line
from lit_attn.cli.run_config import check_config_files


class _Parsed(Exception):
    def __init__(self, config: Any):
        super().__init__("parsed")
        self.config = config


class _ParseOnly(LitAttnCLI):
    """The fit's parser and its checks on the parsed config (attention, ranges, resources); stops before the run
    directory, the checkpoint or any object exists."""

    def parse_arguments(self, parser, args) -> None:
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as e:
            own = getattr(e.__cause__, "subcommand_parser", None) or parser
            raise ValueError(parse_error_line(own, str(e))) from None
        raise _Parsed(self.config)


def parse_fit(args: Sequence[str]) -> Any:
    """The config (a jsonargparse Namespace) `lit-attn fit ARGS` would train with; ValueError in one line for
    arguments the fit would refuse before it builds anything (an unknown flag, a value of the wrong type or out of
    its range)."""
    args = list(args)
    check_config_files(args)
    try:
        with warnings.catch_warnings():
            # Lightning warns when the process's own argv (here the sweep's) sits beside `args`: reading `args` is
            # the point
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            _ParseOnly(GPT, WindowDataModule, subclass_mode_data=True, run=False, load_from_checkpoint_support=False,
                       parser_class=LitAttnParser, args=args,
                       parser_kwargs={"default_config_files": [str(DEFAULT_CONFIG)], "exit_on_error": False})
    except _Parsed as parsed:
        return parsed.config
    raise AssertionError("the fit's parser returned without a config")
