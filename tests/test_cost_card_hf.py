"""`lit-attn cost-card --hf-decode`: benchmarks.bench_hf_decode's hf_decode.csv (lit-attn's and transformers'
generate on the same weights) is the decode column's reference, one note per batch."""

from __future__ import annotations

import csv
from pathlib import Path

from lit_attn.tools import cost_card


def _hf_decode(path: Path, rows: list[tuple[int, float, float, bool]]) -> Path:
    """An hf_decode.csv as benchmarks.bench_hf_decode writes it: (batch, lit tok/s, HF tok/s, tokens equal)."""
    from benchmarks.bench_hf_decode import CSV_COLUMNS

    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for batch, lit, hf, equal in rows:
            writer.writerow(["gpt2", "cpu", "float32", 1, batch, 64, 256, lit, hf, round(lit / hf, 3),
                             round(lit / hf * 0.9, 3), round(lit / hf * 1.1, 3), equal, 0.5, 0.6])
    return path


def test_hf_decode_is_the_decode_columns_reference(tmp_path, capsys):
    ref = _hf_decode(tmp_path / "hf_decode.csv", [(1, 180.0, 150.0, True), (8, 800.0, 600.0, False)])
    assert cost_card.main(["--hf-decode", str(ref), "--attention", "mha", "--out", str(tmp_path / "all")]) == 0
    text = (tmp_path / "all" / "cost_card.md").read_text()
    assert ("decode reference (hf_decode.csv: gpt2 layout, float32, 1 threads, batch 1, prompt 64, 256 new tokens): "
            "lit-attn generate 180.0 "
            "tokens/s, transformers generate 150.0, ratio 1.2 (1.08-1.32), tokens equal") in text
    assert ("batch 8, prompt 64, 256 new tokens): lit-attn generate 800.0 tokens/s, transformers generate 600.0, "
            "ratio 1.333") in text
    assert "tokens DIFFER" in text  # a reference whose tokens differ says so
    assert cost_card.main(["--hf-decode", str(ref), "--batch", "8", "--attention", "mha",
                           "--out", str(tmp_path / "eight")]) == 0
    text = (tmp_path / "eight" / "cost_card.md").read_text()
    assert "batch 8," in text and "batch 1," not in text
    capsys.readouterr()
    assert cost_card.main(["--hf-decode", str(ref), "--batch", "4", "--out", str(tmp_path / "four")]) == 0
    assert "has no row at batch 4: no decode reference" in capsys.readouterr().err


def test_hf_decode_without_a_column_is_an_error(tmp_path, capsys):
    bad = tmp_path / "hf_decode.csv"
    bad.write_text("batch,ratio\n1,1.2\n")
    assert cost_card.main(["--hf-decode", str(bad), "--out", str(tmp_path / "card")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "has no column layout" in err and len(err.strip().splitlines()) == 1
