"""The verifiable code task: problems and their hidden tests, how an answer's code is read,
and answers scored in the sandbox: a right function earns every test, a wrong one the tests
its wrong outputs happen to match, and code that does not compile, loops or spoofs the
harness's lines earns nothing it did not compute. The held-out split shares no question."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_sandbox import require_bubblewrap, sandbox_processes

from agentenv_jax.envs.sandbox import close_shared_pools
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.code_problems import PROBLEMS
from agentenv_jax.envs.text.code_tasks import CodeTask, answer_code, passed_tests
from agentenv_jax.envs.text.registry import make_text_vector_env
from agentenv_jax.envs.text.tasks import question_split

RIGHT = "```python\ndef sum_multiples(xs):\n    return sum(x for x in xs if x % 3 == 0)\n```"


def test_every_problem_is_its_own_question_and_its_tests_follow_the_reference():
    assert len(PROBLEMS) == 326 and len({p.question for p in PROBLEMS}) == 326
    rng = np.random.default_rng(0)
    by_name = {p.question: p for p in PROBLEMS}
    clip = by_name[next(q for q in by_name if "range -3 to 8" in q)]
    assert clip.reference([-9, 0, 12]) == [-3, 0, 8]
    rotate = next(p for p in PROBLEMS if p.function == "rotate_right" and " 2 places" in p.question)
    assert rotate.reference([1, 2, 3, 4]) == [3, 4, 1, 2] and rotate.reference([]) == []
    sequence = next(p for p in PROBLEMS if "starts 2, 1 " in p.question)  # Lucas numbers
    assert [sequence.reference(n) for n in range(6)] == [2, 1, 3, 4, 7, 11]
    cases = clip.tests(rng, 5)
    assert all(expected == clip.reference(*arguments) for arguments, expected in cases)


def test_the_held_out_split_shares_no_question():
    train, test = (
        {p.question for p in PROBLEMS if question_split(p.question, 0.2) == side}
        for side in ("train", "test")
    )
    assert not train & test and (len(train), len(test)) == (254, 72)


def test_the_answers_code_is_read_from_its_last_block():
    assert answer_code("Here:\n```python\na = 1\n```\nand\n```\nb = 2\n```") == "b = 2\n"
    assert answer_code("def f(x):\n    return x") == "def f(x):\n    return x"
    assert answer_code("```python\ndef f(x):\n    return x") == "def f(x):\n    return x"


def test_passed_tests_counts_each_matching_output_once():
    lines = [
        json.dumps({"test": 0, "output": [1, 2]}),
        "the answer's own print",
        json.dumps({"test": 0, "output": [1, 2]}),
        json.dumps({"test": 1, "output": 5}),
        json.dumps({"test": 2, "error": "ZeroDivisionError"}),
        json.dumps({"test": 7, "output": 0}),
    ]
    assert passed_tests("\n".join(lines), [(1, 2), 4, 0]) == 1


@pytest.mark.slow  # the sandbox's workers
class TestScoredInTheSandbox:
    @pytest.fixture(autouse=True)
    def pools(self):
        require_bubblewrap()
        yield
        close_shared_pools()

    def task(self, **kwargs) -> CodeTask:
        task = CodeTask(**kwargs)
        # One problem: the sum of the multiples of 3.
        task._problems = [p for p in PROBLEMS if p.question.endswith("divisible by 3.")]
        task.reset(np.random.default_rng(0))
        return task

    def test_a_right_function_passes_every_test(self):
        task = self.task()
        reply = task.reply(f"Sure.\n{RIGHT}\nThis sums them.")
        assert reply.reward == 1.0 and reply.done and reply.success

    def test_a_wrong_function_earns_only_the_outputs_it_gets_right(self):
        task = self.task(tests=20)
        zeros = sum(expected == 0 for _, expected in task._cases) / 20
        assert 0 < zeros < 1
        reply = task.reply("```python\ndef sum_multiples(xs):\n    return 0\n```")
        assert reply.reward == pytest.approx(zeros) and not reply.success

    @pytest.mark.parametrize(
        "answer",
        [
            "```python\ndef sum_multiples(xs)\n    return 0\n```",  # does not compile
            "```python\ndef add(xs):\n    return 0\n```",  # not the function asked for
            "```python\ndef sum_multiples(xs):\n    while True: pass\n```",  # loops
            "```python\nimport os\nos.system('kill -9 1')\n```",
        ],
    )
    def test_broken_answers_score_zero(self, answer):
        task = self.task(time_limit_s=1.0)
        reply = task.reply(answer)
        assert reply.reward == 0.0 and reply.done
        assert not sandbox_processes(task._pool)

    def test_spoofed_harness_lines_earn_nothing_that_was_not_computed(self):
        task = self.task(tests=20)
        spoof = "\\n".join(json.dumps({"test": i, "output": 0}) for i in range(20))
        answer = f"```python\nimport os\nprint('{spoof}', flush=True)\nos._exit(0)\n```"
        zeros = sum(expected == 0 for _, expected in task._cases) / 20
        assert zeros < 1.0 and task.reply(answer).reward == pytest.approx(zeros)

    def test_a_vector_env_scores_each_answer(self):
        env = make_text_vector_env("agentenv_jax/Code-v0", 2, {"response_length": 128})
        for task in env._tasks:
            task._problems = [p for p in PROBLEMS if p.question.endswith("divisible by 3.")]
        obs, _ = env.reset(seed=1)
        assert "sum_multiples(xs)" in env.transcript(0)
        row = np.full((2, 128), env.tokenizer.pad_id, np.int32)
        for i, text in enumerate([RIGHT, "no code"]):
            tokens = env.tokenizer.encode(text).tolist() + [env.tokenizer.eos_id]
            row[i, : len(tokens)] = tokens
        _, reward, terminated, _, info = env.step(row)
        assert reward.tolist() == [1.0, 0.0] and terminated.all()
        assert info["success"].tolist() == [True, False]


def test_bad_settings_name_the_field():
    with pytest.raises(EnvError, match=r"env.kwargs.split = 'dev'"):
        CodeTask(split="dev")
    with pytest.raises(EnvError, match=r"env.kwargs.test_fraction = 1"):
        CodeTask(test_fraction=1)
    with pytest.raises(EnvError, match=r"env.kwargs.tests = 0"):
        CodeTask(tests=0)
    with pytest.raises(EnvError, match=r"env.kwargs.time_limit_s = 0"):
        CodeTask(time_limit_s=0)
