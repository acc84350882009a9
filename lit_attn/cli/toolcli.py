"""The command-line style of the experiment tools (`lit-attn bench|compare|sweep`, benchmarks/).

They parse with jsonargparse, like `main.py`, and report a user error as one `error: ...` line
on stderr with exit status 2 (set LIT_ATTN_DEBUG=1 for jsonargparse's full report). Their help
names types and defaults as a user types them (`path`, `int | null`, `false`). Arguments after a
bare `--` are not parsed: they are returned apart, for tools that pass them to main.py. The checks
every tool shares (a usable --device, an --out away from every run and written over only with --overwrite,
seeds, threads, the memory left) are here too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Any, NoReturn

from jsonargparse import ActionYesNo, ArgumentParser, DefaultHelpFormatter

from lit_attn.bounds import SEED_MAX  # numpy's seed range: one rule for every seed


def one_line_parse_error(message: str, flags: dict[str, str] | None = None,
                         examples: dict[str, str] | None = None) -> str:
    """jsonargparse's multi-line report on a flag as one line: `--flag='value' is invalid: expected TYPE`.

    `flags` maps a parser key to the flag to show (default `--KEY`); `examples` maps a key to
    what to say is expected instead of the type (e.g. an example of valid JSON).
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    key = re.match(r'Parser key "([^"]+)"', lines[0]) if lines else None
    if key is None:
        return " ".join(lines)
    given = next((m.group(1) for line in lines if (m := re.search(r"(?:Given|Got) value: (.*)$", line))), None)
    reasons = [re.sub(r"<class '(\w+)'>", r"\1", re.sub(r"^(- )?Expected (a )?|\. Got value: .*$", "", line))
               for line in lines[1:] if "Expected" in line]
    reasons = [r for r in reasons if r != "NoneType"] or reasons  # "int or null": saying "int" is the help
    expected = (examples or {}).get(key.group(1)) or "; or ".join(dict.fromkeys(reasons)) or " ".join(lines[1:])
    value = f"={given!r}" if given is not None else ""
    flag = (flags or {}).get(key.group(1), f"--{key.group(1)}")
    return f"{flag}{value} is invalid: expected {expected}"


def readable_type(hint: Any) -> str:
    """A type as help shows it: `int`, `path`, `int | null`, `list[int]`; never a Python repr."""
    if hint is type(None):
        return "null"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(readable_type(a) for a in args)
    if origin is not None and args:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(readable_type(a) for a in args)}]"
    if isinstance(hint, type):
        return "path" if issubclass(hint, PurePath) else hint.__name__
    if callable(hint) and hasattr(hint, "__name__"):  # a parsing function, e.g. type=csv_list
        return hint.__name__
    return re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", str(hint)).replace("typing.", "")


def readable_default(value: Any) -> str:
    """A default as it would be typed: `false`, `null`, `bench_out`, `[4, 16]`."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


class ToolHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help with readable types and defaults.

    A flag whose help text already says what its default is (e.g. "default: cuda if available") and
    whose parsed default is None (resolved later) shows no `default: null`, which would contradict it.
    """

    def _get_type_str(self, action) -> str | None:
        if isinstance(action, ActionYesNo):
            return "bool"
        hint = getattr(action, "_typehint", None) or action.type
        return None if hint is None else readable_type(hint)

    def _get_help_string(self, action) -> str:
        text = super()._get_help_string(action)
        if "%(default)s" not in text:
            return text
        if action.default is None and re.search(r"\bdefault\b", action.help or "", re.IGNORECASE):
            text = text.replace(", default: %(default)s", "").replace(" (default: %(default)s)", "")
            return text.replace("(default: %(default)s, ", "(")
        # Substituted here, as it is typed, so jsonargparse's own rendering (Python reprs) never runs.
        return text.replace("%(default)s", readable_default(action.default).replace("%", "%%"))


class ToolParser(ArgumentParser):
    """A jsonargparse parser whose errors are one `error: ...` line and exit status 2, with readable help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", ToolHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("LIT_ATTN_DEBUG") or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)
        flags = {a.dest: a.option_strings[-1] for a in self._actions if a.option_strings}
        sys.stderr.write(f"error: {one_line_parse_error(message, flags)} (--help lists the flags)\n")
        sys.exit(2)


def split_extra(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(the tool's own arguments, the arguments after the first bare `--`); argv defaults to sys.argv[1:]."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def csv_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [t.strip() for t in str(text).split(",") if t.strip()]


def split_attentions(text: str) -> list[str]:
    """The entries of a comma-separated --attention list; a comma inside an entry's {...} options is its own."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth <= 0:
            entries.append(text[start:i].strip())
            start = i + 1
    return [e for e in entries if e]


def parse_attention(entry: str) -> tuple[str, dict[str, Any] | None]:
    """(name, options) of an --attention entry: NAME, or NAME{JSON options} such as mha{"window": 64}."""
    name, brace, rest = entry.partition("{")
    if not brace:
        return entry.strip(), None
    try:
        options = json.loads(brace + rest)
    except json.JSONDecodeError as e:
        raise ValueError(f"--attention entry {entry!r}: its options are not JSON ({e.msg}); write NAME{{\"key\": "
                         f"value}}, e.g. mha{{\"window\": 64}}") from None
    return name.strip(), options


def check_device(name: str, flag: str = "--device") -> str:
    """`name` if torch can place a tensor on that device here; ValueError with a one-line reason otherwise."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"{flag} {name}: not a torch device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{flag} {name}: this machine has no CUDA GPU; use {flag} cpu")
        if device.index is not None and device.index >= count:
            raise ValueError(f"{flag} {name}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as e:  # torch built without that backend, or its driver missing
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{flag} {name}: torch cannot use this device here ({reason}); use {flag} cpu") from None
    return name


# A run directory (lit_attn.cli.runs): its TensorBoard event files, its checkpoints.
EVENTS = "events.out.tfevents.*"
# How deep below an --out runs are looked for: a run, a runs directory, a project holding runs/.
RUN_SEARCH_DEPTH = 3
RUN_SEARCH_DIRS = 2000  # directories looked at at most (an --out such as ~ or /)


def is_run(directory: Path) -> bool:
    """Whether `directory` holds a run: TensorBoard event files, checkpoints/*.ckpt, or config.yaml and
    checkpoints/ (a run whose checkpoints were removed)."""
    try:
        checkpoints = directory / "checkpoints"
        return (any(directory.glob(EVENTS)) or any(checkpoints.glob("*.ckpt"))
                or ((directory / "config.yaml").is_file() and checkpoints.is_dir()))
    except OSError:
        return False


def _run_below(root: Path) -> Path | None:
    """A run among the directories up to RUN_SEARCH_DEPTH levels below `root` (symbolic links not followed)."""
    level, seen = [root], 0
    for _ in range(RUN_SEARCH_DEPTH):
        below = []
        for directory in level:
            try:
                children = sorted(c for c in directory.iterdir() if c.is_dir() and not c.is_symlink())
            except OSError:
                continue
            for child in children:
                if is_run(child):
                    return child
                seen += 1
                if seen >= RUN_SEARCH_DIRS:
                    return None
            below += children
        level = below
    return None


def _out_among_runs(out: Path, runs: Sequence[Path], runs_dirs: Sequence[Path]) -> str | None:
    """What `out` is to a run or runs directory ("is inside the run X", ...), None if it is apart from all."""
    real = Path(os.path.realpath(out))
    runs_dirs = [d for d in runs_dirs if d.is_dir()]
    places = [(run, Path(os.path.realpath(run)), "run") for run in runs]
    places += [(runs_dir, Path(os.path.realpath(runs_dir)), "runs directory") for runs_dir in runs_dirs]
    for given, where, kind in places:
        if real == where:
            return f"is the {kind} {given}"
    for given, where, kind in places:
        if kind == "run" and where in real.parents:
            return f"is inside the run {given}"
    for given, where, kind in places:
        if real in where.parents:
            return f"holds the {kind} {given}"
    for directory in (real, *real.parents):
        if directory.is_dir() and is_run(directory):
            return f"is the run {directory}" if directory == real else f"is inside the run {directory}"
    if real.is_dir():
        run = _run_below(real)
        if run is not None:
            return f"is the runs directory of {run}" if run.parent == real else f"holds the run {run}"
    return None


def check_out_place(out: Path, flag: str = "--out", runs: Sequence[str | Path] = (),
                    runs_dirs: Sequence[str | Path] = ()) -> None:
    """ValueError (one line) if `out` is a run, inside or above one, or a runs directory or above one: a tool's
    output never goes among runs, so no --overwrite can replace a run's files. `runs` and `runs_dirs` are those
    the command reads, checked at any depth; others are recognized by their files (`is_run`)."""
    where = _out_among_runs(Path(out), [Path(r) for r in runs], [Path(d) for d in runs_dirs])
    if where is not None:
        raise ValueError(f"{flag} {out} {where}; outputs go outside every run and runs directory: give another {flag}")


def check_outputs(directory: Path, names: Sequence[str], overwrite: bool, flag: str = "--out",
                  runs: Sequence[str | Path] = (), runs_dirs: Sequence[str | Path] = ()) -> None:
    """ValueError unless `names` can be written into `directory` without replacing a file, or `overwrite` says so,
    and `directory` is apart from every run (`check_out_place`)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{flag} {directory} is a file; give a directory (it is created if missing)")
    check_out_place(directory, flag, runs, runs_dirs)
    existing = [n for n in names if (directory / n).exists()]
    if existing and not overwrite:
        raise ValueError(f"{flag} {directory} already holds {', '.join(existing)}; pass --overwrite to replace "
                         f"{'it' if len(existing) == 1 else 'them'} or give another {flag}")


def check_output_file(path: Path, overwrite: bool, flag: str = "--out") -> None:
    """ValueError if writing `path` would replace a file without `overwrite`, or `path` is a directory or in a run."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file name")
    if path.exists() and not overwrite:
        raise ValueError(f"{flag} {path} exists; pass --overwrite to replace it or give another {flag}")
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {path}: the directory {path.parent} does not exist")
    where = _out_among_runs(path.parent, [], [])
    if where is not None and not where.startswith(("holds", "is the runs directory")):
        raise ValueError(f"{flag} {path}: its directory {where}; outputs go outside every run: give another {flag}")



def check_seed(value: Any, flag: str = "--seed") -> int:
    """`value` if it is a seed (an integer from 0 to SEED_MAX); ValueError naming `flag` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{flag} {value}: a seed is an integer from 0 to {SEED_MAX} (numpy's seed range)")
    return value


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, e.g. under taskset or a batch job's allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this system (macOS)
        return os.cpu_count() or 1


def check_threads(value: int, flag: str = "--threads") -> int:
    """`value` if it is between 1 and this machine's cores; ValueError naming `flag` and the cores otherwise."""
    cores = cpu_cores()
    if not 1 <= value <= cores:
        raise ValueError(f"{flag} {value}: this machine gives this process {cores} CPU core(s); "
                         f"use {flag} 1 to {cores}")
    return value


@contextmanager
def new_outputs(directory: Path) -> Iterator[Path]:
    """`directory`, created if missing, for the block to write into; when the block fails, a directory created here
    is removed again, so that a failed tool leaves no empty or half-written output directory behind."""
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        yield directory
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise


def available_memory() -> int | None:
    """Bytes of RAM the system can still give this process (MemAvailable), None where it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # other POSIX systems: free pages only, an underestimate, which errs on the safe side
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def gib(n_bytes: float) -> str:
    """Bytes as GiB with one decimal, e.g. '3.2 GiB'."""
    return f"{n_bytes / 2**30:.1f} GiB"


def write_outputs(directory: Path, writers: dict[str, Callable[[Path], Any]], flag: str = "--out") -> int:
    """Call each writer with its file's path in `directory` (created if missing) and say what was written on
    stderr; 0, or 2 after a one-line error when the directory cannot be written (a directory made here is removed
    again, see new_outputs)."""
    try:
        with new_outputs(directory):
            for name, write in writers.items():
                write(directory / name)
    except OSError as e:
        print(f"error: cannot write into {flag} {directory}: {e.strerror or e}; give another {flag}", file=sys.stderr)
        return 2
    print(f"\nwrote {', '.join(str(directory / name) for name in writers)}", file=sys.stderr)
    return 0
