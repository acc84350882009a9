"""lit_attn.tools.cost_card_layout through `lit-attn cost-card`: the analytic columns count for the model the runs
trained (each attention's own heads), runs of unlike models are refused in one line, and runs that do not record
their model fall back to the paper's layout with a note, or are refused when --layout runs asks for them."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import yaml
from docs_commands import unpack_records
from test_cost_card import _decode

from lit_attn.analytic import cache_values_per_token, gpt_params, gpt_train_flops_per_token
from lit_attn.config import GPTConfig
from lit_attn.tools import cost_card


def _run(root: Path, attention: str, n_embd: int = 32, **model) -> tuple[Path, GPTConfig]:
    """A run's hparams.yaml (the model, the data's vocab_size, training settings), config.yaml and events with
    the parameters its model has."""
    from torch.utils.tensorboard import SummaryWriter

    config = GPTConfig(vocab_size=50, attention=attention, n_layer=2, n_embd=n_embd, n_head=4, block_size=16,
                       pos="rope", **model)
    run = root / f"{attention}-w{n_embd}"
    run.mkdir(parents=True)
    hparams = dataclasses.asdict(config) | {"lr": 1e-3, "batch_size": 8, "num_kv_pairs": 4}
    (run / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    (run / "config.yaml").write_text(yaml.safe_dump({"seed_everything": 1, "model": {"attention": attention}}))
    with SummaryWriter(str(run)) as writer:
        writer.add_scalar("val/loss", 2.0, 3)
        writer.add_scalar("whole_run/n_params", gpt_params(config)["total"], 3)
    return run, config


def _card(out: Path) -> dict[str, dict[str, str]]:
    with (out / "cost_card.csv").open() as f:
        return {r["attention"]: r for r in csv.DictReader(f)}


def test_the_card_counts_for_the_model_its_runs_trained(tmp_path, capsys):
    runs = [_run(tmp_path, "mha"), _run(tmp_path, "sqa"), _run(tmp_path, "gqa", n_kv_heads=2)]
    out = tmp_path / "card"
    assert cost_card.main(["--runs", *(str(r) for r, _ in runs), "--attention", "mha,sqa,gqa,mqa",
                           "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err, err  # the runs' parameters are the card's
    card, md = _card(out), (out / "cost_card.md").read_text()
    for _, config in runs:
        row = card[config.attention]
        assert int(row["parameters"]) == gpt_params(config)["total"]
        assert int(row["train_flops_per_token"]) == gpt_train_flops_per_token(config, 16)
        assert int(row["cache_bytes_per_token_analytic"]) == 4 * cache_values_per_token(config)
    assert (card["gqa"]["n_query_heads"], card["gqa"]["n_kv_heads"]) == ("4", "2")  # the run's own n_kv_heads
    assert (card["sqa"]["n_query_heads"], card["sqa"]["n_kv_heads"]) == ("2", "1")
    # mqa has no run: the runs' model with mqa swapped in; 2 layers x (key + value) x 1 head x 8 channels x 4 B
    assert int(card["mqa"]["cache_bytes_per_token_analytic"]) == 2 * 2 * 1 * 8 * 4
    assert md.startswith("- layout of the runs (2 layers, width 32, 4 heads, context 16, vocabulary 50); "
                         "parameters, FLOPs/token at T=16")


def test_runs_of_unlike_models_are_a_one_line_error(tmp_path, capsys):
    (a, _), (b, _) = _run(tmp_path, "mha"), _run(tmp_path, "sqa", n_embd=64)
    assert cost_card.main(["--runs", str(a), str(b), "--out", str(tmp_path / "card")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the runs' models differ in n_embd (32 in {a}, 64 in {b}): the card counts for one "
                          "model; give runs of one layout") and err.count("\n") == 1
    assert not (tmp_path / "card").exists()
    # A chosen layout counts for that model, and warns that the runs' parameters are other
    assert cost_card.main(["--runs", str(a), str(b), "--layout", "sqa-paper", "--out", str(tmp_path / "card")]) == 0
    assert "warning: mha: the runs have" in capsys.readouterr().err


def test_runs_without_their_model_fall_back_or_are_refused(tmp_path, capsys):
    run, _ = _run(tmp_path, "mha")
    (run / "hparams.yaml").write_text("attention: mha\n")  # an older run's: no vocab_size, no model to rebuild
    assert cost_card.main(["--runs", str(run), "--out", str(tmp_path / "card")]) == 0
    md = (tmp_path / "card" / "cost_card.md").read_text()
    assert md.startswith(f"- layout sqa-paper ({run} records no vocab_size (hparams.yaml)); ")
    assert _card(tmp_path / "card")["mha"]["parameters"] == "11966224"  # the paper's MHA
    capsys.readouterr()
    assert cost_card.main(["--runs", str(run), "--layout", "runs", "--out", str(tmp_path / "card2")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --layout runs: {run} records no vocab_size (hparams.yaml); give run directories that "
                   "record their model, or --layout sqa-paper or small\n")


def test_measured_inputs_keep_the_benchmarks_layout(tmp_path):
    """decode.csv timed the paper's model: the card counts for it unless told otherwise."""
    run, _ = _run(tmp_path, "mha")
    decode = _decode(tmp_path / "decode.csv")
    assert cost_card.main(["--runs", str(run), "--decode", str(decode), "--context", "256", "--out",
                           str(tmp_path / "card")]) == 0
    assert _card(tmp_path / "card")["mha"]["parameters"] == "11966224"
    assert (tmp_path / "card" / "cost_card.md").read_text().startswith("- layout sqa-paper; ")


def test_the_archived_mqar_runs_get_their_own_counts(tmp_path):
    """Real runs (docs/mqar_runs.tar.gz): every attention's analytic parameters equal those its runs logged."""
    root = unpack_records(tmp_path) / "records" / "runs"
    runs = sorted(root.glob("mqar-w64-*-s?"))
    rows, table, _ = cost_card.cost_card(cost_card.parse_args(["--runs", *map(str, runs), "--out",
                                                               str(tmp_path / "card")]))
    assert "layout of the runs (2 layers, width 64, 4 heads, context 64, vocabulary 8,192)" in table
    logged = cost_card.run_results(None, [str(r) for r in runs])
    assert {r["attention"]: r["parameters"] for r in rows} == {k: v["parameters"] for k, v in logged.items()}
    cache = {r["attention"]: r["cache_bytes_per_token_analytic"] for r in rows}
    # 2 layers x (key + value) x kv heads x 16 channels x 4 bytes
    assert (cache["mha"], cache["gqa"], cache["ssqa"], cache["xsqa"]) == (1024, 256, 512, 256)


STATES = [("mha", None, "rope", "per token"), ("mha", {"window": 4}, "rope", "window"),
          ("mla", None, "rope", "per token"), ("gated_deltanet", {"chunk_size": 4}, "learned", "fixed")]


def test_the_decode_state_columns_are_what_the_layouts_keep(tmp_path):
    """Per sequence after T/8, T/2 and T tokens as the layout's values() say; per token only where the state grows
    per token (a window's, in the window), none for a fixed recurrent state; in the Markdown table too."""
    configs = {f"{name}{options or ''}": GPTConfig(vocab_size=50, attention=name, attention_options=options, n_layer=2,
                                                    n_embd=32, n_head=4, block_size=32, pos=pos)
               for name, options, pos, _ in STATES}
    rows = cost_card.build_card(next(iter(configs.values())), 32, 2, list(configs), configs=configs)
    for row, (*_, kind) in zip(rows, STATES):
        config = configs[row["attention"]]
        layout = config.spec.state(**config.attention_args())
        assert [row[k] for k in ("state_bytes_t8", "state_bytes_t2", "state_bytes_t")] == \
            [2 * 2 * layout.values(t) for t in (4, 16, 32)]  # 2 layers x 2 bytes per value
        assert row["cache_bytes_per_token_analytic"] == (None if kind == "fixed" else 2 * 2 * layout.values(1))
        assert row["decoding"] == kind
    window, gdn = rows[1], rows[3]
    assert window["state_bytes_t8"] == window["state_bytes_t2"] == window["state_bytes_t"]  # past the window of 4
    assert gdn["state_bytes_t8"] == gdn["state_bytes_t"] > 0
    assert rows[0]["state_bytes_t"] == 8 * rows[0]["state_bytes_t8"]
    table = cost_card.markdown(rows)
    assert ("| state B/token | state B/seq T/8 | state B/seq T/2 | state B/seq T | state B/seq T measured "
            "| decode state |") in table
    gdn_line = next(line for line in table.splitlines() if line.startswith("| gated_deltanet"))
    assert f"| – | {gdn['state_bytes_t8']:,} | {gdn['state_bytes_t8']:,} | {gdn['state_bytes_t8']:,} | – | fixed |" \
        in gdn_line


def test_an_attention_without_rope_is_counted_with_learned_positions():
    """The paper's layout uses RoPE; gated_deltanet takes none, so its row counts that layout with learned positions
    (as the README's table does) instead of staying blank."""
    from lit_attn.config import SPARSE_QUERY_LAYOUT

    (row,) = cost_card.build_card(SPARSE_QUERY_LAYOUT, 1024, 4, ["gated_deltanet"])
    config = dataclasses.replace(SPARSE_QUERY_LAYOUT, attention="gated_deltanet", pos="learned")
    assert row["parameters"] == gpt_params(config)["total"] and row["decoding"] == "fixed"
    assert row["state_bytes_t8"] == row["state_bytes_t"] == 4 * config.n_layer * config.spec.state(
        **config.attention_args()).values(1)


def test_the_card_takes_options_and_reads_the_decode_states_of_the_bench(tmp_path, capsys):
    """`--attention` entries carry their options as bench-decode names them; the card's rows on the paper's layout:
    growing per token for mha, flat past 256 tokens for the window, flat for gated_deltanet."""
    argv = ["--attention", 'mha,mha{"window": 256},gated_deltanet', "--out", str(tmp_path / "card")]
    assert cost_card.main(argv) == 0
    out = capsys.readouterr().out
    assert "state B/seq after T/8, T/2, T = 128, 512, 1024 tokens" in out
    with (tmp_path / "card" / "cost_card.csv").open(newline="") as f:
        rows = {r["attention"]: r for r in csv.DictReader(f)}
    keys = ("state_bytes_t8", "state_bytes_t2", "state_bytes_t")
    sizes = {name: [int(r[k]) for k in keys] for name, r in rows.items()}
    per_token = 8 * 2 * 256 * 4  # 8 layers x (k, v) x width 256 x 4 bytes
    assert sizes == {"mha": [per_token * t for t in (128, 512, 1024)],
                     'mha{"window": 256}': [per_token * 128, per_token * 256, per_token * 256],
                     "gated_deltanet": [sizes["gated_deltanet"][0]] * 3}
    assert [rows[n]["decoding"] for n in rows] == ["per token", "window", "fixed"]
    assert rows["gated_deltanet"]["cache_bytes_per_token_analytic"] == ""
