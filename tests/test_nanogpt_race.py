"""The race against nanoGPT (benchmarks/nanogpt_race.py) without nanoGPT or its text: its reading of nanoGPT's log,
the validation loss on the whole split (lit-attn's windows), the time to nanoGPT's loss read by time_to_loss, the
stored figure standing in for nanoGPT, and a fake nanoGPT checkout (its files' names and outputs) run end to end,
with hand-computed times and losses; bad input is one `error:` line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_chars

from benchmarks import nanogpt_race as race
from lit_attn.tools.run_record import CurvePoint

LOG = """tokens per iteration will be: 768
step 0: train loss 4.1676, val loss 4.1649
iter 0: loss 4.1576, time 900.00ms, mfu -100.00%
iter 1: loss 4.1704, time 100.00ms, mfu -100.00%
iter 2: loss 4.1875, time 120.00ms, mfu -100.00%
step 3: train loss 3.9, val loss 3.9
iter 3: loss 3.9, time 700.50ms, mfu 0.01%
iter 4: loss 3.8, time 110.00ms, mfu 0.01%
iter 5: loss 3.7, time 130.00ms, mfu 0.01%
"""


def test_the_log_gives_each_iterations_time():
    assert race.iteration_times(LOG) == pytest.approx({0: 0.9, 1: 0.1, 2: 0.12, 3: 0.7005, 4: 0.11, 5: 0.13})


@pytest.mark.parametrize(("iters", "eval_interval", "seconds", "left_out"), [
    (6, 3, 0.1 + 0.12 + 0.11 + 0.13 + 2 * 0.115, (0.9 - 0.115) + (0.7005 - 0.115)),  # evaluations at 0 and 3
    (3, 3, 0.1 + 0.12 + 0.11, 0.9 - 0.11),  # the race's setting: one evaluation, at iteration 0
    (6, 100, 0.1 + 0.12 + 0.7005 + 0.11 + 0.13 + 0.12, 0.9 - 0.12),  # only iteration 0; the median of 1..5
])
def test_an_iteration_holding_an_evaluation_counts_as_the_median(iters, eval_interval, seconds, left_out):
    got = race.training_seconds(race.iteration_times(LOG), iters, eval_interval)
    assert got == pytest.approx((seconds, left_out))


def test_a_log_without_every_iteration_is_refused():
    with pytest.raises(ValueError, match="no time for iteration 6 .1 of 7 missing.*log_interval 1"):
        race.training_seconds(race.iteration_times(LOG), 7, 7)


def test_the_whole_split_is_lit_attns_validation_windows():
    from datamodules.windows import TokenWindows

    tokens = np.arange(300, dtype=np.uint16) % 7
    seen = []

    def loss(x, y):
        seen.extend(zip(x, y))
        return torch.tensor(float(len(x)))  # weights each batch by its windows: the mean is the batch size's

    got = race.full_split_loss(loss, tokens, block_size=16, batch=5)
    windows = TokenWindows(tokens, 16, stride=16)
    assert len(seen) == len(windows) == 18
    assert all(torch.equal(x, wx) and torch.equal(y, wy) for (x, y), (wx, wy) in zip(seen, windows))
    # 18 windows in batches of 5, 5, 5, 3 tokens-weighted: (3 * 5 * 5 + 3 * 3) / 18
    assert got == pytest.approx((3 * 25 + 9) / 18)


def test_the_seed_and_threads_reach_nanogpts_torch(monkeypatch):
    threads = []
    monkeypatch.setattr(torch, "manual_seed", torch.manual_seed)  # restored after the config replaces it
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    exec(race.race_config(seed=7, threads=3), {})
    torch.manual_seed(1337)  # what nanoGPT's train.py calls
    assert threads == [3] and torch.initial_seed() == 7


def curve(*points: tuple[float, float]) -> list[CurvePoint]:
    return [CurvePoint(100 * (i + 1), t, t, loss) for i, (t, loss) in enumerate(points)]


NANO = [{"seed": 1, "train_s": 100.0, "val_loss": 1.90}, {"seed": 2, "train_s": 120.0, "val_loss": 1.86},
        {"seed": 3, "train_s": 80.0, "val_loss": 1.95}]


def test_the_race_reads_time_to_nanogpts_median_loss():
    lit = [{"seed": 1, "curve": curve((10.0, 2.1), (30.0, 1.8))},  # 1.9 two thirds of the way: 23.33 s
           {"seed": 2, "curve": curve((12.0, 1.95), (24.0, 1.85))},  # halfway: 18 s
           {"seed": 3, "curve": curve((10.0, 2.5), (20.0, 2.0))},  # never
           {"seed": 4, "curve": curve((50.0, 1.9))}]  # at its first evaluation; no nanoGPT seed 4: the median
    got = race.race(NANO, lit)
    assert got["target_loss"] == 1.90 and got["reached"] == "3 of 4"
    times = [r["time_to_target_s"] for r in got["lit"]]
    assert times[:2] == pytest.approx([10 + 20 * 2 / 3, 18.0]) and times[2] is None and times[3] == 50.0
    assert [r["ratio"] for r in got["lit"]] == pytest.approx([(10 + 40 / 3) / 100, 18 / 120, None, 50 / 100])
    assert "not reached" in got["lit"][2]["note"] and "upper bound" in got["lit"][3]["note"]
    assert got["ratio"] == pytest.approx({"median": 0.2333333, "min": 0.15, "max": 0.5})
    assert got["nanogpt_time_s"] == {"median": 100.0, "min": 80.0, "max": 120.0}


def stored_file(path: Path, **figure) -> Path:
    default = {"machine": "Some CPU, 2 threads", "threads": 2, "iters": 2000, "compile": False, "date": "2026-11-28",
               "runs": NANO}
    path.write_text(json.dumps({"figures": {"2000 iterations, compile off": default | figure}}))
    return path


def fake_lit(points):
    def run_lit(args, seed, runs_dir):
        return {"seed": seed, "curve": curve(*points), "load": [1.0, 1.0]}
    return run_lit


def test_a_seed_that_never_reaches_the_target_is_left_out_of_the_ratio_and_said(tmp_path, monkeypatch, capsys):
    text = write_chars(tmp_path / "text.txt", 3000, seed=1)
    stored = stored_file(tmp_path / "stored.json")
    curves = {1: [(10.0, 2.0), (30.0, 1.8)], 2: [(10.0, 2.0), (30.0, 1.95)]}  # seed 2 ends above the target
    monkeypatch.setattr(race, "run_lit", lambda args, seed, runs_dir: fake_lit(curves[seed])(args, seed, runs_dir))
    assert race.main(["--text", str(text), "--stored", str(stored), "--seeds", "1,2", "--threads", "2"]) == 0
    printed = capsys.readouterr().out
    assert "(reached by 1 of 2 seeds)" in printed and "| lit-attn | 2 | not reached |" in printed
    assert "ratio lit-attn / nanoGPT: 0.200 (0.200 to 0.200) (median, min to max of the seeds that reached it)" \
        in printed


def test_the_stored_figure_stands_in_for_nanogpt(tmp_path, monkeypatch, capsys):
    text = write_chars(tmp_path / "text.txt", 3000, seed=1)
    stored = stored_file(tmp_path / "stored.json")
    monkeypatch.setattr(race, "run_lit", fake_lit([(10.0, 2.0), (30.0, 1.8)]))  # 1.9 at 20 s
    out = tmp_path / "race.json"
    assert race.main(["--text", str(text), "--stored", str(stored), "--seeds", "1,2", "--threads", "1",
                      "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"the stored figure {stored} (measured 2026-11-28 on Some CPU, 2 threads, 2 thread(s)), not measured " \
           "in this run" in printed
    assert "ratio lit-attn / nanoGPT: 0.183 (0.167 to 0.200)" in printed  # 20/100 (seed 1), 20/120 (seed 2)
    assert "nanoGPT's stored figure ran with 2 thread(s), lit-attn here with 1" in printed
    assert json.loads(out.read_text())["race"]["ratio"] == pytest.approx({"median": 0.18333, "min": 1 / 6,
                                                                          "max": 0.2}, rel=1e-4)


# A nanoGPT checkout in miniature: prepare.py as nanoGPT's (sorted characters, the last 10% validates), a model of
# zero logits (loss ln V on every token), and a train.py that runs its config files as nanoGPT's configurator does,
# logs iterations of 500 ms (the first) and 100 ms (the others) and saves the checkpoint.
FAKE = {
    "data/shakespeare_char/prepare.py": """
import os, pickle
import numpy as np
here = os.path.dirname(__file__)
data = open(os.path.join(here, 'input.txt')).read()
chars = sorted(set(data))
stoi = {ch: i for i, ch in enumerate(chars)}
n = len(data)
for name, part in (('train', data[:int(n * 0.9)]), ('val', data[int(n * 0.9):])):
    np.array([stoi[c] for c in part], dtype=np.uint16).tofile(os.path.join(here, name + '.bin'))
pickle.dump({'vocab_size': len(chars), 'itos': dict(enumerate(chars)), 'stoi': stoi},
            open(os.path.join(here, 'meta.pkl'), 'wb'))
""",
    "model.py": """
from dataclasses import dataclass
import torch
import torch.nn.functional as F
@dataclass
class GPTConfig:
    vocab_size: int = 1
class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head = torch.nn.Parameter(torch.zeros(config.vocab_size))
    def forward(self, idx, targets):
        logits = self.head.expand(*idx.shape, -1)
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
""",
    "train.py": """
import os, pickle, sys
import torch
from model import GPT, GPTConfig
settings = dict(a[2:].split('=', 1) for a in sys.argv[1:] if a.startswith('--'))
for a in sys.argv[1:]:
    if not a.startswith('--'):
        exec(open(a).read())
torch.manual_seed(1337)
meta = pickle.load(open('data/shakespeare_char/meta.pkl', 'rb'))
for i in range(int(settings['max_iters']) + 1):
    print(f"iter {i}: loss 1.0, time {500 if i == 0 else 100}.00ms, mfu 0.00%")
print(f"seed {torch.initial_seed()}, {torch.get_num_threads()} threads")
os.makedirs(settings['out_dir'], exist_ok=True)
model = GPT(GPTConfig(vocab_size=meta['vocab_size']))
torch.save({'model': model.state_dict(), 'model_args': {'vocab_size': meta['vocab_size']}},
           os.path.join(settings['out_dir'], 'ckpt.pt'))
""",
    "configurator.py": "",
    "config/train_shakespeare_char.py": "",
}


def test_a_nanogpt_checkout_runs_interleaved_with_lit_attn(tmp_path, monkeypatch, capsys):
    checkout = tmp_path / "nanoGPT"
    for name, body in FAKE.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(body)
    text = write_chars(tmp_path / "text.txt", 3000, seed=1)
    vocab = len(set(text.read_text()))
    order = []

    def run_lit(args, seed, runs_dir):
        order.append(("lit", seed))
        return fake_lit([(1.0, math.log(vocab) + 0.5), (3.0, math.log(vocab) - 0.5)])(args, seed, runs_dir)

    real = race.run_nanogpt
    monkeypatch.setattr(race, "run_lit", run_lit)
    monkeypatch.setattr(race, "run_nanogpt", lambda *a: order.append(("nanogpt", a[1])) or real(*a))
    stored, work = tmp_path / "stored.json", tmp_path / "work"
    assert race.main(["--nanogpt", str(checkout), "--text", str(text), "--seeds", "5,6", "--threads", "1",
                      "--iters", "20", "--stored", str(stored), "--store", "--workdir", str(work)]) == 0
    assert order == [("nanogpt", 5), ("lit", 5), ("nanogpt", 6), ("lit", 6)]
    figure = json.loads(stored.read_text())["figures"]["20 iterations, compile off"]
    # 20 iterations of 100 ms (the first, holding the evaluation, at the median), the loss ln V of zero logits
    assert [r["seed"] for r in figure["runs"]] == [5, 6]
    assert [(r["train_s"], r["warmup_left_out_s"]) for r in figure["runs"]] == [pytest.approx((2.0, 0.4))] * 2
    assert [r["val_loss"] for r in figure["runs"]] == pytest.approx([math.log(vocab)] * 2, rel=1e-6)
    assert figure["threads"] == 1 and figure["iters"] == 20 and "measured" not in figure
    log = (work / "nanogpt" / "seed-6.log").read_text()
    assert "seed 6, 1 threads" in log
    printed = capsys.readouterr().out
    assert "measured in this run" in printed and "ratio lit-attn / nanoGPT: 1.000 (1.000 to 1.000)" in printed
    assert sorted(p.relative_to(checkout).as_posix() for p in checkout.rglob("*") if p.is_file()) == sorted(FAKE)


@pytest.mark.parametrize(("argv", "message"), [
    ([], "--text is required"),
    (["--text", "{missing}"], "--text {missing}: no such file"),
    (["--text", "{text}", "--nanogpt", "{missing}"], "--nanogpt {missing} is not a nanoGPT checkout (no train.py)"),
    (["--text", "{text}", "--stored", "{missing}"], "no --nanogpt checkout given and no stored figure at {missing}"),
    (["--text", "{text}", "--stored", "{text}"], "--stored {text} is not a stored nanoGPT figure"),
    (["--text", "{text}", "--stored", "{stored}", "--compile"],
     "--stored {stored} has no figure for 2000 iterations, compile on (it has 2000 iterations, compile off)"),
    (["--text", "{text}", "--stored", "{empty_runs}"], "--stored {empty_runs}: its figure 2000 iterations, compile "
                                                       "off has no runs"),
    (["--text", "{text}", "--seeds", "1,1"], "--seeds 1,1: give one or more distinct seeds"),
    (["--text", "{text}", "--seeds", "x"], "--seeds x: a seed is an integer"),
    (["--text", "{text}", "--threads", "0"], "--threads 0: this machine gives this process"),
    (["--text", "{text}", "--iters", "0"], "--iters 0 and --eval-every 100 must be >= 1"),
    (["--text", "{text}", "--lit-config", "{missing}"], "--lit-config {missing}: no such file"),
    (["--text", "{text}", "--store"], "--store writes a measured figure: give --nanogpt PATH too"),
    (["--text", "{text}", "--workdir", "{text}"], "--workdir {text} exists; give a new directory"),
    (["--text", "{text}", "--out", "{text}"], "--out {text} exists; pass --overwrite"),
    (["--text", "{text}", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line(argv, message, tmp_path, monkeypatch, capsys):
    paths = {"missing": tmp_path / "missing", "text": write_chars(tmp_path / "text.txt", 300, seed=1),
             "stored": stored_file(tmp_path / "stored.json"),
             "empty_runs": stored_file(tmp_path / "empty.json", runs=[])}
    monkeypatch.setattr(race, "STORED", tmp_path / "none.json")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:
        race.main([a.format(**paths) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: " + message.format(**paths)), err
    assert sorted(tmp_path.iterdir()) == before


def test_a_failing_lit_attn_fit_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    text = write_chars(tmp_path / "text.txt", 3000, seed=1)
    monkeypatch.setattr(race, "lit_command", lambda *a: [sys.executable, "-c", "import sys; sys.exit('error: bad')"])
    made = []
    monkeypatch.setattr(race.tempfile, "mkdtemp", lambda **kw: made.append(tmp_path / "tmp") or str(made[-1]))
    assert race.main(["--text", str(text), "--stored", str(stored_file(tmp_path / "s.json")), "--threads", "1"]) == 2
    assert capsys.readouterr().err == "error: lit-attn's fit (seed 1) failed: error: bad\n"
    assert made and not made[0].exists()


def test_the_stored_figure_is_nanogpts_2000_iterations_without_compile():
    figure = race.load_stored(race.STORED, race.ITERS, compile_=False)
    assert figure["iters"] == 2000 and not figure["compile"] and figure["machine"] and len(figure["runs"]) >= 2
    assert all(r["train_s"] > 0 and 1.5 < r["val_loss"] < 2.5 for r in figure["runs"])
