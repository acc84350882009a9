"""A sweep's option grids: `--grid KEY=V1,V2,...` (repeatable; the cross product), their checks and run names.

A grid point is one value per grid key. Its part of a run name is `SHORTVALUE` per key, in the order the grids
were given, joined by `-`: SHORT is the key's last part (`model.lr` -> `lr`; the whole key, dots kept, when two
grid keys end alike) and VALUE the value as written (`4.6e-4`), so the same command names the same runs again
and `PREFIX-mha-lr4.6e-4-s1` reads as what it trained. Each value is read by the fit's own parser before any
run starts, which also says which config key it sets and the value the run's saved config must hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lit_attn.cli.required_settings import lookup
from lit_attn.tools.best_of import short_names

# The options the sweep sets itself, and which of its own flags to use instead.
OWN_KEYS = {
    "model.attention": "--attention",
    "seed_everything": "--seeds",
    "run": "--prefix",
    "runs_dir": "--runs_dir",
    "ckpt_path": "nothing (the sweep starts or resumes each run)",
}


@dataclass(frozen=True)
class Grid:
    """One `--grid` option: its key as given (`model.lr`), the config key it sets (`data.init_args.X` for
    `data.X`), its values as written and as the run's config holds them (JSON-plain), and its short name."""

    key: str
    config_key: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]
    short: str


def parse_grid(text: str) -> tuple[str, list[str]]:
    """'model.lr=1e-4,1e-3' -> ('model.lr', ['1e-4', '1e-3']); ValueError (one line) for a malformed grid."""
    key, sep, rest = text.partition("=")
    key = key.strip().removeprefix("--")
    if not sep or not key:
        raise ValueError(f"--grid {text!r} is not KEY=VALUE,VALUE,...; e.g. --grid model.lr=1e-4,1e-3")
    key = re.sub(r"^data\.init_args\.", "data.", key)
    values = [v.strip() for v in rest.split(",")]
    if not rest.strip() or not all(values):
        raise ValueError(f"--grid {key} has an empty value list or an empty value ({text!r}); give values "
                         f"separated by commas, e.g. --grid {key}=1,2")
    if len(set(values)) != len(values):
        twice = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(f"--grid {key} lists {', '.join(twice)} twice: each grid point is one run per attention "
                         f"and seed; give distinct values")
    from lit_attn.cli.runs import RUN_NAME  # imports Lightning: only for a grid

    for value in values:
        if not RUN_NAME.fullmatch(f"x{value}"):
            raise ValueError(f"--grid {key}={value} cannot name a run (a run name takes letters, digits, '.', '_' "
                             "and '-'); sweep such values with one sweep and --prefix per value")
    return key, values


def check_grids(texts: Sequence[str], extra: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The parsed `--grid` options; ValueError for a key given twice, one the sweep sets itself, or one also
    given after `--`."""
    grids = [parse_grid(text) for text in texts]
    keys = [key for key, _ in grids]
    for key in keys:
        if keys.count(key) > 1:
            raise ValueError(f"--grid {key} is given twice; list all its values in one --grid {key}=V1,V2,...")
        if key in OWN_KEYS:
            raise ValueError(f"--grid {key} is set by the sweep for every run; use {OWN_KEYS[key]} instead")
        flags = {f"--{key}", f"--{key.replace('data.', 'data.init_args.', 1)}"}
        given = next((arg for arg in extra if arg.split("=", 1)[0] in flags), None)
        if given is not None:
            raise ValueError(f"--grid {key} and {given} after `--` both set {key}: remove one of them")
    return grids


def read_grids(grids: Sequence[tuple[str, list[str]]], fit_args: Sequence[str]) -> list[Grid]:
    """Each grid with its values as the fit reads them: every value is parsed by the fit's parser with
    `fit_args` (the sweep's --config files and the arguments after `--`), so a key that is not a fit option, or
    a value the option refuses, is a one-line ValueError naming --grid before any run starts."""
    if not grids:
        return []
    from lit_attn.cli.fit_parse import parse_fit  # the fit's parser imports Lightning: only for a grid

    shorts = short_names([key for key, _ in grids])
    out = []
    for key, texts in grids:
        values, config_key = [], key
        for text in texts:
            try:
                cfg = parse_fit([*fit_args, f"--{key}={text}"])
            except ValueError as e:
                raise ValueError(f"--grid {key}={text}: {e}") from None
            config_key = key.replace("data.", "data.init_args.", 1) if key.startswith("data.") else key
            value = lookup(cfg, config_key)
            values.append(json.loads(json.dumps(value.as_dict() if hasattr(value, "as_dict") else value)))
        out.append(Grid(key, config_key, tuple(texts), tuple(values), shorts[key]))
    return out


def points(grids: Sequence[Grid]) -> list[tuple[tuple[Grid, int], ...]]:
    """The cross product of the grids, the first grid's values varying slowest: ((grid, value index), ...)."""
    out: list[tuple[tuple[Grid, int], ...]] = [()]
    for grid in grids:
        out = [(*point, (grid, i)) for point in out for i in range(len(grid.texts))]
    return out


def point_name(point: Sequence[tuple[Grid, int]]) -> str:
    """The grid point's part of a run name: 'lr4.6e-4-dropout0.1'."""
    return "-".join(f"{grid.short}{grid.texts[i]}" for grid, i in point)
