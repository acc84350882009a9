"""lit-attn recall-grid: MQAR accuracy by setting, attention and width from run directories."""

import csv
from pathlib import Path

import pytest

from lit_attn.tools.recall_grid import _cell_text, main, read_grid
from lit_attn.tools.recall_state import State, cell_state

MQAR_DATA = "datamodules.MQARDataModule"


def _run(root: Path, attention: str, width: int, seed: int, acc: float | None, *, length: int = 64, pairs: int = 4,
         data: str = MQAR_DATA, finished: bool = True, step: int = 3, heads: int = 4, early: bool = False,
         model: dict | None = None) -> Path:
    """A run's records as a fit writes them; with `model`, an hparams.yaml holding the model (with the data's
    vocabulary, as a fit saves it), so that its GPTConfig can be rebuilt."""
    import yaml
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    run = root / f"{attention}-w{width}-T{length}-s{seed}"
    run.mkdir(parents=True)
    if model is not None:
        (run / "hparams.yaml").write_text(yaml.safe_dump(model_hparams(attention, width, heads, length, model)))
    (run / "config.yaml").write_text(
        f"seed_everything: {seed}\nmodel:\n  attention: {attention}\n  n_embd: {width}\n  n_head: {heads}\n"
        f"data:\n  class_path: {data}\n  init_args:\n    input_seq_len: {length}\n    num_kv_pairs: {pairs}\n")
    writer = SummaryWriter(str(run))
    writer.add_scalar("val/loss", 1.0, 3)
    if acc is not None:
        writer.add_scalar("val/mqar_acc", acc / 2, 1)  # an earlier validation: the last one counts
        writer.add_scalar("val/mqar_acc", acc, step)
    if finished:
        writer.add_scalar("whole_run/train_time", 10.0, 4)  # the end-of-fit record
    if early:  # as an EarlyStopping stop records itself: the step, and the reason in the HPARAMS record
        writer.add_scalar("whole_run/stopped_early_at_step", step, step)
        for summary in hparams({"Stopped early": f"Stopping threshold reached: val/mqar_acc = {acc} > 0.99."}, {}):
            writer.file_writer.add_summary(summary)
    writer.close()
    return run


def model_hparams(attention: str, width: int, heads: int, length: int, model: dict) -> dict:
    return {"vocab_size": 16, "attention": attention, "n_embd": width, "n_head": heads, "n_layer": 2,
            "block_size": length, **model}


@pytest.fixture(scope="module")
def grid_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    runs = [_run(root, "mha", 64, s, a) for s, a in ((1, 0.99), (2, 0.97), (3, 0.98))]
    runs += [_run(root, "mha", 128, s, 1.0) for s in (1, 2)]
    runs += [_run(root, "sqa", 64, s, a) for s, a in ((1, 0.5), (2, 0.7))]
    runs += [_run(root, "mha", 64, 1, 0.6, length=128, pairs=8)]
    return runs


def test_cells_group_runs_by_setting_attention_and_width(grid_runs):
    cells = {(c.setting, c.attention, c.width): c for c in read_grid(grid_runs)}
    assert set(cells) == {((64, 4), "mha", 64), ((64, 4), "mha", 128), ((64, 4), "sqa", 64), ((128, 8), "mha", 64)}
    assert sorted(cells[(64, 4), "mha", 64].accuracies) == pytest.approx([0.97, 0.98, 0.99])
    assert cells[(64, 4), "mha", 64].seeds == [1, 2, 3]


@pytest.mark.slow  # draws a figure
def test_table_csv_and_plot(tmp_path, grid_runs, capsys):
    out = tmp_path / "grid"
    assert main([*map(str, grid_runs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sequence length 64, 4 key-value pairs, at step 3 " in text
    assert "sequence length 128, 8 key-value pairs" in text
    assert "| mha | 0.980 ± 0.010 (3) | 1.000 ± 0.000 (2) |" in text
    assert "| sqa | 0.600 ± 0.141 (2) |  |" in text  # no sqa run at width 128: an empty cell, not a zero
    rows = list(csv.DictReader((out / "recall_grid.csv").open()))
    sqa = next(r for r in rows if r["attention"] == "sqa")
    assert (sqa["runs"], sqa["seeds"]) == ("2", "1 2")
    assert (float(sqa["mqar_acc_min"]), float(sqa["mqar_acc_max"])) == pytest.approx((0.5, 0.7))
    assert (out / "recall_grid.png").stat().st_size > 10_000
    assert main([*map(str, grid_runs), "--out", str(out)]) == 2  # never replaced silently
    assert "--overwrite" in capsys.readouterr().err


def test_runs_of_one_cell_may_end_at_different_steps_where_an_early_stop_ended_them(tmp_path, capsys):
    """Seeds that pass the threshold at different steps are alike; the table of every run says where each ended."""
    runs = [_run(tmp_path, "mha", 64, 1, 0.995, step=7, early=True),
            _run(tmp_path, "mha", 64, 2, 0.993, step=5, early=True), _run(tmp_path, "mha", 64, 3, 0.6)]
    (cell,) = read_grid(runs)
    assert [(r.step, r.stopped_at_step, r.train_time_s) for r in cell.runs] == [(7, 7, 10.0), (5, 5, 10.0),
                                                                                 (3, None, 10.0)]
    assert main([*map(str, runs), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "| 64, 4 | mha | 64 | 1 | 0.995 | stopped early at step 7 | 0.2 min |" in printed
    assert "| 64, 4 | mha | 64 | 3 | 0.600 | step 3 | 0.2 min |" in printed
    # two runs that were not stopped early and ended at different steps are still refused
    other = _run(tmp_path / "more", "mha", 64, 4, 0.7, step=9)
    assert main([*map(str, runs), str(other), "--out", str(tmp_path / "out2")]) == 2
    assert "ended at different steps" in capsys.readouterr().err


@pytest.mark.parametrize("kind,message", [  # runs without a place in the grid: test_run_mixes.py
    ("shorter", "the mha runs at width 64 ended at different steps ("),
])  # runs that differ in their model are separated, not refused: test_grid_tables.py
def test_a_run_that_does_not_belong_is_a_one_line_error(tmp_path, grid_runs, capsys, kind, message):
    bad = {"shorter": lambda: _run(tmp_path, "mha", 64, 9, 0.9, step=1)}[kind]()
    assert main([str(grid_runs[0]), str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # draws a figure
def test_the_documented_table_comes_from_the_archived_runs(tmp_path, capsys):
    """docs/mqar_runs.tar.gz holds the records of the runs behind docs/probes.md's MQAR table: the grid they give
    is the one the docs print."""
    import tarfile

    root = Path(__file__).resolve().parents[1]
    with tarfile.open(root / "docs" / "mqar_runs.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    runs = sorted((tmp_path / "runs").iterdir())
    assert main([*map(str, runs), "--out", str(tmp_path / "grid")]) == 0
    printed = capsys.readouterr().out
    documented = (root / "docs" / "probes.md").read_text(encoding="utf-8")
    for cell in read_grid(runs):
        text = _cell_text(cell)
        assert text in printed and text in documented, (cell.attention, cell.width, text)
    # The runs record their models: gqa and mqa, and xsmqa and xsqa, build one model at 4 heads; qsa and qsa_fixed
    # (one class, the same heads, other circuits) and mha and noq (the same heads, another class) do not
    notes = [line for line in printed.splitlines() if line.startswith("- ")]
    assert notes == [f"- {pair} are one model at width 64 ({heads} key/value heads): seed for seed, their runs train "
                     "the same network" for pair, heads in (("gqa and mqa", "4 query and 1"),
                                                         ("xsmqa and xsqa", "1 query and 1"))]


def test_runs_that_do_not_record_their_model_get_no_one_model_note(grid_runs, capsys):
    assert all(c.model is None for c in read_grid(grid_runs))  # config.yaml only: no vocabulary, no model
    assert main([*map(str, grid_runs), "--out", str(grid_runs[0].parent / "grid")]) == 0
    assert "one model" not in capsys.readouterr().out


@pytest.mark.slow  # draws a figure
def test_the_zoology_gpu_tables_come_from_the_archived_runs(tmp_path, capsys):
    """docs/mqar_zoology_gpu_runs.tar.gz holds the 64 runs behind docs/probes.md's GPU grid of Zoology's protocol:
    the best-of-learning-rate table and the table of every run are the ones recall-grid prints from them."""
    import re
    import tarfile

    root = Path(__file__).resolve().parents[1]
    with tarfile.open(root / "docs" / "mqar_zoology_gpu_runs.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    runs = sorted((tmp_path / "gpu_runs").iterdir())
    assert len(runs) == 64
    assert main([*map(str, runs), "--best-of", "model.lr", "--out", str(tmp_path / "grid")]) == 0
    printed = capsys.readouterr().out
    documented = (root / "docs" / "probes.md").read_text(encoding="utf-8")
    # one best-of table per setting, in setting order: its mha row is the documented row of that setting
    best_rows = [line for line in printed.splitlines() if re.match(r"\| mha \| \d\.\d{3} \(1\) at lr", line)]
    assert len(best_rows) == 4
    for (length, pairs), row in zip(((64, 4), (128, 8), (256, 16), (512, 64)), best_rows):
        assert row.replace("| mha |", f"| ({length}, {pairs}) |", 1) in documented, row
    # every run: its accuracy and the step it ended at, early or by the budget
    ends: dict[tuple[str, str], list[str]] = {}
    for line in printed.splitlines():
        if m := re.match(r"\| (\d+, \d+) \| mha \| (\d+) \| [\d.]+ \| 123 \| ([\d.]+) \| (.+?) \|", line):
            ended = m[4].replace("stopped early at step ", "early, ").replace("step ", "")
            ends.setdefault((m[1], m[2]), []).append(f"{m[3]} ({ended})")
    assert len(ends) == 16 and all(len(v) == 4 for v in ends.values())
    for (setting, width), cells in ends.items():
        assert f"| ({setting}), {width} | " + " | ".join(cells) + " |" in documented, (setting, width)


@pytest.mark.slow  # draws a figure
def test_the_zoology_cpu_table_comes_from_the_archived_runs(tmp_path, capsys):
    """docs/mqar_zoology_cpu_runs.tar.gz holds the CPU runs of Zoology's protocol behind docs/probes.md's CPU
    table: each run's accuracy and where it ended are the ones recall-grid prints from them."""
    import re
    import tarfile

    root = Path(__file__).resolve().parents[1]
    with tarfile.open(root / "docs" / "mqar_zoology_cpu_runs.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    runs = sorted((tmp_path / "cpu_runs").iterdir())
    assert main([*map(str, runs), "--best-of", "model.lr", "--out", str(tmp_path / "grid")]) == 0
    printed = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line for line in
            (root / "docs" / "probes.md").read_text(encoding="utf-8").splitlines()
            if line.startswith(("| (64, 4), width 64 |", "| (128, 8), width 64 |"))}
    found = 0
    for line in printed.splitlines():
        early = r"\| (\d+, \d+) \| mha \| 64 \| [\d.]+ \| 123 \| ([\d.]+) \| stopped early at step ([\d,]+) \|"
        if m := re.match(early, line):
            assert f"{m[2]} (early, {m[3]})" in rows[f"({m[1]}), width 64"], line
            found += 1
    assert found == 3  # two learning rates at (64, 4), one at (128, 8)


def _rows(text: str, header: str) -> list[str]:
    """The body rows of every markdown table in `text` whose header line starts with `header`."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith(header):
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            rows.append(line)
        elif not line.startswith("|"):
            inside = False
    return rows


@pytest.mark.slow  # draws figures
def test_the_tuned_recall_grid_comes_from_the_archived_runs(tmp_path, capsys):
    """docs/mqar_tuned_runs.tar.gz holds the runs behind docs/probes.md's tuned recall grid: its best-of tables,
    its table of every grid point and its paired differences against MHA are the ones recall-grid and the cost
    card print from them."""
    import tarfile

    from lit_attn.tools import cost_card

    root = Path(__file__).resolve().parents[1]
    with tarfile.open(root / "docs" / "mqar_tuned_runs.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    runs = tmp_path / "mqar_tuned_runs"
    documented = (root / "docs" / "probes.md").read_text(encoding="utf-8")
    assert main([*map(str, sorted(runs.iterdir())), "--best-of", "model.lr", "--out", str(tmp_path / "grid")]) == 0
    printed = capsys.readouterr().out
    chosen = _rows(printed, "| attention | width 64 |")
    points = _rows(printed, "| attention | width | model.lr |")
    assert chosen and points
    for row in chosen + points:
        assert row in documented, row
    # paired by seed against MHA at its own best point, one cost card per group of like runs
    groups = [sorted(map(str, runs.glob(pattern))) for pattern in ("mqar-w64-*", "mqar-w64l-*", "mqar-w128-*")]
    for group in filter(None, groups):
        pattern = Path(group[0]).name.split("-")[1]
        assert cost_card.main(["--runs", *group, "--best-of", "model.lr", "--reference", "mha",
                               "--out", str(tmp_path / pattern)]) == 0
        paired = _rows(capsys.readouterr().out, "| attention | runs | MQAR acc |")
        assert paired
        for row in paired:
            assert row in documented, (pattern, row)


# A run's decode state per sequence after its MQAR sequence length: K/V grows with it, a window stops at its width, a
# recurrent state (gated_deltanet) does not grow. Each kind of model once, as hparams.yaml records it.
STATE_MODELS = {"mha": ("mha", {}), "gated_deltanet": ("gated_deltanet", {"pos": "learned"}),
                "mha/S/w16": ("mha", {"layer_pattern": "S", "local_window": 16})}


@pytest.fixture(scope="module")
def state_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("state_runs")
    return [_run(root / label.replace("/", "_"), attention, width, seed, acc, length=length, pairs=pairs,
                 model=model)
            for label, (attention, model) in STATE_MODELS.items() for width in (32, 64)
            for length, pairs in ((64, 4), (128, 8)) for seed, acc in ((1, 0.5), (2, 0.7))]


def test_each_cell_has_its_models_decode_state_in_float32_bytes(state_runs):
    from lit_attn.analytic import cache_values_per_sequence
    from lit_attn.config import GPTConfig

    cells = read_grid(state_runs)
    assert {c.attention for c in cells} == set(STATE_MODELS)
    assert len(cells) == 12  # 3 models x 2 widths x 2 settings
    for c in cells:
        attention, model = STATE_MODELS[c.attention]
        length = c.setting[0]
        config = GPTConfig(**model_hparams(attention, c.width, 4, length, model))
        assert c.state.bytes == cache_values_per_sequence(config, length) * 4, (c.attention, c.width, c.setting)
        assert all(run.state == c.state for run in c.runs)
    at = {(c.attention, c.width, c.setting[0]): c.state for c in cells}
    for width in (32, 64):  # K/V doubles with the length; a window and a recurrent state do not grow past it
        assert at["mha", width, 128].bytes == 2 * at["mha", width, 64].bytes
        assert at["gated_deltanet", width, 128].bytes == at["gated_deltanet", width, 64].bytes
        assert at["mha/S/w16", width, 128].bytes == at["mha/S/w16", width, 64].bytes < at["mha", width, 64].bytes
        assert [at[a, width, 64].kind for a in STATE_MODELS] == ["per token", "fixed", "window"]


@pytest.mark.slow  # draws figures
def test_state_table_csv_and_figure(tmp_path, state_runs, capsys):
    """The markdown and the CSV give each cell's state; the figure is written; a run whose model cannot be rebuilt
    (no hparams.yaml: no vocabulary) gets a note, not a crash."""
    unknown = _run(tmp_path / "old", "sqa", 64, 1, 0.6)
    out = tmp_path / "grid"
    assert main([*map(str, state_runs), str(unknown), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    cells = {(c.attention, c.width, c.setting): c for c in read_grid(state_runs)}
    gdn = cells["gated_deltanet", 64, (128, 8)]
    assert f"| 128, 8 | gated_deltanet | 64 | {gdn.state.bytes:,} B | fixed | 0.600 |" in printed
    assert "(float32, 4 bytes per value)" in printed
    assert f"- no decode state for sqa at width 64: its model cannot be rebuilt: {unknown} records no vocab_size" \
        in printed
    with (out / "recall_grid.csv").open() as f:
        rows = {(r["attention"], r["width"], r["input_seq_len"]): r for r in csv.DictReader(f)}
    assert rows["gated_deltanet", "64", "128"]["state_bytes"] == str(gdn.state.bytes)
    assert rows["mha/S/w16", "32", "64"]["decoding"] == "window"
    assert rows["sqa", "64", "64"]["state_bytes"] == ""
    assert (out / "recall_grid_state.png").stat().st_size > 10_000


@pytest.mark.parametrize("states,expected", [
    ([State(4096, "fixed"), State(4096, "fixed")], State(4096, "fixed")),
    ([State(4096, "window"), State(8192, "per token")],
     State(None, why="its runs keep different decode states (4,096, 8,192 bytes): their models differ in what the "
                     "attention sets (options, heads, layer pattern)")),
    ([State(4096, "fixed"), State(None, why="x records no vocab_size")], State(None, why="x records no vocab_size")),
])
def test_a_cell_has_a_state_only_when_its_runs_agree(states, expected):
    assert cell_state(states) == expected
