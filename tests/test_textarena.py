"""TextArena's single-player games as text envs (`textarena/<game>`), unchanged: GuessTheNumber
and TowerOfHanoi driven by a scripted policy that wins (reward 1) and one that loses, what the
dialogue shows, and bad ids, two-player games and games whose data is missing refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import BYTE_TOKENIZER, is_text_env, make_text_vector_env

from conftest import require_reference

require_reference("textarena")

LENGTHS = {"context_length": 2048, "response_length": 16}


def messages(texts, length=16):
    actions = np.full((len(texts), length), BYTE_TOKENIZER.pad_id, np.int32)
    for i, text in enumerate(texts):
        ids = BYTE_TOKENIZER.encode(text)
        actions[i, : len(ids)] = ids
        actions[i, len(ids)] = BYTE_TOKENIZER.eos_id
    return actions


def test_guess_the_number_binary_search_wins_and_repeating_a_guess_loses():
    assert is_text_env("textarena/GuessTheNumber-v0")
    env = make_text_vector_env("textarena/GuessTheNumber-v0", 2, LENGTHS)
    assert env.max_turns == 10  # the game's own limit
    env.reset(seed=0)
    low, high = np.ones(2, int), np.full(2, 20)
    returns, ended = np.zeros(2), np.zeros(2, bool)
    for _ in range(10):
        guesses = (low + high) // 2
        targets = [task.env.game_number for task in env._tasks]
        _, rewards, terminated, truncated, _ = env.step(messages([f"[{g}]" for g in guesses]))
        returns += np.where(ended, 0.0, rewards)
        ended |= terminated | truncated
        for i, (g, target) in enumerate(zip(guesses, targets, strict=True)):
            low[i], high[i] = (g + 1, high[i]) if g < target else (low[i], g - 1)
        if ended.all():
            break
    assert ended.all() and returns.tolist() == [1.0, 1.0]
    transcript = env.finished_transcripts[-1][0]
    assert transcript.startswith("You are Player 0. You are playing Guess The Number.")
    assert "env: The target number is" in transcript
    # The same guess again is an invalid move: the game forgives one, then ends the episode
    # with less than a win.
    env.reset(seed=1)
    for _ in range(3):
        _, rewards, terminated, _, info = env.step(messages(["[1]", "[1]"]))
    assert terminated.all() and not info["success"].any() and (rewards < 1).all()


def test_tower_of_hanoi_solved_by_its_moves_and_lost_by_a_wrong_one():
    env = make_text_vector_env("textarena/TowerOfHanoi-v0", 1, LENGTHS)
    env.reset(seed=0)
    disks = len(env._tasks[0].env.state.game_state["towers"]["A"])
    moves = []

    def solve(n, source, target, spare):
        if n:
            solve(n - 1, source, spare, target)
            moves.append(f"[{source} {target}]")
            solve(n - 1, spare, target, source)

    solve(disks, "A", "C", "B")
    for move in moves:
        _, rewards, terminated, _, _ = env.step(messages([move]))
    assert terminated.all() and rewards.tolist() == [1.0]
    env.reset(seed=0)
    for _ in range(2):  # from an empty tower; the game forgives one invalid move
        _, rewards, terminated, _, info = env.step(messages(["[C A]"]))
    assert terminated.all() and not info["success"].any() and rewards.tolist() == [0.0]


@pytest.mark.parametrize(
    ("game", "message"),
    [
        ("GuesTheNumber-v0", r"no TextArena game .*did you mean 'GuessTheNumber-v0'"),
        ("TicTacToe-v0", r"is not a single-player game .*self-play .* not supported yet"),
        ("Wordle-v0", r"needs data that is not installed: NLTK's 'words'"),
    ],
)
def test_bad_textarena_games_are_refused_by_name(game, message):
    with pytest.raises(EnvError, match=message):
        make_text_vector_env(f"textarena/{game}", 1, LENGTHS)
