"""`python -m lit_attn.probe`: runs `lit-attn probe` (module lit_attn.tools.probe)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.probe", run_name="__main__", alter_sys=True)
