"""`python -m lit_attn.export`: runs `lit-attn export` (module lit_attn.tools.export)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.export", run_name="__main__", alter_sys=True)
