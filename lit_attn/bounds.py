"""Number types with a valid range: an option's range is its type, written once in its signature.

`n_layer: PositiveInt = 4` is all an option needs: `check_bounds` (GPTConfig, GPT) refuses a value
out of range given from Python, and the command line's parser, which registers these types, refuses
it from a flag or a config file. Only the standard library is used, so the model library stays free
of the command line's packages.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

_LISTENERS: list[Callable[[type], None]] = []  # called with each Bounded type as it is defined (when_defined)


class OutOfRange(ValueError):
    """A value outside its type's range (or no number at all); the message is `must be ..., got VALUE`."""


class Bounded:
    """Mixed into int or float by `bounded`: constructing one from a value out of range raises OutOfRange."""

    base: type = int
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for listener in _LISTENERS:
            listener(cls)

    def __new__(cls, value: Any) -> Any:
        return super().__new__(cls, cls.read(value))

    @classmethod
    def read(cls, value: Any) -> Any:
        """`value` (a number, or its text as a flag gives it) as a plain int or float; OutOfRange if outside."""
        number = value
        if isinstance(value, str):
            for read in (cls.base, float):  # "1.5" for an integer: refused as the number it is
                try:
                    number = read(value.strip())
                    break
                except ValueError:
                    continue
        if not cls.contains(number):
            raise OutOfRange(f"must be {cls.describe()}, got {number!r}")
        return cls.base(number)

    @classmethod
    def contains(cls, x: Any) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (isinstance(x, float) and not math.isfinite(x)):
            return False
        if cls.base is int and not isinstance(x, int):
            return False
        if cls.low is not None and (x <= cls.low if cls.open_low else x < cls.low):
            return False
        return cls.high is None or (x < cls.high if cls.open_high else x <= cls.high)

    @classmethod
    def describe(cls) -> str:
        what = "an integer" if cls.base is int else "a number"
        low, high = _number(cls.low), _number(cls.high)
        if cls.low is not None and cls.high is not None:
            return f"{what} in {'(' if cls.open_low else '['}{low}, {high}{')' if cls.open_high else ']'}"
        if cls.low is not None:
            return f"{what} {'>' if cls.open_low else '>='} {low}"
        if cls.high is not None:
            return f"{what} {'<' if cls.open_high else '<='} {high}"
        return f"{what}, finite"


def _number(x: float | None) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def bounded(name: str, base: type, low: float | None = None, high: float | None = None, *,
            open_low: bool = False, open_high: bool = False) -> type:
    """A subclass of `base` (int or float) holding the numbers from `low` to `high` (None: unbounded on that
    side; an open end excludes its bound). NaN, infinities and booleans are never in range."""
    attrs = {"base": base, "low": low, "high": high, "open_low": open_low, "open_high": open_high,
             "__module__": __name__, "__doc__": None}
    cls = type(name, (Bounded, base), attrs)
    cls.__doc__ = f"{cls.describe()[0].upper()}{cls.describe()[1:]}."
    return cls


PositiveInt = bounded("PositiveInt", int, 1)
NonNegativeInt = bounded("NonNegativeInt", int, 0)
PositiveFloat = bounded("PositiveFloat", float, 0, open_low=True)
NonNegativeFloat = bounded("NonNegativeFloat", float, 0)
UnitInterval = bounded("UnitInterval", float, 0, 1)  # a share of something: [0, 1]
OpenUnitInterval = bounded("OpenUnitInterval", float, 0, 1, open_low=True, open_high=True)  # (0, 1)
Probability = bounded("Probability", float, 0, 1, open_high=True)  # dropout, AdamW's betas: [0, 1)
SEED_MAX = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything enforces: one rule for every seed
Seed = bounded("Seed", int, 0, SEED_MAX)


def when_defined(listener: Callable[[type], None]) -> None:
    """Call `listener` with every Bounded type: those defined so far, and each one defined later (a module
    imported while a command line is parsed may define its own)."""
    if listener in _LISTENERS:
        return
    _LISTENERS.append(listener)
    todo = list(Bounded.__subclasses__())
    while todo:
        cls = todo.pop()
        listener(cls)
        todo += cls.__subclasses__()


def _check(hint: Any) -> Callable[[Any], str | None] | None:
    """A check of one value against `hint` (Bounded, X | None, tuple[X, ...], list[X]) that returns what is
    wrong (None: nothing), or None where the hint holds no Bounded type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, Bounded):
        return lambda v: None if hint.contains(v) else f"must be {hint.describe()}, got {v!r}"
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        check = _check(inner[0]) if len(inner) == 1 else None
        return None if check is None else lambda v: None if v is None else _or_null(check(v))
    if origin in (tuple, list) and args and all(isinstance(a, type) and issubclass(a, Bounded) for a in args
                                                 if a is not Ellipsis):
        item, length = args[0], (None if origin is list or Ellipsis in args else len(args))
        count = "" if length is None else {2: "two", 3: "three"}.get(length, str(length)) + " "

        def items(v: Any) -> str | None:
            ok = isinstance(v, (tuple, list)) and (length is None or len(v) == length) and all(map(item.contains, v))
            numbers = f"{count}numbers" if length else "numbers"
            return None if ok else f"must be {numbers}, each {item.describe()[len('a number '):]}, got {list(v)!r}"
        return items
    return None


def _or_null(problem: str | None) -> str | None:
    return None if problem is None else problem.replace(", got ", " or null, got ", 1)


@functools.cache
def bounded_fields(owner: Any) -> dict[str, Callable[[Any], str | None]]:
    """The checks of `owner`'s parameters (a function) or fields (a class) that have a Bounded type, by name."""
    hints = typing.get_type_hints(owner)
    return {name: check for name, hint in hints.items() if name != "return" and (check := _check(hint)) is not None}


def check_bounds(owner: Any, values: Mapping[str, Any]) -> None:
    """Raise OutOfRange (`NAME must be ..., got VALUE`) for the first of `values` outside its type's range;
    `owner` is the class or function whose annotations hold the types."""
    for name, check in bounded_fields(owner).items():
        if name in values and (problem := check(values[name])) is not None:
            raise OutOfRange(f"{name} {problem}")
