"""Tools in the sandbox: the expressions that ran past the old in-process limits, a user's
tool that holds the GIL, the code interpreter (with and without a session per episode), and a
vector step whose tool calls run at once. Each failure is one tool-error turn, the env goes
on, and nothing a call started is left running."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from test_sandbox import require_bubblewrap, sandbox_processes
from test_tool_env import _question, _say

from agentenv_jax.envs.sandbox import close_shared_pools
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import ArithmeticTask
from agentenv_jax.envs.text.tool_tasks import ToolArithmeticTask, ToolTask, resolve_tools

pytestmark = pytest.mark.slow  # every test starts sandbox workers
TIME_LIMIT = "error: python killed at the (wall-clock|CPU-time) limit of 1 s"


@pytest.fixture(autouse=True)
def fresh_pools():
    require_bubblewrap()
    yield
    close_shared_pools()


def call(tool: str, argument: str, name: str = "expression") -> str:
    import json

    return f"<tool_call>{json.dumps({'name': tool, 'arguments': {name: argument}})}</tool_call>"


def task(tools=("python",), **kwargs) -> ToolArithmeticTask:
    made = ToolArithmeticTask(tools=list(tools), **kwargs)
    made.reset(np.random.default_rng(0))
    return made


@pytest.mark.parametrize(
    ("expression", "error", "time_limit_s"),
    [
        # ~2.5 s of work in C (20 s for the 2000 version) past a 1 s limit.
        ("sum([[0]*1000]*1000, [])", TIME_LIMIT, 1.0),
        ("sum([[0]*2000]*2000, [])", TIME_LIMIT, 1.0),
        # A 27 MB result, built from references the size checks counted as 3,000 elements. Its
        # text takes ~0.5 s to make, more than 1 s on cores shared with training runs (.ci/run,
        # 8 Dec 2026): a limit that leaves the size check to stop it.
        ("[[0]*3000]*3000", "error: python returned more than 65,536 bytes", 10.0),
        # 12 s of work in one call of round().
        ("round(1, -10**7)", TIME_LIMIT, 1.0),
        # A gigabyte asked for by formatting.
        ("'%999999999d' % 1", r"error: python ran out of memory \(limit 256 MB\)", 1.0),
    ],
)
def test_the_expressions_that_escaped_the_old_limits_are_stopped(expression, error, time_limit_s):
    tools = task(time_limit_s=time_limit_s)
    reply = tools.reply(call("python", expression))
    # Work in C ends at whichever of the two 1 s limits, CPU time or wall clock, comes first.
    assert re.fullmatch(error, reply.text) and reply.role == "tool" and not reply.done
    assert not sandbox_processes(tools._pool)
    # The env goes on: the next call is answered.
    assert tools.reply(call("python", "6 * 7")).text == "42"


def test_the_built_in_tools_answer_from_the_sandbox():
    tools = task(("calculator", "python"))
    assert tools.reply(call("calculator", "(17 + 25) * 3")).text == "126"
    assert tools.reply(call("python", "sorted([3, 1, 2])[::-1]")).text == "[3, 2, 1]"
    refused = tools.reply(call("python", "__import__('os')"))
    assert refused.text == "error: the python tool does not take a call of '__import__'"
    assert tools._pool.isolation == "bubblewrap"


def test_a_users_tool_that_holds_the_gil_is_stopped_when_it_opts_in():
    tools = task(
        (
            {"name": "sandbox_tools:busy", "sandbox": True},
            {"name": "sandbox_tools:where", "sandbox": True},
        ),
        time_limit_s=1.0,
    )
    reply = tools.reply(call("busy", "1"))
    assert re.fullmatch(TIME_LIMIT.replace("python", "busy"), reply.text)
    os.environ["AGENTENV_TEST_SECRET"] = "x"
    try:
        where = tools.reply(call("where", "")).text
    finally:
        del os.environ["AGENTENV_TEST_SECRET"]
    uid, secret = (part.split("=")[1] for part in where.split())
    assert int(uid) >= 2**31 and secret == "False"


def test_the_code_tool_returns_the_programs_output_and_status():
    # CPU time above the wall clock's 2 s, so that the loop below meets the wall clock first
    # (with the two equal, an idle machine gives it its CPU seconds first: SIGXCPU).
    tools = task(("code",), time_limit_s=2.0, sandbox={"cpu_s": 4.0})
    assert "- code(code): Runs a Python program" in tools.reset(np.random.default_rng(0))
    ran = tools.reply(call("code", "print(sum(range(10)))", "code"))
    assert ran.text == "exit status: 0\nstdout:\n45\n" and ran.reward == 0.0
    failed = tools.reply(call("code", "x = 1\nraise KeyError('k')", "code"))
    assert failed.text.startswith("exit status: 1\nstdout:\n\nstderr:\nTraceback")
    assert failed.text.endswith("KeyError: 'k'\n")
    looped = tools.reply(call("code", "while True: pass", "code"))
    assert looped.text.startswith("exit status: killed at the wall-clock limit of 2 s")
    long = tools.reply(call("code", "print('x' * 5000)", "code"))
    assert long.text.endswith("... (4,024 more characters)")
    # Without a session, nothing carries over from one program to the next.
    tools.reply(call("code", "total = 41", "code"))
    assert "NameError" in tools.reply(call("code", "print(total + 1)", "code")).text


def test_a_code_session_keeps_an_episodes_state_and_ends_with_it():
    tools = task(("code",), code_session=True)
    tools.reply(call("code", "total = 41\nprint('set')", "code"))
    assert tools.reply(call("code", "print(total + 1)", "code")).text == (
        "exit status: 0\nstdout:\n42\n"
    )
    tools.reset(np.random.default_rng(1))
    assert "NameError" in tools.reply(call("code", "print(total)", "code")).text


def test_a_vector_steps_tool_calls_run_at_once():
    tools = [
        ToolTask(
            ArithmeticTask(),
            resolve_tools([{"name": "sandbox_tools:clock", "sandbox": True}]),
            time_limit_s=5.0,
            sandbox={"workers": 8},
        )
        for _ in range(8)
    ]
    replies = ToolTask.reply_batch(tools, [call("clock", "1")] * 8, [np.zeros(0, np.int32)] * 8)
    assert all(not reply.text.startswith("error") for reply in replies), [r.text for r in replies]
    spans = [tuple(map(float, reply.text.split())) for reply in replies]
    # Every call was running while every other one was: the latest start is before the
    # earliest end (one after another, each would start after the one before had ended).
    assert max(start for start, _ in spans) < min(end for _, end in spans)


def test_tool_settings_are_checked():
    with pytest.raises(EnvError, match=r"env.kwargs.tools\[0\].sandbox = 'yes'"):
        resolve_tools([{"name": "sandbox_tools:where", "sandbox": "yes"}])
    with pytest.raises(EnvError, match=r"env.kwargs.tools\[1\] = \{'function'"):
        resolve_tools(["calculator", {"function": "sandbox_tools:where"}])
    with pytest.raises(EnvError, match=r"env.kwargs.sandbox.isolation = 'vm'"):
        ToolArithmeticTask(sandbox={"isolation": "vm"})
    with pytest.raises(EnvError, match=r"env.kwargs.code_session = 'yes'"):
        ToolArithmeticTask(tools=["code"], code_session="yes")


def test_a_hostile_program_is_one_tool_turn_and_the_env_goes_on():
    from agentenv_jax.envs.text.registry import make_text_vector_env

    env = make_text_vector_env(
        "agentenv_jax/ToolArithmetic-v0",
        1,
        {"tools": ["code"], "response_length": 160, "time_limit_s": 1.0},
    )
    env.reset(seed=2)
    bomb = "import os\nwhile True:\n    os.fork()"

    _, reward, terminated, truncated, _ = env.step(_say(env, call("code", bomb, "code")))
    assert not terminated[0] and not truncated[0] and reward[0] == 0.0
    # Its forks are refused past the process limit (or it is killed at the time limit).
    turn = env.transcript(0).split("\ntool: ")[-1]
    assert re.match(r"exit status: (1\n|killed)", turn)
    assert not sandbox_processes(env._tasks[0]._pool)
    _, reward, terminated, _, _ = env.step(_say(env, str(eval(_question(env)))))  # noqa: S307
    assert reward[0] == 1.0 and terminated[0]


HOSTILE = {
    "an infinite loop": "while True:\n    pass",
    "a loop in C holding the GIL": "sum([[0] * 4000] * 4000, [])",
    "a memory bomb": "x = bytearray(8 << 30)",
    "a fork bomb": "import os\nwhile True:\n    os.fork()",
    "1 GB of output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "a 10 GB file": "with open('big', 'wb') as f:\n    for _ in range(10240):\n        f.write(bytes(1 << 20))",
    "reading /etc/shadow": "print(open('/etc/shadow').read())",
    "writing outside its folder": "open('/usr/evil', 'w').write('x')",
    "connecting out": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
    "killing its parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "sleeping past the limit": "import time\ntime.sleep(60)",
}


@pytest.mark.parametrize("program", HOSTILE.values(), ids=HOSTILE.keys())
def test_each_hostile_program_is_one_error_turn_of_the_code_tool(program):
    tools = task(("code",), time_limit_s=1.0, tool_error_reward=-0.5)
    reply = tools.reply(call("code", program, "code"))
    # One tool turn that says the program failed, with the error reward; the episode goes on.
    assert reply.role == "tool" and not reply.done and reply.reward == -0.5
    assert re.match(r"exit status: (1\n|killed)", reply.text), reply.text[:200]
    assert not sandbox_processes(tools._pool)
    assert tools.reply(call("code", "print(6 * 7)", "code")).text == "exit status: 0\nstdout:\n42\n"
