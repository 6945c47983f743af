"""The shipped experiments of pretrained language models (SmolLM2 with LoRA) on multi-turn
tasks (an OpenEnv env, a TextArena game), each trained for a tiny budget and evaluated: a module
of their own beside test_experiments_pretrained.py's (experiment_smoke.py)."""

from __future__ import annotations

import pytest

from experiment_smoke import experiments, run_smoke


@pytest.mark.slow
@pytest.mark.parametrize("path", experiments("pretrained_multi_turn"), ids=lambda p: p.name)
def test_every_multi_turn_pretrained_experiment_runs_with_a_tiny_budget(path, run_dir):
    run_smoke(path, run_dir)
