"""main.py's short --help: the common options, each with the default the command really runs with."""

from __future__ import annotations

import re

import pytest
import yaml

from lit_attn.cli.lightning_cli import main
from lit_attn.cli.parser import COMMON


def _run(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def _shown_defaults(text: str) -> dict[str, str]:
    """{key: default as printed} from the short help's `--key` entries."""
    shown = {}
    for block in re.split(r"\n  --", text)[1:]:
        key, _, body = block.partition("\n")
        found = re.search(r"\[default: ([^\]]*)\]", " ".join(body.split()))
        if found:
            shown[key.strip()] = found.group(1)
    return shown


def _resolved(config: dict, key: str):
    if key == "data":
        return config["data"]["class_path"]
    node = config["data"]["init_args"] if key.startswith("data.") else config
    for part in (key[5:] if key.startswith("data.") else key).split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_short_help_shows_the_defaults_that_run(stage, capsys):
    text = _run(capsys, stage, "--help")
    assert len(text.splitlines()) < 150, "the short help should fit a few screens"
    assert "--data.path" in text and "'auto'" in text and "<class" not in text
    resolved = yaml.safe_load(_run(capsys, stage, "--print_config"))
    shown = _shown_defaults(text)
    if stage == "fit":
        assert set(shown) == {k for keys in COMMON.values() for k in keys} - {"config", "ckpt_path"}
    for key, printed in shown.items():
        value = _resolved(resolved, key)
        assert printed == ("none" if value is None else str(value)), f"--{key}: help says {printed}, runs {value}"


def test_help_all_lists_every_option(capsys):
    text = _run(capsys, "fit", "--help_all")
    assert len(text.splitlines()) > 400 and "--trainer.profiler" in text


def test_a_data_class_help_shows_the_defaults_that_run(capsys):
    text = _run(capsys, "fit", "--data.help", "CharDataModule")
    resolved = yaml.safe_load(_run(capsys, "fit", "--print_config"))["data"]["init_args"]
    for key in ("batch_size", "val_fraction", "stride"):
        block = text.split(f"--data.{key} ")[-1]
        assert f"default: {resolved[key]})" in " ".join(block.split()[:40]), key
