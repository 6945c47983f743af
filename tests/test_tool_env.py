"""Tools in text envs: the calculator and python tools evaluate by syntax tree with bounded work
(never `eval`), a tool call is parsed from its tag, and `agentenv_jax/ToolArithmetic-v0`
answers a scripted policy (not a learned one) that calls the calculator, reads the result in
a tool turn and answers: reward 1. A tool that raises, runs too long or returns megabytes is
one tool-error turn and the episode goes on."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.registry import make_text_vector_env
from agentenv_jax.envs.text.tools import (
    MAX_RESULT,
    ToolError,
    calculator,
    parse_tool_call,
    python,
    run_tool,
)

TOOL_ENV = "agentenv_jax/ToolArithmetic-v0"


def broken_tool(expression: str) -> str:
    """A user's tool that raises."""
    raise RuntimeError("the tool broke")


def slow_tool(expression: str) -> str:
    """A user's tool that runs far past its time limit."""
    time.sleep(30)
    return "late"


def huge_tool(expression: str) -> str:
    """A user's tool that returns megabytes."""
    return "x" * 5_000_000


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17 + 25", "42"),
        ("(123 * 456) - 7", "56081"),
        ("2 ** 10 // 3 % 7", "5"),
        ("7 / 2", "3.5"),
        ("-(-3) + +4", "7"),
        ("1e3 / 4", "250"),
    ],
)
def test_the_calculator_does_arithmetic(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "not Call expressions"),
        ("(1).__class__", "not Attribute expressions"),
        ("x + 1", "not the name 'x'"),
        ("2 ** 100000", "a power larger than"),
        ("(10 ** 700) * (10 ** 700)", "a product larger than"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an expression"),
        ("1" * 300, "longer than 256 characters"),
        ("10.0 ** 400", "too large for a float"),
        ("'a' * 3", "not Constant expressions"),
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, message):
    with pytest.raises(ToolError, match=re.escape(message)):
        calculator(expression)


def test_the_python_tool_evaluates_a_bounded_expression():
    assert python("sorted([3, 1, 2])[::-1]") == "[3, 2, 1]"
    assert python("max(abs(-4), len('abc')) if 2 > 1 and not False else 0") == "4"
    assert python("sum(range(101))") == "5050"
    assert python("divmod(17, 5)") == "(3, 2)"
    for refused, message in [
        ("[x for x in range(3)]", "ListComp"),
        ("(lambda: 1)()", "Call"),
        ("open('/etc/passwd')", "a call of 'open'"),
        ("'ab' * 100000", "a sequence longer than"),
        ("range(10 ** 9)", "a range longer than"),
        ("().__class__.__bases__", "Attribute"),
    ]:
        with pytest.raises(ToolError, match=re.escape(message)):
            python(refused)


def test_a_tool_call_is_read_from_its_tag():
    message = 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    assert parse_tool_call(message) == ("calculator", {"expression": "2*3"})
    assert parse_tool_call("The answer is 6.") is None
    with pytest.raises(ToolError, match="not JSON"):
        parse_tool_call("<tool_call>{name: calculator}</tool_call>")
    with pytest.raises(ToolError, match='"name"'):
        parse_tool_call('<tool_call>["calculator"]</tool_call>')


def test_a_failing_tool_is_an_error_text_not_an_exception():
    tools = {"broken": broken_tool, "slow": slow_tool, "huge": huge_tool, "calc": calculator}
    assert run_tool(tools, "calc", {"expression": "6*7"}) == ("42", True)
    for name, arguments, message in [
        ("broken", {"expression": "1"}, "broken raised RuntimeError: the tool broke"),
        ("slow", {"expression": "1"}, "slow ran past its time limit of 0.2 s"),
        (
            "huge",
            {"expression": "1"},
            f"huge returned 5,000,000 characters (at most {MAX_RESULT:,})",
        ),
        ("calc", {"expression": "1/0"}, "error: division by zero"),
        ("calc", {"formula": "1"}, "calc raised TypeError"),
        ("search", {}, "no tool 'search'; tools: broken, slow, huge, calc"),
    ]:
        text, ok = run_tool(tools, name, arguments, time_limit_s=0.2)
        assert not ok and message in text, text
    # The tool runner still answers after giving up on a call.
    assert run_tool(tools, "calc", {"expression": "1+1"}) == ("2", True)


# -- the env, with a scripted policy ------------------------------------------------------------


def _say(env, text: str) -> np.ndarray:
    """One message per env: `text`'s tokens, EOS, then padding."""
    tokens = env.tokenizer.encode(text).tolist() + [env.tokenizer.eos_id]
    assert len(tokens) <= env.text_spec.response_length, text
    row = np.full(env.text_spec.response_length, env.tokenizer.pad_id, np.int32)
    row[: len(tokens)] = tokens
    return row[None]


def _question(env) -> str:
    return re.search(r"What is (\d+[-+*]\d+)\?", env.transcript(0)).group(1)


def _call(expression: str, tool: str = "calculator") -> str:
    return f'<tool_call>{{"name": "{tool}", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


@pytest.fixture(params=["bytes", "smollm2"])
def tokenizer(request):
    if request.param == "bytes":
        return None
    from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer
    from agentenv_jax.networks.text_models import SMOLLM2, pretrained_path, pretrained_spec

    return load_tokenizer(str(pretrained_path(SMOLLM2)), pretrained_spec(SMOLLM2).vocab_size)


@pytest.mark.slow  # the built-in tools start the sandbox's workers
def test_a_scripted_policy_calls_the_calculator_and_answers(tokenizer):
    env = make_text_vector_env(TOOL_ENV, 1, {"response_length": 128}, tokenizer)
    env.reset(seed=3)
    assert "Tools:\n- calculator(expression)" in env.transcript(0)
    question = _question(env)
    obs, reward, terminated, truncated, _ = env.step(_say(env, _call(question)))
    value = str(eval(question))  # noqa: S307 - the test's own check of the env's numbers
    assert reward[0] == 0.0 and not terminated[0] and not truncated[0]
    assert env.transcript(0).endswith(f"tool: {value}")
    # The next context holds the call's own tokens, then the result's.
    context = obs[0].tolist()

    def at(ids: list[int]) -> list[int]:
        return [i for i in range(len(context)) if context[i : i + len(ids)] == ids]

    call = _say(env, _call(question))[0].tolist()[: len(env.tokenizer.encode(_call(question)))]
    calls, results = at(call), at(env.tokenizer.encode(value).tolist())
    assert calls and results and results[-1] > calls[-1] + len(call)
    # ...rendered as a tool turn, as the template renders one (bytes: behind "tool: ").
    prompt = env.transcript(0).split("\nagent: ")[0]
    messages = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": _call(question)},
    ]
    tool_turn = env.tokenizer.after_message(messages, value, "tool").tolist()
    assert tool_turn != env.tokenizer.after_message(messages, value, "user").tolist()
    assert context[-len(tool_turn) :] == tool_turn
    _, reward, terminated, _, info = env.step(_say(env, value))
    assert reward[0] == 1.0 and terminated[0] and info["success"][0]
    assert info["final_info"]["turns"][0] == 2


@pytest.mark.slow  # the calculator starts the sandbox's workers
@pytest.mark.parametrize(
    ("tool", "error"),
    [
        ("test_tool_env:broken_tool", "broken_tool raised RuntimeError"),
        ("test_tool_env:slow_tool", "slow_tool ran past its time limit"),
        ("test_tool_env:huge_tool", "huge_tool returned 5,000,000 characters"),
    ],
)
def test_a_failing_tool_is_one_error_turn_and_the_episode_goes_on(tool, error):
    env = make_text_vector_env(
        TOOL_ENV,
        1,
        {
            "tools": ["calculator", tool],
            "tool_error_reward": -0.1,
            "time_limit_s": 0.3,
            "response_length": 128,
        },
    )
    env.reset(seed=4)
    name = tool.partition(":")[2]
    _, reward, terminated, truncated, _ = env.step(_say(env, _call("1", name)))
    assert reward[0] == pytest.approx(-0.1) and not terminated[0] and not truncated[0]
    assert error in env.transcript(0).splitlines()[-1]
    question = _question(env)
    _, reward, terminated, _, _ = env.step(_say(env, str(eval(question))))  # noqa: S307
    assert reward[0] == 1.0 and terminated[0]


def test_bad_tool_settings_name_the_field():
    with pytest.raises(EnvError, match=r"env.kwargs.tools: 'no_such_module:f' is neither"):
        make_text_vector_env(TOOL_ENV, 1, {"tools": ["no_such_module:f"]})
    with pytest.raises(EnvError, match=r"env.kwargs.tools = \[\]"):
        make_text_vector_env(TOOL_ENV, 1, {"tools": []})
    with pytest.raises(EnvError, match=r"env.kwargs.time_limit_s = 0"):
        make_text_vector_env(TOOL_ENV, 1, {"time_limit_s": 0})


@pytest.mark.slow  # the built-in tools start the sandbox's workers
def test_only_the_policys_own_tokens_get_a_gradient():
    """A hand-made tool dialogue's last row: the context holds the prompt, the policy's earlier
    tool call (trained in its own row) and the tool's result; the response is the answer. The
    token-level PPO loss's gradient with respect to the logits at every position is zero
    wherever a context token (tool and env tokens included) or padding is predicted, and not
    zero where the answer's tokens are."""
    import jax
    import jax.numpy as jnp
    from test_grpo_losses import hyperparams

    from agentenv_jax.algorithms.token_ppo import make_token_ppo_loss
    from agentenv_jax.config.schema import LanguageModelConfig
    from agentenv_jax.networks.language_model import scoring_functions
    from agentenv_jax.networks.text_models import language_model_for

    env = make_text_vector_env(TOOL_ENV, 1, {"context_length": 384, "response_length": 96})
    env.reset(seed=5)
    question = _question(env)
    context, *_ = env.step(_say(env, _call(question)))
    answer = _say(env, str(eval(question)))  # noqa: S307
    text = env.text_spec
    lm = language_model_for(LanguageModelConfig(size="tiny"), text)
    params = lm.init(jax.random.key(0))
    length = text.context_length + text.response_length
    offsets = jnp.zeros((1, length, text.vocab_size))

    def apply(p, tokens, mask, read=slice(None)):  # plus an offset to take gradients at
        logits, values = lm.apply(p["model"], tokens, mask, read)
        return logits + p["offsets"][:, read], values

    score, _ = scoring_functions(apply)
    bound = {"model": params, "offsets": offsets}
    scores = score(bound, context, answer, text.pad_id, text.eos_id)
    hp = hyperparams(vf_coef=0.0, ent_coef=0.01, kl_coef=0.1)
    loss = make_token_ppo_loss(
        lambda p, obs, action: tuple(score(p, obs, action, text.pad_id, text.eos_id)), hp
    )
    minibatch = {
        "obs": jnp.asarray(context),
        "action": jnp.asarray(answer),
        "log_prob": scores.log_probs,
        "ref_log_prob": scores.log_probs - 0.1,
        "value": jnp.zeros_like(scores.values),
        "return": jnp.zeros_like(scores.values),
        "advantage": scores.mask * 1.0,
        "mask": scores.mask,
    }
    grads = jax.grad(lambda p: loss(p, minibatch, jnp.float32(0.2))[0])(bound)["offsets"]
    per_position = np.abs(np.asarray(grads[0])).sum(-1)
    answer_tokens = int(np.asarray(scores.mask).sum())
    start = text.context_length - 1  # the position that predicts the answer's first token
    assert 1 < answer_tokens < text.response_length
    assert np.all(per_position[:start] == 0)  # prompt, tool call, tool result, padding
    assert np.all(per_position[start : start + answer_tokens] > 0)
    assert np.all(per_position[start + answer_tokens :] == 0)  # after the answer's EOS
    assert f"tool: {eval(question)}" in env.transcript(0)  # noqa: S307
