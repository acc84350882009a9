"""The tools that read several runs (compare, cost-card, recall-grid) over mixes of runs: evaluated and not, probed
and not, interrupted, resumed, trained on different data or not saying on which. Each mix gives a table whose blank
cells have their reason in the notes, or a one-line refusal that leaves nothing behind; never a traceback. The runs'
records are written directly (config.yaml, hparams.yaml, event files, results under eval/ and probe/)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from helpers import passkey_result
from test_compare import PAUSE, _seeded, _wall, _write

from lit_attn.tools import compare, cost_card, recall_grid, run_record

CHAR = "CharDataModule(corpus.txt, sha256 0123456789ab, val_fraction=0.1)"
CHAR_OTHER = "CharDataModule(shakespeare.txt, sha256 fedcba987654, val_fraction=0.1)"
BPE = "WikipediaDataModule(dataset=wikimedia/wikipedia, dataset_config=20231101.en, train_fraction=0.98)"


def _data(run: Path, data: str) -> None:
    """The run's hparams.yaml, as a fit writes it, naming its data."""
    attention = run_record.setting(run, "attention")
    (run / "hparams.yaml").write_text(f"attention: {attention}\ndata: {data}\n")


def _evaluate(run: Path, task: str = "tiny_choice") -> None:
    """A `lit-attn evaluate` result under RUN/eval/lm-eval-1/."""
    where = run / "eval" / "lm-eval-1"
    where.mkdir(parents=True)
    (where / "results.json").write_text(json.dumps({"results": {task: {"acc,none": 0.5, "acc_stderr,none": 0.1}}}))


def _probe(run: Path) -> None:
    """A `lit-attn probe` passkey result under RUN/probe/passkey/."""
    where = run / "probe" / "passkey"
    where.mkdir(parents=True)
    record = {"run": run.name, "checkpoint": "last.ckpt", "step": 19, **passkey_result([[0.5, 1.0]])}
    (where / "passkey.json").write_text(json.dumps(record))


def _interrupt(run: Path) -> None:
    """No end-of-fit record: the run stopped before its fit ended."""
    shutil.rmtree(run / "hparams")


def _resume(run: Path) -> None:
    """A second attempt's event files: ten more steps, a validation and the whole run's end-of-fit record."""
    _write(run, {"val/loss": [(29, 1.8, _wall(29) + 2 * PAUSE)], "val/train_time": [(29, 0.3, _wall(29) + 2 * PAUSE)]})
    _write(run / "hparams", {"whole_run/time_per_batch": [(30, 0.01, _wall(30))],
                             "whole_run/n_params": [(30, 5000, _wall(30))],
                             "whole_run/tokens_per_sec": [(30, 6400, _wall(30))],
                             "whole_run/train_time": [(30, 0.3, _wall(30))]})


def _unvalidate(run: Path) -> None:
    """Stopped before its first validation: a training loss, no validation, no end-of-fit record."""
    shutil.rmtree(run / "hparams")
    for path in run.glob("events.out.tfevents.*"):
        path.unlink()
    _write(run, {"train/loss": [(4, 3.0, 10.0)]})


KINDS = {
    "plain": lambda run: None,
    "unvalidated": _unvalidate,
    "evaluated": _evaluate,
    "evaluated-other-task": lambda run: _evaluate(run, "tiny_other"),
    "probed": _probe,
    "interrupted": _interrupt,
    "resumed": _resume,
    "char": lambda run: _data(run, CHAR),
    "char-other-file": lambda run: _data(run, CHAR_OTHER),
    "bpe": lambda run: _data(run, BPE),
}


def _runs(root: Path, kinds: tuple[str, ...]) -> list[Path]:
    """A run per kind, attentions mha and sqa in turn, seeds 1, 2, 3 in turn."""
    runs = []
    for i, kind in enumerate(kinds):
        run = _seeded(root, ("mha", "sqa")[i % 2], i % 3 + 1, 2.0 + i / 10)
        run = run.rename(run.with_name(f"{kind}-{run.name}"))
        KINDS[kind](run)
        runs.append(run)
    return runs


# Each blank CSV cell of compare.csv and the words of the notes that may explain it.
NO_VAL = "no validation was logged"
REASONS = {
    "data": "its data is not recorded", "val_loss": NO_VAL, "val_acc": NO_VAL,
    "val_ppl": ("perplexity not logged", NO_VAL), "parameters": "no HParams record",
    "train_time_s": "no HParams record", "time_per_batch_s": "no HParams record", "tokens_per_sec": "no HParams record",
    "mqar_acc": "not trained on MQAR data",
}
# (the kinds of runs mixed, whether their data differ)
MIXES = [
    (("plain", "evaluated"), False),
    (("evaluated", "plain", "plain"), False),
    (("evaluated", "evaluated-other-task"), False),
    (("probed", "plain", "evaluated"), False),
    (("interrupted", "resumed", "plain"), False),
    (("unvalidated", "plain", "plain"), False),
    (("char", "bpe"), True),
    (("char", "char-other-file", "char"), True),
    (("plain", "char"), False),  # a run that does not record its data beside one that does
    (tuple(KINDS), True),
]
IDS = ["+".join(kinds) for kinds, _ in MIXES]


@pytest.mark.parametrize(("kinds", "other_data"), MIXES, ids=IDS)
def test_compare_takes_any_mix_and_says_why_each_cell_is_blank(kinds, other_data, tmp_path, capsys):
    runs = _runs(tmp_path / "runs", kinds)
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out)]) == 0
    assert (out / "compare.md").read_text() in capsys.readouterr().out
    with (out / "compare.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == [r.name for r in runs]
    for row in rows:
        for header, cell in row.items():
            if cell or header in ("notes", "run", "attention") or (header == "data" and not other_data
                                                                    and "char" not in kinds):
                continue
            why = ("lm-eval", run_record.NOT_EVALUATED) if header.startswith("lm_eval/") else REASONS[header]
            assert any(words in row["notes"] for words in ((why,) if isinstance(why, str) else why)), \
                (row["run"], header, row["notes"])
    if (out / "stats.csv").exists() and other_data:  # groups of runs on other data are never paired
        with (out / "stats.csv").open() as f:
            verdicts = {r["attention"]: r["verdict"] for r in csv.DictReader(f)}
        assert compare.OTHER_DATA.verdict in verdicts.values()


def test_the_evaluated_metrics_of_one_run_are_blank_with_a_reason_for_another(tmp_path, capsys):
    """A run with `lit-attn evaluate` results beside one without: a column for each metric, blank where absent."""
    plain, evaluated = _runs(tmp_path / "runs", ("plain", "evaluated"))
    assert compare.main([str(plain), str(evaluated), "--out", str(tmp_path / "cmp")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| tokens/s | tiny_choice/acc | notes |")
    assert lines[2].endswith(f" | 6,400 |  | perplexity not logged (an older run); {run_record.NOT_EVALUATED} |")
    assert lines[3].endswith(" | 5,333 | 0.5 | perplexity not logged (an older run) |")


def test_runs_on_other_data_are_grouped_apart(tmp_path, capsys):
    """Seeds of mha and sqa on two corpora: four groups; each paired only with the reference on its own data."""
    root = tmp_path / "runs"
    runs = []
    for i, data in enumerate((CHAR, CHAR_OTHER)):
        for attention, loss in (("mha", 2.0), ("sqa", 1.9)):
            for seed in (1, 2, 3):
                run = _seeded(root / f"data{i}", attention, seed, loss + seed / 100)
                _data(run, data)
                runs.append(run)
    out = tmp_path / "cmp"
    assert compare.main([*map(str, runs), "--out", str(out), "--reference", "mha"]) == 0
    with (out / "stats.csv").open() as f:
        stats = {r["attention"]: r for r in csv.DictReader(f)}
    assert list(stats) == [f"{a} on {d}" for d in (CHAR, CHAR_OTHER) for a in ("mha", "sqa")]
    assert stats[f"mha on {CHAR}"]["verdict"] == "reference"
    assert stats[f"sqa on {CHAR}"]["verdict"] == "better" and stats[f"sqa on {CHAR}"]["n_pairs"] == "3"
    assert {stats[f"{a} on {CHAR_OTHER}"]["verdict"] for a in ("mha", "sqa")} == {compare.OTHER_DATA.verdict}
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| run | attention | data | seed |") and f"| mha | {CHAR} | 1 |" in table[2]
    assert compare.main([*map(str, runs), "--out", str(out), "--overwrite", "--group-by", "data"]) == 0
    with (out / "stats.csv").open() as f:
        assert [r["data"] for r in csv.DictReader(f)] == [CHAR, CHAR_OTHER]  # a group per data, mha and sqa in it


@pytest.mark.parametrize(("kinds", "other_data"), MIXES, ids=IDS)
def test_cost_card_takes_any_mix_of_one_data_and_refuses_other_data(kinds, other_data, tmp_path, capsys):
    runs = _runs(tmp_path / "runs", kinds)
    out = tmp_path / "card"
    code = cost_card.main(["--runs", *map(str, runs), "--out", str(out)])
    err = capsys.readouterr().err
    if other_data:
        assert code == 2 and err.startswith("error: the runs were trained on different data (") and \
            err.count("\n") == 1, err
        assert not out.exists()
        return
    assert code == 0, err
    md = (out / "cost_card.md").read_text()
    for run in runs:
        if "evaluated" in kinds and not (run / "eval").exists():
            assert f"- run {run.name}: {run_record.NOT_EVALUATED}" in md
    with (out / "cost_card.csv").open() as f:
        rows = {r["attention"]: r for r in csv.DictReader(f)}
    for name, row in rows.items():  # a blank lm-eval cell: the attention's runs were not evaluated, and say so
        if any(h.startswith("lm_eval/") and not row[h] for h in row):
            assert any(line.startswith("- run ") and f"-{name}-None-s" in line
                       and (run_record.NOT_EVALUATED in line or "not among its evaluations" in line)
                       for line in md.splitlines())


def test_cost_card_reference_among_language_modelling_runs_is_not_an_error(tmp_path, capsys):
    runs = _runs(tmp_path / "runs", ("plain", "plain", "plain", "plain"))
    assert cost_card.main(["--runs", *map(str, runs), "--reference", "mha", "--out", str(tmp_path / "card")]) == 0
    md = capsys.readouterr().out
    assert "has no MQAR accuracy" not in md
    assert "- --reference mha: no paired table, no run has MQAR accuracy, passkey accuracy or loss ratios" in md
    assert cost_card.main(["--runs", *map(str, runs), "--reference", "gqa", "--out", str(tmp_path / "c2")]) == 2
    assert capsys.readouterr().err == "error: --reference 'gqa' is none of the runs' attentions: mha, sqa\n"
    assert not (tmp_path / "c2").exists()


def _mqar_run(root: Path, name: str, acc: float | None, *, finished: bool = True, data: str = "MQARDataModule"):
    from torch.utils.tensorboard import SummaryWriter

    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"seed_everything: 1\nmodel:\n  attention: mha\n  n_embd: 64\ndata:\n  class_path: datamodules.{data}\n"
        "  init_args:\n    input_seq_len: 64\n    num_kv_pairs: 4\n")
    writer = SummaryWriter(str(run))
    writer.add_scalar("val/loss", 1.0, 3)
    if acc is not None:
        writer.add_scalar("val/mqar_acc", acc, 3)
    if finished:
        writer.add_scalar("whole_run/train_time", 10.0, 4)
    writer.close()
    return run


# (the runs beside a finished MQAR run, the reason each is left out)
LEFT_OUT = [
    ("text", {"data": "CharDataModule"}, "not trained on MQAR data"),
    ("unvalidated", {"acc": None}, "no val/mqar_acc logged"),
    ("interrupted", {"finished": False}, "did not finish (no end-of-fit record"),
]


@pytest.mark.parametrize(("kind", "how", "why"), LEFT_OUT, ids=[k for k, _, _ in LEFT_OUT])
def test_recall_grid_leaves_out_runs_without_a_place_and_says_why(kind, how, why, tmp_path, capsys):
    good = _mqar_run(tmp_path, "good", 0.9)
    other = _mqar_run(tmp_path, kind, **({"acc": 0.8} | how))
    out = tmp_path / "grid"
    assert recall_grid.main([str(good), str(other), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| mha | 0.900 (1) |" in printed and f"- left out: {other}: {why}" in printed
    assert f"- left out: {other}: {why}" in (out / "recall_grid.md").read_text()
    assert recall_grid.main([str(other), "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no run has a place in the grid: {other}: {why}") and err.count("\n") == 1
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("damage", "why"), [
    (lambda config: config.unlink(), "no {config} (not a run, or one that never started)"),
    (lambda config: config.write_bytes(b"\xff\xfe data: ["), "{config} cannot be read (not UTF-8 YAML)"),
    (lambda config: config.write_text("data: [unclosed\n"), "{config} cannot be read (not UTF-8 YAML)"),
], ids=["missing", "binary", "not-yaml"])
def test_recall_grid_names_a_runs_missing_or_broken_config(damage, why, tmp_path, capsys):
    good = _mqar_run(tmp_path, "good", 0.9)
    other = _mqar_run(tmp_path, "damaged", 0.8)
    damage(other / "config.yaml")
    assert recall_grid.main([str(good), str(other), "--out", str(tmp_path / "grid")]) == 0
    assert f"- left out: {other}: {why.format(config=other / 'config.yaml')}" in capsys.readouterr().out


def test_cost_card_names_a_bench_file_that_is_not_text(tmp_path, capsys):
    bench = tmp_path / "bench.csv"
    bench.write_bytes(b"\xff\xfe\x00\x01 not a csv")
    assert cost_card.main(["--bench", str(bench), "--out", str(tmp_path / "card")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {bench} is not a CSV text file (UnicodeDecodeError); give the CSV the benchmark wrote\n"
