"""`python -m lit_attn.sweep`, kept for existing scripts: runs `lit-attn sweep` (module lit_attn.tools.sweep)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.sweep", run_name="__main__", alter_sys=True)
