"""Benchmarks of lit-attn, run from the repository root as modules: `python -m benchmarks.NAME [--help]`.

bench_overhead (framework tax), bench_compile (torch.compile), bench_qsa (QSA vs PennyLane),
bench_sqa_paper (training speed of the Sparse Query Attention paper's models), sqa_paper_table
(the paper's published results beside a seeded comparison), bench_tokenizer (BPE training and
tokenization), sdpa_backends (which SDPA kernel each attention runs). Being a
package, they import the project (lit_attn, datamodules, main) and each other without editing sys.path.
"""
