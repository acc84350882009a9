"""lit-attn command line: `python main.py fit|validate|test|predict [--config FILE] [--model.attention NAME] ...`

configs/default.yaml is always loaded first; later --config files and flags override it.
Set LIT_ATTN_DEBUG=1 to see full tracebacks for the one-line errors.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from datamodules.windows import WindowDataModule
from lit_attn import GPT

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"

# User mistakes (bad values, missing files, no network) end in one line, not a traceback.
USER_ERRORS = (ValueError, FileNotFoundError, ConnectionError)


class LitAttnCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # One context length, set on the model, drives the data windows too.
        parser.link_arguments("model.block_size", "data.init_args.block_size")
        # The vocabulary is a property of the data, known once the datamodule exists.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as e:
            # jsonargparse folds a datamodule constructor's error into a multi-line
            # "Union subtypes" report; building it directly re-raises the real one-line error.
            if "Union subtypes" not in str(e):
                raise
            data = (self.config[self.subcommand] if self.subcommand else self.config).data
            module, _, name = data.class_path.rpartition(".")
            getattr(importlib.import_module(module), name)(**dict(data.init_args))
            raise


def main(args: list[str] | None = None) -> None:
    LitAttnCLI(
        GPT,
        WindowDataModule,
        subclass_mode_data=True,
        parser_kwargs={
            cmd: {"default_config_files": [str(DEFAULT_CONFIG)]} for cmd in ("fit", "validate", "test", "predict")
        },
        args=args,
    )


if __name__ == "__main__":
    try:
        main()
    except USER_ERRORS as e:
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
