"""What lit_attn.tools.compare and lit_attn.tools.cost_card make of inputs that are not a whole run: damaged, cut-short,
empty or foreign event files, directories without any, a --group-by setting the runs lack (one-line errors,
exit 2, nothing written); runs with values missing (a note per run saying which and why); a run's evaluations
under RUN/eval/ (never read)."""

from __future__ import annotations

import csv
import os
import random
import shutil
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_compare import LOSSES, _seeded, _write

from lit_attn.tools import compare, cost_card, events, run_record


def _event_file(run: Path) -> Path:
    (path,) = run.glob("events.out.tfevents.*")
    return path


def _cut(run: Path) -> Path:
    """The run's event file without its last 7 bytes: the end of a record, as a crash mid-write leaves it."""
    path = _event_file(run)
    path.write_bytes(path.read_bytes()[:-7])
    return path


def _flip(run: Path) -> Path:
    """One byte of the middle of the run's event file changed: its record's checksum no longer matches."""
    path = _event_file(run)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _garbage(run: Path) -> Path:
    """An extra "event file" of random bytes."""
    path = run / "events.out.tfevents.0.host.1"
    path.write_bytes(random.Random(0).randbytes(3000))
    return path


def _zero_bytes(run: Path) -> Path:
    path = run / "events.out.tfevents.0.host.2"
    path.touch()
    return path


def _cut_in_subdirectory(run: Path) -> Path:
    """The HParams record's file (RUN/hparams/) cut short."""
    return _cut(run / "hparams")


def _empty_dir(run: Path) -> Path:
    shutil.rmtree(run)
    run.mkdir()
    return run


def _random_files(run: Path) -> Path:
    """A directory of random files, none of them an event file."""
    shutil.rmtree(run)
    run.mkdir()
    for i in range(3):
        (run / f"blob{i}.bin").write_bytes(os.urandom(500))
    return run


def _eval_only(run: Path) -> Path:
    """A directory whose only event files are evaluations (RUN/eval/...), which are not a training record."""
    (run / "eval").mkdir()
    for path in [*run.glob("events.out.tfevents.*"), run / "hparams"]:
        path.rename(run / "eval" / path.name)
    return run


def _parent_of_runs(run: Path) -> Path:
    """The runs directory itself, which holds several runs (whose events must not be merged into one row)."""
    _seeded(run.parent, "sqa", 1, 1.9)
    return run.parent


# (how the run is broken -> the path the error names, what the error says)
BROKEN = [
    (_cut, "is cut short after"),
    (_flip, "is damaged after"),
    (_garbage, "is damaged after 0 whole records"),
    (_zero_bytes, "is an empty event file"),
    (_cut_in_subdirectory, "is cut short after"),
    (_empty_dir, "has no TensorBoard event files of training"),
    (_random_files, "has no TensorBoard event files of training"),
    (_eval_only, "has no TensorBoard event files of training (events.out.tfevents.*, outside eval/)"),
    (_parent_of_runs, "holds runs (mha-None-s1, sqa-None-s1), not one run"),
]


@pytest.fixture
def good_run(tmp_path) -> Path:
    return _seeded(tmp_path / "runs", "mha", 1, 2.0)


@pytest.mark.parametrize(("breaking", "message"), BROKEN, ids=[b.__name__.strip("_") for b, _ in BROKEN])
@pytest.mark.parametrize("tool", ["compare", "cost_card"])
def test_a_run_that_cannot_be_read_is_a_one_line_error(tool, breaking, message, good_run, tmp_path, capsys):
    other = _seeded(tmp_path / "others", "mha", 2, 2.1)  # a good run beside it does not make it pass
    named = breaking(good_run)  # the file or directory the error must name
    run = named if named.is_dir() else good_run
    out = tmp_path / "out"
    if tool == "compare":
        code = compare.main([str(other), str(run), "--out", str(out)])
    else:
        code = cost_card.main(["--runs", str(other), str(run), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {named} {message}") and err.count("\n") == 1, err
    assert not out.exists()  # nothing written from a partial read


def test_tensorboard_alone_reads_a_cut_file_as_a_shorter_run(good_run):
    """Why the files are checked: TensorBoard's reader stops at the damage without a word."""
    intact = EventAccumulator(str(good_run))
    intact.Reload()
    _cut(good_run)
    cut = EventAccumulator(str(good_run))
    cut.Reload()
    assert len(cut.Scalars("val/train_time")) < len(intact.Scalars("val/train_time"))
    with pytest.raises(ValueError, match="is cut short"):
        events.check_event_file(_event_file(good_run))


@pytest.mark.parametrize("change", [_cut, _flip, _garbage])
def test_a_run_read_once_is_read_again_when_its_files_change(change, good_run):
    """run_scalars keeps what it read of a run (the tools read a run several times) only while its files are
    unchanged: damage done after a first read is an error on the next, and a file added is read."""
    before = events.run_scalars(good_run)
    assert len(before["val/loss"]) == 2
    before["val/loss"].clear()  # a caller's copy: the next read is whole
    assert len(events.run_scalars(good_run)["val/loss"]) == 2
    change(good_run)
    with pytest.raises(ValueError, match="is cut short|is damaged"):
        events.run_scalars(good_run)


def test_a_run_read_once_sees_the_events_written_since(good_run):
    assert [e.step for e in events.run_scalars(good_run)["val/loss"]] == [9, 19]
    _write(good_run, {"val/loss": [(29, 1.5, 99.0)]})
    assert [e.step for e in events.run_scalars(good_run)["val/loss"]] == [9, 19, 29]


def test_a_whole_file_counts_its_records(good_run):
    # file_version, then val/loss twice, val/acc once, val/train_time twice
    assert events.check_event_file(_event_file(good_run)) == 6


@pytest.mark.parametrize(("key", "runs_lacking"), [("n_kv_head", 3), ("n_kv_heads", 1)])
def test_group_by_a_setting_a_run_lacks_names_the_settings(key, runs_lacking, tmp_path, capsys):
    root = tmp_path / "runs"
    runs = [_seeded(root, "gqa", s, loss, n_kv_heads=2) for s, loss in LOSSES["mha"].items()]
    runs[-1] = _seeded(root, "mha", 3, 2.0) if runs_lacking == 1 else runs[-1]  # this one has no n_kv_heads
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--group-by", key]) == 2
    err = capsys.readouterr().err
    lacking = runs[0] if runs_lacking == 3 else runs[-1]
    assert err.startswith(f"error: --group-by {key!r} is not a setting of run {lacking}; choose one of its "
                          f"settings: attention") and err.count("\n") == 1
    assert not out.exists()


# ---- partial records ----

def _no_validation(run: Path) -> None:
    for path in run.glob("events.out.tfevents.*"):
        path.unlink()
    _write(run, {"train/loss": [(4, 3.0, 10.0)]})


def _no_record(run: Path) -> None:
    shutil.rmtree(run / "hparams")
    _write(run, {"train/time_per_batch": [(15, 0.02, 50.0)], "train/tokens_per_sec": [(15, 3000.0, 50.0)]})


def _older_timing(run: Path) -> None:
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("timing:\n  warmup_batches: 10\n", ""))


def _no_warmup(run: Path) -> None:
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("warmup_batches: 10", "warmup_batches: 0"))


def _all_warmup(run: Path) -> None:
    shutil.rmtree(run / "hparams")
    _write(run / "hparams", {"whole_run/n_params": [(7, 5000, 50.0)], "whole_run/train_time": [(7, 1.0, 50.0)]})


def _no_seeds(run: Path) -> None:
    (run / "config.yaml").write_text("model:\n  attention: mha\ndata:\n  init_args:\n    seed: null\n"
                                     "timing:\n  warmup_batches: 10\n")


# (what the run lacks -> its notes, the CSV columns left blank)
PARTIAL = [
    (_no_validation, [run_record.NO_VALIDATION], ["val_loss", "val_acc", "val_ppl"]),
    (_no_record, [run_record.NO_RECORD, "time/batch and tokens/s are the last logged window's, not whole-run means"],
     ["parameters", "train_time_s"]),
    (_older_timing, ["time/batch and tokens/s include the first batches' warm-up (config.yaml sets no "
                     "timing.warmup_batches: an older run)"], []),
    (_no_warmup, ["time/batch and tokens/s include the first batches' warm-up (timing.warmup_batches: 0)"], []),
    (_all_warmup, ["no time/batch or tokens/s: no batch ran after the warm-up (timing.warmup_batches: 10)"],
     ["time_per_batch_s", "tokens_per_sec"]),
    (_no_seeds, ["no seed: config.yaml has no integer seed_everything",
                 "no data seed: config.yaml's data seed is null or absent (an older run)"], ["seed", "data_seed"]),
]


@pytest.mark.parametrize(("lacking", "notes", "blank"), PARTIAL, ids=[p[0].__name__.strip("_") for p in PARTIAL])
def test_a_partial_record_says_what_it_lacks_and_why(lacking, notes, blank, tmp_path, capsys):
    run = _seeded(tmp_path / "runs", "mha", 1, 2.0)
    lacking(run)
    # The synthetic runs log no perplexity (its note is there for every one of them unless validation is gone)
    ppl = [] if lacking is _no_validation else ["perplexity not logged (an older run)"]
    assert compare.read_run(run)["notes"] == ppl + notes
    out = tmp_path / "cmp"
    assert compare.main([str(run), "--out", str(out)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mha-None-s1 |")]
    assert line.endswith(f" | {'; '.join(ppl + notes)} |")
    with (out / "compare.csv").open() as f:
        (row,) = csv.DictReader(f)
    assert row["notes"] == "; ".join(ppl + notes)
    ppl_blank = set() if lacking is _no_validation else {"val_ppl"}
    headers = ("seed", "data_seed", *(c[1] for c in compare.COLUMNS))
    assert {h for h in headers if row[h] == ""} == ppl_blank | set(blank)
    card = tmp_path / "card"
    assert cost_card.main(["--runs", str(run), "--out", str(card)]) == 0
    assert all(f"- run mha-None-s1: {note}" in (card / "cost_card.md").read_text() for note in notes)
    # compare.csv carries the notes on to the cost card
    assert cost_card.main(["--compare", str(out / "compare.csv"), "--out", str(card), "--overwrite"]) == 0
    assert all(f"- run mha-None-s1: {note}" in (card / "cost_card.md").read_text() for note in notes)


def test_a_whole_record_has_no_notes(tmp_path):
    run = _seeded(tmp_path / "runs", "mha", 1, 2.0)
    _write(run, {"val/ppl": [(19, 7.4, 400.0)]})
    row = compare.read_run(run)
    assert row["notes"] == [] and (row["seed"], row["data_seed"]) == (1, 101)


# ---- evaluations after training ----

def test_evaluations_under_eval_are_never_read(tmp_path):
    """`main.py validate|test --run RUN` logs under RUN/eval/: another val/loss, at another step; even a damaged
    file there leaves the training record's numbers as they were."""
    run = _seeded(tmp_path / "runs", "mha", 1, 2.0)
    before = compare.read_run(run)
    _write(run / "eval" / "validate", {"val/loss": [(19, 9.0, 900.0), (40, 9.5, 950.0)], "val/acc": [(40, 0.01, 950.0)],
                                       "whole_run/time_per_batch": [(40, 99.0, 950.0)]})
    _write(run / "eval" / "test", {"test/loss": [(19, 8.0, 990.0)]})
    (run / "eval" / "test" / "events.out.tfevents.1.host.9").write_bytes(b"not an event file")
    assert compare.read_run(run) == before
    assert [f.parent for f in events.event_files(run)] == [run, run / "hparams"]
    rows, _ = compare.compare([run], tmp_path / "cmp")
    assert rows[0]["val_loss"] == pytest.approx(2.0) and rows[0]["time_per_batch_s"] == pytest.approx(0.010)


# ---- outputs of an earlier comparison ----

@pytest.mark.parametrize("tool", ["compare", "cost_card"])
def test_an_earlier_output_is_replaced_only_with_overwrite(tool, tmp_path, capsys):
    run = _seeded(tmp_path / "runs", "mha", 1, 2.0)
    out = tmp_path / "out"

    def call(*extra: str) -> int:
        if tool == "compare":
            return compare.main([str(run), "--out", str(out), *extra])
        return cost_card.main(["--runs", str(run), "--out", str(out), *extra])

    assert call() == 0
    first = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    assert call() == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out} already holds ") and "pass --overwrite" in err and err.count("\n") == 1
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == first  # nothing touched
    assert call("--overwrite") == 0


# ---- the machine each run trained on ----

def _on_machine(run: Path, machine: str) -> Path:
    """The run's HPARAMS record, as HParamsSummary writes it, naming `machine`."""
    from torch.utils.tensorboard import SummaryWriter

    from callbacks.hparams import record

    writer = SummaryWriter(str(run))
    for summary in record({"Attention": "mha", "Machine": machine}, {}):
        writer.file_writer.add_summary(summary, 19)
    writer.close()
    return run


def test_speeds_from_unlike_machines_are_noted_on_each_run(tmp_path):
    a = _on_machine(_seeded(tmp_path / "runs", "mha", 1, 2.0), "NVIDIA H100 80GB HBM3")
    b = _on_machine(_seeded(tmp_path / "runs", "mha", 2, 2.1), "AMD EPYC 7B13, 1 thread")
    c = _seeded(tmp_path / "runs", "sqa", 1, 2.2)  # no record: a run of an older version
    assert run_record.read_run(a)["machine"] == "NVIDIA H100 80GB HBM3" and run_record.read_run(c)["machine"] is None
    rows, _ = compare.compare([a, c], tmp_path / "cmp")
    assert rows[0]["notes"][-1] == "trained on NVIDIA H100 80GB HBM3"
    assert rows[1]["notes"][-1] == "its machine is not recorded (no end-of-fit record, or a run of an older version)"
    rows, _ = compare.compare([a, _on_machine(c, "NVIDIA H100 80GB HBM3")], tmp_path / "cmp2")
    assert not [n for r in rows for n in r["notes"] if "machine" in n or "trained on" in n]  # one machine: no note
    card = tmp_path / "card"
    assert cost_card.main(["--runs", str(a), str(b), "--out", str(card)]) == 0
    md = (card / "cost_card.md").read_text()
    assert "- run mha-None-s1: trained on NVIDIA H100 80GB HBM3" in md
    assert "- run mha-None-s2: trained on AMD EPYC 7B13, 1 thread" in md


def test_a_run_resumed_on_another_machine_says_its_speeds_mix_them(tmp_path):
    run = _on_machine(_seeded(tmp_path / "runs", "mha", 1, 2.0), "GPU-A")
    _on_machine(run, "GPU-A + CPU-B, 2 threads")  # the resumed attempt's record, written last, names both
    row = run_record.read_run(run)
    assert row["machine"] == "GPU-A + CPU-B, 2 threads"
    assert row["notes"][-1] == "trained on several machines (GPU-A + CPU-B, 2 threads): its speeds mix them"


def test_a_resumed_runs_purge_is_read_without_tensorboards_warning(tmp_path, caplog):
    """A run resumed from step 3 after logging up to step 5 purges steps 4-5 on reading: the later attempt's values
    count, and TensorBoard's "out of order" warning, expected here, is not passed on to the user."""
    import logging
    import time

    from torch.utils.tensorboard import SummaryWriter

    from lit_attn.tools.events import run_scalars

    run = tmp_path / "run"
    first = SummaryWriter(str(run), filename_suffix=".a")
    for step in range(1, 6):
        first.add_scalar("val/loss", 10.0 - step, step, walltime=1000.0 + step)
    first.close()
    time.sleep(1.1)  # a later file name: TensorBoard orders the files by the creation time in their names
    second = SummaryWriter(str(run), filename_suffix=".b")
    for step in range(3, 7):
        second.add_scalar("val/loss", 1.0 - step / 10, step, walltime=2000.0 + step)
    second.close()
    with caplog.at_level(logging.DEBUG):
        scalars = run_scalars(run)
    assert [(e.step, round(e.value, 2)) for e in scalars["val/loss"]] == [(1, 9.0), (2, 8.0), (3, 0.7), (4, 0.6),
                                                                          (5, 0.5), (6, 0.4)]
    assert not [r for r in caplog.records if "out of order" in r.getMessage()]
