"""Every shell command in README.md and docs/*.md runs, at tiny sizes, and exits as the docs say.

`docs_commands` finds the commands; RULES says how each one runs here. A command runs in a directory of its own
(or of its group, after the commands it builds on) holding what the docs assume is there: `main.py`, `configs/`,
`input.txt` and `tinyshakespeare.txt` (small generated texts) and Wikipedia-like parquet shards in
`wikipedia/20231101.en/`. The test only ADDS flags (sizes, steps; for a sweep after `--`), never removes the
command's own, so a flag the docs show that no longer parses fails here. Commands that cannot run here (the
install, the suite itself, GPUs, SLURM, the network) have a rule that says what is checked instead."""

from __future__ import annotations

import json
import random
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from docs_commands import (
    BENCH,
    BENCH_FIT,
    CARD_INPUTS,
    LLAMA,
    LLAMA_RUN,
    MQAR,
    PASSKEY,
    PASSKEY_RUN,
    ROOT,
    ROPE_RUN,
    SHAKE_PROBED,
    SHARDS,
    SWEEP_FITS,
    TINY,
    TOOLS_SWEEP,
    WIKI,
    DocCommand,
    all_commands,
    doc_files,
    expand_globs,
    link_eval_tasks,
    run_in_process,
    run_subprocess,
    unpack_cpu_records,
    unpack_gpu_records,
    unpack_records,
    unpack_tuned_records,
    write_readme_attention,
)
from helpers import write_corpus

HAS_GPU = torch.cuda.is_available()


@dataclass(frozen=True)
class Rule:
    pattern: str  # re.match against the command as written
    how: str  # run (in this process) | print_config | ci | slurm | offline | tensorboard
    add: tuple[str, ...] = ()  # flags appended (for a sweep: before `--`, see `after_dashes`)
    after_dashes: tuple[str, ...] = ()  # a sweep's flags for every fit, after `--`
    group: str | None = None  # commands of one group share a directory
    needs: tuple[str, ...] = ()  # commands (as the docs start them) that run first in the group's directory
    status: int = 0
    swap: tuple[str, str] | None = None  # a file name the docs show -> the pattern of this run's file
    setup: Callable[[Path], object] | None = None  # writes what the docs say the user has, into the directory
    why: str = ""
    long: bool = False  # runs with the long tests (pytest -m long), outside the README's five-minute command


RULES = [
    # ---- not run: checked against what CI runs ----
    Rule(r"pip install torch==2\.13\.0 && pip install -e \"\.\[dev\]\" && python main\.py fit$", "ci",
         why="the install is what .ci/run does in a fresh venv; the fit after it runs here"),
    Rule(r"python -m pytest -q -n auto -m \"not long\"$", "ci", why="the suite itself: .ci/run's test command"),
    Rule(r"python -m pytest -q -n auto -m long$", "ci", why="the long tests: .ci/run's second test command"),
    Rule(r"sbatch ", "slurm", why="no SLURM here: the script parses and its array covers its attentions x seeds"),
    Rule(r"srun python main\.py fit --config configs/trainer/multinode\.yaml", "print_config",
         why="16 GPUs on 2 nodes: the command after srun parses"),
    Rule(r"torchrun .* main\.py fit --config configs/trainer/multinode\.yaml", "print_config",
         why="16 GPUs on 2 nodes: the main.py command torchrun starts parses"),
    Rule(r"python main\.py fit --config configs/trainer/ddp\.yaml$", "print_config", why="every GPU of the machine"),
    Rule(r"python main\.py fit --config configs/trainer/fsdp\.yaml"
         r"( --trainer\.strategy\.activation_checkpointing true)?$", "print_config", why="every GPU of the machine"),
    Rule(r"python main\.py fit --data\.url https://", "print_config", why="network: parsed, not downloaded"),
    Rule(r"curl -L -o tinyshakespeare\.txt https://", "download",
         why="network: the commands that read the file get a generated one; the URL is checked for its form"),
    Rule(r"tensorboard --logdir runs$", "tensorboard", needs=("python main.py fit --model.attention=ssqa",),
         group="tensorboard", why="a server that never exits: --inspect reads the same runs and exits"),
    # ---- training ----
    Rule(r"python main\.py fit --config configs/mqar\.yaml --model\.attention=mha --model\.n_embd=64$", "run",
         add=MQAR, why="MQAR at a few hundred examples"),
    Rule(r"python main\.py fit --config configs/mqar_zoology\.yaml --model\.n_embd=64$", "run",
         add=(*MQAR, "--model.n_embd=16", "--trainer.max_epochs=1"), why="Zoology's protocol at seconds' size"),
    Rule(r"lit-attn sweep --config configs/mqar\.yaml --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa,noq --seeds 1,2,3 ",
         "run", add=("--attention", "mha", "--seeds", "1"), after_dashes=MQAR, group="mqar-grid",
         why="one attention and seed of each sweep, MQAR at seconds' size"),
    Rule(r"lit-attn sweep --config configs/mqar\.yaml --attention mha,qsa,qsa_fixed --seeds 1,2,3 ", "run",
         add=("--attention", "mha", "--seeds", "1"), after_dashes=MQAR, group="mqar-grid"),
    Rule(r"lit-attn sweep --config configs/mqar\.yaml --attention mha,gqa,sqa --seeds 1,2,3 ", "run",
         add=("--attention", "sqa", "--seeds", "1"), after_dashes=MQAR, group="mqar-grid"),
    Rule(r"lit-attn recall-grid runs/mqar-w64-\*-s\? ", "run", group="mqar-grid",
         needs=("lit-attn sweep --config configs/mqar.yaml --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa,noq",
                "lit-attn sweep --config configs/mqar.yaml --attention mha,qsa,qsa_fixed",
                "lit-attn sweep --config configs/mqar.yaml --attention mha,gqa,sqa")),
    Rule(r"lit-attn (recall-grid|cost-card --runs) records/runs/", "run", setup=unpack_records, why="the archive"),
    # the tuned grid: each sweep's first run (--task 0) at MQAR's seconds' size, then the tables over them
    Rule(r"lit-attn sweep --config configs/mqar\.yaml --attention \S+ --grid model\.lr=", "run", add=("--task", "0"),
         after_dashes=MQAR, group="mqar-tuned", long=True),
    Rule(r"lit-attn (recall-grid|cost-card --runs) runs/mqar-w64-\*-lr\*-s\? ", "run", group="mqar-tuned", long=True,
         needs=("lit-attn sweep --config configs/mqar.yaml --attention mha,qsa,qsa_fixed --seeds 1,2,3",
                *(f"lit-attn sweep --config configs/mqar.yaml --attention {a} --grid model.lr={lr}" for a, lr in (
                    ("mha,gqa,sqa,ssqa,xsqa,noq", "3e-4,1e-3,3e-3"), ("qsa,qsa_fixed", "3e-4,1e-3,3e-3"),
                    ("mha", "3e-4,3e-3"), ("mha,gqa,sqa", "3e-4,1e-3,3e-3"), ("mha", "1e-2"), ("mha", "3e-3"))))),
    Rule(r"lit-attn (recall-grid|cost-card --runs) records/mqar_tuned_runs/", "run", setup=unpack_tuned_records,
         long=True, why="the tuned grid's archive: test_recall_grid.py checks its tables in the quick suite"),
    Rule(r"lit-attn sweep --attention mha --config configs/mqar_zoology\.yaml .*--prefix zoo64 ", "run",
         add=("--task", "0"), after_dashes=(*MQAR, "--trainer.max_epochs=1"), group="zoo",
         why="the grid's first run (its width is the grid's), Zoology's protocol at seconds' size"),
    Rule(r"lit-attn recall-grid runs/zoo\*-mha-\* --best-of model\.lr ", "run", group="zoo",
         needs=("lit-attn sweep --attention mha --config configs/mqar_zoology.yaml",)),
    Rule(r"lit-attn recall-grid --best-of model\.lr$", "run", status=2, why="named without runs: it asks for them"),
    Rule(r"lit-attn recall-grid records/gpu_runs/", "run", setup=unpack_gpu_records, why="the GPU archive"),
    Rule(r"lit-attn recall-grid records/cpu_runs/", "run", setup=unpack_cpu_records, why="the CPU archive"),
    Rule(re.escape(ROPE_RUN) + "$", "run", add=tuple(a for a in TINY if not a.startswith("--model.block_size")),
         group="rope-1", why="the probe needs a context its passkey prompts fit in"),
    Rule(r"lit-attn probe --run rope-1 --probes extrapolation,passkey$", "run", group="rope-1", needs=(ROPE_RUN,),
         add=("--max_windows=2", "--trials=1", "--lengths=1", "--depths=0,1"), why="a small grid"),
    Rule(re.escape(PASSKEY_RUN) + "$", "run", add=PASSKEY, group="passkey-1", why="the passkey task, two steps"),
    Rule(r"lit-attn probe --run passkey-1 --probes passkey$", "run", group="passkey-1", needs=(PASSKEY_RUN,),
         add=("--trials=1", "--lengths=1", "--depths=0,1"), why="a small grid"),
    Rule(r"python -m lit_attn fit --model\.attention=my_pkg\.attn\.TemperedAttention$", "run", add=TINY,
         setup=write_readme_attention, why="the README's own attention: `python -m` finds my_pkg in the directory "
                                           "(test_user_attention.py starts it as a process of its own)"),
    Rule(r"python main\.py fit --trainer\.accelerator cpu --trainer\.devices 2 --trainer\.strategy ddp$",
         "print_config", why="parsed: test_callbacks.py launches these flags as 2 processes, checks what they train"),
    Rule(r"python main\.py fit --trainer\.accelerator cpu --trainer\.devices 2 --trainer\.strategy fsdp2$",
         "print_config", why="parsed: test_fsdp.py launches these flags as 2 processes, checks they resume exactly"),
    Rule(r"python main\.py fit --config configs/(sqa_wikipedia|wikipedia_local)\.yaml", "run",
         add=(*TINY, *WIKI), why="hub runs read the local shards the docs show (--data.data_files)"),
    Rule(r"python main\.py fit --model\.attention=sqa --run sqa-1$", "run", add=TINY, group="sqa-1"),
    Rule(r"python main\.py fit --run sqa-1 --ckpt_path last$", "run", add=("--trainer.max_steps=4",), group="sqa-1",
         needs=("python main.py fit --model.attention=sqa --run sqa-1",), why="resumed two steps further"),
    Rule(r"python main\.py (validate|test) --run sqa-1", "run", group="sqa-1",
         needs=("python main.py fit --run sqa-1 --ckpt_path last",),
         swap=("best-2000.ckpt", "best-*.ckpt"), why="best-2000.ckpt: here the tiny run's best checkpoint"),
    Rule(r"python main\.py fit --data\.path tinyshakespeare\.txt --run shake-1 --trainer\.max_steps 300$", "run",
         add=TINY, group="evaluate"),
    Rule(r"lit-attn evaluate --run shake-1 --tasks tiny_choice,tiny_text --include_path docs/eval_tasks$", "run",
         group="evaluate", needs=("python main.py fit --data.path tinyshakespeare.txt --run shake-1",),
         setup=link_eval_tasks, why="the docs' local tasks, whose data paths are relative to the directory"),
    Rule(r"lit-attn export --run shake-1 --out hf/shake-1$", "run", group="evaluate",
         needs=("python main.py fit --data.path tinyshakespeare.txt --run shake-1",), why="a GPT-2 layout run"),
    Rule(re.escape(LLAMA_RUN) + "$", "run", add=TINY, group="export"),
    Rule(r"lit-attn export --run llama-1 --out hf/llama-1$", "run", group="export", needs=(LLAMA_RUN,)),
    Rule(re.escape(LLAMA) + r" --model\.init_from hf/llama-1 --run llama-2$", "run",
         add=TINY, group="export", needs=("lit-attn export --run llama-1",), why="the flags as llama-1's"),
    Rule(r"python main\.py fit --help(_all)?$", "run"),
    Rule(r"python main\.py fit .*--model\.layer_pattern ", "run",
         add=tuple(a for a in TINY if not a.startswith(("--model.n_layer", "--model.block_size"))),
         why="the pattern's layers and windows as written: two steps of a narrow model"),
    Rule(r"(python main\.py|python -m lit_attn|lit-attn) fit( |$)", "run", add=TINY),
    # ---- sweeps and what reads them (fewer seeds and attentions: the fits are child processes) ----
    Rule(r"lit-attn sweep --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa --seeds 1,2,3 --parallel 2 --prefix shake ",
         "run", add=("--attention", "mha,gqa", "--seeds", "1,2"), after_dashes=SWEEP_FITS, group="shake"),
    Rule(r"lit-attn sweep --attention mha,gqa,diff --seeds 1,2,3 --parallel 2 --prefix cmp ", "run",
         add=("--attention", "mha", "--seeds", "1"), after_dashes=SWEEP_FITS, group="cmp"),
    Rule(r"lit-attn compare runs/cmp-mha-s\? ", "run", group="cmp", status=2,
         needs=("lit-attn sweep --attention mha,gqa,diff --seeds 1,2,3",),
         why="one sweep's run of mha here: the other runs the command names are missing, and it says so"),
    Rule(r"lit-attn probe --run cmp-mha-s1 --probes extrapolation$", "run", group="cmp",
         needs=("lit-attn sweep --attention mha,gqa,diff --seeds 1,2,3",)),
    Rule(r"lit-attn cost-card --runs runs/cmp-mha-s\? ", "run", group="cmp", status=2,
         needs=("lit-attn sweep --attention mha,gqa,diff --seeds 1,2,3",),
         why="one sweep's run of mha here: the other runs the command names are missing, and it says so"),
    Rule(r"lit-attn probe --run shake-\S+ --probes passkey$", "run", group="shake", needs=SHAKE_PROBED[:1], status=2),
    Rule(r"(lit-attn compare runs/shake-|python -m benchmarks\.sqa_paper_table runs/shake-compare|lit-attn probe --run "
         r"shake-)", "run", group="shake", needs=SHAKE_PROBED[:1]),
    Rule(r"lit-attn cost-card --runs runs/shake-", "run", group="shake", needs=SHAKE_PROBED),
    # results.md's tuned comparisons and ablation: the first run of each sweep (--task 0), with the long tests
    Rule(r"lit-attn sweep --attention mha,gqa --grid model\.lr=1e-3,2e-3,4e-3,8e-3,1\.6e-2 --seeds 1 ", "run",
         add=("--task", "0"), after_dashes=SWEEP_FITS, group="tuned", long=True),
    Rule(r"lit-attn compare runs/tw-\*-s\? --best-of model\.lr ", "run", group="tuned", long=True,
         needs=("lit-attn sweep --attention mha,gqa --grid model.lr=1e-3,2e-3,4e-3,8e-3,1.6e-2",)),
    Rule(r"lit-attn sweep (--config configs/recipe_modern\.yaml )?--attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa --grid ",
         "run", add=("--task", "0"), after_dashes=SWEEP_FITS, group="recipes", long=True),
    Rule(r"lit-attn compare runs/r[dm]-\*-s\? --best-of model\.(muon_)?lr ", "run", group="recipes", long=True,
         needs=("lit-attn sweep --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa --grid",
                "lit-attn sweep --config configs/recipe_modern.yaml --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa")),
    Rule(r"lit-attn sweep --config configs/recipe_modern\.yaml --attention mha --seeds 1,2,3 --prefix ab-", "run",
         add=("--seeds", "1"), after_dashes=SWEEP_FITS, group="recipes", long=True),
    Rule(r"lit-attn compare runs/rm-mha-muon_lr\S+-s\? runs/ab-", "run", group="recipes", long=True, status=2,
         needs=("lit-attn sweep --config configs/recipe_modern.yaml --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa",
                "lit-attn sweep --config configs/recipe_modern.yaml --attention mha --seeds 1,2,3 --prefix ab-"),
         why="the grid's first run only here (muon_lr 0.01): the recipe's runs the command names are missing, and it "
             "says so"),
    Rule(r"lit-attn sweep --attention mha,qsa,qsa_fixed --seeds 1,2,3 ", "run",
         add=("--attention", "qsa,qsa_fixed", "--seeds", "1"), after_dashes=SWEEP_FITS, group="qsa",
         why="the two the compare command reads against each other"),
    Rule(r"lit-attn compare runs/qsa-d4-", "run", group="qsa", needs=("lit-attn sweep --attention mha,qsa,qsa_fixed",)),
    Rule(r"lit-attn sweep --attention [a-z,]+ --config configs/sqa_wikipedia\.yaml --prefix sqa-paper$", "offline",
         why="hub: the docs' offline command is this one with local shards after --, and that one runs"),
    Rule(r"lit-attn sweep --attention [a-z,]+ --config configs/sqa_wikipedia\.yaml --prefix sqa-paper -- ", "run",
         add=("--attention", "sqa", "--seeds", "1"), after_dashes=(*SWEEP_FITS, *WIKI[1:]), group="sqa-paper",
         why="one seed: runs named as the SLURM array's, which tools.md compares"),
    Rule(r"lit-attn compare runs/sqa-paper-", "run", group="sqa-paper",
         needs=("lit-attn sweep --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa --config configs/sqa_wikipedia.yaml "
                "--prefix sqa-paper --",)),
    Rule(r"lit-attn sweep --attention mha,gqa,sqa -- ", "run", add=("--parallel", "2"), after_dashes=SWEEP_FITS,
         group="sweep"),
    Rule(r"lit-attn (compare|sample) .*runs/sweep-", "run", group="sweep", needs=(TOOLS_SWEEP,)),
    Rule(r"python -m lit_attn\.(sweep|compare|sample)$", "run", status=2,
         why="named without arguments: each says which it needs (exit 2)"),
    Rule(r"python -m lit_attn\.cost_card$", "run", why="without arguments: the card of the layout alone"),
    Rule(r"python -m lit_attn\.memory$", "run", why="counts on the meta device: seconds"),
    # ---- benchmarks (tiny sizes) ----
    Rule(r"lit-attn bench --model .*--out bench_out$", "run", add=("--seq-lens", "16", "--tokens", "64", "--repeats",
                                                                   "1", "--warmup", "0"), group="sweep"),
    Rule(r"lit-attn bench-decode --contexts 1024 --batches 16 --out decode_out$", "run",
         add=("--contexts", "16", "--batches", "1", "--repeats", "1", "--warmup", "0"), group="sweep"),
    Rule(r"lit-attn cost-card ", "run", add=("--context", "16", "--batch", "1"), group="sweep", needs=CARD_INPUTS),
    Rule(r"(lit-attn bench|python -m benchmarks\.bench)( |$)", "run", add=BENCH),
    Rule(r"(lit-attn bench-decode|python -m benchmarks\.bench_decode)( |$)", "run",
         add=("--contexts", "16", "--batches", "1", "--repeats", "1", "--warmup", "0", "--prompt", "8",
              "--new-tokens", "4")),
    Rule(r"python -m benchmarks\.(bench_overhead|bench_compile)( --|$)", "run",
         add=("--steps", "2", "--repeats", "1", "--warmup", "1"), after_dashes=tuple(BENCH_FIT)),
    Rule(r"python -m benchmarks\.bench_variants ", "run", add=("--steps", "1", "--repeats", "1", "--warmup", "0"),
         after_dashes=tuple(a for a in BENCH_FIT if not a.startswith(("--model.n_layer", "--model.block_size"))),
         why="the seven models narrow, one step each; their layers and context as written (the pattern, the window)"),
    Rule(r"python -m benchmarks\.bench_muon( |$)", "run", add=("--repeats", "1", "--steps", "1", "--n-layer", "1",
                                                              "--n-embd", "32")),
    Rule(r"python -m benchmarks\.sdpa_backends$", "run", add=("--seq-len", "16", "--batch", "1", "--repeats", "1")),
    Rule(r"python -m benchmarks\.sdpa_backends --device cuda$", "run", status=0 if HAS_GPU else 2,
         add=("--seq-len", "16", "--batch", "1", "--repeats", "1"), why="refused in one line without a GPU"),
    Rule(r"python -m benchmarks\.bench_sqa_paper$", "run",
         add=("--variants", "mha,xsmqa", "--batch", "1", "--seq-len", "16", "--steps", "1", "--warmup", "0")),
    Rule(r"python -m benchmarks\.bench_qsa$", "run", add=("--batch", "4", "--dims", "4", "--repeats", "1")),
    Rule(r"python -m benchmarks\.bench_hf_decode( |$)", "run", add=("--layout", "tiny", "--batches", "1", "--prompt",
                                                                    "4", "--new-tokens", "3", "--repeats", "1")),
    Rule(r"python -m benchmarks\.bench_tokenizer$", "run",
         add=("--mb", "0.1", "--vocab-size", "300", "--num-proc", "1")),
    Rule(r"python -m benchmarks\.nanogpt_race --nanogpt ~/nanoGPT ", "run", status=2,
         why="no nanoGPT checkout here: refused in one line (tests/test_nanogpt_race.py runs a fake one)"),
]


def rule_for(command: DocCommand) -> Rule:
    text = command.text.split(" #")[0].strip()
    for rule in RULES:
        if re.match(rule.pattern, text):
            return rule
    raise LookupError(f"no rule for command {command.text!r} ({command.where}): add one to RULES in {__file__}")


COMMANDS = all_commands()
QUICK = ("ci", "slurm", "download")  # checks that run nothing heavy


def _param(command: DocCommand):
    try:
        rule = rule_for(command)
    except LookupError:  # fails at once, in the quick loop too
        return pytest.param(command, id=command.where)
    slow = rule.how not in QUICK or "main.py" in command.text
    return pytest.param(command, id=command.where,
                        marks=[*([pytest.mark.slow] if slow else []), *([pytest.mark.long] if rule.long else [])])


# ---- the directories commands run in ----

def _articles(n: int = 60) -> list[dict[str, str]]:
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 9))) for _ in range(400)]
    return [{"id": str(i), "url": f"https://en.wikipedia.org/wiki?curid={i}", "title": f"Article {i}",
             "text": " ".join(rng.choices(words, k=rng.randint(40, 120))).capitalize() + "."} for i in range(n)]


def _workdir(path: Path) -> Path:
    """A directory with what the docs' commands expect to find in the current directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True, exist_ok=True)
    (path / "main.py").symlink_to(ROOT / "main.py")
    (path / "configs").symlink_to(ROOT / "configs")
    (path / "scripts").symlink_to(ROOT / "scripts")
    write_corpus(path / "input.txt")
    write_corpus(path / "tinyshakespeare.txt", non_ascii=False)
    shards = path / "wikipedia" / "20231101.en"
    shards.mkdir(parents=True)
    rows = _articles()
    for k in range(2):
        pq.write_table(pa.Table.from_pylist(rows[k::2]), shards / f"train-{k:05d}-of-00002.parquet")
    return path


class Workspace:
    """Directories for the commands, one per group (or per command), and each command's exit status."""

    def __init__(self, root: Path):
        self.root, self.dirs, self.done = root, {}, {}

    def dir(self, key: str) -> Path:
        if key not in self.dirs:
            self.dirs[key] = _workdir(self.root / f"w{len(self.dirs)}")
        return self.dirs[key]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        cache = tmp_path_factory.mktemp("cache")
        patch.setenv("LIT_ATTN_CACHE", str(cache))  # Wikipedia token caches
        patch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach the network
        patch.setenv("HF_HOME", str(cache / "hf"))
        patch.delenv("LIT_ATTN_DEBUG", raising=False)
        yield Workspace(tmp_path_factory.mktemp("docs"))


# ---- running one command ----

def _with_added(rule: Rule, words: list[str]) -> list[str]:
    """The command's words with the rule's flags: before a sweep's `--` (and its fits' flags after it)."""
    if rule.after_dashes:
        own, rest = (words[: words.index("--")], words[words.index("--") + 1:]) if "--" in words else (words, [])
        return [*own, *rule.add, "--", *rest, *rule.after_dashes]
    return [*words, *rule.add]


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip().startswith("python -m ")]


def _check_ci(command: DocCommand, workspace: Workspace) -> None:
    """The docs' install and test commands are what .ci/run runs (there `python -m pip ... -q`, `pytest -q -n auto`)."""
    ci = _ci_lines()
    parts = [p.strip() for p in command.text.split("&&")]
    for part in parts:
        if part.startswith("pip install "):
            assert f"python -m pip install -q {part.removeprefix('pip install ')}" in ci, (part, ci)
        elif part.startswith("python -m pytest"):
            assert ci[-2:] == ['python -m pytest -q -n auto -m "not long"', "python -m pytest -q -n auto -m long"], ci
            assert part in ci, (part, ci)
            markers = (ROOT / "pyproject.toml").read_text()
            assert '"long: ' in markers and '"slow: ' in markers, "the markers are registered"
        else:  # the command after the install: the default fit
            run(DocCommand(command.file, command.line, part), workspace)


def _check_slurm(command: DocCommand) -> None:
    words = command.words
    script = ROOT / words[-1]
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    attentions = re.search(r"ATTENTIONS=\$\{ATTENTIONS:-([a-z,]+)\}", text).group(1).split(",")
    seeds = re.search(r"SEEDS=\$\{SEEDS:-([0-9,]+)\}", text).group(1).split(",")
    first, last = map(int, re.search(r"--array=(\d+)-(\d+)", command.text).groups())
    assert (first, last + 1) == (0, len(attentions) * len(seeds)), "the array is one task per attention and seed"


def run(command: DocCommand, workspace: Workspace, group: str | None = None) -> None:
    """Run `command` by its rule (its prerequisites first, in the same directory) and check its exit status."""
    rule = rule_for(command)
    group = group or rule.group
    key = (group, command.text)
    if key in workspace.done:
        assert workspace.done[key] == rule.status, f"{command.where}: exit {workspace.done[key]}"
        return
    for prefix in rule.needs:
        (first,) = [c for c in COMMANDS if c.text.startswith(prefix)][:1] or [None]
        assert first is not None, f"{command.where} needs a command starting {prefix!r}; the docs have none"
        run(first, workspace, group)
    cwd = workspace.dir(group or command.text)
    if rule.setup is not None:
        rule.setup(cwd)
    words = command.words
    if rule.how == "ci":
        return _check_ci(command, workspace)
    if rule.how == "slurm":
        return _check_slurm(command)
    if rule.how == "download":
        output, url = words[words.index("-o") + 1], words[-1]
        assert re.fullmatch(r"https://[\w.-]+/[\w./-]+\.txt", url) and (cwd / output).is_file(), (url, output)
        return None
    if rule.how == "offline":
        offline = [c for c in COMMANDS if c.text.startswith(f"{command.text} -- ")]
        assert [c.words[-1] for c in offline] == [f"--data.data_files={SHARDS}"], "the docs' offline variant"
        return run(offline[0], workspace)
    if words[0] in ("srun", "torchrun"):  # the main.py command the launcher starts
        words = ["python", *words[words.index("main.py"):]] if words[0] == "torchrun" else words[1:]
    words = expand_globs(command, _with_added(rule, words), cwd)
    if rule.swap:
        old, pattern = rule.swap
        words = [str(next(cwd.glob(w.replace(old, pattern)))) if old in w else w for w in words]
    if rule.how == "print_config":
        words = [*words, "--print_config"]
    if rule.how == "tensorboard":
        status = run_subprocess([*words, "--inspect"], cwd)
    else:
        status = run_in_process(words, cwd)
    workspace.done[key] = status
    assert status == rule.status, f"{command.where}: `{shlex.join(words)}` exited {status}, expected {rule.status}"


# ---- the tests ----

def test_the_docs_have_commands_and_every_one_has_a_rule():
    assert len(COMMANDS) > 40, "the extraction found too few commands"
    missing = []
    for command in COMMANDS:
        try:
            rule_for(command)
        except LookupError as e:
            missing.append(str(e))
    assert not missing, "\n".join(missing)


def test_a_command_without_a_rule_fails():
    with pytest.raises(LookupError, match="no rule for command 'lit-attn frobnicate"):
        rule_for(DocCommand("README.md", 1, "lit-attn frobnicate --all"))


def test_the_readme_attention_table_matches_the_projects_counts():
    from lit_attn.analytic import attention_params, gpt_params
    from lit_attn.config import SPARSE_QUERY_LAYOUT

    rows = re.findall(r"^\| `(\w+)`(?: `(\{.*?\})`)? \|.*\| ([\d,]+) \| ([\d,]+) \|$", (ROOT / "README.md").read_text(),
                      re.M)  # a name, then its options if any: | `mha` `{"gate": "headwise"}` |
    assert len(rows) >= 10
    for name, options, per_layer, total in rows:
        options = json.loads(options) if options else None
        try:
            config = replace(SPARSE_QUERY_LAYOUT, attention=name, attention_options=options)
        except ValueError:  # an attention that takes no RoPE: the layout with learned positions, as the README says
            config = replace(SPARSE_QUERY_LAYOUT, attention=name, attention_options=options, pos="learned")
        assert (attention_params(config), gpt_params(config)["total"]) == (int(per_layer.replace(",", "")),
                                                                         int(total.replace(",", ""))), name


# runpy's note that `python -m` runs a module this process imported before: true, and harmless here.
@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_documented_command_runs(command, workspace):
    run(command, workspace)


@pytest.mark.slow
def test_a_documented_flag_that_no_longer_parses_fails(workspace):
    with pytest.raises(AssertionError, match=r"docs/x\.md:3: .* exited 2, expected 0"):
        run(DocCommand("docs/x.md", 3, "python main.py fit --model.no_such_flag=1"), workspace)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_resolves():
    broken = []
    for page in doc_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"https?://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and anchor not in {_anchor(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.M)}:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
