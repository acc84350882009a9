"""lit_attn.testing.check_attention: passes a correct attention, and names what is wrong with a broken one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_attn.attention import KVLayout, RotaryEmbedding, register_attention, unregister_attention
from lit_attn.testing import check_attention


class Causal(nn.Module):
    """Multi-head causal softmax attention with optional RoPE: a correct one-class attention."""

    leak = False  # subclasses break one thing each

    def __init__(self, n_embd, n_head, block_size, rope=False, **_):
        super().__init__()
        self.n_head, self.head_size = n_head, n_embd // n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.rotary = RotaryEmbedding(self.head_size, block_size) if rope else None

    def project(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_size).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        return q, k, v

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.project(x)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=not self.leak)  # (B, nh, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class Leaky(Causal):
    leak = True


class IgnoresRope(Causal):
    def __init__(self, n_embd, n_head, block_size, rope=False, **_):
        super().__init__(n_embd, n_head, block_size, rope=False)


class CachedKV(Causal):
    """Declares a key/value cache; `forget` makes decoding attend only to the new tokens (a wrong cache)."""

    forget = False

    @classmethod
    def decoding_state(cls, n_embd, n_head, **_):
        return KVLayout({"k": (n_head, n_embd // n_head), "v": (n_head, n_embd // n_head)})

    def forward(self, x, state=None):
        if state is None:
            return super().forward(x)
        cache, positions = state, state.positions
        B, T, C = x.shape
        q, k, v = self.project(x)  # (B, nh, T, hs)
        cache["k"].index_copy_(1, positions, k.transpose(1, 2))
        cache["v"].index_copy_(1, positions, v.transpose(1, 2))
        if not self.forget:
            k, v = cache["k"].transpose(1, 2), cache["v"].transpose(1, 2)  # (B, nh, L, hs)
        mask = torch.arange(k.size(2)) <= (positions[:, None] if not self.forget else torch.arange(T)[:, None])
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class ForgetsCache(CachedKV):
    forget = True


class FormerCacheLayout(Causal):
    """Declares its cache the former way (cache_layout, forward(x, cache, positions)): refused, not decoded uncached."""

    @classmethod
    def cache_layout(cls, n_embd, n_head, **_):
        return {"k": (n_head, n_embd // n_head), "v": (n_head, n_embd // n_head)}


class WrongCount(Causal):
    @classmethod
    def parameter_count(cls, n_embd, **_):
        return 4 * n_embd * n_embd + 1  # one too many


class WrongShape(Causal):
    def forward(self, x):
        return super().forward(x)[..., : x.size(-1) // 2]


class KeepsFloat32(Causal):
    def forward(self, x):
        return super().forward(x).float()


class DeadParameter(Causal):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unused = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return super().forward(x.to(self.qkv.weight.dtype)).to(x.dtype)


@pytest.fixture
def registered():
    names = []

    def register(cls, **kw):
        name = f"check_{cls.__name__.lower()}"
        register_attention(name, cls, **kw)
        names.append(name)
        return name

    yield register
    for name in names:
        unregister_attention(name)


@pytest.mark.parametrize("cls", [Causal, CachedKV])
def test_a_correct_attention_passes(registered, cls):
    check_attention(registered(cls))
    check_attention(registered(type(f"{cls.__name__}Wide", (cls,), {})), n_embd=48, n_head=3, block_size=12)


@pytest.mark.parametrize("cls, message", [
    (Leaky, r"is not causal: changing the tokens after position 0 changed the output at position 0 .*is_causal=True"),
    (IgnoresRope, r"ignores rope: built with rope=True its output equals the one without; .*with rope=False"),
    (ForgetsCache, r"cached decoding differs from the full forward at position 5 .*check decoding_state"),
    (FormerCacheLayout, r"declares cache_layout, the former decoding interface; declare decoding_state"),
    (WrongCount, r"its parameter_count\(\) says 4097, the module measures 4096 .*fix the formula"),
    (WrongShape, r"returned \(2, 16, 16\); it must return a tensor of the input's shape"),
    (KeepsFloat32, r"a torch.bfloat16 input gave a torch.float32 output"),
    (DeadParameter, r"no \(or a non-finite\) gradient reaches unused"),
])
def test_a_broken_attention_is_rejected_with_what_is_wrong(registered, cls, message):
    with pytest.raises(AssertionError, match=message):
        check_attention(registered(cls))


def test_an_attention_that_says_it_cannot_use_rope_is_refused_rope(registered):
    name = registered(IgnoresRope, rope=False)
    check_attention(name)  # the rope check now asks for the refusal instead
    with pytest.raises(ValueError, match=rf"attention '{name}' does not use rotary position embeddings"):
        from lit_attn.config import GPTConfig

        GPTConfig(vocab_size=10, attention=name, pos="rope")


def test_an_import_path_needs_no_registration(tmp_path, monkeypatch):
    (tmp_path / "user_attn.py").write_text(
        "import torch.nn.functional as F\nfrom torch import nn\nfrom lit_attn.attention import RotaryEmbedding\n\n\n"
        "class Mine(nn.Module):\n"
        "    def __init__(self, n_embd, n_head, block_size, rope=False):\n"
        "        super().__init__()\n"
        "        self.n_head, self.hs = n_head, n_embd // n_head\n"
        "        self.qkv = nn.Linear(n_embd, 3 * n_embd)\n"
        "        self.rotary = RotaryEmbedding(self.hs, block_size) if rope else None\n\n"
        "    def forward(self, x):\n"
        "        B, T, C = x.shape\n"
        "        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.hs).permute(2, 0, 3, 1, 4)\n"
        "        if self.rotary is not None:\n"
        "            q, k = self.rotary(q), self.rotary(k)\n"
        "        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_attention("user_attn.Mine")
    # What it cannot find fails as any broken class does: an AssertionError saying what is wrong.
    with pytest.raises(AssertionError, match=r"cannot import attention 'no_such_pkg.Mine': No module named 'no_such"):
        check_attention("no_such_pkg.Mine")
    with pytest.raises(AssertionError, match=r"module 'user_attn' has no attribute 'Other'; check the class name"):
        check_attention("user_attn.Other")
    with pytest.raises(AssertionError, match=r"attention 'user_attn.Mine' got unknown option\(s\) window; it takes no"):
        check_attention("user_attn.Mine", {"window": 3})
    with pytest.raises(ValueError, match=r"attention 'user_attn.Mine' does not take n_kv_heads"):
        from lit_attn.config import GPTConfig

        GPTConfig(vocab_size=10, attention="user_attn.Mine", n_kv_heads=2)


def test_register_attention_is_also_a_class_decorator():
    @register_attention("check_decorated")
    class Decorated(Causal):
        pass

    try:
        assert isinstance(Decorated, type) and issubclass(Decorated, Causal)  # the class itself, unchanged
        check_attention("check_decorated")
        with pytest.raises(ValueError, match="attention 'check_decorated' is already registered"):
            register_attention("check_decorated", Causal)
    finally:
        unregister_attention("check_decorated")
