"""A run's TensorBoard scalars, read only from event files that are whole: every record's length and CRC-32C
checks pass, every record is an Event, and the last one ends where the file ends.

TensorBoard's own readers stop quietly at the first bad record, so a truncated or damaged file would
read as a shorter run; here it is a ValueError naming the file. A run's evaluations after training
(RUN/eval/...) are not its training record and are never read.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

EVAL_DIR = "eval"  # RUN/eval/...: `main.py validate|test --run RUN` writes its events there
PROBE_DIR = "probe"  # RUN/probe/...: `lit-attn probe --run RUN` writes its events there


def is_event_file(path: Path) -> bool:
    """What TensorBoard reads as an event file: a file with "tfevents" in its name."""
    return "tfevents" in path.name and path.is_file()


def event_files(run_dir: Path) -> list[Path]:
    """The training event files of a run: under `run_dir`, none of them under its eval/ or probe/ directory; sorted."""
    return sorted(p for p in run_dir.rglob("*tfevents*")
                  if is_event_file(p) and p.relative_to(run_dir).parts[0] not in (EVAL_DIR, PROBE_DIR))


def check_event_file(path: Path) -> int:
    """The number of records in `path`; ValueError naming the file if it is empty, cut short or damaged."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    if path.stat().st_size == 0:
        raise ValueError(f"{path} is an empty event file (the run wrote nothing to it); move it out of the run "
                         f"directory to compare what remains")
    reader = PyRecordReader_New(str(path))
    records = 0
    try:
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:  # the end of the file, at a record boundary
                return records
            Event.FromString(reader.record())
            records += 1
    except (errors.DataLossError, DecodeError) as e:
        what = "is cut short" if "truncated" in str(e) else "is damaged"
        raise ValueError(f"{path} {what} after {records} whole records (not a complete TensorBoard event file); "
                         f"restore it, or move it out of the run directory to compare what remains") from None
    finally:
        reader.file_handle.close()


def run_scalars(run_dir: Path) -> dict[str, list[Any]]:
    """Every scalar tag of the run's training event files (directories merged), one event per step.

    ValueError when the run has no event file or one of them is not whole. Read per directory with
    TensorBoard's EventAccumulator, so a resumed run's purge of an earlier attempt's later steps applies;
    where a tag has two events at one step, the later write wins.
    """
    files = event_files(run_dir)
    if not files:
        raise ValueError(f"{run_dir} has no TensorBoard event files of training (events.out.tfevents.*, outside "
                         f"{EVAL_DIR}/): not a run directory, or a run that has logged nothing yet")
    stamps = tuple((path, st.st_ino, st.st_size, st.st_mtime_ns) for path in files for st in [path.stat()])
    return {tag: list(events) for tag, events in _read_scalars(stamps).items()}


@contextmanager
def _quiet_purge() -> Iterator[None]:
    """TensorBoard's logger above warnings: it warns of each purge ("Detected out of order event.step"), which a
    resumed run's files make on purpose (see run_scalars)."""
    logger = logging.getLogger("tensorboard")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@lru_cache(maxsize=64)  # a sweep's runs; bounded, so that many long runs do not hold memory
def _read_scalars(stamps: tuple[tuple[Path, int, int, int], ...]) -> dict[str, list[Any]]:
    """run_scalars' reading of the files in `stamps` (path, inode, size, modification time). The tools read a run
    several times (its table row, its grid cell): a file that has changed since is read again, a damaged one fails
    each time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = [path for path, *_ in stamps]
    for path in files:
        check_event_file(path)
    merged: dict[str, list[Any]] = defaultdict(list)
    for directory in sorted({p.parent for p in files}):
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        with _quiet_purge():
            acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            merged[tag] += acc.Scalars(tag)
    return {tag: by_step(events) for tag, events in merged.items()}


def hparams_record(run_dir: Path) -> dict[str, Any]:
    """Column -> value of the run's latest HPARAMS-tab record (written at the end of each fit, so a resumed
    run's last attempt has the whole run's); {} if its training event files hold none. Assumes whole files
    (run_scalars checks them)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
    from tensorboard.plugins.hparams import metadata

    latest: tuple[float, Any] | None = None
    for path in event_files(run_dir):
        reader = PyRecordReader_New(str(path))
        try:
            while True:
                try:
                    reader.GetNext()
                except errors.OutOfRangeError:
                    break
                event = Event.FromString(reader.record())
                for value in event.summary.value:
                    newer = latest is None or event.wall_time >= latest[0]
                    if value.tag == metadata.SESSION_START_INFO_TAG and newer:
                        latest = (event.wall_time, value.metadata.plugin_data.content)
        finally:
            reader.file_handle.close()
    if latest is None:
        return {}
    start = metadata.parse_session_start_info_plugin_data(latest[1])
    return {name: getattr(v, v.WhichOneof("kind")) for name, v in start.hparams.items() if v.WhichOneof("kind")}


def by_step(events: list[Any]) -> list[Any]:
    """One event per step (the latest written), in step order."""
    latest: dict[int, Any] = {}
    for e in sorted(events, key=lambda e: e.wall_time):
        latest[e.step] = e
    return [latest[s] for s in sorted(latest)]
