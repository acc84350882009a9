"""`python -m lit_attn.compare`, kept for existing scripts: runs `lit-attn compare` (module lit_attn.tools.compare)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.compare", run_name="__main__", alter_sys=True)
