"""A user's broken attention class is refused in one line naming the class, the problem and the fix: by
`main.py fit` before it builds the model (exit 2, nothing left behind), by `lit-attn sweep` before it starts
any run, and by `lit_attn.testing.check_attention` as an AssertionError. A non-causal one trains only when the
check is skipped on purpose; attention options are checked against the constructor's types."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
from helpers import TINY_FIT

from lit_attn.attention import attention_names, get_attention, register_attention, unregister_attention
from lit_attn.cli.attention_check import check_before_launch, checked_options, fit_settings
from lit_attn.cli.lightning_cli import cli
from lit_attn.config import GPTConfig, common_attention_args
from lit_attn.testing import check_attention, check_before_training
from lit_attn.tools import sweep

PKG = "broken_attn_pkg"

SOURCE = '''
import torch
import torch.nn.functional as F
from torch import nn


class Good(nn.Module):
    def __init__(self, n_embd, n_head, block_size, **_):
        super().__init__()
        self.n_head, self.hs = n_head, n_embd // n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)

    def forward(self, x, causal=True):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.hs).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(B, T, C)


class NonCausal(Good):
    def forward(self, x):
        return super().forward(x, causal=False)


class NextToken(Good):
    """Each position also sees the next token, and nothing else from the future."""

    def forward(self, x):
        return super().forward(x) + 0.1 * torch.roll(x, -1, dims=1)


class LeaksAtFive(Good):
    """Only position 5 sees a later token (position 6)."""

    def forward(self, x):
        y = super().forward(x).clone()
        y[:, 5] = y[:, 5] + x[:, 6]
        return y


class ReturnsTuple(Good):
    def forward(self, x):
        return super().forward(x), None


class Float64(Good):
    def forward(self, x):
        return super().forward(x).double()


class HalfChannels(Good):
    def forward(self, x):
        return super().forward(x)[..., : x.size(-1) // 2]


class HalfPositions(Good):
    def forward(self, x):
        return super().forward(x)[:, : x.size(1) // 2]


class NaNs(Good):
    def forward(self, x):
        return super().forward(x) * float("nan")


class NeedsWindow(Good):
    def __init__(self, n_embd, n_head, block_size, window):
        super().__init__(n_embd, n_head, block_size)


class FormerCache(Good):
    """Its cache declared the former way: forward(x, cache, positions) and cache_layout."""

    def forward(self, x, cache=None, positions=None):
        return super().forward(x)

    @classmethod
    def cache_layout(cls, n_embd, **_):
        return {"k": (n_embd,), "v": (n_embd,)}


class RaisesInInit(Good):
    def __init__(self, n_embd, n_head, block_size, **_):
        super().__init__(n_embd, n_head, block_size)
        raise ValueError("broken on purpose")


class RaisesInForward(Good):
    def forward(self, x):
        return _helper(x)


def _helper(x):
    raise RuntimeError("no forward today")


class Typed(Good):
    def __init__(self, n_embd, n_head, block_size, scale: float = 1.0, steps: int = 2, seed=0, **_):
        super().__init__(n_embd, n_head, block_size)


def a_function(**_):
    return None


CONSTANT = 3
'''

# (import path, the one line's text), as the fit says it (check_attention says the same but for the fit's
# suffix naming the skip flag)
BROKEN = [
    ("bad.NonCausal", "is not causal: changing the tokens after position 0 changed the output at position 0"),
    ("bad.NextToken", "is not causal: changing the tokens after position 0 changed the output at position 0"),
    ("bad.LeaksAtFive", "is not causal: changing the tokens after position 5 changed the output at position 5"),
    ("bad.ReturnsTuple", "forward(x) returned a tuple, not a tensor; return the output alone"),
    ("bad.Float64", "a torch.float32 input gave a torch.float64 output; return the input's dtype"),
    ("bad.HalfChannels", "returned (2, 16, 16); it must return a tensor of the input's shape (B, T, C): project the "
                         "heads back to n_embd channels (C=32, got 16)"),
    ("bad.HalfPositions", "returned (2, 8, 32); it must return a tensor of the input's shape (B, T, C): one output "
                          "per position (T=16, got 8)"),
    ("bad.NaNs", "the torch.float32 output has NaN or inf values"),
    ("bad.RaisesInForward", "its forward raised RuntimeError: no forward today (an error in the attention's own code)"),
]
# Refused whatever the skip flag says: the class cannot be found or built.
UNBUILDABLE = [
    ("bad.NeedsWindow", "needs option(s) window (its constructor gives no default); set them with "
                        "--model.attention_options '{\"window\": ...}'"),
    ("bad.RaisesInInit", "raised ValueError: broken on purpose (an error in the attention's own code)"),
    ("bad.FormerCache", "declares cache_layout, the former decoding interface; declare decoding_state(**args)"),
    ("bad.a_function", "names a function (a_function), not a torch.nn.Module subclass"),
    ("bad.CONSTANT", "names an int (3), not a torch.nn.Module subclass"),
    ("bad", "names the module broken_attn_pkg.bad, not a torch.nn.Module subclass"),
    ("syntax.Mine", "cannot import attention 'broken_attn_pkg.syntax.Mine': "),
    ("raising.Mine", "importing broken_attn_pkg.raising raised RuntimeError: not today; fix the module"),
]
# Errors raised in the user's own code: shown with the user's frames above the line.
OWN_CODE = {"bad.RaisesInInit": "__init__", "bad.RaisesInForward": "_helper", "raising.Mine": "<module>"}
OTHER_NAMES = [
    ("os.path", "names the module"),
    ("builtins.int", "names the class int, not a torch.nn.Module subclass"),
    (".good", "is not a class's absolute import path; give the full path"),
]


def path(name: str) -> str:
    return name if name.startswith((".", "os.", "builtins.")) else f"{PKG}.{name}"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("")
    (root / PKG / "bad.py").write_text(textwrap.dedent(SOURCE))
    (root / PKG / "syntax.py").write_text("class Mine(:\n    pass\n")
    (root / PKG / "raising.py").write_text("raise RuntimeError('not today')\n")
    corpus = root / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 80)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield root
    for module in [m for m in sys.modules if m == PKG or m.startswith(f"{PKG}.")]:
        del sys.modules[module]


def refused_fit(package, tmp_path, capsys, *args: str) -> list[str]:
    """The stderr lines of a fit refused with exit 2 that left no run behind; its last line is the error."""
    runs = tmp_path / "runs"
    code = cli(["fit", f"--data.path={package / 'corpus.txt'}", f"--runs_dir={runs}", *TINY_FIT, *args])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    assert not runs.exists() or not any(runs.iterdir())
    return err.strip().splitlines()


@pytest.mark.parametrize("name, message", BROKEN + UNBUILDABLE + OTHER_NAMES)
def test_fit_refuses_a_broken_class_in_one_line(package, tmp_path, capsys, name, message):
    lines = refused_fit(package, tmp_path, capsys, f"--model.attention={path(name)}")
    last = lines[-1]
    assert last.startswith("error: ") and message in last, last
    assert f"'{path(name)}'" in last  # the class is named
    if (name, message) in BROKEN:
        assert last.endswith("(checked before training; --skip_attention_check true skips the check)")
    if name in OWN_CODE:  # the user's frames above the line, and only theirs
        assert re.search(rf'File ".*broken_attn_pkg/\w+\.py", line \d+, in {OWN_CODE[name]}', "\n".join(lines))
        assert not any("torch/" in line or "lit_attn/" in line for line in lines[:-1])
    else:
        assert len(lines) == 1 or not lines[-2].lstrip().startswith("File "), lines


@pytest.mark.parametrize("name, message", BROKEN + UNBUILDABLE + OTHER_NAMES)
def test_check_attention_fails_every_broken_class_with_an_assertion(package, name, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_attention(path(name))


@pytest.mark.parametrize("name, message", [BROKEN[0], BROKEN[3], UNBUILDABLE[0], UNBUILDABLE[1], OTHER_NAMES[2]])
def test_a_sweep_refuses_a_broken_class_before_any_run_starts(package, tmp_path, capsys, name, message):
    runs = tmp_path / "runs"
    code = sweep.main(["--attention", f"mha,{path(name)}", "--runs_dir", str(runs), "--prefix", "t", "--",
                       f"--data.path={package / 'corpus.txt'}", *TINY_FIT])
    err = capsys.readouterr().err
    assert code == 2 and "[sweep 1/" not in err and not runs.exists()
    assert err.strip().splitlines()[-1].startswith("error: ") and message in err.strip().splitlines()[-1]


def test_a_layer_of_a_pattern_is_checked_as_the_models_attention_is(package, tmp_path, capsys):
    noncausal = path("bad.NonCausal")
    pattern = f'--model.layer_pattern=["mha", "{noncausal}"]'
    last = refused_fit(package, tmp_path, capsys, "--model.n_layer=2", pattern)[-1]
    assert last.startswith("error: ") and f"'{noncausal}'" in last and "is not causal" in last, last


def test_a_non_causal_class_trains_only_when_the_check_is_skipped(package, tmp_path, capsys):
    noncausal = path("bad.NonCausal")
    refused_fit(package, tmp_path, capsys, f"--model.attention={noncausal}")
    assert cli(["fit", f"--data.path={package / 'corpus.txt'}", f"--runs_dir={tmp_path / 'runs'}", "--run=mine",
                *TINY_FIT, f"--model.attention={noncausal}", "--skip_attention_check", "true"]) == 0
    assert (tmp_path / "runs" / "mine" / "checkpoints" / "last.ckpt").is_file()
    # A sweep reads the flag where its fits read it, after `--`.
    check_before_launch(["--skip_attention_check", "true"], [noncausal])
    with pytest.raises(ValueError, match="is not causal"):
        check_before_launch(["--skip_attention_check=false"], [noncausal])


def test_a_sweep_checks_with_the_fits_own_model_settings(package, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text('model:\n  n_head: 2\n  attention_options: {"window": 4}\nskip_attention_check: true\n')
    settings, skip = fit_settings(["--config", str(config), "--model.n_embd=48", "--model.block_size", "12"])
    assert skip and (settings["n_head"], settings["n_embd"], settings["block_size"]) == (2, 48, 12)
    assert settings["attention_options"] == {"window": 4} and settings["pos"] == "learned"
    assert fit_settings(["--config", str(config), "--skip_attention_check=false"])[1] is False
    check_before_launch(["--config", str(config), "--skip_attention_check=false"], [path("bad.NeedsWindow")])


@pytest.mark.parametrize("name", attention_names())
def test_every_registered_attention_passes_the_check_before_training(name):
    pos = "rope" if get_attention(name).rope else "learned"
    config = GPTConfig(vocab_size=10, attention=name, n_embd=64, n_head=8, block_size=48, pos=pos)
    check_before_training(name, None, common_attention_args(vars(config)))


def test_the_check_before_training_is_at_a_tiny_size(package):
    """The model's head layout at head size 8 and 32 positions: a leak at position 5 is found at any width."""
    common = common_attention_args(vars(GPTConfig(vocab_size=10, attention="mha", n_embd=4096, n_head=4,
                                                  block_size=4096)))
    with pytest.raises(AssertionError, match="after position 5 changed the output at position 5"):
        check_before_training(path("bad.LeaksAtFive"), None, common)


# ---- attention options against the constructor's types ----

SEED = "is a seed: it must be an integer in [0, 4294967295], got "


@pytest.mark.parametrize("value, got", [
    (".nan", "nan"), ('"nan"', "'nan'"), ('"abc"', "'abc'"), ("1.5", "1.5"), ("1.0e30", "1e+30"), ("null", "None"),
    ("[1]", "[1]"), ("-1", "-1"), ("4294967296", "4294967296"), ("true", "True"),
])
def test_a_seed_option_out_of_range_or_of_another_type_is_refused(package, tmp_path, capsys, value, got):
    (last,) = refused_fit(package, tmp_path, capsys, "--model.attention=qsa_fixed",
                          f"--model.attention_options={{pauli_seed: {value}}}")[-1:]
    assert last == f"error: --model.attention_options key 'pauli_seed' of attention 'qsa_fixed' {SEED}{got}"


@pytest.mark.parametrize("options, message", [
    ({"scale": "x"}, "key 'scale' of attention 'broken_attn_pkg.bad.Typed' must be float (its constructor's type), "
                     "got 'x'"),
    ({"scale": None}, "key 'scale' of attention 'broken_attn_pkg.bad.Typed' must be float (its constructor's type), "
                      "got None"),
    ({"scale": float("nan")}, "key 'scale' of attention 'broken_attn_pkg.bad.Typed' is NaN; give a number"),
    ({"steps": 1.5}, "key 'steps' of attention 'broken_attn_pkg.bad.Typed' must be int (its constructor's type), "
                     "got 1.5"),
    ({"seed": -1}, f"key 'seed' of attention 'broken_attn_pkg.bad.Typed' {SEED}-1"),
])
def test_options_are_checked_against_the_constructors_types(package, options, message):
    with pytest.raises(ValueError, match=re.escape(f"--model.attention_options {message}")):
        checked_options(get_attention(path("bad.Typed")), options)


def test_options_of_the_right_type_are_read_as_the_constructor_takes_them(package):
    spec = get_attention(path("bad.Typed"))
    assert checked_options(spec, {"scale": 2, "steps": "3", "seed": 7}) == {"scale": 2.0, "steps": 3, "seed": 7}
    assert checked_options(get_attention("qsa"), {"normalization": "softmax", "pauli_seed": 0}) == {
        "normalization": "softmax", "pauli_seed": 0}


@pytest.mark.parametrize("name", ["", "a.b", "   "])
def test_register_attention_refuses_an_empty_or_dotted_name(name):
    with pytest.raises(ValueError, match="must be a non-empty name without dots"):
        register_attention(name, get_attention("mha").cls)
    assert name.lower() not in attention_names()
    unregister_attention(name)
