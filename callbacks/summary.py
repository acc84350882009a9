"""Lightning's model summary without FLOPs it never counted."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

from lit_attn.training.lightning_compat import model_summary_settings

# Columns of numbers, right-aligned as Lightning aligns them.
_RIGHT = {"Params", "Params per Device", "FLOPs", "In sizes", "Out sizes"}


class CountedFlopsModelSummary(RichModelSummary):
    """RichModelSummary that leaves out the FLOPs column and "Total FLOPs" when nothing was counted.

    Lightning counts FLOPs only by running the module's `example_input_array` (the GPT has
    none) and otherwise prints a column of zeros and "Total FLOPs: 0". The training FLOPs
    are counted by TimingMonitor. With a count, the summary is Lightning's own.
    """

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            RichModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                       total_training_modes, total_flops, **summarize_kwargs)
            return
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            style = "dim" if name == " " else "white" if name in ("In sizes", "Out sizes") else None
            table.add_column(name, justify="right" if name in _RIGHT else "left", style=style,
                             no_wrap=name == "Name")
        for row in zip(*(values for _, values in columns)):
            table.add_row(*row)
        console = get_console()
        console.print(table)

        grid = Table.grid(expand=True)
        grid.add_column()
        for label, value in (
            ("Trainable params", get_human_readable_count(int(trainable_parameters))),
            ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
            ("Total params", get_human_readable_count(int(total_parameters))),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
        ):
            grid.add_row(f"[bold]{label}[/]: {value}")
        console.print(grid)


def use_counted_flops_summary(trainer: L.Trainer) -> bool:
    """Replace the RichModelSummary in `trainer.callbacks` (Lightning's default) by a CountedFlopsModelSummary
    with its settings (max_depth, ...); returns whether there was one. Call before fit starts (the summary
    prints in `on_fit_start`)."""
    summary = next((cb for cb in trainer.callbacks if type(cb) is RichModelSummary), None)
    if summary is None:
        return False
    replace_callback(trainer, summary, CountedFlopsModelSummary(**model_summary_settings(summary)))
    return True


def replace_callback(trainer: L.Trainer, old: L.Callback, new: L.Callback) -> None:
    """Put `new` in `old`'s place in `trainer.callbacks`, from a callback's `setup`.

    Lightning walks the live list when it calls a hook (trainer/call.py, `_call_callback_hooks`), so a
    callback put after the one calling this still gets this `setup` call (Lightning's default progress
    bar and model summary come after the configured callbacks); `trainer.progress_bar_callback` looks
    its bar up in the list.
    """
    trainer.callbacks[trainer.callbacks.index(old)] = new
