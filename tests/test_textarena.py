"""TextArena's games as text envs (`textarena/<game>`), unchanged: GuessTheNumber and
TowerOfHanoi driven by a scripted policy that wins (reward 1) and one that loses; TicTacToe in
self-play, each game two envs (its seats), won by seat 0 and by seat 1, a draw, the turn limit,
and rounds under a group baseline; what the dialogues show; bad ids and games whose data is
missing refused by name; and a one-process self-play run that reconciles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentenv_jax.config import load_config
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import is_text_env, make_text_vector_env
from agentenv_jax.runtime.roles import check_frozen_opponent, check_group_baseline
from agentenv_jax.workflow.text_dialogues import sample_dialogues

from conftest import (
    byte_messages,
    require_reference,
    train_in_folder,
)

require_reference("textarena")

LENGTHS = {"context_length": 2048, "response_length": 16}


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
        _, rewards, terminated, truncated, _ = env.step(byte_messages([f"[{g}]" for g in guesses]))
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
        _, rewards, terminated, _, info = env.step(byte_messages(["[1]", "[1]"]))
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
        _, rewards, terminated, _, _ = env.step(byte_messages([move]))
    assert terminated.all() and rewards.tolist() == [1.0]
    env.reset(seed=0)
    for _ in range(2):  # from an empty tower; the game forgives one invalid move
        _, rewards, terminated, _, info = env.step(byte_messages(["[C A]"]))
    assert terminated.all() and not info["success"].any() and rewards.tolist() == [0.0]


@pytest.mark.parametrize(
    ("game", "message"),
    [
        ("GuesTheNumber-v0", r"no TextArena game .*did you mean 'GuessTheNumber-v0'"),
        ("Wordle-v0", r"needs data that is not installed: NLTK's 'words'"),
    ],
)
def test_bad_textarena_games_are_refused_by_name(game, message):
    with pytest.raises(EnvError, match=message):
        make_text_vector_env(f"textarena/{game}", 1, LENGTHS)


# Self-play: with group_size 2 and 4 envs, envs 0, 1 are seat 0 of games 0, 1, and envs 2, 3
# their seat 1. Seat 0 moves first.
SEAT_0, SEAT_1 = [0, 1], [2, 3]


def play(env, moves_0, moves_1):
    """Alternate the seats' moves (the same in both games); each step's outputs."""
    steps = []
    for turn in range(max(len(moves_0), len(moves_1)) * 2):
        seat_moves = moves_0 if turn % 2 == 0 else moves_1
        if turn // 2 >= len(seat_moves):
            break
        move = seat_moves[turn // 2]
        texts = [move, move, "idle", "idle"] if turn % 2 == 0 else ["idle", "idle", move, move]
        steps.append(env.step(byte_messages(texts)))
    return steps


def tictactoe(episode_groups=False, **kwargs):
    return make_text_vector_env(
        "textarena/TicTacToe-v0",
        4,
        LENGTHS | {"group_size": 2} | kwargs,
        episode_groups=episode_groups,
    )


def test_tictactoe_self_play_seats_take_turns_and_both_get_the_outcome():
    env = tictactoe()
    assert env.seats == 2 and env.reward_names == ("seat_0", "seat_1")
    env.reset(seed=0)
    # Seat 0 takes the top row; seat 1 answers 3 and 4.
    steps = play(env, ["[0]", "[1]", "[2]"], ["[3]", "[4]"])
    for n, (_, rewards, terminated, _, info) in enumerate(steps[:-1]):
        mover = SEAT_0 if n % 2 == 0 else SEAT_1
        assert np.flatnonzero(info["agent_acted"]).tolist() == mover  # the others are padding
        assert not terminated.any() and not rewards.any()
    _, rewards, terminated, _, info = steps[-1]
    assert terminated.all() and rewards.tolist() == [1, 1, -1, -1]
    # Seat 1's game ended on seat 0's move: a step with its reward and end, and no message.
    assert info["agent_acted"].all() and info["response_tokens"].tolist()[2:] == [0, 0]
    assert info["final_info"]["success"].tolist() == [True, True, False, False]
    terms = info["reward_terms"]
    assert terms[SEAT_0, 0].tolist() == [1, 1] and np.isnan(terms[SEAT_0, 1]).all()
    assert terms[SEAT_1, 1].tolist() == [-1, -1] and np.isnan(terms[SEAT_1, 0]).all()
    # Each seat's dialogue is its own view: seat 1 hears seat 0's moves as env turns.
    seat_1 = [t for t, _, _ in env.finished_transcripts if "You are Player 1" in t][0]
    assert "agent: [3]" in seat_1 and "Player 0 placed their symbol (O) in cell 0" in seat_1
    assert "agent: [0]" not in seat_1
    # Both seats started the next game together.
    assert [len(turns) for turns in env._turns] == [0] * 4


def test_tictactoe_self_play_seat_1_wins_and_a_full_board_is_a_draw():
    env = tictactoe()
    env.reset(seed=0)
    *_, (_, rewards, terminated, _, _) = play(env, ["[0]", "[1]", "[8]"], ["[3]", "[4]", "[5]"])
    assert terminated.all() and rewards.tolist() == [-1, -1, 1, 1]
    # O X O / O X X / X O O: nine moves, no line.
    *_, (_, rewards, terminated, _, info) = play(
        env, ["[0]", "[2]", "[3]", "[7]", "[8]"], ["[1]", "[4]", "[5]", "[6]"]
    )
    assert terminated.all() and rewards.tolist() == [0, 0, 0, 0]
    assert not info["final_info"]["success"].any()


def test_a_game_past_max_turns_moves_ends_as_a_draw_and_rounds_wait_for_every_game():
    env = tictactoe(episode_groups=True, max_turns=4)
    assert env.text_spec.episode_round == 4
    env.reset(seed=0)
    steps = play(env, ["[0]", "[1]"], ["[3]", "[4]"])
    _, rewards, terminated, _, info = steps[-1]
    assert terminated.all() and rewards.tolist() == [0, 0, 0, 0]  # cut at 4 moves
    # A game won in 5 moves under a round of 6: both seats wait for the round's last step.
    env = tictactoe(episode_groups=True, max_turns=6)
    env.reset(seed=0)
    steps = play(env, ["[0]", "[1]", "[2]"], ["[3]", "[4]"])
    assert steps[-1][2].all()
    _, _, terminated, truncated, info = env.step(byte_messages(["idle"] * 4))
    assert not info["agent_acted"].any() and not (terminated | truncated).any()
    assert [len(turns) for turns in env._turns] == [0] * 4  # the next round began


def test_a_frozen_opponent_plays_the_other_seat_and_the_seats_alternate_between_games():
    env = tictactoe(opponent="initial")
    assert env.needs_frozen_opponent
    env.reset(seed=0)
    with pytest.raises(EnvError, match="none was given to play its seat"):
        env.step(byte_messages(["idle"] * 4))
    env = tictactoe(opponent="initial")
    env.reset(seed=0)
    calls = []

    def opponent(obs, rows):
        calls.append((rows.tolist(), [env.tokenizer.decode(o) for o in obs]))
        move = ["[0]", "[1]", "[2]"][len(calls) - 1]
        return byte_messages([move] * rows.size)

    env.frozen_opponent = opponent
    # The first game: the policy plays seat 1 (envs 2 and 3), the opponent seat 0, moving
    # first; the policy's own messages for envs 0 and 1 are ignored.
    steps = [env.step(byte_messages(["[8]", "[8]", m, m])) for m in ("idle", "[3]", "idle")]
    steps += [env.step(byte_messages(["[8]", "[8]", "[4]", "[4]"]))]
    steps += [env.step(byte_messages(["[8]"] * 4))]
    assert [rows for rows, _ in calls] == [[0, 1]] * 3
    assert "You are Player 0" in calls[0][1][0]
    for _, _, _, _, info in steps:
        assert info["opponent_played"].tolist() == [True, True, False, False]
        assert not info["agent_acted"][:2].any()  # the opponent's seat is padding
    # Moves alternate: the policy's seat acts on steps 2 and 4 only.
    assert [info["agent_acted"][2:].all() for *_, info in steps] == [0, 1, 0, 1, 1]
    _, rewards, terminated, _, info = steps[-1]
    assert terminated.all() and rewards.tolist() == [1, 1, -1, -1]  # the opponent's top row
    assert not info["final_info"]["success"][2:].any()
    # The next game swaps the seats: the policy moves first, as seat 0.
    _, _, _, _, info = env.step(byte_messages(["[4]", "[4]", "[8]", "[8]"]))
    assert info["opponent_played"].tolist() == [False, False, True, True]
    assert info["agent_acted"].tolist() == [True, True, False, False]
    assert "agent: [4]" in env.transcript(0) and len(calls) == 3


def test_envs_whose_message_a_step_ignores_are_generated_one_token():
    """`row_sampling()` before each step: the policy's whole answer where the step takes the
    env's message, one token where it ignores it (the frozen opponent's seat, the other seat's
    turn, a game waiting for its round), so that padding is not decoded to its end."""
    env = tictactoe(episode_groups=True, opponent="initial", max_turns=6)
    env.frozen_opponent = lambda obs, rows: byte_messages(["[0]", "[1]", "[2]"][:1] * rows.size)
    env.reset(seed=0)
    moves = iter(["[0]", "[1]", "[2]", "[6]", "[7]", "[5]", "[3]", "[4]"])
    ignored_seen = taken_seen = 0
    for _ in range(12):
        sampling = env.row_sampling()
        _, _, _, _, info = env.step(byte_messages([next(moves, "[8]")] * 4))
        taken = info["agent_acted"] & (info["response_tokens"] > 0)  # the policy's message
        whole = np.ones(4, bool) if sampling is None else np.isinf(sampling[:, 2])
        np.testing.assert_array_equal(whole, taken)
        if sampling is not None:
            assert (sampling[~whole, 2] == 1).all() and (sampling[:, :2] == 1).all()
        ignored_seen += int((~whole).sum())
        taken_seen += int(whole.sum())
    assert ignored_seen and taken_seen


def test_frozen_opponents_refused_where_they_cannot_play(tmp_path):
    with pytest.raises(EnvError, match=r"opponent = 'past': expected one of self, initial"):
        tictactoe(opponent="past")
    with pytest.raises(EnvError, match="single-player game, which has no opponent"):
        make_text_vector_env("textarena/GuessTheNumber-v0", 2, LENGTHS | {"opponent": "initial"})
    config = load_config(
        None,
        [
            "env.id=textarena/TicTacToe-v0",
            "env.kwargs={context_length: 512, response_length: 4, opponent: initial}",
            "topology.inference=learner",
        ],
    )
    env = make_text_vector_env(config.env.id, 4, config.env.kwargs)
    with pytest.raises(EnvError, match=r"needs topology\.inference = 'env_ranks' \(got 'learner'"):
        check_frozen_opponent(config, env)


def test_self_play_is_refused_with_gae_and_with_envs_that_do_not_fill_its_games(tmp_path):
    with pytest.raises(EnvError, match=r"must be a multiple of 2 seats x .*group_size = 2"):
        make_text_vector_env("textarena/TicTacToe-v0", 6, LENGTHS | {"group_size": 2})
    config = {
        "env": {"id": "textarena/TicTacToe-v0", "kwargs": LENGTHS, "global_num_envs": 4},
        "algorithm": {"name": "ppo", "rollout_length": 16},
        "network": {"language_model": {"size": "tiny"}},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    env = make_text_vector_env("textarena/TicTacToe-v0", 4, LENGTHS)
    with pytest.raises(EnvError, match=r"needs algorithm\.advantage = 'group' or 'rloo'"):
        check_group_baseline(load_config(tmp_path / "config.yaml"), env)


def test_dialogues_of_a_self_play_game_come_from_whole_games():
    """`agentenv eval`'s dialogues: an odd number of episodes still makes whole games (two
    envs each), and each seat's messages are its own turns."""
    config = load_config(
        None,
        [
            "env.id=textarena/TicTacToe-v0",
            "env.kwargs={context_length: 512, response_length: 4}",
            "network.language_model.size=tiny",
        ],
    )
    sample = sample_dialogues(config, num_episodes=3, seed=0)
    assert len(sample.transcripts) == 3
    assert all(r in (-1.0, 0.0, 1.0) for r in sample.returns)
    assert all("Tic Tac Toe" in t for t in sample.transcripts)


def train_tictactoe(tmp_path, opponent: str):
    """A one-process GRPO run of TicTacToe (tiny model, 8 envs in groups of 2, rounds of 9
    moves, one update of one epoch: accounting is the check, not learning) against `opponent`,
    checked to reconcile: its folder, summary and metrics."""
    config = {
        "env": {
            "id": "textarena/TicTacToe-v0",
            "kwargs": {
                "max_turns": 9,
                "context_length": 512,
                "response_length": 4,
                "opponent": opponent,
            },
            "global_num_envs": 8,
        },
        "algorithm": {
            "name": "ppo",
            "advantage": "group",
            "group_size": 2,
            "rollout_length": 9,
            "num_epochs": 1,
            "num_minibatches": 1,
        },
        "network": {"language_model": {"size": "tiny"}},
        "run": {"total_env_steps": 72},
    }
    _, run = train_in_folder(tmp_path, config)
    summary = json.loads((run / "summary.json").read_text())
    for accounting in ("accounting", "token_accounting", "episode_accounting"):
        assert summary[accounting]["reconciles"], summary[accounting]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return run, summary, records


@pytest.mark.slow
def test_tictactoe_self_play_trains_in_one_process_and_reconciles(tmp_path):
    """GRPO across turns on both seats: rounds of 9 moves, each seat's returns logged."""
    _, summary, records = train_tictactoe(tmp_path, opponent="self")
    # Every seat's episode of every round ended: 8 envs, one round a segment.
    assert summary["episode_accounting"]["trained"] == 8 * summary["updates"]
    for record in records:
        # Zero-sum: the seats' mean returns are opposite (a random policy mostly loses on
        # invalid moves, which the game forgives once).
        assert record["reward/seat_0/mean"] == pytest.approx(-record["reward/seat_1/mean"])


@pytest.mark.slow
def test_tictactoe_against_a_frozen_opponent_trains_the_policy_seats_only(tmp_path):
    """`opponent: initial`: the env rank plays one seat of each game with its first policy;
    the learner gets the other seat's episodes only, and accuracy is the win rate."""
    run, summary, records = train_tictactoe(tmp_path, opponent="initial")
    # Of 8 envs (4 games), the 4 seats the policy played each round.
    assert summary["updates"] == 1
    assert summary["episode_accounting"]["trained"] == 4 * summary["updates"]
    assert all(0 <= record["accuracy"] <= 1 for record in records)
    # The opponent's seats and the policy's off-turn steps are generated one token
    # (`TextVectorEnv.row_sampling`): 0.15 of the tokens decoded were moves, 0.083 when every
    # row was decoded to its end.
    assert records[0]["generation_utilisation"] > 0.12
    # The policy's seat alternates from block to block (and game to game): each update has
    # both seats' returns.
    for record in records:
        assert np.isfinite([record["reward/seat_0/mean"], record["reward/seat_1/mean"]]).all()
    # agentenv eval's dialogues: the policy's seats only, against the untrained model.
    loaded = load_config(run / "config.yaml")
    sample = sample_dialogues(loaded, num_episodes=4, seed=0)
    assert len(sample.transcripts) == 4
    assert sum("You are Player 0" in t for t in sample.transcripts) == 2
