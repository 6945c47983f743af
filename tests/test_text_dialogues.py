"""`text_dialogues`: sampled dialogues of untrained and trained language-model policies, and the
trained parameters of a finished text run."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import agentenv_jax as ae
from agentenv_jax.checkpoint.store import CheckpointStore
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import ArithmeticTask, make_text_vector_env
from agentenv_jax.networks.text_models import language_model_for
from agentenv_jax.workflow.api import resolve_config
from agentenv_jax.workflow.evaluation import EVAL_SEED_BASE
from agentenv_jax.workflow.text_dialogues import (
    DialogueSample,
    initial_params,
    pass_at_k,
    sample_dialogues,
    trained_params,
)

ARITHMETIC = "agentenv_jax/Arithmetic-v0"
GUESS_NUMBER = "agentenv_jax/GuessNumber-v0"


def text_config(env_id: str, **kwargs: object):
    """The defaults on `env_id` with `env.kwargs` = `kwargs` (the tiny language model)."""
    return resolve_config(None, env={"id": env_id, "kwargs": kwargs})


def check_counts(sample: DialogueSample, num_episodes: int) -> None:
    assert len(sample.transcripts) == len(sample.successes) == len(sample.returns) == num_episodes
    assert 0.0 <= sample.accuracy <= 1.0
    assert sample.accuracy == pytest.approx(np.mean(sample.successes))


@pytest.mark.slow
def test_arithmetic_dialogues_of_the_untrained_policy():
    config = text_config(ARITHMETIC, max_operand=4, context_length=8, response_length=3)
    # 70 episodes: a batch of 64 envs, then a second round.
    sample = sample_dialogues(config, num_episodes=70, seed=0)
    check_counts(sample, 70)
    assert 1.0 <= sample.mean_response_tokens <= 3.0
    # Episode j's prompt is the one the evaluation seed EVAL_SEED_BASE + j draws.
    for j, transcript in enumerate(sample.transcripts):
        prompt = ArithmeticTask(max_operand=4).reset(np.random.default_rng(EVAL_SEED_BASE + j))
        assert transcript.startswith(prompt + "\nagent: ")
        assert "\nenv: " not in transcript  # single turn: no reply after the answer
    assert all(r in (0.0, 0.1, 1.0) for r in sample.returns)

    again = sample_dialogues(config, num_episodes=70, seed=0)
    assert again == sample
    other = sample_dialogues(config, num_episodes=70, seed=1)
    assert other.transcripts != sample.transcripts

    text = sample.format(limit=2)
    assert text.splitlines()[0].startswith(f"70 dialogues on {ARITHMETIC}: accuracy")
    assert re.search(r"^ 1 [✓✗] return ", text, re.M) and re.search(r"^ 2 [✓✗] ", text, re.M)
    assert not re.search(r"^ 3 ", text, re.M) and text.endswith("... and 68 more")
    assert str(sample) == sample.format()


@pytest.mark.slow
def test_guess_number_dialogues_are_multi_turn():
    config = text_config(GUESS_NUMBER, max_turns=3)
    sample = sample_dialogues(config, num_episodes=6, seed=2)
    check_counts(sample, 6)
    assert 1.0 <= sample.mean_response_tokens <= 4.0
    for transcript, success, length in zip(
        sample.transcripts, sample.successes, sample.lengths, strict=True
    ):
        assert transcript.startswith("Guess my number (1-8):\nagent: ")
        agent, env = transcript.count("\nagent: "), transcript.count("\nenv: ")
        # A solved episode ends on the agent's guess; an unsolved one runs all 3 turns.
        assert (agent, env) == ((env + 1, env) if success else (3, 3))
        assert length == agent
    assert sample_dialogues(config, num_episodes=6, seed=2) == sample


@pytest.mark.slow
def test_a_group_of_envs_shares_its_prompts():
    config = text_config(ARITHMETIC, max_operand=9, group_size=4)
    sample = sample_dialogues(config, num_episodes=6, seed=0)  # 8 envs, the first 6 counted
    check_counts(sample, 6)
    prompts = [transcript.split("\n")[0] for transcript in sample.transcripts]
    assert len(set(prompts[:4])) == 1 and prompts[4] == prompts[5] != prompts[0]


def test_pass_at_k_is_the_unbiased_estimator():
    # n = k: whether any answer is right.
    assert pass_at_k([[False, True], [False, False], [True, True]], 2) == pytest.approx(2 / 3)
    # n = 4 answers, 1 right, k = 2: 1 - C(3, 2) / C(4, 2) = 1/2; k = 1 is the accuracy.
    assert pass_at_k([[True, False, False, False]], 2) == pytest.approx(0.5)
    assert pass_at_k([[True, False, False, False]], 1) == pytest.approx(0.25)
    assert pass_at_k([[True, True, True, False]], 2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="pass@3 needs at least 3 answers"):
        pass_at_k([[True, False]], 3)


def test_bad_arguments_name_what_is_wrong():
    config = text_config(ARITHMETIC)
    with pytest.raises(ValueError, match="num_episodes = 0"):
        sample_dialogues(config, num_episodes=0)
    with pytest.raises(ValueError, match="temperature = 0"):
        sample_dialogues(config, temperature=0)
    wide = resolve_config(None, env={"id": ARITHMETIC}, network={"language_model": {"d_model": 32}})
    with pytest.raises(ValueError, match=r"params\['policy'\]\['block_0'\].* has shape \(32,\)"):
        sample_dialogues(config, initial_params(wide))
    with pytest.raises(EnvError, match="is not a text env"):
        sample_dialogues(resolve_config("cartpole_ppo"))


@pytest.mark.slow
def test_trained_params_load_the_runs_policy(tmp_path):
    run = ae.train(
        "arithmetic_ppo",
        run={"total_env_steps": 1024, "run_dir": str(tmp_path), "name": "text", "progress": False},
    )
    params = trained_params(run.run_dir)
    env = make_text_vector_env(run.config.env.id, 1, run.config.env.kwargs)
    shapes = language_model_for(run.config.network.language_model, env.text_spec).param_shapes()
    assert jax.tree.structure(params) == jax.tree.structure(shapes)
    assert [p.shape for p in jax.tree.leaves(params)] == [s.shape for s in jax.tree.leaves(shapes)]
    # What the learner held at the end, and no longer the initial draw.
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, params, run.params)))
    initial = initial_params(run.config)
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, params, initial)))
    # `initial_params` draws what the learner drew: its frozen reference policy.
    store = CheckpointStore(run.run_dir, run.config.checkpoint.keep)
    try:
        state, _ = store.restore_raw()
    finally:
        store.close()
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, state["ref_params"], initial)))
    check_counts(sample_dialogues(run.config, params, num_episodes=4), 4)


@pytest.mark.slow
def test_dialogues_generate_from_the_columns_the_contexts_use(monkeypatch):
    """With `algorithm.length_bucket`, each message is generated from the context's used
    columns (rounded up to the bucket), as the actor does, not its whole length: the same
    dialogues, on fewer columns."""
    from agentenv_jax.networks import text_models

    widths: list[int] = []
    real = text_models.text_generate

    def recording(lm, text):
        generate = real(lm, text)

        def run(params, context, key, **kwargs):
            widths.append(context.shape[-1])
            return generate(params, context, key, **kwargs)

        return run

    monkeypatch.setattr(text_models, "text_generate", recording)
    config = text_config(GUESS_NUMBER, max_turns=3, context_length=64)
    whole = sample_dialogues(config, num_episodes=6, seed=2)
    assert set(widths) == {64}
    widths.clear()
    config = resolve_config(config, ["algorithm.length_bucket=4"])
    trimmed = sample_dialogues(config, num_episodes=6, seed=2)
    assert trimmed == whole
    # The first turn's context is the prompt alone ("Guess my number (1-8):"); later ones
    # hold the guesses and replies so far.
    assert min(widths) < 64 and all(w % 4 == 0 for w in widths), widths
