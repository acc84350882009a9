"""`python -m lit_attn.evaluate`: runs `lit-attn evaluate` (module lit_attn.tools.evaluate)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.evaluate", run_name="__main__", alter_sys=True)
