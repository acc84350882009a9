"""A recall run's accuracy across its test settings, as one of two means (recall-grid's `--mean`).

per-query: every query counts once, the accuracy the run logs as val/mqar_acc (callbacks/recall.py).
per-example: each example's accuracy (its queries right, over its queries), averaged over the examples, as
Zoology's train.py averages its per-example accuracies. Every example of one test setting has num_kv_pairs
queries, so a setting's per-query accuracy (val/mqar_acc/T{L}_kv{K}) is also its per-example mean, and the
per-example mean across settings is their mean weighted by each setting's example count (data.num_test_examples,
the same for every setting). That is exact when the validation scored every test example: refused when the run's
trainer.limit_val_batches cut it, or its per-setting values are missing or do not give back the logged per-query
accuracy. With one test setting the two means are one number.
"""

from __future__ import annotations

from pathlib import Path

from lit_attn.tools.events import run_scalars
from lit_attn.tools.run_record import read_yaml

MEANS = {
    "per-query": "per-query mean across test settings (val/mqar_acc: every query counts once)",
    "per-example": "per-example mean across test settings (Zoology's: each example's accuracy, averaged over "
                   "examples)",
}
TAG = "val/mqar_acc"
# The float32 of the logged values: a per-query mean rebuilt from the per-setting values is this close to the logged
# one when the counts are right.
TOLERANCE = 1e-5


def scored_settings(run_dir: Path) -> tuple[list[tuple[int, int]], int | None]:
    """([(input_seq_len, num_kv_pairs) per test setting], examples per setting) from the run's config.yaml."""
    config = read_yaml(run_dir / "config.yaml") or {}
    data = (config.get("data") or {}).get("init_args") or {}
    given = data.get("test_settings")
    settings = [(data.get("input_seq_len"), data.get("num_kv_pairs"))] if not given else [tuple(s) for s in given]
    n = data.get("num_test_examples")
    return settings, n if isinstance(n, int) and not isinstance(n, bool) else None


def accuracy(run_dir: Path, mean: str = "per-query") -> tuple[float, int]:
    """(the run's last accuracy as `mean` takes it, the step of that validation); ValueError (one line) when the
    run's records cannot give the per-example mean exactly."""
    series = run_scalars(run_dir)
    last = series[TAG][-1]
    settings, n = scored_settings(run_dir)
    if mean == "per-query" or len(settings) == 1:
        return last.value, last.step
    why = f"--mean per-example: run {run_dir}"
    trainer = (read_yaml(run_dir / "config.yaml") or {}).get("trainer") or {}
    limit = trainer.get("limit_val_batches")
    if not (limit is None or isinstance(limit, float) and limit == 1.0):  # an int 1 is one batch, not all of them
        raise ValueError(f"{why} validated on part of its test examples (trainer.limit_val_batches "
                         f"{trainer['limit_val_batches']}), so its examples per setting are unknown; use --mean "
                         "per-query")
    if n is None:
        raise ValueError(f"{why} records no data.num_test_examples; use --mean per-query")
    values = []
    for length, pairs in settings:
        tag = f"{TAG}/T{length}_kv{pairs}"
        at = [e.value for e in series.get(tag, []) if e.step == last.step]
        if not at:
            raise ValueError(f"{why} logged no {tag} at step {last.step}; use --mean per-query")
        values.append((pairs, at[-1]))
    per_query = sum(n * k * a for k, a in values) / sum(n * k for k, _ in values)
    if abs(per_query - last.value) > TOLERANCE:
        raise ValueError(f"{why}: its per-setting accuracies give a per-query mean of {per_query:.6f}, not the "
                         f"{last.value:.6f} it logged, so its examples per setting are not data.num_test_examples "
                         "each; use --mean per-query")
    return sum(n * a for _, a in values) / (n * len(values)), last.step
