"""Name -> attention: the one place that lists attention names and knows what each one costs.

An attention is a plain `nn.Module` class whose `forward(x, state=None)` maps (B, T, C) to (B, T, C) causally and
whose constructor takes the `COMMON_ARGS` it cares about (plus options of its own). Register it with
`register_attention("name", MyAttention)` (or as a class decorator); a class can also be named by its
import path (`my_pkg.attn.MyAttention`) without registering. Everything else is derived unless the class
overrides it with a classmethod taking the builder's keyword arguments:

- `heads(**args) -> (query heads, key/value heads)`: default from the module's attributes (see derive);
- `parameter_count(**args) -> int`: default counted on a meta-device build;
- `flop_split(context, **args) -> FlopSplit`: default measured by FlopCounterMode on meta tensors;
- `no_qk_norm`: a class attribute saying why the attention cannot normalise queries and keys, for the line that
  refuses `qk_norm=True` (see COMMON_ARGS) to an attention whose constructor does not take it;
- `decoding_state(**args) -> layout`: declares what decoding keeps between steps (see `state`: e.g.
  `KVLayout({"k": (Hkv, hs), "v": (Hkv, hs)})`); the model creates one state per layer with `layout.new(...)`
  and calls `forward(x, state)`. Without it, forward(x) is all it needs, and decoding recomputes the prefix
  (correct, uncached).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .derive import FlopSplit, meta_flops, meta_heads, meta_params

__all__ = ["COMMON_ARGS", "AttentionSpec", "FlopSplit", "attention_names", "attention_options", "build_attention",
           "get_attention", "register_attention", "unregister_attention"]

# What the model passes every attention, with the defaults used where a caller leaves one out (n_embd and n_head
# it must give). A constructor takes those it cares about; anything else it accepts is an attention option.
# `dropout` is the attention weights' dropout; the block applies the residual dropout to the attention's output.
# `layer_idx` is the block's index from 0 (for depth-dependent initialisation); costs never depend on it.
# `qk_norm`: RMS-normalise every head's queries and keys before their scores (kernels.rms_per_head); an attention
# applies it by taking the argument, and one that does not take it is refused it (`no_qk_norm` says why);
# "auto" becomes True or False per attention, by whether it can.
COMMON_ARGS: dict[str, Any] = {"n_embd": None, "n_head": None, "n_query_heads": None, "n_kv_heads": None,
                               "block_size": 1024, "dropout": 0.0, "bias": False, "qkv_bias": None, "rope": False,
                               "qk_norm": False, "layer_idx": 0}
# Common arguments that change what an attention is: refused, rather than dropped, by one that does not take them.
_MEANINGFUL = ("n_query_heads", "n_kv_heads")


@dataclass(frozen=True)
class AttentionSpec:
    """A registered attention: its class, arguments bound at registration (`fixed`, e.g. a head preset),
    and whether it applies rotary position embeddings when built with rope=True."""

    name: str
    cls: type[nn.Module]
    fixed: dict[str, Any] = field(default_factory=dict)
    rope: bool = True

    def _parameters(self) -> dict[str, inspect.Parameter]:
        return dict(inspect.signature(self.cls).parameters)

    def _takes_any(self) -> bool:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._parameters().values())

    def option_defaults(self) -> dict[str, Any]:
        """The attention-specific options (constructor arguments beyond COMMON_ARGS and `fixed`) and their defaults."""
        return {name: (None if p.default is inspect.Parameter.empty else p.default)
                for name, p in self._parameters().items()
                if name not in COMMON_ARGS and name not in self.fixed
                and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}

    def options(self) -> list[str]:
        return list(self.option_defaults())

    def arguments(self, options: dict[str, Any] | None, common: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the class and its cost methods: common ones, checked options, fixed ones."""
        options = dict(options or {})
        allowed = self.options()
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            hint = f"its options are: {', '.join(allowed)}" if allowed else "it takes no options"
            raise ValueError(f"attention {self.name!r} got unknown option(s) {', '.join(unknown)}; {hint}")
        unexpected = sorted(set(common) - set(COMMON_ARGS))
        if unexpected or common.get("n_embd") is None or common.get("n_head") is None:
            raise TypeError(f"attention {self.name!r} takes n_embd, n_head and optionally "
                            f"{', '.join(list(COMMON_ARGS)[2:])}; got {', '.join(sorted(common))}")
        args = {**COMMON_ARGS, **common, **options, **self.fixed}
        missing = [name for name, p in self._parameters().items() if name not in args and p.default is p.empty
                   and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]
        if missing:
            given = ", ".join(f'"{name}": ...' for name in missing)
            raise ValueError(f"attention {self.name!r} needs option(s) {', '.join(missing)} (its constructor gives "
                             f"no default); set them with --model.attention_options '{{{given}}}'")
        if not self._takes_any():
            for name in _MEANINGFUL:
                if args[name] is not None and name not in self._parameters():
                    raise ValueError(f"attention {self.name!r} does not take {name} (its constructor has no such "
                                     f"argument); drop --model.{name}")
        if args["qk_norm"] == "auto":  # the model's "where the attention can": resolved per attention here
            args["qk_norm"] = self.takes_qk_norm()
        if args["qk_norm"] and not self.takes_qk_norm():
            why = getattr(self.cls, "no_qk_norm", "does not normalise queries and keys (its constructor takes no "
                                                  "qk_norm)")
            raise ValueError(f"attention {self.name!r} {why}; drop --model.qk_norm")
        if args["rope"] and not self.rope:
            raise ValueError(f"attention {self.name!r} does not use rotary position embeddings (it says so at "
                             "registration); use --model.pos learned")
        return args

    def takes_qk_norm(self) -> bool:
        """Whether the attention can normalise its queries and keys: its constructor takes qk_norm (or anything)."""
        return "qk_norm" in self._parameters() or self._takes_any()

    def build(self, **args: Any) -> nn.Module:
        """The attention module from `arguments(...)`: each constructor gets the arguments it takes."""
        if not self._takes_any():
            args = {k: v for k, v in args.items() if k in self._parameters()}
        return self.cls(**args)

    def _meta(self, args: dict[str, Any]) -> nn.Module:
        """The module built on the meta device (shapes only), once per distinct arguments."""
        key = (self.name, self.cls, _key(args))
        if key not in _META:
            with torch.device("meta"):
                _META[key] = self.build(**args)
        return _META[key]

    def _meta_flops(self, args: dict[str, Any], context: int) -> FlopSplit:
        key = (self.name, self.cls, _key(args), context)
        if key not in _FLOPS:
            _FLOPS[key] = meta_flops(self._meta(args), args["n_embd"], context)
        return _FLOPS[key]

    def heads(self, **args: Any) -> tuple[int, int]:
        """(query heads, key/value heads) the attention really uses."""
        if hasattr(self.cls, "heads"):
            return self.cls.heads(**args)
        return meta_heads(self._meta(args), args["n_head"])

    def params(self, **args: Any) -> int:
        """Parameters of one layer."""
        if hasattr(self.cls, "parameter_count"):
            return self.cls.parameter_count(**args)
        return meta_params(self._meta(args))

    def flops(self, context: int, **args: Any) -> FlopSplit:
        """FlopSplit of one layer's forward per token at context T."""
        if hasattr(self.cls, "flop_split"):
            return self.cls.flop_split(context, **args)
        return self._meta_flops(args, context)

    def derived(self, context: int, **args: Any) -> tuple[tuple[int, int], int, FlopSplit]:
        """(heads, params, FlopSplit at `context`) measured from the module, ignoring any analytic override."""
        module = self._meta(args)
        return meta_heads(module, args["n_head"]), meta_params(module), self._meta_flops(args, context)

    def state(self, **args: Any) -> Any:
        """The layout of one layer's decoding state (`new(batch, length, dtype, device)`, `values(length)`; see
        `state`); None: the attention declares none, and decoding recomputes the prefix."""
        layout = getattr(self.cls, "decoding_state", None)
        if self.former_interface():
            raise TypeError(self.former_interface())
        return None if layout is None else layout(**args)

    def former_interface(self) -> str | None:
        """What to change if the class declares its cache the former way (`cache_layout`, a forward taking the
        cache and positions), which would otherwise decode wrongly or not at all; None if it does not."""
        if getattr(self.cls, "decoding_state", None) is not None or not hasattr(self.cls, "cache_layout"):
            return None
        return (f"attention {self.name!r} declares cache_layout, the former decoding interface; declare "
                "decoding_state(**args) returning lit_attn.attention.KVLayout(its cache_layout) and take "
                "forward(x, state=None), reading state[name], state.positions and state.length (docs/attentions.md)")


def _key(args: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in args.items()))


# Meta-device builds and measured FLOPs, per (name, class, arguments[, context]): measuring is not free.
_META: dict[tuple, nn.Module] = {}
_FLOPS: dict[tuple, FlopSplit] = {}
_REGISTRY: dict[str, AttentionSpec] = {}


def register_attention(name: str, cls: type[nn.Module] | None = None, *, rope: bool | None = None,
                       fixed: dict[str, Any] | None = None) -> Any:
    """Register attention class `cls` under `name` (case-insensitive) and return it; without `cls`, a class
    decorator. `rope=False` says the attention cannot use rotary embeddings (default: the class's
    `supports_rope`, else True); `fixed` binds constructor arguments (e.g. a head preset)."""
    if not isinstance(name, str) or not name.strip() or "." in name:
        raise ValueError(f"attention name {name!r} must be a non-empty name without dots (a dotted name reads as a "
                         "class's import path); e.g. register_attention('tempered', TemperedAttention)")
    if cls is None:
        return lambda c: register_attention(name, c, rope=rope, fixed=fixed)
    key = name.lower()
    if key in _REGISTRY:
        raise ValueError(f"attention {name!r} is already registered")
    _REGISTRY[key] = _spec(key, cls, rope, fixed)
    return cls


def _spec(name: str, cls: Any, rope: bool | None, fixed: dict[str, Any] | None) -> AttentionSpec:
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"attention {name!r} must be an nn.Module class, got {cls!r}")
    return AttentionSpec(name, cls, dict(fixed or {}), getattr(cls, "supports_rope", True) if rope is None else rope)


def unregister_attention(name: str) -> None:
    """Remove a registered attention (for tests and notebooks that register their own)."""
    _REGISTRY.pop(name.lower(), None)


def attention_names() -> list[str]:
    return sorted(_REGISTRY)


def get_attention(name: str) -> AttentionSpec:
    """The registered attention `name`, or the class at import path `name` (e.g. `my_pkg.attn.MyAttention`)."""
    spec = _REGISTRY.get(name.lower()) if isinstance(name, str) else None
    if spec is not None:
        return spec
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"unknown attention {name!r}; choose one of: {', '.join(attention_names())}, "
                         "or give a class's import path (my_pkg.module.MyAttention)")
    return _imported(name)


def _imported(path: str) -> AttentionSpec:
    module_name, _, attr = path.rpartition(".")
    if not all(part.isidentifier() for part in path.split(".")):
        raise ValueError(f"attention {path!r} is not a class's absolute import path; give the full path from a "
                         "package on PYTHONPATH, e.g. my_pkg.module.MyAttention (relative paths are not resolved)")
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as e:
        raise ValueError(f"cannot import attention {path!r}: {e.msg} in {e.filename}, line {e.lineno}; "
                         "fix the module's syntax") from None
    except ImportError as e:
        raise ValueError(f"cannot import attention {path!r}: {e}; check the module is importable "
                         "(installed, or its directory on PYTHONPATH)") from None
    except Exception as e:  # the user's module raised while it was imported: __cause__ keeps its frames
        raise ValueError(f"cannot import attention {path!r}: importing {module_name} raised "
                         f"{type(e).__name__}: {e}; fix the module") from e
    try:
        cls = getattr(module, attr)
    except AttributeError:
        try:
            cls = importlib.import_module(path)  # a submodule, named as if it were the class
        except Exception:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}; check the class name") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"attention {path!r} names {_kind(cls)}, not a torch.nn.Module subclass; give the import "
                         "path of an nn.Module class whose forward maps (B, T, C) to (B, T, C)")
    # A class its module registered under a short name keeps what it said at registration (e.g. rope=False).
    registered = [s for s in _REGISTRY.values() if s.cls is cls and not s.fixed]
    return registered[0] if registered else _spec(path, cls, None, None)


def _kind(obj: Any) -> str:
    """What `obj` is, in words, for a message."""
    if inspect.ismodule(obj):
        return f"the module {obj.__name__}"
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    kind = type(obj).__name__
    text = getattr(obj, "__qualname__", None) if callable(obj) else repr(obj)
    text = text or kind
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({text if len(text) <= 40 else text[:37] + '...'})"


def attention_options(name: str) -> list[str]:
    """The attention-specific options of `name` (beyond COMMON_ARGS)."""
    return get_attention(name).options()


def build_attention(name: str, options: dict[str, Any] | None = None, **common: Any) -> nn.Module:
    """Build attention `name` from the common arguments and its own `options`."""
    spec = get_attention(name)
    return spec.build(**spec.arguments(options, common))


def describe_names() -> str:
    """The attention names for help text."""
    return f"one of {', '.join(attention_names())}, or a class's import path (my_pkg.module.MyAttention)."


def describe_options() -> str:
    """Each attention's own options and their defaults, for help text: attentions with the same options share a line."""
    groups: dict[str, list[str]] = {}
    for name in attention_names():
        defaults = get_attention(name).option_defaults()
        text = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
        if text:
            groups.setdefault(text, []).append(name)
    listed = "; ".join(f"{', '.join(names)}: {text}" for text, names in groups.items())
    return f"Options of the chosen attention (a JSON mapping). {listed or 'None take options'}; the others take none."
