"""The tools' shared command-line behaviour: readable --help, and the checks of --device, outputs and memory."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path
from typing import Optional

import pytest
from helpers import NO_GPU, ROOT

from lit_attn.cli.toolcli import (
    ToolParser,
    check_device,
    check_output_file,
    check_outputs,
    readable_default,
    readable_type,
)

TOOLS = ["benchmarks.bench", "benchmarks.bench_decode", "lit_attn.tools.cost_card", "lit_attn.tools.compare",
         "lit_attn.tools.sweep",
         "lit_attn.tools.sample", "benchmarks.bench_overhead", "benchmarks.bench_compile", "benchmarks.bench_qsa",
         "benchmarks.bench_sqa_paper", "benchmarks.bench_tokenizer", "benchmarks.sdpa_backends",
         "benchmarks.sqa_paper_table"]
# Python's spelling of types and values, which a user cannot type back.
REPRS = ("<class", "typing.", "Optional[", "Union[", "NoneType", "PosixPath", "default: False", "default: True",
         "default: None", "function ")


def _help(module: str, monkeypatch, capsys) -> str:
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is run from the repository root
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__")
    assert e.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("module", TOOLS)
def test_help_shows_readable_types_and_real_defaults(module, monkeypatch, capsys):
    text = " ".join(_help(module, monkeypatch, capsys).split())
    assert "--help" in text and not [r for r in REPRS if r in text], text
    # A flag whose help says what its default is does not also claim `default: null`.
    for entry in re.split(r" (?=--[a-z])", text):
        assert not ("default" in entry.split("(type:")[0] and "default: null" in entry), entry


def test_help_defaults_are_the_values_parsed(monkeypatch, capsys):
    text = " ".join(_help("benchmarks.bench", monkeypatch, capsys).split())
    assert "--out OUT directory for bench.csv, bench.png, bench.md (type: path, default: bench_out)" in text
    assert "--overwrite replace those files if --out already holds them (default: false)" in text
    assert re.search(r"--dtype \{[a-z0-9,]+\} default: bfloat16 on CUDA, float32 otherwise --threads", text)


@pytest.mark.parametrize(("hint", "shown"), [
    (int, "int"), (Path, "path"), (Optional[int], "int | null"), (int | None, "int | null"),  # noqa: UP045
    (Optional[Path], "path | null"), (list[int], "list[int]"), (str | int | None, "str | int | null"),  # noqa: UP045
])
def test_readable_type(hint, shown):
    assert readable_type(hint) == shown


@pytest.mark.parametrize(("value", "shown"), [
    (False, "false"), (True, "true"), (None, "null"), (Path("a/b"), "a/b"), ([4, 16], "[4, 16]"), (1.5, "1.5"),
    ("x", "x"),
])
def test_readable_default(value, shown):
    assert readable_default(value) == shown


def test_parser_help_end_to_end():
    p = ToolParser(prog="t")
    p.add_argument("--path", type=Path, default=Path("out"), help="where")
    p.add_argument("--k", type=Optional[int], default=None, help="how many (default: all)")  # noqa: UP045
    p.add_argument("--n", type=Optional[int], default=None, help="a count")  # noqa: UP045
    p.add_argument("--flag", action="store_true", help="a switch")
    text = " ".join(p.format_help().split())
    assert "where (type: path, default: out)" in text
    assert "how many (default: all) (type: int | null) --n" in text  # no contradicting default: null
    assert "a count (type: int | null, default: null)" in text and "a switch (default: false)" in text




@pytest.mark.parametrize(("name", "message"), [
    pytest.param("cuda", "--device cuda: this machine has no CUDA GPU; use --device cpu", marks=NO_GPU),
    pytest.param("cuda:0", "--device cuda:0: this machine has no CUDA GPU; use --device cpu", marks=NO_GPU),
    ("gpu", "--device gpu: not a torch device; use cpu, cuda or cuda:N"),
    ("", "--device : not a torch device"),
    ("cuda:x", "--device cuda:x: not a torch device"),
])
def test_check_device_refuses_in_one_line(name, message):
    with pytest.raises(ValueError) as e:
        check_device(name)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["cpu", "cpu:0"])
def test_check_device_accepts_usable_devices(name):
    assert check_device(name) == name


@pytest.mark.parametrize(("existing", "overwrite", "message"), [
    ([], False, None),
    (["other.txt"], False, None),  # files the tool does not write are no obstacle
    (["a.csv"], False, "--out {d} already holds a.csv; pass --overwrite to replace it or give another --out"),
    (["a.csv", "b.png"], False, "--out {d} already holds a.csv, b.png; pass --overwrite to replace them"),
    (["a.csv", "b.png"], True, None),
])
def test_check_outputs(existing, overwrite, message, tmp_path):
    for name in existing:
        (tmp_path / name).write_text("x")
    if message is None:
        check_outputs(tmp_path, ["a.csv", "b.png"], overwrite)
    else:
        with pytest.raises(ValueError, match=re.escape(message.format(d=tmp_path))):
            check_outputs(tmp_path, ["a.csv", "b.png"], overwrite)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; give a directory"):
        check_outputs(tmp_path / "file", ["a.csv"], True)


@pytest.mark.parametrize(("make", "overwrite", "message"), [
    (None, False, None),
    ("file", False, "exists; pass --overwrite to replace it or give another --out"),
    ("file", True, None),
    ("dir", True, "is a directory; give a file name"),
])
def test_check_output_file(make, overwrite, message, tmp_path):
    path = tmp_path / "t.md"
    if make == "file":
        path.write_text("x")
    elif make == "dir":
        path.mkdir()
    if message is None:
        check_output_file(path, overwrite)
    else:
        with pytest.raises(ValueError, match=message):
            check_output_file(path, overwrite)
    with pytest.raises(ValueError, match="does not exist"):
        check_output_file(tmp_path / "no" / "t.md", overwrite)


def _fails(error: BaseException):
    def write(path):
        raise error
    return write


# (whether --out existed with a file of the user's, the second file's writer, what write_outputs gives or raises)
WRITES = [
    (False, lambda path: path.write_text("b"), 0),
    (False, _fails(OSError(28, "No space left on device")), 2),
    (False, _fails(RuntimeError("a plotting library failed")), RuntimeError),
    (True, _fails(OSError(28, "No space left on device")), 2),
    (True, _fails(RuntimeError("a plotting library failed")), RuntimeError),
]


@pytest.mark.parametrize(("existed", "second", "outcome"), WRITES)
def test_a_failed_write_leaves_no_output_directory_it_made(existed, second, outcome, tmp_path, capsys):
    from lit_attn.cli.toolcli import write_outputs

    out = tmp_path / "out"
    if existed:
        out.mkdir()
        (out / "mine.txt").write_text("the user's")
    writers = {"a.md": lambda path: path.write_text("a"), "b.csv": second}
    if isinstance(outcome, int):
        assert write_outputs(out, writers) == outcome
    else:
        with pytest.raises(outcome):
            write_outputs(out, writers)
    if outcome == 0:
        assert sorted(p.name for p in out.iterdir()) == ["a.md", "b.csv"]
    elif existed:  # a directory the tool did not make is left as it is, with what was written into it
        assert (out / "mine.txt").read_text() == "the user's"
    else:
        assert not out.exists()
    if outcome == 2:
        assert capsys.readouterr().err.startswith(f"error: cannot write into --out {out}: No space left on device")
