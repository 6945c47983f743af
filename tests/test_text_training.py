"""Language-model policies on text envs, end to end: token-level PPO learning under mpiexec,
a multi-turn dialogue with central inference (env ranks hold no parameters; tokens and
episodes reconcile), central inference of a CNN policy acting as the env ranks' own would,
and the start-up errors of text settings."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import operator
import re
from collections.abc import Sequence

import numpy as np
import pytest

from agentenv_jax.config.loading import load_config
from agentenv_jax.envs.text.registry import ENV_KWARGS
from agentenv_jax.envs.text.tasks import ArithmeticTask
from agentenv_jax.envs.text.tokenizer import BYTE_TOKENIZER
from agentenv_jax.networks.language_model import count_params
from agentenv_jax.networks.text_models import language_model_for
from agentenv_jax.workflow.text_dialogues import sample_dialogues, trained_params

from conftest import REPO, agentenv_command, mpiexec_path, run_command, settings

# Trivial policies on the shipped task (sums of two operands drawn uniformly from 0..4), from
# the task's own prompt generator (`_trivial_accuracies(_task_answers(...))`): always answering
# the most common answer, 4, scores 0.20 (5 of the 25 operand pairs); a uniformly random answer
# among the 9 that occur (0..8) scores 0.11. On the prompts whose answer is not 4, the best
# constant answer (3 or 5) scores 0.20 (4 of 20 pairs) and a random one 0.125. The untrained
# model emits random bytes: its first 256 answers are 0.0 accurate.
# As shipped (`experiments/arithmetic_ppo.yaml`, 100 updates of 256 answers) how well a seed learns
# varies widely. The mean accuracy of the last 10 updates at commit 78cbb6a, one process each on 2
# CPU cores (`mpiexec -n 3` trains a seed to the same metrics): 0.15, 0.42, 0.37, 0.52, 0.38, 0.40,
# 0.31, 0.60, 0.30 and 0.27 on seeds 0-9, median 0.38. Any float-level change reshuffles which seeds
# do well: c9d074c, which only made the LM head read the answer positions alone (the same logits,
# gradients 4e-7 apart relative), took seed 0 from 0.42 to 0.15, and seeds 0-9 before it scored
# 0.29-0.58, median 0.39, the same spread. (The 0.22, 0.46 and 0.42 quoted here before for seeds 0-2
# after c9d074c match their last 10 updates' mean reward, 0.229, 0.464 and 0.427, which pays 0.1 for
# a wrong number.) So the test trains ARITHMETIC_SEEDS and holds their medians to the best trivial
# policy + MEDIAN_MARGIN_OVER_TRIVIAL (0.25): the last 10 updates' accuracy (0.37 at 78cbb6a; 0.15,
# 0.42, 0.37 on seeds 0, 1, 2) and, on 1024 fresh prompts sampled as in training, the accuracy
# overall (0.37; 0.15, 0.42, 0.37) and on the prompts whose answer is not 4 (0.48; 0.19, 0.54,
# 0.48). Of the 20 runs measured (seeds 0-9 before and after c9d074c), 1 fell below 0.25 on its last
# 10 updates and 5 below 0.30; on fresh prompts 1 and 3 overall, 2 and 4 where the answer is not 4.
# Three seeds drawn from those 20 runs fail a bar of 0.30 for their medians 22% of the time, one of
# 0.25 3%. Trained models answer some sums always right and others never, not one constant.
UNTRAINED_ACCURACY = 0.0
MARGIN_OVER_TRIVIAL = 0.1  # accuracy the trained policy must add to the best trivial policy's
# The explained variance token PPO's critic must exceed, the mean of the last 10 updates: its
# value error at most 0.8 of a constant predictor's, the targets' mean (0.47 measured, seed 1
# under `mpiexec -n 3`; each of the 10 at least 0.34, the first updates' -9 to 0).
EXPLAINED_VARIANCE = 0.2
MEDIAN_MARGIN_OVER_TRIVIAL = 0.05  # what the median of ARITHMETIC_SEEDS must add to it
ARITHMETIC_SEEDS = (1, 0, 2)  # arithmetic_ppo's learning test: the first under mpiexec
_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _answer(prompt: str) -> int:
    """The right answer to an arithmetic prompt such as `"3+4="`."""
    left, symbol, right = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt).groups()
    return _OPERATIONS[symbol](int(left), int(right))


def _task_answers(env_kwargs: dict, draws: int = 20_000, seed: int = 0) -> list[int]:
    """The right answers to `draws` prompts of `ArithmeticTask`'s own generator (its `reset`),
    with the task settings of `env_kwargs` (an arithmetic env's `env.kwargs`)."""
    task = ArithmeticTask(**{k: v for k, v in env_kwargs.items() if k not in ENV_KWARGS})
    rng = np.random.default_rng(seed)
    return [_answer(task.reset(rng)) for _ in range(draws)]


def _trivial_accuracies(answers: Sequence[int]) -> tuple[int, float, float]:
    """For prompts whose right answers are `answers`: the most common answer, the accuracy of
    always giving it (its share), and that of a uniformly random answer among those that
    occur."""
    counts = collections.Counter(answers)
    common, count = counts.most_common(1)[0]
    return common, count / len(answers), 1 / len(counts)


def _fresh_accuracies(run, common: int) -> tuple[float, float, dict[int, float]]:
    """A trained arithmetic run's policy on 1024 fresh prompts (the evaluation seeds), sampled
    as in training: its accuracy, that on the prompts whose answer is not `common`, and its
    accuracy by answer."""
    sample = sample_dialogues(
        load_config(run / "config.yaml"), trained_params(run), num_episodes=1024
    )
    right: dict[int, list[bool]] = collections.defaultdict(list)  # by each prompt's answer
    for transcript, success in zip(sample.transcripts, sample.successes, strict=True):
        right[_answer(transcript.split("\n")[0])].append(success)
    by_answer = {answer: round(float(np.mean(right[answer])), 2) for answer in sorted(right)}
    rest = [success for answer in right if answer != common for success in right[answer]]
    assert len(rest) >= len(sample.successes) // 2, by_answer
    return sample.accuracy, float(np.mean(rest)), by_answer


def test_the_trivial_baselines_come_from_the_tasks_own_prompts():
    answers = _task_answers(load_config("arithmetic_ppo").env.kwargs)
    common, common_share, uniform = _trivial_accuracies(answers)
    assert (common, uniform) == (4, 1 / 9)
    assert common_share == pytest.approx(5 / 25, abs=0.01)
    rest = [a for a in answers if a != common]
    rest_common, rest_share, rest_uniform = _trivial_accuracies(rest)
    assert rest_common in (3, 5) and rest_uniform == 1 / 8
    assert rest_share == pytest.approx(4 / 20, abs=0.01)
    assert _answer("3+4=") == 7 and _answer("2*3=") == 6 and _answer("1-4=") == -3


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _mpiexec_train(run_dir, experiment: str, name: str, *overrides: str, ranks: int = 3):
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            str(ranks),
            *agentenv_command(
                "train",
                experiment,
                *settings(
                    f"run.run_dir={run_dir}", f"run.name={name}", "run.progress=false", *overrides
                ),
            ),
        ],
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir / name


def _train(
    run_dir,
    experiment: str,
    name: str,
    *overrides: str,
    timeout: float = 600,
    extra_env: dict[str, str] | None = None,
):
    """`agentenv train` in one process (the embedded default); the run's folder."""
    proc = run_command(
        agentenv_command(
            "train",
            experiment,
            *settings(
                f"run.run_dir={run_dir}", f"run.name={name}", "run.progress=false", *overrides
            ),
        ),
        timeout=timeout,
        cwd=REPO,
        extra_env=extra_env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir / name


def _assert_reconciles(accounting: dict) -> None:
    assert accounting["reconciles"], accounting
    assert accounting["produced"] == accounting["trained"] > 0, accounting


@pytest.mark.slow
@pytest.mark.timeout(900)  # three trainings: one under mpiexec, two in one process
def test_mpiexec_token_ppo_raises_arithmetic_accuracy_above_the_untrained_model(run_dir):
    first, *others = ARITHMETIC_SEEDS
    run = _mpiexec_train(run_dir, "arithmetic_ppo", "arithmetic", f"run.seed={first}")
    runs = {first: run} | {
        seed: _train(run_dir, "arithmetic_ppo", f"seed{seed}", f"run.seed={seed}")
        for seed in others
    }
    records = _metrics(run)
    summary = _summary(run)
    assert summary["topology"].startswith("1 learner + 2 env rank(s), 32 envs")
    config = load_config(run / "config.yaml")
    answers = _task_answers(config.env.kwargs)
    common, common_share, uniform = _trivial_accuracies(answers)
    _, rest_share, rest_uniform = _trivial_accuracies([a for a in answers if a != common])
    trained, fresh, fresh_rest, by_answer = {}, {}, {}, {}
    for seed, seed_run in sorted(runs.items()):
        accuracy = [record["accuracy"] for record in _metrics(seed_run)]
        # The first update's answers come from the untrained model, the last ones from training.
        assert accuracy[0] <= UNTRAINED_ACCURACY + 0.02, (seed, accuracy[::10])
        trained[seed] = round(float(np.mean(accuracy[-10:])), 3)
        fresh[seed], fresh_rest[seed], by_answer[seed] = _fresh_accuracies(seed_run, common)
    # A seed may learn little (top of the file): the seeds' medians beat the trivial policies.
    bar = max(common_share, uniform) + MEDIAN_MARGIN_OVER_TRIVIAL
    assert np.median(list(trained.values())) >= bar, trained
    assert np.median(list(fresh.values())) >= bar, (fresh, by_answer)
    rest_bar = max(rest_share, rest_uniform) + MEDIAN_MARGIN_OVER_TRIVIAL
    assert np.median(list(fresh_rest.values())) >= rest_bar, (fresh_rest, by_answer)
    assert summary["accuracy"] == records[-1]["accuracy"]
    # The metrics LLM-RL users read are there and sensible.
    last = records[-1]
    assert 1.0 <= last["response_length_mean"] <= 2.0  # a digit and EOS, at most
    assert last["kl_to_reference"] > 0.1  # the policy moved away from the initial one
    # Rates are wall-clock quantities: in timings.jsonl, which metrics.jsonl stays free of.
    assert "tokens_generated_per_s" not in last
    timing = [json.loads(line) for line in (run / "timings.jsonl").read_text().splitlines()][-1]
    assert timing["tokens_generated_per_s"] > 0 and timing["tokens_trained_per_s"] > 0
    # The critic predicts the answers' value targets better than a constant, their mean, would:
    # explained variance (1 - `value_error` over the targets' variance, over each update's
    # tokens, the values being those the answers were generated with) above EXPLAINED_VARIANCE
    # over the last 10 updates.
    explained = float(np.mean([r["explained_variance"] for r in records[-10:]]))
    assert explained > EXPLAINED_VARIANCE, [round(r["explained_variance"], 2) for r in records]
    # Env-rank inference: each env rank held the whole model.
    kwargs = config.env.kwargs
    lm = language_model_for(
        config.network.language_model,
        BYTE_TOKENIZER.text_spec(kwargs["context_length"], kwargs["response_length"]),
    )
    assert summary["env_rank_policy_params"] == [count_params(lm.param_shapes())] * 2
    _assert_reconciles(summary["accounting"])
    _assert_reconciles(summary["token_accounting"])
    _assert_reconciles(summary["episode_accounting"])
    # Single-turn: one episode per message.
    assert summary["episode_accounting"]["trained"] == summary["accounting"]["trained"]


@pytest.mark.slow
def test_a_serving_thread_answers_env_ranks_while_the_learner_updates(run_dir):
    """Central inference for token-level PPO with env ranks up to 2 updates ahead, answered by
    the learner's serving thread or only while it waits for a round. Answers of up to 16
    tokens and one pass per update make generating and updating take alike, so the env ranks
    have requests to make while the learner updates. The server counts those it answered
    during updates (`central_inference.requests_while_updating`): the thread answers them,
    serving between rounds never does. What that saves the env ranks in seconds is measured by
    `benchmarks/async_generation.py --sides asynchronous lag2_between_rounds` (docs/
    benchmarks.md), not asserted here: on a machine shared with other jobs it varies."""
    runs, served = {}, {}
    for serving in ("thread", "between_rounds"):
        runs[serving] = _mpiexec_train(
            run_dir,
            "arithmetic_ppo",
            serving,
            "run.total_env_steps=5120",  # 20 updates of 256 answers
            "topology.inference=learner",
            f"topology.inference_serving={serving}",
            "algorithm.max_policy_lag=2",
            "algorithm.num_epochs=1",
            "algorithm.num_minibatches=1",
            "env.kwargs.response_length=16",
        )
        summary = _summary(runs[serving])
        served[serving] = summary["central_inference"]
        for name in ("accounting", "token_accounting", "episode_accounting"):
            accounting = summary[name]
            assert accounting["reconciles"], (serving, name, accounting)
            assert accounting["trained"] > 0 and accounting["unsent"] == 0, (serving, accounting)
            # What the learner did not train on arrived after its last update, counted late.
            assert accounting["produced"] == accounting["trained"] + accounting["late"]
        assert summary["updates"] == 20
    # The thread served the env ranks while the learner updated: they ran ahead, and a quarter
    # of its requests at least were answered during updates (377 of 396 measured, each env
    # rank's message one request; docs/benchmarks.md).
    lags = [record["policy_lag_max"] for record in _metrics(runs["thread"])]
    assert max(lags) == 2, lags
    thread = served["thread"]
    assert thread["requests_while_updating"] >= thread["requests"] / 4, served
    # Between rounds the learner answers only while it waits for a round, never updating.
    assert served["between_rounds"]["requests_while_updating"] == 0, served
    assert served["between_rounds"]["requests"] > 0, served


@pytest.mark.slow
def test_a_reasoning_gym_run_is_evaluated_on_its_held_out_split(run_dir):
    """GRPO on reasoning-gym sums read by their last number, then `agentenv eval --split`: the
    held-out problems are other problems than the training split's on the same seeds, and a
    task without splits is refused by name."""
    proc = run_command(
        agentenv_command(
            "train",
            "arithmetic_ppo",
            *settings(
                f"run.run_dir={run_dir}",
                "run.name=gym",
                "run.progress=false",
                "run.total_env_steps=256",
                "env.id=reasoning_gym/basic_arithmetic",
                "env.kwargs={context_length: 24, response_length: 4, answer_format: "
                "last_number, min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, "
                "operators: ['+'], allow_parentheses: false, allow_negation: false}",
                "algorithm.advantage=group",
                "algorithm.group_size=4",
            ),
        ),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    prompts = {}
    for split in ("train", "test"):
        proc = run_command(
            agentenv_command(
                "eval",
                str(run_dir / "gym"),
                "--episodes",
                "8",
                "--split",
                split,
                "--dialogues",
                "8",
            ),
            timeout=300,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "8 episodes (deterministic)" in proc.stdout.splitlines()[0], proc.stdout
        prompts[split] = re.findall(r"^ +(Calculate .*)$", proc.stdout, re.MULTILINE)
        assert len(prompts[split]) == 8, proc.stdout
    assert prompts["train"] != prompts["test"]
    proc = run_command(
        agentenv_command("eval", str(run_dir / "gym"), "--episodes", "2", "--split", "dev"),
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode != 0 and "invalid choice: 'dev'" in proc.stderr


@pytest.mark.slow
def test_the_group_baseline_beats_the_best_trivial_policy(run_dir):
    """GRPO's group advantage (`algorithm.advantage=group`, 8 answers per prompt, critic-free)
    on the shipped arithmetic task, 100 updates in one process (~25 s on a quiet machine): the
    mean accuracy of the last 20 updates must beat the best trivial policy (always the most
    common sum, 0.20) by MARGIN_OVER_TRIVIAL, as token PPO's does.

    It does not yet, and the test says so (xfail) rather than hold it to less: 0.27 on seed 0
    (0.19 and 0.10 on seeds 1 and 2). The trained policy answers nearly one constant: on 1024
    fresh prompts, 4 on 20 of the 25 and 3 on the others (0.29 overall, 0.10 where the sum is
    not 4), and with `scale_group_rewards: false` 4 on all of them. Once a prompt's 8 answers
    all say the same, they all score alike, their group advantages are 0, and nothing moves the
    policy off that answer; likely it got there because, before the model reads the operands,
    the answer that wins its groups most often is the most common sum (docs/text.md)."""
    run = _train(
        run_dir,
        "arithmetic_ppo",
        "group",
        "algorithm.advantage=group",
        "algorithm.group_size=8",
        timeout=400,
    )
    accuracy = [record["accuracy"] for record in _metrics(run)]
    assert len(accuracy) == 100 and accuracy[0] <= 0.02
    _, common_share, uniform = _trivial_accuracies(
        _task_answers(load_config("arithmetic_ppo").env.kwargs)
    )
    bar = max(common_share, uniform) + MARGIN_OVER_TRIVIAL
    trained = float(np.mean(accuracy[-20:]))
    if trained < bar:
        pytest.xfail(
            f"the group baseline's accuracy {trained:.3f} is below the best trivial policy's "
            f"{max(common_share, uniform):.3f} + {MARGIN_OVER_TRIVIAL}: it collapses onto "
            "constant answers (this test's docstring)"
        )


@pytest.mark.slow
def test_mpiexec_dynamic_sampling_refills_alike_groups_from_more_rounds(run_dir):
    """GRPO with dynamic sampling and up to 2 refill rounds per update, 1 learner and 2 env
    ranks, from the untrained model (0.004 of its answers right: most groups of 8 score 0
    alike). Each update fills its 32 group slots with every informative group the rounds
    brought, and what is left over is discarded, counted, and reconciled."""
    updates, answers, slots = 10, 256, 32
    run = _mpiexec_train(
        run_dir,
        "arithmetic_ppo",
        "refill",
        f"run.total_env_steps={updates * answers}",
        "algorithm.advantage=group",
        "algorithm.group_size=8",
        "algorithm.dynamic_sampling=true",
        "algorithm.refill_rounds=2",
    )
    records = _metrics(run)
    assert len(records) == updates
    for record in records:
        rounds = record["refill_rounds"]
        assert 0 <= rounds <= 2, record
        # Fewer rounds than allowed only once the slots were full.
        assert rounds == 2 or record["groups_informative"] >= slots, record
        # The update drops exactly the slots left without an informative group...
        assert record["groups_dropped"] == max(0, slots - record["groups_informative"]), record
        # ...and every row of the other rounds was discarded (all rows are valid here).
        assert record["rows_discarded"] == rounds * answers, record
        # The extra rounds ran under the update's own parameters.
        assert record["policy_lag_max"] == 0, record
    assert sum(record["refill_rounds"] for record in records) > 0
    assert sum(record["groups_informative"] for record in records) > 0
    summary = _summary(run)
    assert summary["updates"] == updates
    discarded = sum(record["rows_discarded"] for record in records)
    for name in ("accounting", "token_accounting", "episode_accounting"):
        accounting = summary[name]
        assert accounting["reconciles"], (name, accounting)
        assert accounting["discarded"] > 0 and accounting["unsent"] == 0, (name, accounting)
    accounting = summary["accounting"]
    assert accounting["trained"] == updates * answers
    assert accounting["discarded"] == discarded
    assert (
        accounting["produced"]
        == accounting["trained"] + accounting["discarded"] + accounting["late"]
    )


@pytest.mark.slow
def test_mpiexec_multi_turn_dialogue_with_central_inference(run_dir):
    run = _mpiexec_train(
        run_dir, "guess_number_ppo", "dialogue", "run.total_env_steps=1280"
    )  # 10 updates of 16 envs x 8 messages
    summary = _summary(run)
    # The env ranks never held the model's parameters: the learner answered every step.
    assert summary["env_rank_policy_params"] == [0, 0]
    served = summary["central_inference"]
    _assert_reconciles(summary["accounting"])
    _assert_reconciles(summary["token_accounting"])
    _assert_reconciles(summary["episode_accounting"])
    # Every token the env ranks produced was generated by the learner's server.
    assert served["tokens_generated"] == summary["token_accounting"]["produced"]
    # One act request per env rank per message, batched across both env ranks (8 envs each).
    assert served["requests"] >= summary["accounting"]["produced"] // 8
    assert 8 < served["rows_per_act_batch"] <= 16
    # Dialogues: episodes of several messages (the 4-turn limit truncates unsolved ones).
    episodes = summary["episode_accounting"]["trained"]
    assert 0 < episodes < summary["accounting"]["trained"]
    assert summary["accounting"]["trained"] <= 4 * episodes + 16
    assert summary["updates"] == 10


@pytest.mark.slow
def test_central_inference_acts_as_the_env_ranks_own_cnn_policy_would(run_dir):
    """Catch's pixels through the Nature CNN: the learner's server draws each env rank's own
    noise stream, so training is the same as with the policy on the env rank (jit)."""
    records = {}
    for place in ("env_ranks", "learner"):
        proc = run_command(
            agentenv_command(
                "train",
                "catch_ppo",
                *settings(
                    f"run.run_dir={run_dir}",
                    f"run.name={place}",
                    "run.progress=false",
                    "run.total_env_steps=4096",
                    f"topology.inference={place}",
                    "topology.env_rank_inference=jit",
                ),
            ),
            timeout=300,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        records[place] = _metrics(run_dir / place)
        params = _summary(run_dir / place)["env_rank_policy_params"]
        assert (params == [0]) == (place == "learner"), params
    assert len(records["learner"]) == 8
    for central, own in zip(records["learner"], records["env_ranks"], strict=True):
        assert central["episode_return_mean"] == own["episode_return_mean"]
        assert central["loss/total"] == pytest.approx(own["loss/total"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "overrides", "message"),
    [
        (
            "cartpole_impala",
            ["env.id=agentenv_jax/Arithmetic-v0"],
            "is a text env: algorithm.name = 'impala' is not supported for it; use 'ppo'",
        ),
        (
            "cartpole_ppo",
            [
                "algorithm.kl_coef=0.1",
                "algorithm.loss_aggregation=sequence",
                "algorithm.max_policy_lag=2",
            ],
            "algorithm.kl_coef, algorithm.loss_aggregation, algorithm.max_policy_lag: for text "
            "envs (token-level PPO); env.id = 'CartPole-v1' is not one",
        ),
        (
            "guess_number_ppo",
            ["algorithm.advantage=group", "algorithm.group_size=4", "algorithm.rollout_length=6"],
            "algorithm.rollout_length = 6 must be a multiple of 4 under algorithm.advantage = "
            "'group'",
        ),
        (
            "arithmetic_ppo",
            ["env.kwargs.max_operands=3"],
            "env.kwargs.max_operands is not a kwarg of env.id = 'agentenv_jax/Arithmetic-v0' "
            "(did you mean 'max_operand'?)",
        ),
        (
            "arithmetic_ppo",
            ["env.id=agentenv_jax/Arithmetc-v0"],
            "(did you mean 'agentenv_jax/Arithmetic-v0'?)",
        ),
        (
            "arithmetic_ppo",
            ["network.language_model.num_heads=5"],
            "num_heads = 5 must divide d_model = 64",
        ),
        (
            "arithmetic_ppo",
            ["algorithm.packed_row_length=9"],
            "algorithm.packed_row_length = 9: a packed row must hold the longest message, "
            "context_length + response_length = 10 tokens; allowed: 0 (off) or an integer >= 10",
        ),
        (
            "cartpole_ppo",
            ["algorithm.packed_row_length=64"],
            "algorithm.packed_row_length: for text envs (token-level PPO)",
        ),
        (
            "pendulum_sac",
            ["topology.inference=learner"],
            "topology.inference = 'learner' is not allowed: expected 'env_ranks' with "
            "algorithm.name = 'sac'",
        ),
    ],
)
def test_bad_text_settings_are_one_start_up_error(experiment, overrides, message, run_dir):
    _assert_start_up_error(run_dir, experiment, overrides, message)


def _assert_start_up_error(run_dir, experiment, overrides, message, extra_env=None):
    proc = run_command(
        agentenv_command(
            "train",
            experiment,
            *settings(f"run.run_dir={run_dir}", "run.progress=false", *overrides),
        ),
        timeout=120,
        cwd=REPO,
        extra_env=extra_env,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_packed_run_trains_on_rows_of_less_padding_and_reconciles(run_dir):
    """`algorithm.packed_row_length` through the learner, on a mesh of two host devices that
    split the packed rows: two updates of 256 messages of 7 tokens ("BOS 3+4=" in a context of
    8, an answer and EOS) packed two a row of 14, longer than the model's 10 positions (each
    message counts its own): every message trained once, the padded update's left padding (3
    of 10 tokens) gone from the packed rows. (Learners of several processes: a start-up
    error, test_multi_learner.py.)"""
    run = _train(
        run_dir,
        "arithmetic_ppo",
        "packed",
        "algorithm.packed_row_length=14",
        "run.total_env_steps=512",
        "topology.learner_devices=2",
        extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )
    assert _summary(run)["topology"].endswith("2 learner device(s)")
    records = _metrics(run)
    assert len(records) == 2
    for record in records:
        assert 0.0 <= record["packed_padding_fraction"] < record["update_padding_fraction"]
        assert math.isfinite(record["loss/total"]) and math.isfinite(record["kl_to_reference"])
    _assert_reconciles(_summary(run)["accounting"])


@pytest.mark.slow
def test_a_nan_policy_stops_the_run_with_the_non_finite_error(run_dir, tmp_path):
    """Finite weights whose logits are NaN (a final norm scaled to 3e38 overflows the hidden
    state to +-inf, and the tied output layer's sums of +inf and -inf are NaN): the env is still
    answered with valid token ids, and the run stops at its first update with the non-finite
    error (exit 3), not with an env error about an id out of range."""
    import jax

    from agentenv_jax.checkpoint.pretrained import save_language_model

    config = load_config("arithmetic_ppo")
    kwargs = config.env.kwargs
    text = BYTE_TOKENIZER.text_spec(kwargs["context_length"], kwargs["response_length"])
    lm = language_model_for(config.network.language_model, text)
    weights = jax.tree.map(np.array, lm.init(jax.random.key(0)))
    weights["policy"]["final_norm"]["scale"][:] = 3e38  # finite: the update-0 check passes
    save_language_model(tmp_path / "overflowing", weights)
    proc = run_command(
        agentenv_command(
            "train",
            "arithmetic_ppo",
            *settings(
                f"run.run_dir={run_dir}",
                "run.name=overflowing",
                "run.progress=false",
                "run.total_env_steps=512",
                f"network.language_model.init_from={tmp_path / 'overflowing'}",
            ),
        ),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert re.search(r"agentenv: error: update 1: \S+ = nan is not finite", proc.stderr), (
        proc.stderr[-3000:]
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_init_from_starts_training_from_a_local_checkpoint_of_weights(run_dir, tmp_path):
    from agentenv_jax.checkpoint import CheckpointStore
    from agentenv_jax.checkpoint.pretrained import save_language_model

    config = load_config("arithmetic_ppo")
    kwargs = config.env.kwargs
    text = BYTE_TOKENIZER.text_spec(kwargs["context_length"], kwargs["response_length"])
    lm = language_model_for(config.network.language_model, text)
    import jax
    import numpy as np

    weights = lm.init(jax.random.PRNGKey(123))  # not the run's own initialization (seed 0)
    save_language_model(tmp_path / "weights", weights)
    proc = run_command(
        agentenv_command(
            "train",
            "arithmetic_ppo",
            *settings(
                f"run.run_dir={run_dir}",
                "run.name=warm",
                "run.progress=false",
                "run.total_env_steps=256",
                f"network.language_model.init_from={tmp_path / 'weights'}",
            ),
        ),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    store = CheckpointStore(run_dir / "warm", keep=3)
    state, _ = store.restore_raw()
    store.close()
    # The frozen reference is the initial policy: the weights loaded, leaf for leaf.
    for loaded, saved in zip(
        jax.tree.leaves(state["ref_params"]), jax.tree.leaves(weights), strict=True
    ):
        np.testing.assert_array_equal(loaded, saved)

    # Its checkpoint plays: accuracy and dialogues on fresh prompts.
    proc = run_command(
        agentenv_command("eval", str(run_dir / "warm"), "--episodes", "4", "--dialogues", "2"),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert "4 episodes (deterministic)" in lines[0] and "length 1.0  accuracy " in lines[0]
    assert lines[1].startswith("4 dialogues on agentenv_jax/Arithmetic-v0: accuracy")
    assert re.match(r"^1 [✓✗] return ", lines[2]) and re.match(r"^ +\d\+\d=$", lines[3])
    assert lines[4].lstrip().startswith("agent: ") and lines[-1] == "... and 2 more"
    # pass@k: 3 problems answered 4 times each, sampled.
    proc = run_command(
        agentenv_command("eval", str(run_dir / "warm"), "--episodes", "3", "--pass-at", "4"),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = proc.stdout.splitlines()[0]
    assert "12 episodes (sampled actions)" in line and " over 3 problems" in line, line
    # With 4 answers drawn per problem, pass@4 is the share of the 3 problems answered right
    # at least once: a third at a time, 0 exactly where no answer was right.
    accuracy = float(re.search(r"accuracy (\S+)", line).group(1))
    pass_at_4 = float(re.search(r"pass@4 (\S+)", line).group(1))
    assert pass_at_4 in (0.0, 0.333, 0.667, 1.0) and (pass_at_4 == 0) == (accuracy == 0), line
    assert accuracy in {round(right / 12, 3) for right in range(13)}, line

    # Weights of another shape: one start-up error naming the field and the leaf.
    small = language_model_for(
        dataclasses.replace(config.network.language_model, d_model=32, num_heads=2), text
    )
    save_language_model(tmp_path / "small", small.init(jax.random.PRNGKey(0)))
    proc = run_command(
        agentenv_command(
            "train",
            "arithmetic_ppo",
            *settings(
                f"run.run_dir={run_dir}",
                "run.progress=false",
                f"network.language_model.init_from={tmp_path / 'small'}",
            ),
        ),
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert "network.language_model.init_from = " in proc.stderr, proc.stderr[-3000:]
    assert "does not fit this model: leaf ['policy']" in proc.stderr, proc.stderr[-3000:]
    assert "has shape [32], expected [64]" in proc.stderr
    assert "Traceback" not in proc.stderr
