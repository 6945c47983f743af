"""Reward functions of dataset tasks (`envs.text.rewards`): TRL's and verl's signatures called
with exactly the arguments those libraries pass, TRL's own reward functions run unchanged, the
built-in ones, failures counted rather than crashing, async functions run concurrently, and
each function's mean logged per update by a real training run."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import textwrap
import threading

import numpy as np
import pytest

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import BYTE_TOKENIZER, make_text_vector_env
from agentenv_jax.envs.text.rewards import (
    Completion,
    load_reward_functions,
    score_completions,
)

from conftest import require_reference, train_in_folder

# What a recording reward function saw, per call: {"style", "kwargs"}.
CALLS: list[dict] = []
# Two async functions inside at once (or a timeout): they ran concurrently.
BOTH_INSIDE = threading.Barrier(2, timeout=10)


def recording_trl(prompts, completions, completion_ids, **kwargs):
    CALLS.append(
        {
            "style": "trl",
            "kwargs": {"prompts": prompts, "completions": completions}
            | {"completion_ids": completion_ids}
            | kwargs,
        }
    )
    return [1.0] * len(completions)


def recording_verl(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append(
        {
            "style": "verl",
            "kwargs": {
                "data_source": data_source,
                "solution_str": solution_str,
                "ground_truth": ground_truth,
                "extra_info": extra_info,
            },
        }
    )
    return {"score": 0.5, "acc": True}


async def async_first(completions, **kwargs):
    BOTH_INSIDE.wait()
    return [1.0] * len(completions)


async def async_second(completions, **kwargs):
    BOTH_INSIDE.wait()
    return [2.0] * len(completions)


# Rows an async verl function has started on: they wait for each other, so rows scored one
# after another time out.
ROWS_STARTED = {"count": 0}


async def async_verl(data_source, solution_str, ground_truth, extra_info=None):
    ROWS_STARTED["count"] += 1
    for _ in range(500):
        if ROWS_STARTED["count"] >= 3:
            return float(solution_str == ground_truth)
        await asyncio.sleep(0.01)
    raise TimeoutError("the other rows never started")


def raises(completions, **kwargs):
    raise RuntimeError("the grader is down")


def nan_for_long(completions, **kwargs):
    return [math.nan if len(c) > 3 else 1.0 for c in completions]


def none_always(completions, **kwargs):
    return [None] * len(completions)


def nan_on_odd_answers(completions, answer, **kwargs):
    return [math.nan if int(a) % 2 else 1.0 for a in answer]


def one_short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def sleeps(completions, **kwargs):
    threading.Event().wait(60)
    return [1.0] * len(completions)


def wrong_signature(text, gold):
    return 1.0


def completions_of(rows: list[dict], texts: list[str], prompt_column: str = "prompt"):
    return [
        Completion(row[prompt_column], text, [1, 2, 3], row, row.get("answer"))
        for row, text in zip(rows, texts, strict=True)
    ]


def score(entries, completions, **kwargs):
    return score_completions(load_reward_functions(entries), completions, **kwargs)


def test_a_trl_reward_function_gets_the_arguments_grpo_trainer_passes():
    """TRL 1.16's GRPOTrainer._calculate_rewards calls `reward_func(prompts=prompts,
    completions=completions, completion_ids=completion_ids_list, **reward_kwargs)`, where
    reward_kwargs are the rows' columns but prompt/completion/completion_ids, one list entry a
    row, and trainer_state, log_extra and log_metric."""
    trl = require_reference("trl")
    source = inspect.getsource(trl.GRPOTrainer._calculate_rewards)
    for line in (
        'if key not in ["prompt", "completion", "completion_ids"]',
        'reward_kwargs["trainer_state"]',
        'reward_kwargs["log_extra"]',
        'reward_kwargs["log_metric"]',
        "prompts=prompts, completions=completions, completion_ids=completion_ids_list",
    ):
        assert line in source, f"TRL's call site changed: {line!r} not found"
    CALLS.clear()
    rows = [
        {"prompt": "What is 2+2?", "answer": "4", "level": 1},
        {"prompt": "What is 3+3?", "answer": "6", "level": 2},
    ]
    batch = score([f"{__name__}:recording_trl"], completions_of(rows, ["4", "7"]))
    (call,) = CALLS
    kwargs = call["kwargs"]
    assert set(kwargs) == {
        "prompts",
        "completions",
        "completion_ids",
        "answer",
        "level",
        "trainer_state",
        "log_extra",
        "log_metric",
    }
    assert kwargs["prompts"] == ["What is 2+2?", "What is 3+3?"]
    assert kwargs["completions"] == ["4", "7"]  # standard format: texts
    assert kwargs["completion_ids"] == [[1, 2, 3], [1, 2, 3]]
    assert kwargs["answer"] == ["4", "6"] and kwargs["level"] == [1, 2]
    kwargs["log_extra"]("column", [1, 2])  # the logging hooks accept their arguments
    kwargs["log_metric"]("name", 1.0)
    assert batch.total.tolist() == [1.0, 1.0]
    # Conversational rows: each completion is one assistant message, as TRL gives them.
    CALLS.clear()
    chat = [{"prompt": [{"role": "user", "content": "Hi"}], "answer": "1"}]
    score([f"{__name__}:recording_trl"], completions_of(chat, ["Hello"]))
    assert CALLS[0]["kwargs"]["completions"] == [[{"role": "assistant", "content": "Hello"}]]
    assert CALLS[0]["kwargs"]["prompts"] == [[{"role": "user", "content": "Hi"}]]


def test_trl_own_reward_functions_run_unchanged():
    """TRL's shipped `accuracy_reward` (math-verify on `solution`) and `think_format_reward`,
    named by import path, score conversational completions as GRPOTrainer would."""
    require_reference("trl")
    rows = [
        {"prompt": [{"role": "user", "content": "Half?"}], "solution": r"\frac{1}{2}"},
        {"prompt": [{"role": "user", "content": "Third?"}], "solution": r"\frac{1}{3}"},
    ]
    texts = [r"<think>easy</think>So \boxed{\frac{1}{2}}", r"It is \boxed{\frac{1}{2}}"]
    batch = score(
        ["trl.rewards:accuracy_reward", "trl.rewards:think_format_reward"],
        completions_of(rows, texts),
    )
    assert batch.values.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert batch.total.tolist() == [2.0, 0.0]


def test_a_verl_compute_score_gets_the_arguments_its_reward_manager_passes():
    """verl 0.9.1's NaiveRewardManager.run_single (verl/experimental/reward_loop/reward_manager/
    naive.py) calls `compute_score(data_source=..., solution_str=..., ground_truth=...,
    extra_info=...)` per row, ground_truth from reward_model.ground_truth and extra_info with
    num_turns and rollout_reward_scores added; a dict result's `score` is the reward."""
    CALLS.clear()
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "How many?"}],
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 7},
    }
    completion = Completion(row["prompt"], "#### 72", [5], row, "72")
    batch = score([f"{__name__}:recording_verl"], [completion, completion])
    assert [c["kwargs"] for c in CALLS] == [
        {
            "data_source": "openai/gsm8k",
            "solution_str": "#### 72",
            "ground_truth": "72",
            "extra_info": {
                "split": "train",
                "index": 7,
                "num_turns": 1,
                "rollout_reward_scores": {},
            },
        }
    ] * 2
    assert batch.total.tolist() == [0.5, 0.5]


def test_a_reward_file_by_path_with_verls_default_name(tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(
        textwrap.dedent(
            """
            def compute_score(data_source, solution_str, ground_truth, extra_info=None):
                return float(solution_str.strip() == ground_truth)
            """
        )
    )
    rows = [{"prompt": "p", "answer": "yes"}] * 2
    batch = score([f"{reward_file}:compute_score"], completions_of(rows, ["yes", "no"]))
    assert batch.total.tolist() == [1.0, 0.0]


def test_async_reward_functions_run_concurrently():
    """Each waits until the other is running too: run one after the other, the barrier times
    out and both fail."""
    rows = [{"prompt": "p", "answer": "1"}] * 3
    batch = score(
        [f"{__name__}:async_first", {"function": f"{__name__}:async_second", "weight": 0.5}],
        completions_of(rows, ["a", "b", "c"]),
    )
    assert not batch.failed.any(), batch.errors
    assert batch.total.tolist() == [2.0, 2.0, 2.0]


def test_an_async_verl_compute_score_scores_the_rows_concurrently():
    ROWS_STARTED["count"] = 0
    rows = [{"prompt": "p", "answer": "1"}] * 3
    batch = score([f"{__name__}:async_verl"], completions_of(rows, ["1", "2", "1"]))
    assert not batch.failed.any(), batch.errors
    assert batch.total.tolist() == [1.0, 0.0, 1.0]


def test_built_in_rewards():
    rows = [{"prompt": "p", "answer": "0.5"}, {"prompt": "p", "answer": "28080"}]
    accuracy = score(["accuracy"], completions_of(rows, ["so 1/2 = 0.50", "It is 28,080."]))
    assert accuracy.total.tolist() == [1.0, 1.0]
    boxed = score(
        [{"function": "accuracy", "kwargs": {"answer_format": "boxed"}}],
        completions_of(rows, [r"\boxed{\frac{1}{2}} not 3", "28080"]),
    )
    assert boxed.total.tolist() == [1.0, 0.0]  # the second has no \boxed{}
    fmt = score(
        [{"function": "format", "kwargs": {"pattern": r"<answer>.*</answer>"}}],
        completions_of(rows, ["<answer>\n1\n</answer>", "1"]),
    )
    assert fmt.total.tolist() == [1.0, 0.0]
    long_rows = [{"prompt": "p", "answer": "1"}] * 4
    length = score(
        [{"function": "length", "kwargs": {"max_tokens": 10, "buffer_tokens": 4}}],
        [Completion("p", "x", list(range(n)), long_rows[0], "1") for n in (6, 8, 10, 11)],
    )
    # DAPO: 0 up to 6 tokens, then (6 - n) / 4 down to -1 at 10, -1 past it.
    assert length.total.tolist() == [0.0, -0.5, -1.0, -1.0]


def test_failing_reward_functions_are_counted_and_the_row_gets_the_configured_reward():
    rows = [{"prompt": "p", "answer": "1"}] * 3
    texts = ["1", "1 and more", "2"]
    cases = {
        "raises": (f"{__name__}:raises", [True] * 3, "raised RuntimeError: the grader is down"),
        "nan": (f"{__name__}:nan_for_long", [False, True, False], "returned nan"),
        "count": (f"{__name__}:one_short", [True] * 3, "returned 2 values for 3 completions"),
        "timeout": (f"{__name__}:sleeps", [True] * 3, "ran past its time limit of 0.5 s"),
    }
    for case, (path, failed_rows, message) in cases.items():
        batch = score(
            ["accuracy", path],
            completions_of(rows, texts),
            timeout_s=0.5,
            reward_on_error=-1.0,
        )
        assert batch.failed[:, 1].tolist() == failed_rows, case
        assert not batch.failed[:, 0].any(), case
        assert message in next(iter(batch.errors.values())), (case, batch.errors)
        accuracy = [1.0, 1.0, 0.0]  # the last number of each text against "1"
        expected = [-1.0 if f else a + 1.0 for f, a in zip(failed_rows, accuracy, strict=True)]
        assert batch.total.tolist() == expected, case
    # None is "does not apply" (TRL): skipped in the sum; every function None is an error row.
    batch = score(["accuracy", f"{__name__}:none_always"], completions_of(rows, texts))
    assert batch.total.tolist() == [1.0, 1.0, 0.0] and not batch.failed.any()
    batch = score([f"{__name__}:none_always"], completions_of(rows, texts), reward_on_error=-2.0)
    assert batch.total.tolist() == [-2.0] * 3


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["acuracy"], r"rewards\[0\]\.function = 'acuracy' is not a built-in reward \(did you "),
        (["no_such_module_xyz:fn"], r"cannot import module 'no_such_module_xyz' \(ModuleNotFound"),
        ([f"{__name__}:missing"], r"has no 'missing'"),
        ([f"{__name__}:wrong_signature"], r"takes \(text, gold\); a reward function takes TRL"),
        ([{"function": "accuracy", "weigth": 2}], r"rewards\[0\]\.weigth is not a key .*weight"),
        ([{"function": "format"}], r"rewards\[0\]\.kwargs\.pattern = None"),
        ([{"function": "format", "kwargs": {"pattern": "("}}], r"not a regex"),
        (["accuracy", "accuracy"], r"rewards\[1\]\.name = 'accuracy': another reward function"),
        ([], r"env\.kwargs\.rewards = \[\]: expected a list of reward functions"),
    ],
)
def test_bad_reward_configs_are_refused_with_the_field(entries, message):
    with pytest.raises(EnvError, match=message):
        load_reward_functions(entries)


def test_an_env_rank_survives_a_failing_reward_and_reports_it(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}?", "answer": str(i)}) + "\n" for i in range(9))
    )
    env = make_text_vector_env(
        "agentenv_jax/Dataset-v0",
        4,
        {
            "path": str(path),
            "test_fraction": 0.0,
            "rewards": ["accuracy", f"{__name__}:raises"],
            "context_length": 16,
            "response_length": 4,
        },
    )
    env.reset(seed=0)
    for _ in range(3):
        _, rewards, terminated, _, info = env.step(np.full((4, 4), BYTE_TOKENIZER.eos_id))
        assert terminated.all() and (rewards == 0.0).all()
        assert info["reward_failed"][:, 1].all() and not info["reward_failed"][:, 0].any()
    err = capsys.readouterr().err
    assert err.count("reward function 'raises' raised RuntimeError") == 1  # shown once
    assert "agent_acted" not in info  # every row trained, at reward_on_error


def test_reward_on_error_drop_leaves_the_failed_rows_out(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}?", "answer": str(i)}) + "\n" for i in range(9))
    )
    kwargs = {
        "path": str(path),
        "test_fraction": 0.0,
        "rewards": [f"{__name__}:nan_on_odd_answers"],
        "reward_on_error": "drop",
        "context_length": 16,
        "response_length": 4,
    }
    env = make_text_vector_env("agentenv_jax/Dataset-v0", 4, kwargs)
    env.reset(seed=0)
    for _ in range(3):
        odd = [int(task.row["answer"]) % 2 == 1 for task in env._tasks]
        _, rewards, terminated, _, info = env.step(np.full((4, 4), BYTE_TOKENIZER.eos_id))
        # A dropped row is padding, as a step an env did not act on.
        acted = info.get("agent_acted", np.ones(4, bool))  # there only when a row is dropped
        assert acted.tolist() == [not o for o in odd]
        assert rewards.tolist() == [0.0 if o else 1.0 for o in odd]
    with pytest.raises(EnvError, match=r"reward_on_error = 'dorp': expected a number .* or 'drop'"):
        make_text_vector_env("agentenv_jax/Dataset-v0", 4, kwargs | {"reward_on_error": "dorp"})


@pytest.mark.slow
def test_a_training_run_logs_each_reward_function_per_update(tmp_path):
    """A from-scratch model on a dataset file with two reward functions, one failing (NaN) on
    rows with an odd answer: metrics.jsonl has each function's mean and failures per update,
    and the run ends normally."""
    (tmp_path / "sums.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
            for a in range(5)
            for b in range(5)
        )
    )
    config = {
        "env": {
            "id": "agentenv_jax/Dataset-v0",
            "kwargs": {
                "path": "sums.jsonl",
                "test_fraction": 0.0,
                "rewards": ["accuracy", {"function": f"{__name__}:nan_on_odd_answers"}],
                "context_length": 8,
                "response_length": 2,
            },
            "global_num_envs": 8,
        },
        "algorithm": {"name": "ppo", "rollout_length": 4, "num_minibatches": 1},
        "network": {"language_model": {"size": "tiny"}},
        "run": {"total_env_steps": 96},
    }
    result, run = train_in_folder(tmp_path, config)
    metrics = (run / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in metrics]
    assert len(records) == 3  # 96 steps of 8 envs x 4 steps
    failures = 0
    for record in records:
        assert 0.0 <= record["reward/accuracy/mean"] <= 1.0
        assert record["reward/accuracy/failures"] == 0
        # 32 answers an update: those with an odd answer fail, the others score 1.
        failures += record["reward/nan_on_odd_answers/failures"]
        assert 0 <= record["reward/nan_on_odd_answers/failures"] <= 32
        if record["reward/nan_on_odd_answers/failures"] < 32:
            assert record["reward/nan_on_odd_answers/mean"] == 1.0
    assert failures > 0
    assert "reward function 'nan_on_odd_answers' returned nan" in result.stderr
