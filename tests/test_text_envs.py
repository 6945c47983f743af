"""Tests of the text envs: the byte tokenizer, the built-in tasks, `TextVectorEnv`'s token layout
and autoreset, the registry, and the reasoning-gym adapter (skipped without reasoning-gym)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from agentenv_jax.config.schema import EnvConfig
from agentenv_jax.envs.factory import check_first_reset, make_vector_env
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import (
    BYTE_TOKENIZER,
    REASONING_GYM_TASKS,
    TEXT_ENV_IDS,
    ArithmeticTask,
    GuessNumberTask,
    ReasoningGymTask,
    TaskReply,
    TextVectorEnv,
    close_text_env_id,
    is_text_env,
    make_text_vector_env,
    verification,
)
from agentenv_jax.envs.text.tasks import answer_text, extract_answer, question_split

TOK = BYTE_TOKENIZER
PAD, BOS, EOS = 256, 257, 258
GUESS_PROMPT = "Guess my number (1-8):"
INVALID_GUESS = "a number from 1 to 8"


def message(text: str, length: int, eos: bool = True) -> np.ndarray:
    """`text` as one action of `length` tokens: its bytes, EOS, then PAD."""
    ids = np.full(length, PAD, np.int32)
    data = list(text.encode())
    if eos:
        data.append(EOS)
    assert len(data) <= length, text
    ids[: len(data)] = data
    return ids


def messages(texts: list[str], length: int) -> np.ndarray:
    return np.stack([message(text, length) for text in texts])


def byte_ids(text: str) -> list[int]:
    return list(text.encode())


def left_padded(tokens: list[int], length: int) -> np.ndarray:
    return np.array([PAD] * (length - len(tokens)) + tokens, np.int32)


def arithmetic_answer(prompt: str) -> int:
    """The answer to an ArithmeticTask prompt such as `"12*3="`, computed independently."""
    match = re.fullmatch(r"(\d+)([+*-])(\d+)=", prompt)
    assert match, prompt
    left, symbol, right = int(match[1]), match[2], int(match[3])
    return {"+": left + right, "-": left - right, "*": left * right}[symbol]


def arithmetic_env(num_envs: int = 2, **kwargs) -> TextVectorEnv:
    kwargs = {"context_length": 16, "response_length": 4} | kwargs
    return make_text_vector_env("agentenv_jax/Arithmetic-v0", num_envs, kwargs)


def guess_env(num_envs: int = 1, **kwargs) -> TextVectorEnv:
    return make_text_vector_env("agentenv_jax/GuessNumber-v0", num_envs, kwargs)


# --- tokenizer ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ids",
    [
        ("hi", [104, 105]),
        ("", []),
        ("é€", [0xC3, 0xA9, 0xE2, 0x82, 0xAC]),
        ("a\nb", [97, 10, 98]),
    ],
)
def test_byte_tokenizer_encodes_utf8_bytes_and_round_trips(text, ids):
    encoded = TOK.encode(text)
    assert encoded.dtype == np.int32
    assert encoded.tolist() == ids
    assert TOK.decode(encoded) == text


def test_byte_tokenizer_decode_stops_at_eos_and_skips_specials():
    ids = [BOS, 97, PAD, 259, 98, EOS, 99, EOS]
    assert TOK.decode(np.array(ids)) == "ab"
    assert TOK.decode(np.array([EOS, 97])) == ""
    assert TOK.decode(np.array([0xFF, 97])) == "\ufffda"  # invalid UTF-8
    assert TOK.decode(np.array([0xC3, EOS, 0xA9])) == "\ufffd"  # a character cut by EOS
    with pytest.raises(EnvError, match="0..259"):
        TOK.decode(np.array([97, 260]))
    with pytest.raises(EnvError, match="0..259"):
        TOK.decode(np.array([-1]))


def test_byte_tokenizer_text_spec():
    spec = TOK.text_spec(32, 8)
    assert (spec.vocab_size, spec.context_length, spec.response_length) == (260, 32, 8)
    assert (spec.pad_id, spec.bos_id, spec.eos_id) == (PAD, BOS, EOS)
    assert spec.vocab_size % 4 == 0  # shards over a 4-way model axis


# --- tasks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("operations", ["+", "-", "*", "+-*"])
def test_arithmetic_task_rewards(operations):
    task = ArithmeticTask(max_operand=20, operations=operations, format_reward=0.25)
    assert task.max_turns == 1
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(30):
        prompt = task.reset(rng)
        answer = arithmetic_answer(prompt)
        seen.add(re.fullmatch(r"\d+([+*-])\d+=", prompt)[1])
        assert task.reply(str(answer)) == TaskReply(None, 1.0, True, True)
        assert task.reply(f"  {answer}\n") == TaskReply(None, 1.0, True, True)
        assert task.reply(str(answer + 1)) == TaskReply(None, 0.25, True, False)
        assert task.reply(f"{answer}.0") == TaskReply(None, 0.0, True, False)
        assert task.reply(f"{answer} apples") == TaskReply(None, 0.0, True, False)
        assert task.reply("") == TaskReply(None, 0.0, True, False)
    assert seen == set(operations)


def test_arithmetic_task_hand_cases():
    task = ArithmeticTask(max_operand=9, operations="-")
    rng = np.random.default_rng(0)
    prompts = [task.reset(rng) for _ in range(200)]
    assert all(re.fullmatch(r"\d-\d=", p) for p in prompts)
    # Operands cover 0..9 and nothing else; differences go negative.
    assert {int(p[0]) for p in prompts} == set(range(10))
    assert {int(p[2]) for p in prompts} == set(range(10))
    while task.reset(rng) != "2-5=":
        pass
    assert task.reply("-3").reward == 1.0
    assert task.reply("-03").reward == 1.0  # checked by value
    assert task.reply("3").reward == pytest.approx(0.1)
    assert task.reply("three").reward == 0.0
    assert task.reply("٣").reward == 0.0  # not ASCII digits


@pytest.mark.parametrize(
    ("message", "answer_format", "value"),
    [
        (" -7", "exact", -7.0),
        ("7.", "exact", None),
        ("17 + 25 = 42.", "last_number", 42.0),
        ("3-2=1", "last_number", 1.0),
        ("That is 1,234 apples", "last_number", 1234.0),
        ("x = -5, not 2.5 or 3", "last_number", 3.0),
        ("no number here", "last_number", None),
        (r"first \boxed{\frac{1}{2}}, then \boxed{ 42 }", "boxed", 42.0),
        (r"\boxed{-1,000.5}", "boxed", -1000.5),
        (r"\boxed{x + 1}", "boxed", None),
        (r"\boxed{42", "boxed", None),
        ("42", "boxed", None),
    ],
)
def test_answers_are_extracted_as_their_format_says(message, answer_format, value):
    assert extract_answer(message, answer_format) == value


def test_a_chat_models_sentence_is_scored_by_its_last_number():
    task = ArithmeticTask(max_operand=9, operations="+", answer_format="last_number")
    rng = np.random.default_rng(0)
    while task.reset(rng) != "3+4=":
        pass
    assert task.reply("3 + 4 = 7").reward == 1.0
    assert task.reply("The sum of 3 and 4 is 7.").success
    assert task.reply("3 + 4 = 8").reward == pytest.approx(0.1)
    with pytest.raises(EnvError, match="env.kwargs.answer_format = 'last'"):
        ArithmeticTask(answer_format="last")


@pytest.mark.parametrize("target", [1, 5, 8])
def test_guess_number_task_replies(target):
    task = GuessNumberTask(max_number=8, max_turns=4)
    assert task.max_turns == 4
    rng = np.random.default_rng(0)
    # The target is whatever the rng draws; draw until it is the one under test (replies
    # leave the task as it was, so trying every guess finds it).
    while True:
        assert task.reset(rng) == GUESS_PROMPT
        if task.reply(str(target)).done:
            break
    for guess in range(1, 9):
        reply = task.reply(str(guess))
        if guess < target:
            assert reply == TaskReply("higher", 0.0, False, False)
        elif guess > target:
            assert reply == TaskReply("lower", 0.0, False, False)
        else:
            assert reply == TaskReply(None, 1.0, True, True)
    for garbled in ["0", "9", "-1", "four", "", "4.5"]:
        assert task.reply(garbled) == TaskReply(INVALID_GUESS, 0.0, False, False)
    assert task.reply(f" {target} ").success


def test_guess_number_targets_cover_the_range():
    task = GuessNumberTask(max_number=5)
    rng = np.random.default_rng(3)
    targets = set()
    for _ in range(100):
        task.reset(rng)
        targets.add(next(g for g in range(1, 6) if task.reply(str(g)).done))
    assert targets == {1, 2, 3, 4, 5}


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: ArithmeticTask(max_operand=0), "env.kwargs.max_operand = 0"),
        (lambda: ArithmeticTask(max_operand="9"), "env.kwargs.max_operand = '9'"),
        (lambda: ArithmeticTask(max_operand=True), "env.kwargs.max_operand = True"),
        (lambda: ArithmeticTask(operations="/"), "env.kwargs.operations = '/'"),
        (lambda: ArithmeticTask(operations=""), "env.kwargs.operations = ''"),
        (lambda: ArithmeticTask(format_reward=1.0), "env.kwargs.format_reward = 1.0"),
        (lambda: ArithmeticTask(format_reward=-0.1), "env.kwargs.format_reward = -0.1"),
        (lambda: GuessNumberTask(max_number=0), "env.kwargs.max_number = 0"),
        (lambda: GuessNumberTask(max_turns=0), "env.kwargs.max_turns = 0"),
        (lambda: GuessNumberTask(max_turns=2.0), "env.kwargs.max_turns = 2.0"),
    ],
)
def test_task_kwargs_errors_name_the_field(make, field):
    with pytest.raises(EnvError, match=re.escape(field)):
        make()


# --- TextVectorEnv ------------------------------------------------------------------------------


def test_spaces_and_containment():
    env = arithmetic_env(3)
    assert env.metadata["autoreset_mode"].name == "SAME_STEP"
    assert env.single_observation_space.shape == (16,)
    assert env.single_observation_space.dtype == np.int32
    assert env.single_observation_space.high.max() == 259
    assert env.single_action_space.nvec.tolist() == [260] * 4
    assert env.observation_space.shape == (3, 16)
    assert env.action_space.shape == (3, 4)
    assert env.text_spec == TOK.text_spec(16, 4)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.int32 and obs in env.observation_space
    assert info == {}
    env.action_space.seed(0)
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert obs in env.observation_space
        assert all(row in env.single_observation_space for row in obs)
        assert all(row in env.single_observation_space for row in info["final_obs"])
        assert reward.dtype == np.float32 and reward.shape == (3,)
        assert terminated.dtype == bool and truncated.dtype == bool
        assert terminated.all() and not truncated.any()  # single turn


def test_observation_is_left_padded_bos_prompt():
    env = arithmetic_env(2)
    obs, _ = env.reset(seed=0)
    for i in range(2):
        prompt = env.transcript(i)
        assert re.fullmatch(r"\d\+\d=", prompt)
        expected = left_padded([BOS, *byte_ids(prompt)], 16)
        np.testing.assert_array_equal(obs[i], expected)
        assert obs[i, :11].tolist() == [PAD] * 11


def test_turns_join_with_eos_and_the_oldest_tokens_are_cut():
    env = guess_env(1, context_length=64, response_length=4, max_turns=4)
    obs, _ = env.reset(seed=0)
    prompt = [BOS, *byte_ids(GUESS_PROMPT)]  # 23 tokens
    np.testing.assert_array_equal(obs[0], left_padded(prompt, 64))
    turn = [*byte_ids("0"), EOS, *byte_ids(INVALID_GUESS)]  # 22 tokens
    obs, reward, terminated, truncated, info = env.step(messages(["0"], 4))
    assert reward.tolist() == [0.0] and not terminated[0] and not truncated[0]
    assert "final_obs" not in info
    np.testing.assert_array_equal(obs[0], left_padded(prompt + turn, 64))
    assert obs[0, :19].tolist() == [PAD] * 19
    # 23 + 2 * 22 = 67 tokens: the newest 64 stay, BOS and "Gu" are cut.
    obs, *_ = env.step(messages(["0"], 4))
    np.testing.assert_array_equal(obs[0], np.array((prompt + turn + turn)[3:], np.int32))
    assert env.transcript(0) == "\n".join(
        [GUESS_PROMPT, "agent: 0", f"env: {INVALID_GUESS}", "agent: 0", f"env: {INVALID_GUESS}"]
    )


def test_message_ends_at_eos_or_fills_the_response():
    env = guess_env(3, response_length=4)
    env.reset(seed=0)
    actions = np.array(
        [
            [ord("0"), EOS, ord("7"), ord("7")],  # after EOS: ignored
            [ord(" "), ord("0"), ord(" "), ord("x")],  # no EOS: all 4 tokens
            [EOS, PAD, PAD, PAD],  # empty message
        ],
        np.int32,
    )
    _, _, _, _, info = env.step(actions)
    assert info["response_tokens"].tolist() == [2, 4, 1]
    assert info["response_tokens"].dtype == np.int32
    assert env.transcript(0).splitlines()[1] == "agent: 0"
    assert env.transcript(1).splitlines()[1] == "agent:  0 x"
    assert env.transcript(2).splitlines()[1] == "agent: "


def test_prompt_longer_than_context_is_an_error():
    # BOS + "3+4=" is 5 tokens, which must fit in context_length - 1.
    with pytest.raises(EnvError, match=r"env\.kwargs\.context_length = 5 .* 5 tokens"):
        arithmetic_env(1, context_length=5).reset(seed=0)
    obs, _ = arithmetic_env(1, context_length=6).reset(seed=0)
    assert obs[0, :2].tolist() == [PAD, BOS]


def test_a_context_too_short_at_start_up_names_the_setting_not_every_kwarg():
    # A long question template: the refusal must not echo it (all of env.kwargs) back.
    question = "Work it out step by step, then give the number alone. " * 40 + "{expression}="
    config = EnvConfig(
        id="agentenv_jax/Arithmetic-v0",
        kwargs={"max_operand": 4, "question": question, "context_length": 64},
    )
    env = make_vector_env(config, 2)
    with pytest.raises(EnvError) as err:
        check_first_reset(env, config)
    prompt_tokens = 1 + len(question) - len("{expression}") + len("3+4")  # BOS, single digits
    assert str(err.value) == (
        "env.id = 'agentenv_jax/Arithmetic-v0': env.kwargs.context_length = 64 is too short for "
        f"the prompt: {prompt_tokens} tokens (BOS included) need a context_length of at least "
        f"{prompt_tokens + 1} (the prompt begins {question[:40]!r})"
    )


def test_same_step_autoreset_returns_the_new_episode_and_final_obs():
    env = arithmetic_env(2)
    env.reset(seed=3)
    prompts = [env.transcript(0), env.transcript(1)]
    answers = [arithmetic_answer(p) for p in prompts]
    actions = messages([str(answers[0]), str(answers[1] + 1)], 4)
    obs, reward, terminated, truncated, info = env.step(actions)
    assert reward.tolist() == [1.0, pytest.approx(0.1)]
    assert terminated.tolist() == [True, True] and truncated.tolist() == [False, False]
    assert info["success"].tolist() == [True, False]
    assert info["_final_obs"].tolist() == [True, True]
    for i, text in enumerate([str(answers[0]), str(answers[1] + 1)]):
        ended = [BOS, *byte_ids(prompts[i]), *byte_ids(text), EOS]
        np.testing.assert_array_equal(info["final_obs"][i], left_padded(ended, 16))
        new_prompt = env.transcript(i)  # the next episode, just drawn
        np.testing.assert_array_equal(obs[i], left_padded([BOS, *byte_ids(new_prompt)], 16))
    assert info["final_info"]["success"].tolist() == [True, False]
    assert info["final_info"]["return"].tolist() == [1.0, pytest.approx(0.1)]
    assert list(env.finished_transcripts) == [
        (f"{prompts[0]}\nagent: {answers[0]}", True, 1.0),
        (f"{prompts[1]}\nagent: {answers[1] + 1}", False, pytest.approx(0.1)),
    ]


def test_guess_number_truncates_at_the_turn_limit():
    env = guess_env(2, max_turns=3)
    env.reset(seed=0)
    for _ in range(2):
        _, reward, terminated, truncated, info = env.step(messages(["0", "0"], 4))
        assert not terminated.any() and not truncated.any() and "final_obs" not in info
    obs, reward, terminated, truncated, info = env.step(messages(["0", "0"], 4))
    assert reward.tolist() == [0.0, 0.0]
    assert terminated.tolist() == [False, False] and truncated.tolist() == [True, True]
    assert info["success"].tolist() == [False, False]
    assert info["final_info"]["turns"].tolist() == [3, 3]
    prompt = [BOS, *byte_ids(GUESS_PROMPT)]
    turn = [*byte_ids("0"), EOS, *byte_ids(INVALID_GUESS)]
    np.testing.assert_array_equal(info["final_obs"][0], np.array((prompt + 3 * turn)[-64:]))
    np.testing.assert_array_equal(obs[0], left_padded(prompt, 64))
    transcript, success, episode_return = env.finished_transcripts[-1]
    assert transcript.count("agent: 0") == 3 and transcript.count(f"env: {INVALID_GUESS}") == 3
    assert (success, episode_return) == (False, 0.0)


def test_bisection_solves_every_guess_number_episode_in_the_turn_limit():
    env = guess_env(16, max_turns=4)
    env.reset(seed=7)
    low, high = np.ones(16, int), np.full(16, 8)
    solved, turns_seen = 0, []
    for _ in range(40):
        guess = (low + high) // 2
        _, reward, terminated, truncated, info = env.step(messages([str(g) for g in guess], 4))
        assert not truncated.any()
        for i in range(16):
            if terminated[i]:
                assert info["success"][i] and reward[i] == 1.0
                solved += 1
                turns_seen.append(info["final_info"]["turns"][i])
                low[i], high[i] = 1, 8
            else:
                reply = env.transcript(i).splitlines()[-1]
                if reply == "env: higher":
                    low[i] = guess[i] + 1
                else:
                    assert reply == "env: lower"
                    high[i] = guess[i] - 1
    assert solved >= 160  # at most 4 turns each
    assert max(turns_seen) == 4 and min(turns_seen) == 1


def test_group_envs_share_prompts_and_groups_differ():
    env = arithmetic_env(8, group_size=4, max_operand=99)
    env.reset(seed=11)
    for _ in range(3):
        prompts = [env.transcript(i) for i in range(8)]
        assert len(set(prompts[:4])) == 1 and len(set(prompts[4:])) == 1
        assert prompts[0] != prompts[4]
        env.step(messages(["1"] * 8, 4))
    # group_size 1: each env its own prompt stream.
    env = arithmetic_env(8, max_operand=99)
    env.reset(seed=11)
    assert len({env.transcript(i) for i in range(8)}) >= 6


def test_seeded_reset_is_reproducible():
    def rollout(env: TextVectorEnv, seed: int) -> list[np.ndarray]:
        obs, _ = env.reset(seed=seed)
        out = [obs]
        rng = np.random.default_rng(0)
        for _ in range(6):
            guesses = [str(g) for g in rng.integers(0, 10, size=4)]
            obs, reward, terminated, truncated, _ = env.step(messages(guesses, 4))
            out += [obs, reward, terminated, truncated]
        return out

    first = rollout(guess_env(4), seed=5)
    again = rollout(guess_env(4), seed=5)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    env = guess_env(4)
    assert all(np.array_equal(a, b) for a, b in zip(rollout(env, 5), first, strict=True))
    other = rollout(guess_env(4), seed=6)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_step_input_errors():
    env = arithmetic_env(2)
    with pytest.raises(Exception, match="reset"):
        env.step(messages(["1", "1"], 4))
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"\(2, 4\)"):
        env.step(np.zeros((2, 5), np.int32))
    with pytest.raises(EnvError, match="0..259"):
        env.step(np.full((2, 4), 260))
    with pytest.raises(EnvError, match="seed = -1"):
        env.reset(seed=-1)


# --- registry -----------------------------------------------------------------------------------


def test_registry_defaults_and_ids():
    arithmetic = make_text_vector_env("agentenv_jax/Arithmetic-v0", 2, {})
    assert (arithmetic.text_spec.context_length, arithmetic.text_spec.response_length) == (16, 4)
    guess = make_text_vector_env("agentenv_jax/GuessNumber-v0", 2, {"max_number": 4})
    assert (guess.text_spec.context_length, guess.text_spec.response_length) == (64, 4)
    guess.reset(seed=0)
    assert guess.transcript(0) == "Guess my number (1-4):"
    entry = TEXT_ENV_IDS["reasoning_gym/<dataset>"]
    assert (entry.context_length, entry.response_length) == (512, 16)
    assert is_text_env("agentenv_jax/Arithmetic-v0")
    assert is_text_env("agentenv_jax/GuessNumber-v0")
    assert is_text_env("reasoning_gym/basic_arithmetic")
    assert not is_text_env("CartPole-v1") and not is_text_env("agentenv_jax/Catch-v0")
    assert close_text_env_id("agentenv_jax/Arithmetc-v0") == "agentenv_jax/Arithmetic-v0"


@pytest.mark.parametrize(
    "env_id, num_envs, kwargs, pattern",
    [
        ("agentenv_jax/Arithmetc-v0", 2, {}, "did you mean 'agentenv_jax/Arithmetic-v0'"),
        (
            "agentenv_jax/Arithmetic-v0",
            2,
            {"context_len": 8},
            r"env\.kwargs\.context_len is not .*did you mean 'context_length'.*allowed: context_length, response_length, group_size, max_operand, operations, format_reward",
        ),
        ("agentenv_jax/GuessNumber-v0", 2, {"max_operand": 8}, r"env\.kwargs\.max_operand is not"),
        (
            "agentenv_jax/Arithmetic-v0",
            2,
            {"context_length": 1},
            r"env\.kwargs\.context_length = 1: expected an int >= 2",
        ),
        (
            "agentenv_jax/Arithmetic-v0",
            2,
            {"context_length": "16"},
            r"env\.kwargs\.context_length = '16'",
        ),
        (
            "agentenv_jax/Arithmetic-v0",
            2,
            {"response_length": 0},
            r"env\.kwargs\.response_length = 0",
        ),
        (
            "agentenv_jax/Arithmetic-v0",
            4,
            {"group_size": 3},
            r"env\.kwargs\.group_size = 3 must divide .* num_envs = 4",
        ),
        ("agentenv_jax/Arithmetic-v0", 4, {"group_size": 0}, r"env\.kwargs\.group_size = 0"),
        ("agentenv_jax/Arithmetic-v0", 0, {}, r"num_envs = 0"),
        ("agentenv_jax/GuessNumber-v0", 2, {"max_turns": -1}, r"env\.kwargs\.max_turns = -1"),
    ],
)
def test_registry_errors_name_the_field(env_id, num_envs, kwargs, pattern):
    with pytest.raises(EnvError, match=pattern):
        make_text_vector_env(env_id, num_envs, kwargs)


# --- reasoning-gym ------------------------------------------------------------------------------


def test_reasoning_gym_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails as if not installed
    with pytest.raises(EnvError, match=re.escape("pip install 'agentenv_jax[text]'")):
        ReasoningGymTask("basic_arithmetic")


@pytest.mark.parametrize("dataset", list(REASONING_GYM_TASKS))
def test_reasoning_gym_task_scores_its_own_answer(dataset):
    pytest.importorskip("reasoning_gym")
    task = ReasoningGymTask(dataset)
    assert task.max_turns == 1
    rng = np.random.default_rng(0)
    for _ in range(2):
        question = task.reset(rng)
        assert question == task.entry["question"] and len(question.encode()) < 511
        answer = task.entry["answer"]
        assert task.reply(answer) == TaskReply(None, 1.0, True, True)
        assert task.reply(f" {answer}\n").success  # whitespace stripped
        wrong = task.reply("no idea @@")
        assert wrong.done and not wrong.success and wrong.reward < 1.0


@pytest.mark.parametrize("dataset", list(REASONING_GYM_TASKS))
def test_reasoning_gym_env_rewards_the_right_answer(dataset):
    pytest.importorskip("reasoning_gym")
    tasks = [ReasoningGymTask(dataset) for _ in range(2)]
    env = TextVectorEnv(iter(tasks).__next__, 2, context_length=512, response_length=96)
    obs, _ = env.reset(seed=1)
    prompt = tasks[0].entry["question"]
    np.testing.assert_array_equal(obs[0], left_padded([BOS, *byte_ids(prompt)], 512))
    actions = messages([tasks[0].entry["answer"], "0 0 0"], 96)
    _, reward, terminated, _, info = env.step(actions)
    assert reward[0] == 1.0 and reward[1] < 1.0
    assert terminated.all() and info["success"].tolist() == [True, False]


def test_reasoning_gym_difficulty_kwargs_and_seeding():
    pytest.importorskip("reasoning_gym")
    kwargs = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+"])
    task = ReasoningGymTask(
        "basic_arithmetic", allow_parentheses=False, allow_negation=False, **kwargs
    )
    rng = np.random.default_rng(0)
    for _ in range(10):
        question = task.reset(rng)
        match = re.fullmatch(r"Calculate (\d+) \+ (\d+)\.", question)
        assert match, question
        assert task.entry["answer"] == str(int(match[1]) + int(match[2]))
    same = [ReasoningGymTask("chain_sum").reset(np.random.default_rng(4)) for _ in range(2)]
    assert same[0] == same[1]
    other = ReasoningGymTask("chain_sum", seed_offset=1).reset(np.random.default_rng(4))
    assert other != same[0]
    env = make_text_vector_env(
        "reasoning_gym/spell_backward", 4, {"group_size": 2, "max_word_len": 5}
    )
    env.reset(seed=0)
    prompts = [env.transcript(i) for i in range(4)]
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[0] != prompts[2]


def test_reasoning_gym_pass_through_dataset_and_unparseable_answers():
    pytest.importorskip("reasoning_gym")
    task = ReasoningGymTask("prime_factorization", max_value=50)
    task.reset(np.random.default_rng(0))
    # The dataset's scorer raises ValueError on text it cannot parse: a wrong answer here.
    assert task.reply("zzz") == TaskReply(None, 0.0, True, False)
    assert task.reply(task.entry["answer"]).success


@pytest.mark.parametrize(
    "make, pattern",
    [
        (
            lambda: ReasoningGymTask("basic_arithmetc"),
            "did you mean 'basic_arithmetic'.*tested: basic_arithmetic",
        ),
        (
            lambda: make_text_vector_env("reasoning_gym/nope", 1, {}),
            "no reasoning-gym dataset 'nope'",
        ),
        (
            lambda: ReasoningGymTask("basic_arithmetic", max_term=3),
            r"env\.kwargs\.max_term is not .*did you mean 'max_terms'",
        ),
        (
            lambda: ReasoningGymTask("basic_arithmetic", seed=3),
            r"env\.kwargs\.seed is set by the env",
        ),
        (lambda: ReasoningGymTask("chain_sum", size=3), r"env\.kwargs\.size is set by the env"),
        (lambda: ReasoningGymTask("chain_sum", seed_offset=-1), r"env\.kwargs\.seed_offset = -1"),
        (
            lambda: ReasoningGymTask("chain_sum", split="dev"),
            r"env\.kwargs\.split = 'dev' is not allowed: expected one of train, test",
        ),
        (
            lambda: ReasoningGymTask("chain_sum", answer_format="last"),
            r"env\.kwargs\.answer_format = 'last' is not allowed: expected one of dataset, "
            "last_number, boxed",
        ),
        (
            lambda: ReasoningGymTask("chain_sum", instruction=3),
            r"env\.kwargs\.instruction = 3: expected a string",
        ),
        (
            lambda: ReasoningGymTask("chain_sum", min_terms=5, max_terms=2),
            "AssertionError: max_terms must be >= min_terms",
        ),
        (
            lambda: make_text_vector_env("reasoning_gym/chain_sum", 1, {"max_turns": 2}),
            r"env\.kwargs\.max_turns is not .*allowed: context_length, response_length, group_size, "
            "seed_offset, split, test_fraction, answer_format, instruction, min_terms",
        ),
    ],
)
def test_reasoning_gym_errors(make, pattern):
    pytest.importorskip("reasoning_gym")
    with pytest.raises(EnvError, match=pattern):
        make()


@pytest.mark.parametrize(
    ("gold", "answer", "plain", "with_math_verify"),
    [
        ("28080", "28,080", True, True),
        ("28080", "28080.0", True, True),
        ("-7", "-7", True, True),
        ("42", "41", False, False),
        ("0.5", "1/2", False, True),  # math-verify reads the fraction
        ("0.5", r"\frac{1}{2}", False, True),
        ("3", "x + 1", False, False),
        ("3", "", False, False),
    ],
)
def test_numbers_match_with_and_without_math_verify(
    monkeypatch, gold, answer, plain, with_math_verify
):
    assert verification.plain_numbers_match(gold, answer) == plain
    if verification.math_verify() is not None:
        assert verification.numbers_match(gold, answer) == with_math_verify
    monkeypatch.setattr(verification, "math_verify", lambda: None)  # as if not installed
    assert verification.numbers_match(gold, answer) == plain
    assert not verification.numbers_match(gold, "1" * (verification.MAX_ANSWER_CHARS + 1))


def test_answer_text_cuts_the_answer_out():
    assert answer_text(" 42 \n", "exact") == "42"
    assert answer_text("17 + 25 = 42.", "last_number") == "42"
    assert answer_text(r"so \boxed{6*(98 - 54) - 34} it is", "boxed") == "6*(98 - 54) - 34"
    assert answer_text("no box", "boxed") is None


def test_reasoning_gym_word_problems_are_checked_on_the_extracted_number():
    pytest.importorskip("reasoning_gym")
    last = ReasoningGymTask("gsm_symbolic", answer_format="last_number")
    boxed = ReasoningGymTask("gsm_symbolic", answer_format="boxed")
    rng = np.random.default_rng(0)
    for _ in range(5):
        gold = int(last.reset(rng) and last.entry["answer"])
        assert last.reply(f"Adding up, the total is {gold:,}.").reward == 1.0
        assert last.reply(f"{gold} in all, or rather {gold + 1}").reward == 0.0
        assert last.reply("I cannot tell").reward == 0.0
        boxed.entry = last.entry
        assert boxed.reply(f"so \\boxed{{{gold}}} dollars").success
        assert not boxed.reply(str(gold)).success  # not boxed: no answer
    # The dataset's own scorer reads the first number of the whole message (0.01 if wrong).
    plain = ReasoningGymTask("gsm_symbolic")
    plain.entry = last.entry
    assert plain.reply(f"{gold - 1}, no: {gold}").reward == 0.01


def test_reasoning_gym_countdown_expressions_are_scored_by_the_dataset_inside_the_box():
    pytest.importorskip("reasoning_gym")
    task = ReasoningGymTask("countdown", answer_format="boxed")
    task.reset(np.random.default_rng(0))
    expression = task.entry["answer"]
    assert task.reply(f"I try: \\boxed{{{expression}}}").reward == 1.0
    assert task.reply(expression).reward == 0.0  # not boxed
    assert task.reply("\\boxed{1 + 1}").reward < 1.0


def test_question_split_is_a_function_of_the_text_and_holds_out_its_fraction():
    questions = [f"What is {a} + {b}?" for a in range(100) for b in range(100)]
    for fraction in (0.1, 0.5, 0.9):
        held_out = [q for q in questions if question_split(q, fraction) == "test"]
        # 10,000 questions: the share held out is the fraction to within ~4 standard errors.
        assert abs(len(held_out) / len(questions) - fraction) < 0.02, (fraction, len(held_out))
    # Nested: a question held out at 0.1 stays held out at 0.5.
    assert all(
        question_split(q, 0.5) == "test" for q in questions if question_split(q, 0.1) == "test"
    )
    # Spacing does not move a question to the other side.
    for question in questions[:200]:
        spaced = "  " + question.replace(" ", "\n  ") + " "
        assert question_split(spaced, 0.5) == question_split(question, 0.5)


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.1, True, "half"])
def test_reasoning_gym_test_fraction_out_of_range_is_refused(fraction):
    pytest.importorskip("reasoning_gym")
    with pytest.raises(EnvError, match=r"env.kwargs.test_fraction = .* strictly between 0 and 1"):
        ReasoningGymTask("chain_sum", test_fraction=fraction)


def test_reasoning_gym_test_split_is_held_out_and_instructions_are_appended():
    pytest.importorskip("reasoning_gym")
    # chain_sum of two one-digit numbers has 200 distinct questions (10 x 10 operands, + or -):
    # any 2,000 draws of one side repeat each of its questions many times, so a question on
    # both sides would show. Drawn by entry index alone, 86% of the test side's questions were
    # also training questions.
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    for dataset, kwargs, draws in (("gsm_symbolic", {}, 20), ("chain_sum", small, 2000)):
        train = ReasoningGymTask(dataset, **kwargs)
        test = ReasoningGymTask(dataset, split="test", instruction="Put it in \\boxed{}.", **kwargs)
        train_rng, test_rng = np.random.default_rng(3), np.random.default_rng(3)
        seen = {"train": set(), "test": set()}
        for _ in range(draws):
            question = train.reset(train_rng)
            held_out = test.reset(test_rng)
            assert held_out == test.entry["question"] + "\nPut it in \\boxed{}."
            assert question == train.entry["question"]
            seen["train"].add(question)
            seen["test"].add(test.entry["question"])
        assert not seen["train"] & seen["test"]
        if dataset == "chain_sum":
            # Both sides hold about half of the 200 questions, and together all of them.
            assert 70 <= len(seen["test"]) <= 130, len(seen["test"])
            assert len(seen["train"]) + len(seen["test"]) == 200
    # The same seeds give the same held-out problems: a fixed evaluation set.
    again = ReasoningGymTask("chain_sum", split="test")
    first = [again.reset(np.random.default_rng(s)) for s in range(3)]
    assert first == [again.reset(np.random.default_rng(s)) for s in range(3)]
