"""`python -m lit_attn.bench`, kept for existing scripts: runs `lit-attn bench` (module benchmarks.bench)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("benchmarks.bench", run_name="__main__", alter_sys=True)
