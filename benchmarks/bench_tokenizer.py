"""Throughput of the Wikipedia pipeline's tokenizer training and tokenization, in MB/s of UTF-8 text.

Generates a corpus of Wikipedia-like articles (columns id, url, title, text) as parquet shards
in a temporary directory, then times the functions WikipediaDataModule itself uses:
`train_tokenizer` on the whole corpus, and `tokenize_to_file` (datasets.map) at each
--num-proc. `num_proc=1` lets the Rust tokenizer use all cores in one process; with more
processes each gets one thread. The "1 (1 thread)" row is one process with one thread.

    python -m benchmarks.bench_tokenizer            # 50 MB, vocab 10000, num_proc 1 and 2
    python -m benchmarks.bench_tokenizer --mb 100 --num-proc 1 2 4
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from datamodules.wikipedia import single_threaded_tokenizers, tokenize_to_file, train_tokenizer
from lit_attn.cli.toolcli import ToolParser, available_memory, check_out_place, gib

# Peak bytes of memory per byte of text while make_corpus runs, with a margin (the measurement: docs/benchmarks.md).
CORPUS_MEMORY_PER_BYTE = 6
UNICODE_WORDS = ["café", "naïve", "Straße", "São", "Zürich", "日本語", "東京都", "Москва", "столица", "Ελλάδα",
                 "القاهرة", "हिन्दी", "🚀", "½", "x²", "—", "«citation»", "1,234.5", "(1952–2019)"]


def make_corpus(directory: Path, megabytes: float, seed: int = 0, shards: int = 8) -> tuple[int, int]:
    """Write >= `megabytes` MB of articles as parquet shards; return (articles, UTF-8 bytes of text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    # A Zipf-distributed lexicon, like natural text: a few very common words, a long tail of rare ones.
    lexicon = ["".join(rng.choice(letters, size=rng.integers(1, 13))) for _ in range(40_000)] + UNICODE_WORDS * 20
    lexicon = np.array(lexicon, dtype=object)
    weights = 1.0 / np.arange(1, len(lexicon) + 1) ** 1.1
    weights /= weights.sum()
    target = int(megabytes * 1e6)
    rows, total, i = [], 0, 0
    while total < target:
        paragraphs = []
        for p in range(int(rng.integers(1, 8))):
            words = lexicon[rng.choice(len(lexicon), size=int(rng.integers(20, 200)), p=weights)]
            sentence = " ".join(words)
            number = f" In {int(rng.integers(1000, 2025))}, {int(rng.integers(0, 10**6)):,} people."
            paragraphs.append((f"== Section {p} ==\n" if p else "") + sentence.capitalize() + "." + number)
        text = "\n\n".join(paragraphs)
        rows.append({"id": str(i), "url": f"https://en.wikipedia.org/wiki?curid={i}", "title": f"Article {i}",
                     "text": text})
        total += len(text.encode())
        i += 1
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        part = rows[k * len(rows) // shards : (k + 1) * len(rows) // shards]
        pq.write_table(pa.Table.from_pylist(part), directory / f"train-{k:05d}-of-{shards:05d}.parquet")
    return len(rows), total


def parse_args(argv: Sequence[str] | None = None):
    """The command line, checked: a one-line error (exit 2) for a size, --num-proc or --workdir that cannot work."""
    parser = ToolParser(prog="python -m benchmarks.bench_tokenizer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size in MB of UTF-8 text")
    parser.add_argument("--vocab-size", type=int, default=10_000, help="BPE vocabulary size")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2],
                        help="tokenization processes to time")
    parser.add_argument("--workdir", type=Optional[Path], default=None,
                        help="keep the corpus and outputs here: a new or empty directory (default: a temp dir, "
                        "deleted)")
    parser.add_argument("--overwrite", action="store_true", help="let --workdir be a directory with files in it")
    args = parser.parse_args(argv)
    if not args.mb > 0 or args.vocab_size < 257 or min(args.num_proc) < 1:
        # 257: the byte-level BPE's 256 bytes and its end-of-text token come first
        parser.error("--mb must be > 0, --vocab-size >= 257 and every --num-proc value >= 1")
    free = available_memory()
    # The corpus is built in memory: the texts as Python strings, then each shard as an Arrow table.
    need = CORPUS_MEMORY_PER_BYTE * args.mb * 1e6
    if free is not None and need > free:
        parser.error(f"--mb {args.mb:g}: building the corpus needs about {gib(need)} of memory, {gib(free)} is "
                     f"available; pass --mb {free / CORPUS_MEMORY_PER_BYTE / 1e6:.0f} or less")
    if args.workdir is not None:
        if args.workdir.exists() and not args.workdir.is_dir():
            parser.error(f"--workdir {args.workdir} is a file; give a directory (it is created if missing)")
        try:
            check_out_place(args.workdir, "--workdir")
        except ValueError as e:
            parser.error(str(e))
        if args.workdir.is_dir() and any(args.workdir.iterdir()) and not args.overwrite:
            parser.error(f"--workdir {args.workdir} is not empty; the corpus and token files written there would "
                         "replace files of the same names: pass --overwrite to allow it or give another --workdir")
    return args


def time_tokenization(articles, tokenizer, work: Path, num_procs: list[int], vocab_size: int, mb: float) -> None:
    """Print tokenize_to_file's MB/s at each number of processes, and one process with one Rust thread."""
    # (processes, one Rust thread only); the single-thread row isolates what processes add over threads.
    runs = [(n, False) for n in num_procs] + ([(1, True)] if 1 in num_procs else [])
    rates: dict[tuple[int, bool], float] = {}
    for num_proc, single_thread in runs:
        with single_threaded_tokenizers(single_thread):
            start = time.perf_counter()
            stats = tokenize_to_file(articles, tokenizer, work / f"tokens-{num_proc}.bin", vocab_size,
                                     num_proc, work / "scratch")
            seconds = time.perf_counter() - start
        rates[num_proc, single_thread] = mb / seconds
        label = f"{num_proc} (1 thread)" if single_thread else str(num_proc)
        print(f"tokenization num_proc={label}: {seconds:.1f} s, {mb / seconds:.2f} MB/s, "
              f"{stats['tokens']:,} tokens ({stats['tokens'] / stats['characters']:.3f} tokens/char)")
    if (1, False) in rates and (2, False) in rates:
        print(f"ratio tokenization MB/s num_proc=2 / num_proc=1: {rates[2, False] / rates[1, False]:.2f}")
    if (1, True) in rates and (2, False) in rates:
        print(f"ratio tokenization MB/s num_proc=2 / num_proc=1 (1 thread): {rates[2, False] / rates[1, True]:.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    """Generate the corpus, then print the times of loading it, training the tokenizer and tokenizing."""
    args = parse_args(argv)
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="bench_tokenizer-") as tmp:
        work = args.workdir or Path(tmp)
        start = time.perf_counter()
        n_articles, n_bytes = make_corpus(work / "corpus", args.mb)
        mb = n_bytes / 1e6
        print(f"corpus: {n_articles:,} articles, {mb:.1f} MB of text, generated in {time.perf_counter() - start:.1f} s")
        print(f"machine: {os.cpu_count()} CPU cores (os.cpu_count), load average {os.getloadavg()[0]:.2f} at start")

        start = time.perf_counter()
        articles = datasets.load_dataset("parquet", data_files=sorted(map(str, (work / "corpus").glob("*.parquet"))),
                                         split="train", cache_dir=str(work / "hf"))
        print(f"load_dataset (parquet -> arrow): {time.perf_counter() - start:.1f} s")

        start = time.perf_counter()
        texts = (t for batch in articles.iter(batch_size=1000) for t in batch["text"])
        tokenizer = train_tokenizer(texts, args.vocab_size, max_chars=10**12, progress=False)
        seconds = time.perf_counter() - start
        print(f"tokenizer training (vocab {tokenizer.get_vocab_size()}): {seconds:.1f} s, {mb / seconds:.2f} MB/s")
        time_tokenization(articles, tokenizer, work, args.num_proc, args.vocab_size, mb)

if __name__ == "__main__":
    main()
