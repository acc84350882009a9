"""Muon (lit_attn.training.muon): the float32 Newton–Schulz step, where each step runs, the one optimizer over Muon
and AdamW, and the parameter groups `--model.optimizer muon` gives them."""

import pytest
import torch
import torch.optim._muon as torch_muon
from helpers import tiny_gpt

from lit_attn.training import muon
from lit_attn.training.muon import Muon, MuonWithAdamW, newton_schulz


def matrices(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((8, 4), (4, 8), (6, 6))]


def set_grads(params: list[torch.nn.Parameter], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("shape", [(16, 4), (4, 16), (8, 8)])
def test_newton_schulz_is_float32_and_nearly_orthogonal(shape):
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    out = newton_schulz(grad, (torch_muon.DEFAULT_A, torch_muon.DEFAULT_B, torch_muon.DEFAULT_C), 5, 1e-7)
    assert out.dtype == torch.float32 and out.shape == grad.shape
    # The quintic iteration leaves singular values near 1 (about 0.5 to 1.5 by its design), not exactly 1.
    singular = torch.linalg.svdvals(out)
    assert singular.min() > 0.5 and singular.max() < 1.5


def test_the_float32_step_is_the_librarys_with_a_float32_iteration(monkeypatch):
    """The same momentum, Nesterov, weight decay and shape scaling as torch.optim.Muon, bit for bit."""
    ours, theirs = matrices(), matrices()
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
    mine, library = Muon(ours, float32=True, **settings), torch.optim.Muon(theirs, **settings)
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz)
    for step in range(3):
        set_grads(ours, step), set_grads(theirs, step)
        mine.step(), library.step()
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("float32,native,expected", [
    (None, False, "float32"),  # a CPU without bfloat16 hardware: our iteration
    (None, True, "library"),  # AVX512-BF16 or AMX: torch's bfloat16 one
    (True, True, "float32"),
    (False, False, "library"),
])
def test_which_newton_schulz_runs(float32, native, expected, monkeypatch):
    ran = []
    monkeypatch.setattr(muon, "native_bfloat16_cpu", lambda: native)
    monkeypatch.setattr(muon, "newton_schulz", lambda *a: ran.append("float32") or newton_schulz(*a))
    real = torch_muon._zeropower_via_newtonschulz
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", lambda *a: ran.append("library") or real(*a))
    params = matrices()
    set_grads(params, 0)
    Muon(params, float32=float32).step()
    assert ran == [expected] * len(params)


def composite(params: list[torch.nn.Parameter]) -> MuonWithAdamW:
    return MuonWithAdamW([{"params": params[:2], "name": "muon"}], [{"params": params[2:], "name": "adamw"}],
                         muon={"lr": 0.02, "float32": True}, adamw={"lr": 1e-3})


def test_one_optimizer_steps_muon_and_adamw_as_they_would_alone():
    together, alone = matrices(), matrices()
    optimizer = composite(together)
    assert [g["name"] for g in optimizer.param_groups] == ["muon", "adamw"]
    by_muon, by_adamw = Muon(alone[:2], lr=0.02, float32=True), torch.optim.AdamW(alone[2:], lr=1e-3)
    for step in range(3):
        set_grads(together, step), set_grads(alone, step)
        optimizer.step(), by_muon.step(), by_adamw.step()
    for a, b in zip(together, alone):
        assert torch.equal(a, b)
    assert set(optimizer.state[together[0]]) == {"momentum_buffer"}
    assert set(optimizer.state[together[2]]) == {"step", "exp_avg", "exp_avg_sq"}


def test_a_reloaded_optimizer_continues_exactly():
    first, second = matrices(), matrices()
    straight, resumed = composite(first), composite(second)
    for step in range(2):
        set_grads(first, step), set_grads(second, step)
        straight.step(), resumed.step()
    saved = resumed.state_dict()
    resumed = composite(second)  # a new process: fresh state, then the checkpoint's
    resumed.load_state_dict(saved)
    assert resumed.muon.state is resumed.state and resumed.adamw.param_groups[0] is resumed.param_groups[1]
    for step in range(2, 4):
        set_grads(first, step), set_grads(second, step)
        straight.step(), resumed.step()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = tiny_gpt(16, total_steps=10, optimizer="muon", muon_lr=0.03, muon_weight_decay=0.01, lr=2e-3)
    optimizer = model.configure_optimizers()["optimizer"]
    hidden, matrices_, vectors = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert hidden["name"] == "muon" and hidden["initial_lr"] == 0.03 and hidden["weight_decay"] == 0.01
    assert all(names[id(p)].startswith("transformer.blocks.") and p.dim() == 2 for p in hidden["params"])
    assert {names[id(p)] for p in matrices_["params"]} == {"transformer.tok_emb.weight", "transformer.pos_emb.weight"}
    assert (matrices_["name"], vectors["name"]) == ("adamw", "adamw_no_decay") and matrices_["initial_lr"] == 2e-3
    assert (matrices_["weight_decay"], vectors["weight_decay"]) == (0.1, 0.0)
    assert all(p.dim() == 1 for p in vectors["params"])
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
