"""The best point of an option grid (`--best-of KEY[,KEY]` of compare and recall-grid): per group of runs (an
attention, a width), the grid point whose runs have the best mean over seeds of a validation metric, and a note
when it lies at the grid's edge.

The means are over the seeds every point of the group has: a grid tried on one seed and then given more seeds at
its chosen point keeps that choice, since a point's extra seeds would otherwise make its mean a different sample
from its neighbours'. Where the points share no seed, each point's mean is over its own.

A run's grid point is its values of the keys, read from its config.yaml (`model.lr`, `data.X` for
data.init_args.X: run_record.run_setting), so runs need not be named by the sweep's grid to be chosen among.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from lit_attn.tools import stats
from lit_attn.tools.run_record import run_setting


class Choice(NamedTuple):
    """The chosen point of one group: its values, the seed mean of the metric there, and the edge note (or None)."""

    point: tuple
    mean: float
    edge: str | None


def parse_keys(text: str | None) -> tuple[str, ...]:
    """'model.lr, data.power_a' -> ('model.lr', 'data.power_a'); data.init_args.X is data.X."""
    if text is None:
        return ()
    keys = tuple(k.strip().removeprefix("--").replace("data.init_args.", "data.", 1) for k in text.split(","))
    if not all(keys) or len(set(keys)) != len(keys):
        raise ValueError(f"--best-of takes distinct setting keys separated by commas, e.g. --best-of model.lr; "
                         f"got {text!r}")
    return keys


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """key -> its short name, in run names and table cells: the key's last part (model.lr -> lr), or the whole key
    where two keys end alike."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: short if last.count(short) == 1 else key for key, short in zip(keys, last)}


def grid_point(run_dir: Path, keys: Sequence[str]) -> tuple:
    """The run's values of `keys` (its config.yaml); ValueError naming the key a run does not record."""
    settings = run_setting(Path(run_dir))
    missing = [k for k in keys if k not in settings]
    if missing:
        raise ValueError(f"--best-of {missing[0]}: run {run_dir} has no such setting in its config.yaml (give a "
                         f"dotted key as the fit's flag names it, e.g. model.lr or data.num_train_examples)")
    return tuple(_plain(settings[k]) for k in keys)


def _plain(value: Any) -> Hashable:
    return tuple(_plain(v) for v in value) if isinstance(value, list) else value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def sort_key(point: tuple) -> tuple:
    """Points in order of their values: numbers by size, anything else by its text after them."""
    return tuple((0, v, "") if _number(v) else (1, 0, str(v)) for v in point)


def show(value: Any) -> str:
    """A grid value as the config holds it: 0.00046, rope, true."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else format(value, "g") if isinstance(value, float) else str(value)


def choose(means: dict[tuple, float], keys: Sequence[str], maximize: bool) -> Choice | None:
    """The point with the best seed mean (`maximize`: the highest), the first in grid order on a tie; its edge
    note names each key whose chosen value is the lowest or highest of two or more numbers tried: the best may lie
    beyond the grid. None when no point has a value."""
    ranked = [(p, m) for p, m in sorted(means.items(), key=lambda kv: sort_key(kv[0])) if not math.isnan(m)]
    if not ranked:
        return None
    point, mean = (max if maximize else min)(ranked, key=lambda pm: pm[1])
    edges = []
    for i, key in enumerate(keys):
        tried = sorted({p[i] for p in means if _number(p[i])})
        if len(tried) >= 2 and _number(point[i]) and point[i] in (tried[0], tried[-1]):
            side = "lowest" if point[i] == tried[0] else "highest"
            edges.append(f"{key} at the {side} value tried")
    return Choice(point, mean, f"edge: {' and '.join(edges)}; widen the grid" if edges else None)


def seed_means(values: dict[tuple, list[float]], seeds: dict[tuple, list[int | None]] | None = None
               ) -> dict[tuple, float]:
    """point -> the mean of its runs' values (NaN for a point none of whose runs has one). With `seeds` (point ->
    its runs' seeds, aligned with values), the mean is over the seeds every point with a value has, where there is
    one such seed at least."""
    shared = shared_seeds(seeds) if seeds is not None else set()
    if shared:
        values = {p: [v for v, s in zip(vs, seeds[p]) if s in shared] for p, vs in values.items()}
    return {p: (stats.summarize(v).mean if v else math.nan) for p, v in values.items()}


def shared_seeds(seeds: dict[tuple, list[int | None]]) -> set[int]:
    """The seeds every point with a run has (none when a run's seed is unknown)."""
    sets = [set(s) for s in seeds.values() if s]
    if not sets or any(None in s for s in sets):
        return set()
    return set.intersection(*sets)


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """'mean ± std (n)', as the tables write a group of runs."""
    if not values:
        return ""
    s = stats.summarize(list(values))
    return fmt.format(s.mean) + ("" if s.std is None else " ± " + fmt.format(s.std)) + f" ({s.n})"


class Point(NamedTuple):
    """The runs of one group at one grid point: the group's columns (e.g. (attention,) or (attention, width)), the
    point, and the runs' seeds and metric values (a run without a value is left out of both)."""

    group: tuple
    point: tuple
    seeds: list[int | None]
    values: list[float]


def choose_all(points: Sequence[Point], keys: Sequence[str], maximize: bool) -> dict[tuple, Choice | None]:
    """group -> its chosen point (choose), in the order of the groups' first points."""
    by_group: dict[tuple, dict[tuple, Point]] = {}
    for p in points:
        by_group.setdefault(p.group, {})[p.point] = p
    return {group: choose(seed_means({k: p.values for k, p in ps.items()}, {k: p.seeds for k, p in ps.items()}),
                          keys, maximize) for group, ps in by_group.items()}


def rule(keys: Sequence[str], metric: str, maximize: bool) -> str:
    """The sentence that says how the point was chosen."""
    return (f"best {', '.join(keys)} chosen on validation: the point with the {'highest' if maximize else 'lowest'} "
            f"{metric}, averaged over the seeds every point of the group has (over each point's own seeds where "
            f"they share none)")


def every_point_table(points: Sequence[Point], headers: Sequence[str], keys: Sequence[str], metric: str,
                      chosen: dict[tuple, Choice | None], fmt: str = "{:.3f}",
                      reported: tuple[str, dict[tuple, list[float]]] | None = None) -> str:
    """Every grid point of every group, in grid order: its runs' seeds and the metric's mean ± std (n); the chosen
    point is marked. `reported`: (the name of a metric reported beside the one chosen on, e.g. "test loss",
    {(group, point): its runs' values}), a column after the metric's."""
    extra = [] if reported is None else [reported[0]]
    lines = [f"Every grid point: {', '.join([metric, *extra])}, mean ± std over seeds (n); `chosen` marks each "
             f"group's best", "",
             "| " + " | ".join([*headers, *keys, "seeds", metric, *extra, "chosen"]) + " |",
             "|" + "---|" * len(headers) + "---:|" * len(keys) + "---|" + "---:|" * (1 + len(extra)) + "---|"]
    order = {g: i for i, g in enumerate(dict.fromkeys(p.group for p in points))}
    for p in sorted(points, key=lambda p: (order[p.group], sort_key(p.point))):
        choice = chosen.get(p.group)
        mark = "chosen" if choice is not None and choice.point == p.point else ""
        seeds = ", ".join("?" if s is None else str(s) for s in p.seeds)
        cells = [spread(p.values, fmt), *([] if reported is None else [spread(reported[1].get((p.group, p.point), []),
                                                                              fmt)])]
        lines.append("| " + " | ".join([*map(str, p.group), *map(show, p.point), seeds, *cells, mark]) + " |")
    return "\n".join(lines) + "\n"
