"""`python -m lit_attn.sample`, kept for existing scripts: runs `lit-attn sample` (module lit_attn.tools.sample)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.sample", run_name="__main__", alter_sys=True)
