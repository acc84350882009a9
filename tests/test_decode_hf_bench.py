"""benchmarks.bench_hf_decode on a tiny model: lit-attn's and transformers' greedy generations agree token for
token, and the report says so."""

import pytest

pytest.importorskip("transformers")

from benchmarks.bench_hf_decode import build, main, report, run_batch  # noqa: E402


def test_lit_attn_and_hugging_face_generate_the_same_tokens():
    model, hf = build("tiny")
    row = run_batch(model, hf, batch=3, prompt=5, new_tokens=12, warmup=0, repeats=1)
    assert row.equal and row.first_difference is None
    assert len(row.lit) == len(row.hf) == len(row.lit_first) == 1 and len(row.ratios) == 1
    text = report(row, threads=1)
    assert "batch 3: lit-attn / HF tokens/s" in text and "tokens equal" in text and "load average" in text


def test_cli_prints_one_report_per_batch(capsys):
    assert main(["--layout", "tiny", "--batches", "1,2", "--prompt", "4", "--new-tokens", "3", "--repeats", "1",
                 "--warmup", "0", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("tokens equal") == 2 and "batch 1:" in out and "batch 2:" in out


@pytest.mark.parametrize("argv, message", [
    (["--batches", "0"], "--batches needs integers >= 1"),
    (["--layout", "tiny", "--prompt", "60", "--new-tokens", "8"], "prompt + new tokens <= block size 64"),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_out_writes_one_csv_row_per_batch_and_keeps_earlier_files(tmp_path, capsys):
    import csv

    from benchmarks.bench_hf_decode import CSV_COLUMNS

    argv = ["--layout", "tiny", "--batches", "1,2", "--prompt", "4", "--new-tokens", "3", "--repeats", "1",
            "--warmup", "0", "--threads", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    with (tmp_path / "hf_decode.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["batch"] for r in rows] == ["1", "2"] and list(rows[0]) == list(CSV_COLUMNS)
    for r in rows:
        assert r["tokens_equal"] == "True" and r["threads"] == "1" and r["layout"] == "tiny"
        assert abs(float(r["ratio"]) - float(r["lit_tokens_per_sec"]) / float(r["hf_tokens_per_sec"])) < 0.01
    assert "tokens equal" in (tmp_path / "hf_decode.md").read_text()
    before = (tmp_path / "hf_decode.csv").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "hf_decode.csv").read_text() == before
