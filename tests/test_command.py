"""The `lit-attn` command, `python -m lit_attn` and the `python -m lit_attn.<tool>` aliases existing scripts use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import main_env

from lit_attn.cli import command


def test_usage_lists_every_command_and_tool(capsys):
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("fit", "validate", "test", "predict", *command.TOOLS):
        assert f"\n  {name} " in out, name
    assert command.main([]) == 2 and "usage: lit-attn COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize("tool", sorted(command.TOOLS))
def test_a_tool_runs_through_the_command(tool, capsys):
    with pytest.raises(SystemExit) as e:
        command.main([tool, "--help"])
    assert e.value.code == 0 and f"lit-attn {tool}" in capsys.readouterr().out


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=main_env(), capture_output=True, text=True, timeout=600)


def test_the_console_script_runs_the_command_from_any_directory(tmp_path, capsys, monkeypatch):
    """The installed script starts the command; `fit` finds its default config (it ships with the package) from any
    directory. (`lit-attn fit` in a process of its own is `python -m lit_attn fit`, as the sweep starts its runs:
    the sweep's tests run it, and main.py is how most tests start a process.)"""
    script = Path(sys.executable).with_name("lit-attn")
    assert script.is_file(), "pip install -e . installs the lit-attn console script beside python"
    done = _run(str(script), "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: lit-attn COMMAND"), done.stderr[-2000:]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        command.main(["fit", "--help"])
    assert e.value.code == 0 and "--model.attention" in capsys.readouterr().out


