"""Probe a trained run: `lit-attn probe --run RUN [--probes extrapolation,passkey]`.

extrapolation: validation loss by position bucket at 1x, 2x, 4x the training context (pos=rope runs only).
passkey: a 5-digit key hidden at a depth of filler text, retrieved by greedy decoding, over lengths x depths.
Results go to RUN/probe/PROBE/ (PROBE.json, PROBE.png and TensorBoard events at the checkpoint's step), beside
the run's training curves, never into them. User errors end in one `error: ...` line and exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import ArgumentParser, Namespace

from lit_attn.cli.toolcli import SEED_MAX, ToolParser, available_memory, check_device, check_seed, csv_list, gib
from lit_attn.tools.probe_output import progress, summary, write_results
from lit_attn.tools.run_record import read_yaml

# torch, the probes and the run reader (which loads Lightning) are imported where they are used, after the
# arguments are parsed: `--help` and a mistyped flag answer at once.
if TYPE_CHECKING:
    import torch

PROBES = ("extrapolation", "passkey")


def numbers(text: str, kind: type, flag: str) -> list:
    """'0.25, 0.5,1' -> [0.25, 0.5, 1.0] (kind float); a one-line ValueError naming `flag` otherwise."""
    try:
        values = [kind(t) for t in csv_list(text)]
    except ValueError:
        values = []
    if not values:
        raise ValueError(f"{flag} {text!r}: expected comma-separated {kind.__name__}s, e.g. {flag} 1,2,4")
    return values


def build_parser() -> ArgumentParser:
    p = ToolParser(prog="lit-attn probe", description=__doc__.splitlines()[0])
    p.add_argument("--run", type=str, required=True, help="the run's name (its directory under --runs_dir)")
    p.add_argument("--runs_dir", type=str, default="runs", help="where the run is")
    p.add_argument("--ckpt", "--ckpt_path", dest="ckpt", type=str, default="last",
                   help="last, best, or a checkpoint file")
    p.add_argument("--probes", type=str, default=",".join(PROBES), help="which probes, comma-separated")
    p.add_argument("--data.path", type=str | None, default=None,
                   help="text file whose trailing val_fraction is the extrapolation text (default: the run's data)")
    p.add_argument("--contexts", type=str, default="1,2,4", help="extrapolation contexts, multiples of block_size")
    p.add_argument("--buckets", type=int, default=8, help="position buckets per context")
    p.add_argument("--max_windows", type=int, default=32, help="windows of the longest context to evaluate at most")
    p.add_argument("--batch_size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--lengths", type=str, default="0.25,0.5,1",
                   help="passkey prompt+answer lengths, multiples of block_size (past 1 needs pos=rope)")
    p.add_argument("--depths", type=str, default="0,0.25,0.5,0.75,1",
                   help="passkey depths: 0 puts the key first, 1 just before the question")
    p.add_argument("--trials", type=int, default=5, help="passkey trials (keys) per cell")
    p.add_argument("--seed", type=int, default=0, help=f"seed of the passkeys, 0 to {SEED_MAX}")
    p.add_argument("--device", type=str | None, default=None,
                   help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    return p


def check_args(args: Namespace) -> None:
    """The comma-separated flags as lists; ValueError (one line) for flag values no probe can use."""
    args.probes = csv_list(args.probes)
    args.contexts = numbers(args.contexts, int, "--contexts")
    args.lengths = numbers(args.lengths, float, "--lengths")
    args.depths = numbers(args.depths, float, "--depths")
    unknown = [p for p in args.probes if p not in PROBES]
    if unknown or not args.probes:
        raise ValueError(f"--probes {','.join(args.probes)}: choose from {', '.join(PROBES)}")
    for flag in ("buckets", "max_windows", "batch_size", "trials"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if min(args.contexts) < 1:
        raise ValueError(f"--contexts must be positive multiples of block_size, got {args.contexts}")
    if min(args.lengths) <= 0:
        raise ValueError(f"--lengths must be positive multiples of block_size, got {args.lengths}")
    if not all(0.0 <= d <= 1.0 for d in args.depths):
        raise ValueError(f"--depths must be fractions in [0, 1], got {args.depths}")
    check_seed(args.seed, "--seed")


def validation_tokens(run_dir: Path, codec: Any, data_path: str | None) -> torch.Tensor:
    """The run's validation tokens (1-D int64): its text's trailing val_fraction (char runs, or --data.path's
    text), encoded with the run's codec, or a Wikipedia run's val split."""
    import numpy as np
    import torch

    data = (read_yaml(run_dir / "config.yaml") or {}).get("data") or {}
    init = data.get("init_args", data) if isinstance(data, dict) else {}
    kind = str(data.get("class_path", "")).rpartition(".")[2]
    val_fraction = float(init.get("val_fraction") or 0.1)
    if data_path is not None or kind == "CharDataModule":
        from datamodules.char import CharDataModule, read_text

        if data_path is not None:
            text, source = read_text(data_path), f"--data.path {data_path}"
        else:
            keep = {k: init.get(k) for k in ("path", "url", "cache_dir")}
            text, source = CharDataModule(**keep).text, f"run {run_dir.name}'s text"
        text = text[int(len(text) * (1.0 - val_fraction)):]
        try:
            ids = codec.encode(text)
        except ValueError as e:
            raise ValueError(f"{source}: {e}; the model knows only its training text's characters") from None
    elif kind == "WikipediaDataModule":
        from datamodules.wikipedia import WikipediaDataModule

        ids = WikipediaDataModule(**init).load_tokens("val")
    else:
        raise ValueError(f"run {run_dir.name}'s data ({kind or 'none in config.yaml'}) is not a datamodule the probe "
                         f"reads; pass --data.path FILE (a text file)")
    return torch.from_numpy(np.asarray(ids, dtype=np.int64))


def plan(args: Namespace, model: Any) -> dict[str, Any]:
    """The probe's lengths in tokens, refused (one line) where the run's positions cannot reach them or a window
    of the longest does not fit in memory."""
    from lit_attn.tools.probe_tasks import context_lengths, learned_refusal

    block_size = model.config.block_size
    contexts = context_lengths(block_size, args.contexts) if "extrapolation" in args.probes else []
    lengths = [max(1, round(m * block_size)) for m in args.lengths] if "passkey" in args.probes else []
    if model.config.pos != "rope":
        if contexts:
            raise ValueError(learned_refusal(args.run, block_size, "extrapolation")
                             + " (--probes passkey probes it within its context)")
        if max(lengths) > block_size:
            raise ValueError(learned_refusal(args.run, block_size, "a passkey length past 1x block_size"))
    longest = max(contexts + lengths)
    _check_memory(model.config, longest, "--contexts" if longest in contexts else "--lengths")
    return {"block_size": block_size, "lengths": lengths, "longest": longest}


def _check_memory(config: Any, tokens: int, flag: str) -> None:
    """ValueError (one line) if one window of `tokens` tokens cannot fit in the memory left: its logits and each
    layer's output alone (float32) take that much, whatever the attention."""
    free = available_memory()
    need = 4 * tokens * (config.vocab_size + config.n_embd * config.n_layer)
    if free is not None and need > free:
        raise ValueError(f"{flag}: a window of {tokens} tokens needs at least {gib(need)} of memory, {gib(free)} is "
                         f"available; give smaller {flag}")


def main(argv: list[str] | None = None) -> int:
    """Run the probes, write their results and print a summary; 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        import torch

        from lit_attn.tools.probe_tasks import check_passkey_text, context_lengths, model_for_context, passkey_minimum

        device = check_device(args.device) if args.device else "cuda" if torch.cuda.is_available() else "cpu"
        from lit_attn.cli.runs import find_run, run_checkpoint
        from lit_attn.load import load_run

        run_dir = find_run(args.run, args.runs_dir)
        run = load_run(run_checkpoint(run_dir, args.ckpt), device)
        codec, base = run.codec, run.network
        sizes = plan(args, base)
        tokens = None
        if "extrapolation" in args.probes:
            tokens = validation_tokens(run_dir, codec, getattr(args.data, "path", None))
            tokens = tokens[: args.max_windows * max(context_lengths(sizes["block_size"], args.contexts)) + 1]
        if "passkey" in args.probes:
            check_passkey_text(codec)
            if max(sizes["lengths"]) < passkey_minimum(codec):
                raise ValueError(f"--lengths {','.join(f'{m:g}' for m in args.lengths)} x block_size="
                                 f"{sizes['block_size']} gives at most {max(sizes['lengths'])} tokens; a passkey "
                                 f"prompt and its answer need {passkey_minimum(codec)}: give longer --lengths"
                                 f"{'' if base.config.pos == 'rope' else ' (up to 1 for pos=learned)'}")
        try:
            model = model_for_context(base, sizes["longest"])
        except ValueError as e:
            raise ValueError(f"run {args.run}: {e}") from None
        results = _run_probes(args, model, codec, sizes, tokens)
    except (ValueError, FileNotFoundError, ConnectionError) as e:  # ConnectionError: a run's data URL
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary(args.run, results))
    return write_results(run_dir, args.run, results, step=run.step,
                         checkpoint=str(run.path))


def _run_probes(args: Namespace, model: Any, codec: Any, sizes: dict[str, Any],
                tokens: torch.Tensor | None) -> dict[str, dict[str, Any]]:
    from lit_attn.tools.probe_tasks import extrapolation, extrapolation_batches, passkey

    block_size = sizes["block_size"]
    work = {}
    if tokens is not None:
        work["extrapolation"] = extrapolation_batches(tokens.numel(), block_size, args.contexts, args.batch_size)
    if "passkey" in args.probes:
        work["passkey"] = len(sizes["lengths"]) * len(args.depths)
    results = {}
    with progress(work) as advance:
        if tokens is not None:
            results["extrapolation"] = extrapolation(model, block_size, tokens, args.contexts, args.buckets,
                                                     args.batch_size, advance["extrapolation"])
        if "passkey" in args.probes:
            results["passkey"] = passkey(model, codec, sizes["lengths"], args.depths, args.trials, args.seed,
                                         advance["passkey"])
    return results


if __name__ == "__main__":
    sys.exit(main())
