"""`python -m lit_attn.bench_decode`: runs `lit-attn bench-decode` (module benchmarks.bench_decode)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("benchmarks.bench_decode", run_name="__main__", alter_sys=True)
