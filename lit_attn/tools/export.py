"""Export a trained run as a Hugging Face transformers model: `lit-attn export --run RUN_DIR --out DIR`.

DIR gets model.safetensors, config.json, generation_config.json and the tokenizer (tokenizer.json,
tokenizer_config.json): `AutoModelForCausalLM.from_pretrained(DIR)` computes the run's logits and
`AutoTokenizer.from_pretrained(DIR)` encodes text to the run's token ids. GPT-2 and Llama layouts export
(docs/export.md says which). User errors end in one `error: ...` line and exit code 2.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser

from lit_attn.codec import EOT, BPECodec, CharCodec, codec_from_checkpoint
from lit_attn.toolcli import ToolParser


def build_parser() -> ArgumentParser:
    p = ToolParser(prog="lit-attn export", description=__doc__.splitlines()[0])
    p.add_argument("--run", type=str, required=True, help="the run's name (its directory under --runs_dir)")
    p.add_argument("--runs_dir", type=str, default="runs", help="where the run is")
    p.add_argument("--out", type=str, required=True, help="directory to write the transformers model into")
    p.add_argument("--ckpt", type=str, default="last",
                   help="best (lowest val/loss), last, or a checkpoint file")
    p.add_argument("--overwrite", action="store_true", help="replace what a non-empty --out holds")
    return p


def hf_tokenizer(codec: CharCodec | BPECodec, max_length: int) -> Any:
    """A PreTrainedTokenizerFast that encodes text to `codec`'s ids: the run's BPE tokenizer (special tokens in
    text encoded as plain text, as the codec does), or one token per character (spaces and newlines too)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    options = {"clean_up_tokenization_spaces": False, "model_max_length": max_length}
    if isinstance(codec, BPECodec):
        special = {"eos_token": EOT, "bos_token": EOT} if codec.eot_id is not None else {}
        return PreTrainedTokenizerFast(tokenizer_object=codec.tokenizer, split_special_tokens=True,
                                       **special, **options)
    # A character outside the vocabulary is an error, as for the codec: "[UNK]" is no token of the vocabulary.
    tokenizer = Tokenizer(models.WordLevel(dict(codec.index), unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tokenizer.decoder = decoders.Fuse()  # characters joined with nothing between them
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **options)


def export(ckpt: dict[str, Any], out: Path, overwrite: bool = False) -> list[str]:
    """Write the checkpoint's model and tokenizer into `out` (created, or replaced whole with `overwrite`);
    the names of the files written. Nothing in `out` changes until the export is complete."""
    from transformers.utils import logging

    from lit_attn.hf import to_hf_model
    from lit_attn.tools.sample import build_model

    check_out(out, overwrite)
    codec = codec_from_checkpoint(ckpt)
    model = build_model(ckpt, "cpu")
    eot = codec.eot_id
    hf = to_hf_model(model, bos_token_id=eot, eos_token_id=eot)
    tokenizer = hf_tokenizer(codec, model.config.block_size)
    staging = out.parent / f".{out.name}.{secrets.token_hex(6)}.tmp"
    logging.disable_progress_bar()
    try:
        hf.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(os.listdir(out))


def _replace(staging: Path, out: Path) -> None:
    """Move the finished `staging` directory to `out`; an old `out` is removed only after the move."""
    if not out.exists():
        staging.rename(out)
        return
    old = out.parent / f".{out.name}.{secrets.token_hex(6)}.old"
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old)


def check_out(out: Path, overwrite: bool) -> None:
    """ValueError (one line) unless `out` can be written without losing anything."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory (it is created if missing)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out} is not empty; pass --overwrite to replace what it holds, or give another --out")


def main(argv: list[str] | None = None) -> int:
    """Export the run; 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    from lit_attn.hf import INSTALL

    try:
        import transformers  # noqa: F401
    except ImportError:
        print(f"error: lit-attn export needs transformers: {INSTALL}", file=sys.stderr)
        return 2
    from lit_attn.tools.sample import load_checkpoint
    from lit_attn.training.runs import find_run, run_checkpoint

    out = Path(args.out).expanduser()
    try:
        check_out(out, args.overwrite)
        path = run_checkpoint(find_run(args.run, args.runs_dir), args.ckpt)
        ckpt = load_checkpoint(path)
        print(f"exporting {path} (step {ckpt.get('global_step', '?')})", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        files = export(ckpt, out, args.overwrite)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write --out {out}: {e.strerror or e}; give another --out", file=sys.stderr)
        return 2
    print(f"wrote {out}: {', '.join(files)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
