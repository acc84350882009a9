"""Sizes that keep the code readable: a file has one job (at most 400 lines), a function fits on a screen
(at most 60 lines, from `def` to its last line)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("lit_attn", "callbacks", "datamodules", "benchmarks", "configs", "tests")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _python_files() -> list[Path]:
    return sorted([p for d in SOURCES for p in (ROOT / d).rglob("*.py")] + [ROOT / "main.py"])


def test_no_file_over_400_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _python_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES]
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by topic):\n" + "\n".join(long)


def test_no_function_over_60_lines():
    long = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_checks_see_the_whole_project():
    names = {p.relative_to(ROOT).as_posix() for p in _python_files()}
    assert {"main.py", "lit_attn/training/cli.py", "callbacks/timing.py", "benchmarks/bench.py",
            "tests/test_layout.py"} <= names
