"""Export a trained run as a Hugging Face transformers model: `lit-attn export --run RUN_DIR --out DIR`.

DIR gets model.safetensors, config.json, generation_config.json and the tokenizer (tokenizer.json,
tokenizer_config.json): `AutoModelForCausalLM.from_pretrained(DIR)` computes the run's logits and
`AutoTokenizer.from_pretrained(DIR)` encodes text to the run's token ids. GPT-2 and Llama layouts export
(docs/export.md says which). User errors end in one `error: ...` line and exit code 2.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import ArgumentParser

from lit_attn.cli.toolcli import ToolParser, check_out_place
from lit_attn.codec import EOT, BPECodec, CharCodec

if TYPE_CHECKING:
    from lit_attn.load import Run

# The files transformers' save_pretrained writes for a model and its tokenizer: a directory holding these only,
# with a config and weights, is an earlier export, which --overwrite may replace.
EXPORT_FILES = re.compile(r"config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors"
                          r"|model\.safetensors\.index\.json|tokenizer(_config)?\.json|special_tokens_map\.json"
                          r"|added_tokens\.json|chat_template\.(jinja|json)")


def build_parser() -> ArgumentParser:
    p = ToolParser(prog="lit-attn export", description=__doc__.splitlines()[0])
    p.add_argument("--run", type=str, required=True, help="the run's name (its directory under --runs_dir)")
    p.add_argument("--runs_dir", type=str, default="runs", help="where the run is")
    p.add_argument("--out", type=str, required=True, help="directory to write the transformers model into")
    p.add_argument("--ckpt", type=str, default="last",
                   help="best (lowest val/loss), last, or a checkpoint file")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
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


def export(run: Run, out: Path, overwrite: bool = False, runs: Sequence[Path] = (),
           runs_dirs: Sequence[Path] = ()) -> list[str]:
    """Write the network and tokenizer of `run` (`lit_attn.load_run`'s) into `out` (created, or an earlier export
    replaced whole with `overwrite`); the names of the files written. Nothing in `out` changes until the export is
    complete."""
    from safetensors import SafetensorError
    from transformers.utils import logging

    from lit_attn.hf import to_hf_model

    check_out(out, overwrite, runs, runs_dirs)
    codec, model = run.codec, run.network
    eot = codec.eot_id
    hf = to_hf_model(model, bos_token_id=eot, eos_token_id=eot)
    tokenizer = hf_tokenizer(codec, model.config.block_size)
    staging = out.parent / f".{out.name}.{secrets.token_hex(6)}.tmp"
    logging.disable_progress_bar()
    try:
        hf.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _as_umask_says(staging)
        _replace(staging, out)
    except SafetensorError as e:  # writing the weights failed (a full disk): its OSError, as for the other files
        raise _os_error(e) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(os.listdir(out))


def _os_error(e: Exception) -> OSError:
    """safetensors' write error (its message quotes Rust's io::Error, "... (os error 28)") as that OSError."""
    code = re.search(r"\(os error (\d+)\)|code: (\d+)", str(e))
    if code:
        number = int(code.group(1) or code.group(2))
        return OSError(number, os.strerror(number))
    return OSError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def _as_umask_says(directory: Path) -> None:
    """Give every file in `directory` the mode a new file gets (0666 less the umask), as the configs and the
    tokenizer have: safetensors creates the weights file readable by its owner only (0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def _replace(staging: Path, out: Path) -> None:
    """Move the finished `staging` directory to `out`; an old `out` is removed only after the move."""
    if not out.exists():
        staging.rename(out)
        return
    old = out.parent / f".{out.name}.{secrets.token_hex(6)}.old"
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old)


def is_export(directory: Path) -> bool:
    """Whether `directory` holds an export and nothing else: a config, weights, and only EXPORT_FILES."""
    names = [p.name for p in directory.iterdir()]
    return ("config.json" in names and any(n.endswith(".safetensors") for n in names)
            and all(EXPORT_FILES.fullmatch(n) for n in names))


def check_out(out: Path, overwrite: bool, runs: Sequence[Path] = (), runs_dirs: Sequence[Path] = ()) -> None:
    """ValueError (one line) unless `out` can be written without losing anything: a new or empty directory,
    or with `overwrite` an earlier export; never a run, a runs directory or a directory above one."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory (it is created if missing)")
    check_out_place(out, "--out", runs, runs_dirs)
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ValueError(f"--out {out} is not empty; pass --overwrite to replace an earlier export there, "
                         "or give another --out")
    if not is_export(out):
        others = sorted(p.name for p in out.iterdir() if not EXPORT_FILES.fullmatch(p.name))
        more = " ..." if len(others) > 3 else ""
        held = f"holds {', '.join(others[:3])}{more}" if others else "lacks config.json or the weights"
        raise ValueError(f"--out {out} is not an earlier export ({held}); --overwrite replaces only an export: "
                         "give another --out")


def main(argv: list[str] | None = None) -> int:
    """Export the run; 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    from lit_attn.hf import INSTALL

    try:
        import transformers  # noqa: F401
    except ImportError:
        print(f"error: lit-attn export needs transformers: {INSTALL}", file=sys.stderr)
        return 2
    from lit_attn.cli.runs import find_run, run_checkpoint
    from lit_attn.load import load_run

    out = Path(args.out).expanduser()
    try:
        run_dir = find_run(args.run, args.runs_dir)
        places = dict(runs=[run_dir], runs_dirs=[Path(args.runs_dir).expanduser(), run_dir.parent])
        check_out(out, args.overwrite, **places)
        run = load_run(run_checkpoint(run_dir, args.ckpt), "cpu")
        print(f"exporting {run.path} (step {run.step})", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        files = export(run, out, args.overwrite, **places)
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
