"""`python -m lit_attn.cost_card`: runs `lit-attn cost-card` (module lit_attn.tools.cost_card)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("lit_attn.tools.cost_card", run_name="__main__", alter_sys=True)
