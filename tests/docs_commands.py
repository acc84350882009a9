"""The shell commands that README.md and docs/*.md show, found the same way every time, and how one runs.

A command is
- every line of a ```bash, ```sh, ```shell or ```console block (in a console block, the lines that start with
  `$ `; the others are output), with lines ending in `\\` joined to the next; lines that are only a comment
  are not commands;
- an inline code span in the prose that starts with a program (`python`, `lit-attn`, `pip`, `tensorboard`,
  `srun`, `torchrun`, `sbatch`) and has at least two arguments. A span that names a placeholder in capitals
  (`runs/RUN/...`, `benchmarks.NAME`) is a synopsis, not a command; `$VAR` environment variables are allowed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from helpers import main_env

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
# ---- the flags and commands the rules of test_docs.py add and refer to ----

# A fit of seconds (as helpers.TINY_FIT, two steps, batch 8), appended after the command's own flags.
TINY = ["--model.n_layer=1", "--model.n_embd=32", "--model.n_head=4", "--model.block_size=16", "--data.batch_size=8",
        "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--timing.warmup_batches=1", "--samples.max_new_tokens=4"]
SHARDS = "wikipedia/20231101.en/*.parquet"
WIKI = [f"--data.data_files={SHARDS}", "--data.vocab_size=300", "--data.num_proc=1", "--data.stride=16"]
# A model of seconds for the benchmarks that take main.py flags after `--`.
BENCH_FIT = (*TINY[:5],)
BENCH = ["--seq-lens", "16,32", "--tokens", "64", "--repeats", "1", "--warmup", "0"]
SWEEP_FITS = (*TINY, "--trainer.enable_model_summary=false")
# MQAR at seconds' size: 2 pairs in 16 tokens of a 64-token vocabulary
MQAR = ("--model.block_size=16", "--data.input_seq_len=16", "--data.num_kv_pairs=2", "--data.vocab_size=64",
        "--data.num_train_examples=256", "--data.num_test_examples=32", "--data.batch_size=8", *TINY[5:])
ROPE_RUN = "python main.py fit --model.pos=rope --model.block_size=128 --run rope-1"
# the passkey task at its own context (a prompt needs 79 characters), a tiny model, two steps
PASSKEY_RUN = "python main.py fit --config configs/passkey.yaml --run passkey-1"
PASSKEY = (*(a for a in TINY if not a.startswith("--model.block_size")), "--data.num_val_examples=16")
TOOLS_SWEEP = "lit-attn sweep --attention mha,gqa,sqa --"  # the runs tools.md reads
# results.md's seeded comparison (the README's worked one), then the probe that reads its runs.
SHAKE_PROBED = ("lit-attn sweep --attention mha,gqa,mqa,sqa,ssqa,xsqa,xsmqa --seeds 1,2,3",
                "lit-attn probe --run shake-")
# What the documented cost cards read: benchmark outputs, the sweep's runs, the decode reference.
CARD_INPUTS = ("lit-attn bench --model", "lit-attn bench-decode --contexts 1024", TOOLS_SWEEP,
               "python -m benchmarks.bench_hf_decode --threads 1 --repeats 5 --out")
LLAMA = "python main.py fit --model.attention=sqa --model.pos=rope --model.norm=rmsnorm --model.ffn=swiglu"
LLAMA_RUN = f"{LLAMA} --run llama-1"  # the run export.md exports

PROGRAMS = ("python", "lit-attn", "pip", "tensorboard", "srun", "torchrun", "sbatch")
PLACEHOLDER = re.compile(r"(?<![$\w])[A-Z][A-Z_]+\b")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class DocCommand:
    file: str  # relative to the repository root
    line: int
    text: str  # as written, continuation lines joined, a trailing comment kept

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def words(self) -> list[str]:
        """The command's words as the shell splits them (quotes removed, the comment dropped)."""
        return shlex.split(self.text, comments=True)


def _inline_command(span: str) -> bool:
    words = span.split()
    return words[0] in PROGRAMS and len(words) >= 3 and not PLACEHOLDER.search(span)


def commands_in(path: Path) -> list[DocCommand]:
    """Every command in one Markdown file, in file order."""
    name = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[DocCommand] = []
    fence: str | None = None
    start, pending = 0, ""
    prose = []  # the file with code blocks blanked, one entry per line, for the inline spans
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = (stripped[3:].strip() or "text") if fence is None else None
            prose.append("")
            continue
        prose.append("" if fence is not None else line)
        if fence not in SHELL_FENCES:
            continue
        if fence == "console":
            if not stripped.startswith("$ "):
                continue
            stripped = stripped[2:]
        if not pending:
            if not stripped or stripped.startswith("#"):
                continue
            start = n
        pending = f"{pending} {stripped}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        found.append(DocCommand(name, start, pending))
        pending = ""
    text = "\n".join(prose)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(m.group(1).split())
        if _inline_command(span):
            found.append(DocCommand(name, text.count("\n", 0, m.start()) + 1, span))
    return sorted(found, key=lambda c: c.line)


def all_commands() -> list[DocCommand]:
    return [c for path in doc_files() for c in commands_in(path)]


def expand_globs(command: DocCommand, words: list[str], cwd: Path) -> list[str]:
    """`words` with the shell's pathname expansion in `cwd`: unquoted words with *, ? or [ that match files."""
    out = []
    for word in words:
        unquoted = re.search(r"(^|\s)" + re.escape(word) + r"(\s|$)", command.text)
        matches = sorted(glob.glob(word, root_dir=cwd)) if unquoted and re.search(r"[*?[]", word) else []
        out += matches or [word]
    return out


def python_blocks(path: Path, heading: str) -> list[str]:
    """The ```python blocks of the section `heading` (a Markdown `## ` heading) of `path`, in order."""
    text = path.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def write_readme_attention(directory: Path) -> Path:
    """The README's "Adding an attention" package (`my_pkg/attn.py` and its one-line test) in `directory`."""
    attention, test = python_blocks(ROOT / "README.md", "Adding an attention")
    (directory / "my_pkg").mkdir(exist_ok=True)
    (directory / "my_pkg" / "__init__.py").write_text("")
    (directory / "my_pkg" / "attn.py").write_text(attention)
    (directory / "test_my_attention.py").write_text(test)
    return directory


def link_eval_tasks(directory: Path) -> Path:
    """docs/eval_tasks in `directory`, where the docs' `lit-attn evaluate` reads its local tasks and their data."""
    (directory / "docs").mkdir(exist_ok=True)
    if not (directory / "docs" / "eval_tasks").exists():
        (directory / "docs" / "eval_tasks").symlink_to(ROOT / "docs" / "eval_tasks")
    return directory


def unpack_records(directory: Path, name: str = "mqar_runs.tar.gz") -> Path:
    """docs/`name` unpacked into `directory`/records, as docs/probes.md tells the reader to."""
    with tarfile.open(ROOT / "docs" / name) as archive:
        if not (directory / "records" / archive.getnames()[0]).exists():  # each archive once, beside the others
            archive.extractall(directory / "records", filter="data")
    return directory


def unpack_cpu_records(directory: Path) -> Path:
    """docs/mqar_zoology_cpu_runs.tar.gz unpacked into `directory`/records, as docs/probes.md tells the reader to."""
    return unpack_records(directory, "mqar_zoology_cpu_runs.tar.gz")


def unpack_tuned_records(directory: Path) -> Path:
    """docs/mqar_tuned_runs.tar.gz unpacked into `directory`/records, as docs/probes.md tells the reader to."""
    return unpack_records(directory, "mqar_tuned_runs.tar.gz")


def unpack_gpu_records(directory: Path) -> Path:
    """docs/mqar_zoology_gpu_runs.tar.gz unpacked into `directory`/records, as docs/probes.md tells the reader to."""
    return unpack_records(directory, "mqar_zoology_gpu_runs.tar.gz")


# ---- running one command ----

@contextlib.contextmanager
def _argv(argv: list[str], cwd: Path):
    """sys.argv and the working directory of a command; both, and the signal handlers it sets, restored after."""
    saved, here = sys.argv, Path.cwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = argv
    os.chdir(cwd)
    try:
        yield
    finally:
        sys.argv = saved
        os.chdir(here)
        for s, handler in handlers.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _cwd_first_on_path(cwd: Path):
    """What `python -m` does with the directory it starts in: first on sys.path, so a user's package there (the
    README's my_pkg) imports. Afterwards the path is restored and the modules imported from there are forgotten."""
    sys.path.insert(0, str(cwd))
    try:
        yield
    finally:
        sys.path.remove(str(cwd))
        for name, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "/").resolve().is_relative_to(cwd.resolve()):
                del sys.modules[name]


def run_in_process(words: list[str], cwd: Path) -> int:
    """The exit status of `python main.py ...`, `python -m MODULE ...` or `lit-attn ...`, run in this process."""
    try:
        if words[0] == "lit-attn":
            from lit_attn.cli.command import main

            with _argv(["lit-attn", *words[1:]], cwd):
                return main(words[1:]) or 0
        if words[:2] == ["python", "main.py"]:
            with _argv(words[1:], cwd):
                runpy.run_path(str(cwd / "main.py"), run_name="__main__")
        elif words[:2] == ["python", "-m"]:
            with _argv(words[2:], cwd), _cwd_first_on_path(cwd):
                runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        else:
            raise AssertionError(f"not a python or lit-attn command: {shlex.join(words)}")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_subprocess(words: list[str], cwd: Path) -> int:
    program = [sys.executable] if words[0] == "python" else [str(Path(sys.executable).with_name(words[0]))]
    done = subprocess.run([*program, *words[1:]], cwd=cwd, env=main_env(), capture_output=True, text=True, timeout=600)
    print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
    return done.returncode
