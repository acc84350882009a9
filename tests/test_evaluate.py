"""`lit-attn evaluate`: the lm-eval adapter's numbers against the network's own, local tasks end to end, where the
results go, and what is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_FIT, history, write_bpe_tokenizer, write_corpus

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from lit_attn.codec import BPECodec  # noqa: E402
from lit_attn.load import load_run  # noqa: E402
from lit_attn.tools import compare, cost_card, evaluate  # noqa: E402
from lit_attn.tools.evaluate_lm import LitAttnLM  # noqa: E402
from lit_attn.tools.events import event_files  # noqa: E402

CHOICES = [("the cat sat on the", ["mat", "sky", "cat"], 0), ("one two three", ["four", "five"], 1),
           ("a b c d e f g h i j k l m n o p q", ["r s", "x"], 0), ("hello", ["world", "there"], 1)]
TEXTS = ["the quick brown fox jumps over the lazy dog and runs away.", "a short line."]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny trained char run (block_size 16) on lowercase words."""
    from lit_attn.cli.lightning_cli import cli

    where = tmp_path_factory.mktemp("evaluate")
    corpus = write_corpus(where / "corpus.txt", non_ascii=False)
    assert cli(["fit", f"--data.path={corpus}", f"--runs_dir={where / 'runs'}", "--run=char", *TINY_FIT,
                "--data.batch_size=4", "--params.print_table=false"]) == 0
    return where / "runs" / "char"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """A multiple-choice task over a local jsonl and a perplexity task over a local text file."""
    where = tmp_path_factory.mktemp("tasks")
    (where / "mc.jsonl").write_text("".join(json.dumps({"context": c, "choices": ch, "answer": a}) + "\n"
                                            for c, ch, a in CHOICES))
    (where / "text.txt").write_text("\n".join(TEXTS) + "\n")
    (where / "mc.yaml").write_text(f"""task: local_mc
dataset_path: json
dataset_kwargs: {{data_files: {{test: {where / 'mc.jsonl'}}}}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list: [{{metric: acc, aggregation: mean, higher_is_better: true}}]
""")
    (where / "text.yaml").write_text(f"""task: local_text
dataset_path: text
dataset_kwargs: {{data_files: {{test: {where / 'text.txt'}}}}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list: [{{metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}}]
""")
    return where


@pytest.fixture(scope="module")
def char_lm(run) -> LitAttnLM:
    loaded = load_run(run)
    return LitAttnLM(loaded.network, loaded.codec, batch_size=3, progress=False)


@pytest.fixture(scope="module")
def bpe_lm(tmp_path_factory) -> LitAttnLM:
    """A BPE checkpoint (trained tokenizer, untrained network, block_size 16) as the sampling tests build one."""
    from lit_attn import GPT

    where = tmp_path_factory.mktemp("bpe")
    tok = write_bpe_tokenizer(where / "tokenizer.json")
    hp = {"vocab_size": tok.get_vocab_size(), "n_layer": 1, "n_embd": 32, "n_head": 4, "block_size": 16}
    return LitAttnLM(GPT(**hp).transformer.eval(), BPECodec.from_file(where / "tokenizer.json"), batch_size=3,
                     progress=False)


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, a, i, ("task", i, 1)) for i, a in enumerate(args)]


@torch.no_grad()
def _direct(lm: LitAttnLM, inputs: list[int], targets: list[int]) -> tuple[float, bool]:
    """The network's own summed log-prob of `targets`, the last len(targets) next tokens after `inputs`."""
    logits = lm.model(torch.tensor([inputs]))[0, -len(targets):]
    logp = F.log_softmax(logits.float(), -1)
    return float(logp[range(len(targets)), targets].sum()), logits.argmax(-1).tolist() == targets


def _pairs(lm: LitAttnLM) -> list[tuple[str, str]]:
    return [("hello world", " there"), ("", "hello"), ("the world is wide. " * 5, " hello world, hello"),
            ("the", " world")] if lm.codec.eot_id is not None else \
        [("the cat sat", " on"), ("", "abc"), ("the lazy dog went over the hill and far", " away"), ("a", " b")]


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_loglikelihood_is_the_networks_own_summed_log_prob(which, char_lm, bpe_lm):
    lm = char_lm if which == "char" else bpe_lm
    pairs = _pairs(lm)
    got = lm.loglikelihood(_requests("loglikelihood", pairs))
    assert len(got) == len(pairs)
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        # A context's trailing space belongs to the continuation (as the harness's own models split a pair)
        whole, head = lm.codec.encode(context + continuation), lm.codec.encode(context.rstrip())
        tokens = ([lm.prefix_id] if not head else []) + whole
        tokens = tokens[-(lm.block_size + 1):]  # a context longer than the model's is cut on the left
        cont = whole[len(head):]
        expected, expected_greedy = _direct(lm, tokens[:-1], cont)
        assert logprob == pytest.approx(expected, abs=1e-5) and greedy == expected_greedy
    assert len(lm.encode(pairs[2][0])) > lm.block_size, "one context is longer than the model's"


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_loglikelihood_rolling_scores_every_token_once_in_windows(which, char_lm, bpe_lm):
    lm = char_lm if which == "char" else bpe_lm
    texts = ["the world is wide. hello there. " * 5, "hello"] if which == "bpe" else TEXTS
    got = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(t,) for t in texts]))
    block = lm.block_size
    for text, logprob in zip(texts, got):
        ids = lm.codec.encode(text)
        seq = [lm.prefix_id] + ids  # seq[j + 1] is ids[j]
        expected = 0.0
        for start in range(0, len(ids), block):  # predict ids[start:end] from the block tokens before end
            end = min(start + block, len(ids))
            expected += _direct(lm, seq[max(0, end - block):end], ids[start:end])[0]
        assert logprob == pytest.approx(expected, abs=1e-4)
    assert len(lm.codec.encode(texts[0])) > 2 * block, "the first text needs three windows"


def test_generate_until_is_greedy_decoding_cut_at_the_first_stop(char_lm, monkeypatch):
    lm, prompts = char_lm, ["the cat", "the dog"]
    full = lm.model.generate(torch.tensor([lm.codec.encode(p) for p in prompts]), 30, temperature=0.0)
    texts = [lm.codec.decode(row[len("the cat"):].tolist()) for row in full]
    stop = texts[0][8:10]  # a string greedy decoding gives, after a few tokens
    steps = []
    generate = lm.model.generate

    def counting(*args, on_token, **kwargs):
        return generate(*args, on_token=lambda t: (steps.append(1), on_token(t)), **kwargs)

    monkeypatch.setattr(lm.model, "generate", counting)
    got = lm.generate_until(_requests("generate_until", [(p, {"until": [stop], "max_gen_toks": 30}) for p in prompts]
                                      + [(prompts[0], {"until": ["never seen"], "max_gen_toks": 5})]))
    assert got[0] == texts[0][:texts[0].index(stop)]
    assert got[1] == (texts[1][:texts[1].index(stop)] if stop in texts[1] else texts[1])
    assert got[2] == texts[0][:5], "no stop string: max_gen_toks tokens"
    assert stop in texts[1] and len(steps) < 30 + 5, "generation ended once both sequences met the stop string"


def test_a_character_the_model_never_saw_is_one_line(char_lm):
    with pytest.raises(ValueError, match="task task: characters not in the vocabulary: '7~'") as e:
        char_lm.loglikelihood(_requests("loglikelihood", [("~", " 7")]))
    assert "\n" not in str(e.value)


def _evaluate(run: Path, tasks: Path, *flags: str) -> int:
    return evaluate.main([f"--run={run.name}", f"--runs_dir={run.parent}", f"--include_path={tasks}", "--device=cpu",
                          *flags])


@pytest.mark.slow
def test_local_tasks_end_to_end_results_beside_the_training_record(run, tasks, char_lm, tmp_path, capsys):
    trained, training_files = history(run), event_files(run)
    assert _evaluate(run, tasks, "--tasks=local_mc,local_text", "--batch_size=2") == 0
    out, err = capsys.readouterr()
    assert "local_mc" in out and "wrote " in err
    results = json.loads((run / "eval" / "lm-eval-1" / "results.json").read_text())
    correct = []
    for context, choices, answer in CHOICES:  # the accuracy by hand: the most likely " " + choice
        scores = []
        for choice in choices:
            ids = char_lm.codec.encode(context + " " + choice)
            scores.append(_direct(char_lm, ids[:-1][-char_lm.block_size:], ids[len(context):])[0])
        correct.append(max(range(len(choices)), key=scores.__getitem__) == answer)
    assert results["results"]["local_mc"]["acc,none"] == pytest.approx(sum(correct) / len(correct))
    assert results["results"]["local_text"]["bits_per_byte,none"] > 0
    scalars = history(run / "eval" / "lm-eval-1")
    assert scalars["whole_run/lm_eval/local_mc/acc"] == [(4, pytest.approx(sum(correct) / len(correct)))]
    assert history(run) == trained and event_files(run) == training_files, "the training record changed"

    first = (run / "eval" / "lm-eval-1" / "results.json").read_bytes()
    assert _evaluate(run, tasks, "--tasks=local_mc", "--limit=2", "--ckpt=best") == 0
    assert (run / "eval" / "lm-eval-1" / "results.json").read_bytes() == first, "an earlier result is kept"
    second = json.loads((run / "eval" / "lm-eval-2" / "results.json").read_text())
    assert second["n-samples"]["local_mc"] == {"original": 4, "effective": 2}
    assert Path(second["config"]["checkpoint"]).name == "best-4.ckpt" and second["config"]["step"] == 4

    rows, text = compare.compare([run], tmp_path / "cmp")
    assert rows[0]["lm_eval/local_text/bits_per_byte"] == results["results"]["local_text"]["bits_per_byte,none"]
    assert "| local_mc/acc | local_text/bits_per_byte |" in text.splitlines()[0]
    assert "lm-eval local_mc: 2 of its 4 examples (--limit)" in rows[0]["notes"], "the newest evaluation's values"
    assert "lm_eval/local_mc/acc" in (tmp_path / "cmp" / "compare.csv").read_text().splitlines()[0]
    capsys.readouterr()
    assert cost_card.main(["--runs", str(run), "--layout", "small", "--out", str(tmp_path / "card")]) == 0
    card = capsys.readouterr().out
    assert "local_mc/acc" in card and "local_text/bits_per_byte" in card
    assert "lm_eval/local_mc/acc" in (tmp_path / "card" / "cost_card.csv").read_text().splitlines()[0]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and len([e for e in err if e.startswith("error")]) == 1, err
    return err[-1]


def test_what_is_not_a_run_or_a_task_is_refused_in_one_line(run, tasks, tmp_path, capsys, monkeypatch):
    before = sorted(run.glob("eval/lm-eval-*"))
    assert evaluate.main(["--run=nope", f"--runs_dir={run.parent}", "--tasks=local_mc"]) == 2
    assert "--run nope: no such run (" in _error(capsys)
    assert _evaluate(run, tasks, "--tasks=local_mc", "--ckpt", str(tmp_path / "x.ckpt")) == 2
    assert "no such checkpoint file" in _error(capsys)
    assert _evaluate(run, tasks, "--tasks=local_mc", "--limit=0") == 2
    assert "--limit must be > 0" in _error(capsys)
    assert _evaluate(run, tasks, "--tasks=local_mc", "--num_fewshot=-1") == 2
    assert _error(capsys) == "error: --num_fewshot must be >= 0, got -1"
    assert _evaluate(run, tasks, "--tasks=local_mc", "--num_fewshot=1000000") == 2
    assert _error(capsys) == ("error: --num_fewshot 1000000: more few-shot examples than a task of --tasks local_mc "
                              "has; give a smaller --num_fewshot")
    # A task whose data is on the Hub, evaluated offline: one line that says so (and nothing reaches the network).
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "hub.yaml").write_text((tasks / "mc.yaml").read_text().replace("local_mc", "hub_mc").replace(
        "dataset_path: json", "dataset_path: someone/a_dataset_never_cached"))
    assert evaluate.main([f"--run={run.name}", f"--runs_dir={run.parent}", f"--include_path={hub}",
                          "--tasks=hub_mc"]) == 2
    assert "Hugging Face Hub, which cannot be reached (HF_HUB_OFFLINE set" in _error(capsys)
    assert sorted(run.glob("eval/lm-eval-*")) == before, "a refused evaluation writes nothing"


@pytest.mark.parametrize("text, why", [
    ("task: broken_mc\ndataset_path: [json\n", "is not valid YAML (line 3)"),
    ("- just\n- a list\n", "is not an lm-eval task (a mapping with 'task:')"),
    (b"\xff\xfe\x00garbage", "is not UTF-8 text"),
])
def test_a_broken_task_file_is_named(run, tasks, tmp_path, capsys, text, why):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "broken.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    assert evaluate.main([f"--run={run.name}", f"--runs_dir={run.parent}", f"--include_path={broken}",
                          "--tasks=broken_mc"]) == 2
    assert _error(capsys).startswith(f"error: --tasks broken_mc: not found, and the task file {broken / 'broken.yaml'} "
                                      f"{why}")


def test_evaluation_scalars_open_after_the_training_curves(tmp_path):
    """TensorBoard's TIME SERIES groups tags by the part before the first "/", alphabetically, and opens the first
    two: beside an evaluation's scalars, the run's train and val groups still come first."""
    results = {"results": {"tiny_choice": {"acc,none": 0.5, "acc_stderr,none": 0.1}, "tiny_text": {"ppl,none": 9.0}}}
    evaluate.write_results(tmp_path, results, step=4)
    scalars = history(tmp_path / "eval" / "lm-eval-1")
    assert scalars == {"whole_run/lm_eval/tiny_choice/acc": [(4, 0.5)], "whole_run/lm_eval/tiny_text/ppl": [(4, 9.0)]}
    groups = sorted({"train", "val"} | {tag.split("/")[0] for tag in scalars})
    assert groups[:2] == ["train", "val"]
