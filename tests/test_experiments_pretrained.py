"""The shipped experiments of pretrained language models (SmolLM2 with LoRA) on single-turn
tasks, each trained for a tiny budget and evaluated: a module of their own beside
test_experiments.py's (experiment_smoke.py)."""

from __future__ import annotations

import pytest

from experiment_smoke import experiments, run_smoke


@pytest.mark.slow
@pytest.mark.parametrize("path", experiments("pretrained"), ids=lambda p: p.name)
def test_every_pretrained_experiment_runs_with_a_tiny_budget(path, run_dir):
    run_smoke(path, run_dir)
