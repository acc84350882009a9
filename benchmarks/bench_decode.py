"""Incremental-decoding benchmark: prefill latency, decode latency and tokens/s, decode state bytes per sequence.

Per attention, batch B and context T, on the Sparse Query Attention paper's model (`--layout small`
shrinks it for quick checks), with a decoding state for T tokens: prefill = one forward of a T-token prompt;
decode = with the state holding the prompt's first T-n tokens, n single-token steps ending at T
(n = --decode-steps), seconds per token = round time / n, tokens/s = B / that; the decode state one sequence holds
once T tokens went through it, from the registered layout (values(T) x element size) and from the buffers (bytes / B),
which must agree: it grows with T for a K/V cache, stops growing at W for a window of W tokens, and stays flat for a
recurrent state. An attention without RoPE runs with learned positions; an entry may carry options as JSON,
e.g. mha{"window": 64}.
As in benchmarks.bench the attentions are timed in turns with torch's threads pinned, so machine load hits
all alike; times are medians over the rounds (min and max in decode.csv); peak CUDA memory is measured
beforehand, one attention at a time. `--generate` times greedy generation (batch 1) with and without the cache.

    lit-attn bench-decode --contexts 128,512,1024 --batches 1,16 --out decode_out
    lit-attn bench-decode --generate --device cpu --dtype float32 --prompt 512 --new-tokens 256
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.bench import (
    DTYPES,
    add_timing_arguments,
    peak_memory_mib,
    time_interleaved,
    with_attention,
)
from benchmarks.bench_decode_report import (
    DecodeRow,
    GenerateRow,
    generate_table,
    markdown_table,
    write_cache_plot,
    write_csv,
    write_decode_plot,
)
from lit_attn.analytic import cache_values_per_sequence, decode_state_kind
from lit_attn.attention.heads import PRESETS
from lit_attn.cli.toolcli import (
    ToolParser,
    available_memory,
    check_device,
    check_outputs,
    check_threads,
    csv_list,
    gib,
    split_attentions,
    write_outputs,
)
from lit_attn.config import SPARSE_QUERY_LAYOUT, GPTConfig
from lit_attn.transformer import Transformer

__all__ = ["LAYOUTS", "DecodeRow", "GenerateRow", "generate_table", "main", "markdown_table", "model_config",
           "parse_args", "run_decode", "run_generate"]

LAYOUTS = {
    "paper": SPARSE_QUERY_LAYOUT,
    # Same shape of model, in seconds on a CPU: 8 heads keep every grouped preset's head ratio.
    "small": dataclasses.replace(SPARSE_QUERY_LAYOUT, vocab_size=256, n_layer=2, n_embd=64, n_head=8,
                                 ffn_hidden=128, block_size=128),
}


def model_config(layout: str, attention: str) -> GPTConfig:
    """The benchmarked model: `layout` (paper or small) with this attention entry (NAME or NAME{JSON options});
    learned positions for an attention without RoPE."""
    return with_attention(LAYOUTS[layout], attention)


def build_model(config: GPTConfig, device: torch.device, dtype: torch.dtype) -> Transformer:
    # The same seed for every build: the cached and uncached paths, and reruns, see the same weights.
    torch.manual_seed(0)
    return Transformer(config).to(device=device, dtype=dtype).eval()


class _Case:
    """One model at one batch and context: a prompt, a cache of `context` tokens, and its timed steps."""

    def __init__(self, model: Transformer, batch: int, context: int, steps: int, step: Callable | None = None):
        device = model.tok_emb.weight.device
        self.model, self.steps, self.context = model, steps, context
        self.step = step or model  # the decode step: the model itself or a compiled wrapper of it
        self.tokens = torch.randint(0, model.config.vocab_size, (batch, context), device=device)
        # An attention without a cache layout decodes by recomputing the prefix: no cache, the same steps.
        self.cache = model.new_cache(batch, context) if model.cached_decoding else None
        self.positions = torch.arange(context, device=device)
        # Inputs of every step, built once: no host-side work inside the timed loop.
        self.step_inputs = [(self.tokens[:, t : t + 1] if self.cache is not None else self.tokens[:, : t + 1],
                             self.positions[t : t + 1]) for t in range(context - steps, context)]

    @torch.no_grad()
    def prefill(self) -> None:
        # Every position is overwritten, so the reused buffers behave as a fresh cache; a recurrent state carries on
        # from the last round instead, which changes its values, not its work.
        if self.cache is None:
            self.model(self.tokens)
        else:
            self.model(self.tokens, self.cache, self.positions)

    @torch.no_grad()
    def decode(self) -> None:
        # Positions >= T-n are rewritten before they are attended to, so every round starts from the
        # same state as a cache prefilled with T-n tokens.
        for token, pos in self.step_inputs:
            if self.cache is None:
                self.step(token)  # the whole prefix up to this position
            else:
                self.step(token, self.cache, pos)


def _decode_step(model: Transformer, compiled: bool) -> Callable:
    """The function one decode step calls: the model, or torch.compile of it (one graph per cache shape)."""
    if not compiled:
        return model
    # Each model x batch x context is a graph of its own; past the default limit torch runs eager, silently.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
    return torch.compile(model, dynamic=False)


def peak_mib(config: GPTConfig, batch: int, context: int, steps: int, device: torch.device,
             dtype: torch.dtype) -> float | None:
    """Peak CUDA memory in MiB (weights, cache, activations) of one eager prefill + decode, alone; None off CUDA."""
    if device.type != "cuda":
        return None
    case = _Case(build_model(config, device, dtype), batch, context, steps)

    def prefill_and_decode() -> None:
        case.prefill()
        case.decode()

    peak = peak_memory_mib([prefill_and_decode], device, warmup=1)
    case = None  # free the model and its cache before the next attention is measured alone
    torch.cuda.empty_cache()
    return peak


def _row(name: str, case: _Case, prefill: list[float], decode: list[float], peak: float | None) -> DecodeRow:
    """A row from the timed rounds; raises RuntimeError if the state's bytes disagree with the registry's layout."""
    config, batch = case.model.config, case.tokens.size(0)
    element = torch.empty((), dtype=case.model.tok_emb.weight.dtype).element_size()
    analytic = (cache_values_per_sequence(config, case.context) or 0) * element  # uncached: nothing kept
    measured = sum(layer.nbytes for layer in case.cache or []) / batch
    if measured != analytic:
        raise RuntimeError(f"{name}: the decode state holds {measured:g} bytes per sequence, its registered layout "
                           f"says {analytic}")
    per_token = [t / case.steps for t in decode]
    hq, hkv = config.heads
    return DecodeRow(name, batch, case.context, hq, hkv, statistics.median(prefill), min(prefill), max(prefill),
                     statistics.median(per_token), min(per_token), max(per_token),
                     batch / statistics.median(per_token), analytic, measured, peak,
                     decoding=decode_state_kind(config) or "uncached")


def add_speedups(rows: list[DecodeRow]) -> list[DecodeRow]:
    """Fill each row's decode speed-up vs the MHA row at the same batch and context (NaN without one)."""
    mha = {(r.batch, r.context): r for r in rows if r.attention == "mha"}
    for r in rows:
        if (base := mha.get((r.batch, r.context))) is not None:
            r.decode_speedup = base.decode_s_per_token / r.decode_s_per_token
    return rows


def memory_needed(configs: Sequence[GPTConfig], batch: int, context: int, element: int) -> int:
    """Estimated peak bytes of `run_decode` at one batch and context: every model's weights and cache resident,
    and one prefill's largest activations (logits, FFN, attention scores where the kernel materialises them)."""
    weights = 0
    for config in configs:
        with torch.device("meta"):  # shapes only
            weights += sum(t.nbytes for m in [Transformer(config)] for t in [*m.parameters(), *m.buffers()])
    caches = sum(cache_values_per_sequence(c, context) or 0 for c in configs) * element * batch
    prefill = max(c.vocab_size + 4 * c.ffn_width + 8 * c.n_embd + c.heads[0] * context for c in configs)
    return weights + caches + prefill * element * batch * context


def run_decode(
    attentions: Sequence[str], contexts: Sequence[int], batches: Sequence[int], steps: int, layout: str = "paper",
    device: str = "cpu", dtype: str = "float32", warmup: int = 1, repeats: int = 3, compiled: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[DecodeRow]:
    """Rows of every batch x context x attention; at each batch and context the attentions are timed in turns."""
    dev, dt = torch.device(device), DTYPES[dtype]
    configs = {name: model_config(layout, name) for name in dict.fromkeys(attentions)}
    free = available_memory() if dev.type == "cpu" else None  # CUDA raises when full; the kernel kills a process
    need = memory_needed(list(configs.values()), max(batches), max(contexts), torch.empty((), dtype=dt).element_size())
    if free is not None and need > free:
        raise ValueError(f"batch {max(batches)} x context {max(contexts)} needs about {gib(need)} of memory "
                         f"(estimated), {gib(free)} is available; pass smaller --batches or --contexts")
    # Peaks first, one model at a time, before the timed models are resident.
    peaks = {(n, b, t): peak_mib(c, b, t, steps, dev, dt)
             for n, c in configs.items() for b in batches for t in contexts}
    models = {name: build_model(config, dev, dt) for name, config in configs.items()}
    step_fns = {name: _decode_step(model, compiled) for name, model in models.items()}
    rows = []
    for batch in batches:
        for context in contexts:
            cases = {n: _Case(m, batch, context, steps, step_fns[n]) for n, m in models.items()}
            prefill = time_interleaved({n: c.prefill for n, c in cases.items()}, dev, warmup, repeats)
            # The prefill rounds left every cache holding the prompt: decoding starts from there.
            decode = time_interleaved({n: c.decode for n, c in cases.items()}, dev, warmup, repeats)
            for name, case in cases.items():
                rows.append(_row(name, case, prefill[name], decode[name], peaks[name, batch, context]))
                if log:
                    r = rows[-1]
                    log(f"{name} B={batch} T={context}: prefill {r.prefill_s:.4g}s, decode "
                        f"{r.decode_s_per_token * 1e3:.4g} ms/token ({r.decode_s_per_token_min * 1e3:.4g}-"
                        f"{r.decode_s_per_token_max * 1e3:.4g}), {r.decode_tokens_per_sec:.1f} tokens/s")
            del cases
    return add_speedups(rows)


def run_generate(attentions: Sequence[str], layout: str, prompt: int, new_tokens: int, device: str = "cpu",
                 dtype: str = "float32", warmup: int = 1, repeats: int = 3) -> list[GenerateRow]:
    """Time greedy generation (batch 1) cached and uncached, in turns, and compare their tokens."""
    dev, dt = torch.device(device), DTYPES[dtype]
    models = {name: build_model(model_config(layout, name), dev, dt) for name in dict.fromkeys(attentions)}
    idx = torch.randint(0, LAYOUTS[layout].vocab_size, (1, prompt), device=dev)
    outputs: dict[tuple[str, bool], torch.Tensor] = {}

    def generate(name: str, cached: bool, n: int = new_tokens) -> Callable[[], None]:
        def step() -> None:
            outputs[name, cached] = models[name].generate(idx, n, temperature=0, use_cache=cached)[0, prompt:]
        return step

    for name, cached in [(n, c) for n in models for c in (True, False)] * warmup:
        generate(name, cached, 2)()  # a short generation warms both paths up; a full one would double the run
    steps = {f"{name} {kind}": generate(name, kind == "cached") for name in models for kind in ("cached", "uncached")}
    times = time_interleaved(steps, dev, 0, repeats)
    rows = []
    for name in models:
        cached, uncached = statistics.median(times[f"{name} cached"]), statistics.median(times[f"{name} uncached"])
        differs = (outputs[name, True] != outputs[name, False]).nonzero()
        first = int(differs[0, 0]) if len(differs) else None
        rows.append(GenerateRow(name, cached, uncached, uncached / cached, first is None, first))
    return rows


def _int_list(p: ToolParser, flag: str, text: str) -> list[int]:
    try:
        values = [int(t) for t in csv_list(text)]
    except ValueError:
        p.error(f"{flag}={text!r} is invalid: expected comma-separated integers, e.g. 128,512")
    if not values or min(values) < 1:
        p.error(f"{flag} needs integers >= 1, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None):
    """Command-line options of `lit-attn bench-decode` (a jsonargparse Namespace)."""
    p = ToolParser(prog="lit-attn bench-decode", description="Time prefill and cached decoding per "
                   "attention, batch and context on the Sparse Query Attention paper's model; print a Markdown table, "
                   "write decode.csv, decode.md, decode.png, cache.png. With --generate, time greedy generation with "
                   "and without the cache instead.")
    p.add_argument("--attention", type=str, default=None,
                   help="comma-separated attention names, each optionally with its options as JSON, e.g. "
                        "mha,mha{\"window\": 64},gated_deltanet (default: the seven grouped ones; mha,sqa with "
                        "--generate)")
    p.add_argument("--contexts", type=str, default=None, help="contexts T, comma-separated (default: 128,512,1024)")
    p.add_argument("--batches", type=str, default="1,16", help="comma-separated batch sizes")
    p.add_argument("--decode-steps", type=int, default=16, help="timed single-token steps ending at each context")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="paper",
                   help="paper: the Sparse Query Attention paper's model; small: 2 layers, width 64, 8 heads")
    add_timing_arguments(p)
    p.add_argument("--compile", action="store_true", help="time a torch.compile'd decode step (needs --warmup >= 1)")
    p.add_argument("--generate", action="store_true", help="time greedy generation, cached vs uncached, batch 1")
    p.add_argument("--prompt", type=int, default=512, help="--generate: prompt tokens")
    p.add_argument("--new-tokens", type=int, default=256, help="--generate: generated tokens")
    p.add_argument("--out", type=Path, default=Path("decode_out"), help="directory for the outputs")
    p.add_argument("--overwrite", action="store_true", help="replace the outputs if --out already holds them")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    args.attention = split_attentions(args.attention or ("mha,sqa" if args.generate else ",".join(PRESETS)))
    block = LAYOUTS[args.layout].block_size
    args.contexts = _int_list(p, "--contexts", args.contexts or f"{block // 8},{block // 2},{block}")
    args.batches = _int_list(p, "--batches", args.batches)
    if not args.attention:
        p.error("--attention needs at least one name, e.g. --attention mha,sqa")
    for name in args.attention:
        try:
            model_config(args.layout, name)
        except ValueError as e:
            p.error(str(e).strip().splitlines()[0])
    try:
        check_threads(args.threads)
        check_device(args.device)
        check_outputs(args.out, outputs(args.generate), args.overwrite)
    except ValueError as e:
        p.error(str(e))
    if args.dtype is None:
        args.dtype = "bfloat16" if torch.device(args.device).type == "cuda" else "float32"
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1, --warmup >= 0")
    if max(args.contexts) > block and not args.generate:
        p.error(f"--contexts values must be <= the {args.layout} layout's block size {block}")
    if not 1 <= args.decode_steps <= min(args.contexts) and not args.generate:
        p.error(f"--decode-steps must be between 1 and the smallest context {min(args.contexts)}")
    if args.generate and not (args.prompt >= 1 and args.new_tokens >= 1 and args.prompt + args.new_tokens <= block):
        p.error(f"--prompt and --new-tokens must be >= 1 with prompt + new tokens <= block size {block}")
    if args.compile and args.warmup < 1:
        p.error("--compile needs --warmup >= 1: the first call of each shape compiles")
    return args


def outputs(generate: bool) -> list[str]:
    """The files main writes into --out."""
    return ["generate.md"] if generate else ["decode.md", "decode.csv", "decode.png", "cache.png"]


def _header(args) -> str:
    common = (f"{args.layout} layout, device {args.device}, dtype {args.dtype}, {torch.get_num_threads()} threads, "
              f"median of {args.repeats} rounds after {args.warmup} warm-up, attentions timed in turns")
    if args.generate:
        return f"greedy generation, batch 1, prompt {args.prompt}, {args.new_tokens} new tokens; {common}"
    compiled = ", compiled decode step" if args.compile else ""
    return (f"{common}{compiled}; decode = {args.decode_steps} single-token steps ending at T, a decode state for T "
            f"tokens; state B/seq = what one sequence's state holds after T tokens")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark from the command line; return 0, or 2 after a one-line error."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        if args.generate:
            table = generate_table(run_generate(args.attention, args.layout, args.prompt, args.new_tokens,
                                                args.device, args.dtype, args.warmup, args.repeats))
        else:
            rows = run_decode(args.attention, args.contexts, args.batches, args.decode_steps, args.layout, args.device,
                              args.dtype, args.warmup, args.repeats, args.compile,
                              log=lambda m: print(m, file=sys.stderr, flush=True))
            table = markdown_table(rows)
    except (ValueError, RuntimeError) as e:  # an unknown device, a size or a cache the attention refuses
        if os.environ.get("LIT_ATTN_DEBUG"):
            raise
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2
    text = _header(args) + "\n\n" + table
    print(text)
    writers = {"generate.md" if args.generate else "decode.md": lambda path: path.write_text(text + "\n")}
    if not args.generate:
        writers |= {"decode.csv": lambda path: write_csv(rows, path),
                    "decode.png": lambda path: write_decode_plot(rows, path),
                    "cache.png": lambda path: write_cache_plot(rows, path)}
    return write_outputs(args.out, writers)

if __name__ == "__main__":
    raise SystemExit(main())
