"""`textarena/<game>`: TextArena's single-player games (`GuessTheNumber-v0`, `TowerOfHanoi-v0`,
`Minesweeper-v0`, ...) as multi-turn text tasks, unchanged.

Each copy of the task holds its own game, made by `textarena.make("<game>-raw")`: the game
without TextArena's observation wrappers, whose observations are rendered here as the dialogue
needs them: the prompt is everything the game shows the player before its first move, and each
reply is only what the game said since the player's last move (its own move is already in the
dialogue). The game's own rules judge each message (TextArena reads a move in `[brackets]`); an
invalid move ends the episode as the game decides. The reward is the game's reward for the
player when the game ends (`env.close()`), 0 before; an episode is a success when it reaches
`success_reward` (1). TextArena seeds Python's global `random` at each reset, so an episode's
game follows its rng's seed.

Two-player games (`TicTacToe-v0`, `KuhnPoker-v0`, `ConnectFour-v0`, ...) are played in
self-play by the policy on both seats (`TextArenaSelfPlayTask`): each game is two envs of the
vector env, one a seat (`TextTask.seats`), each seat's dialogue its own view of the game. A seat
takes a message only on its turn (its other steps are padding), hears the other seat's moves as
env turns before its next one, and its episode ends with the game: on its own move, or on a
step without a message of its own that carries its reward (the game's: 1 win, -1 loss, 0 draw).
The learner trains on every seat the policy played, and each seat's returns are logged per
update as `reward/seat_0/mean` and `reward/seat_1/mean`.

With `opponent: initial` one seat of each game is played by a frozen opponent instead: the
policy the env rank started with (on a fresh run the untrained model), whose messages the env
rank generates itself (`TextVectorEnv.frozen_opponent`). The policy's seat alternates from game
to game (a game's seat is `(block + games started) % 2`, alike within a group of envs), the
opponent's seat is padding the learner trains nothing on, and the policy's success rate
(`accuracy`) is its win rate against the opponent, per seat in `reward/seat_<k>/mean`.
TextArena is the optional extra `pip install 'agentenv_jax[textarena]'`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import numpy as np

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import TaskReply, require_int

TEXTARENA_PREFIX = "textarena/"
# Turns an episode may take where the game names no limit of its own: a single-player game's
# messages, or a two-player game's moves (both seats; a round of self-play under a group
# baseline is this long).
DEFAULT_MAX_TURNS = 64
DEFAULT_SELF_PLAY_TURNS = 16
# Who plays the other seat of a two-player game: the policy itself, or the policy the env rank
# started with, frozen.
OPPONENTS = ("self", "initial")


def import_textarena() -> Any:
    """The `textarena` module; `EnvError` naming the extra when it is missing."""
    try:
        import textarena
    except ImportError as err:
        raise EnvError(
            f"textarena/<game> envs need TextArena ({err}): pip install 'agentenv_jax[textarena]'"
        ) from None
    return textarena


def textarena_games() -> list[str]:
    """Every game id the installed TextArena registers (its `-raw` and wrapper variants left
    out: the adapter takes the raw game itself)."""
    import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    suffixes = ("-raw", "-train")
    return sorted(game for game in ENV_REGISTRY if not game.endswith(suffixes))


def _render(observations: list[tuple[int, str, Any]], player_id: int) -> str:
    """A player's new observations as text: every message but the player's own moves."""
    import textarena

    lines = [
        message
        for sender, message, kind in observations
        if not (sender == player_id and kind == textarena.ObservationType.PLAYER_ACTION)
    ]
    return "\n".join(line.strip("\n") for line in lines)


def textarena_task(
    game: str, max_turns: int | None = None, success_reward: float = 1.0, opponent: str = "self"
) -> TextArenaTask | TextArenaSelfPlayTask:
    """The task of TextArena game `game`: a single-player game as it is, a two-player game in
    self-play (against itself, or against a frozen `opponent`); `EnvError` for an unknown game,
    one of more players, one that cannot start, or an opponent for a single-player game."""
    if opponent not in OPPONENTS:
        raise EnvError(
            f"env.kwargs.opponent = {opponent!r}: expected one of {', '.join(OPPONENTS)} (the "
            "policy itself, or the policy the env rank started with, frozen)"
        )
    games = textarena_games()
    if game not in games:
        close = difflib.get_close_matches(game, games, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EnvError(
            f"env.id = 'textarena/{game}': no TextArena game {game!r}{hint}; e.g. "
            "GuessTheNumber-v0, TowerOfHanoi-v0, TicTacToe-v0, KuhnPoker-v0"
        )
    probe = _make_game(game)
    players = None
    for count in (1, 2):
        try:
            probe.reset(num_players=count, seed=0)
        except AssertionError:
            continue
        except Exception as err:
            raise EnvError(
                f"env.id = 'textarena/{game}': the game does not start: {type(err).__name__}: "
                f"{err} (a game whose data is not installed fails so)"
            ) from err
        players = count
        break
    if players is None:
        raise EnvError(
            f"env.id = 'textarena/{game}' is a game of more than two players: not supported"
        )
    own_limit = getattr(probe, "max_turns", None) or getattr(probe.state, "max_turns", None)
    if max_turns is None:
        max_turns = own_limit if isinstance(own_limit, int) and own_limit > 0 else None
    default = DEFAULT_MAX_TURNS if players == 1 else DEFAULT_SELF_PLAY_TURNS
    max_turns = require_int("env.kwargs.max_turns", default if max_turns is None else max_turns, 1)
    if players == 1:
        if opponent != "self":
            raise EnvError(
                f"env.kwargs.opponent = {opponent!r}: textarena/{game} is a single-player game, "
                "which has no opponent"
            )
        return TextArenaTask(game, max_turns, float(success_reward))
    return TextArenaSelfPlayTask(game, max_turns, float(success_reward), opponent)


def _make_game(game: str) -> Any:
    """A new raw TextArena env of `game`; `EnvError` naming data it lacks."""
    import textarena

    try:
        return textarena.make(f"{game}-raw")
    except LookupError as err:
        # NLTK's message is a 20-line banner; its resource's name is what matters.
        missing = re.search(r"Resource '?([\w/.-]+)'? not found", str(err))
        name = missing.group(1) if missing else str(err).strip().splitlines()[0]
        raise EnvError(
            f"env.id = 'textarena/{game}' needs data that is not installed: NLTK's {name!r} "
            "(TextArena fetches it from the internet, which runs do not reach; install it into "
            "an nltk_data folder beforehand, or pick another game)"
        ) from None
    except Exception as err:
        raise EnvError(
            f"env.id = 'textarena/{game}': making the game failed: {type(err).__name__}: {err}"
        ) from err


class TextArenaTask:
    """One TextArena single-player game an episode (see the module docstring)."""

    def __init__(self, game: str, max_turns: int, success_reward: float):
        self.game = game
        self.max_turns = max_turns
        self.success_reward = success_reward
        self.env: Any = None  # this copy's game, made at its first reset

    def reset(self, rng: np.random.Generator) -> str:
        if self.env is None:
            self.env = _make_game(self.game)
        self.env.reset(num_players=1, seed=int(rng.integers(2**31)))
        player_id, observations = self.env.get_observation()
        return _render(observations, player_id)

    def reply(self, message: str) -> TaskReply:
        if self.env is None:
            raise RuntimeError("TextArenaTask.reply before reset")
        done, _ = self.env.step(message)
        if done:
            rewards, _ = self.env.close()
            reward = float((rewards or {}).get(0, 0.0))
            return TaskReply(
                text=None, reward=reward, done=True, success=reward >= self.success_reward
            )
        player_id, observations = self.env.get_observation()
        return TaskReply(
            text=_render(observations, player_id), reward=0.0, done=False, success=False
        )


class _SharedGame:
    """One two-player game, shared by the task copies of its two seats."""

    def __init__(self) -> None:
        self.env: Any = None
        self.episode = 0  # games started
        self.rewards: dict[int, float] | None = None  # each seat's, once the game is over
        self.shown = [0, 0]  # each seat's queued observations already in its dialogue


class TextArenaSelfPlayTask:
    """A seat of a TextArena two-player game played by the policy on both seats, or on one
    against a frozen `opponent` (see the module docstring). `max_turns` bounds the moves of a
    game, both seats together: a game still on after them ends there, scored 0 for both seats,
    as a draw."""

    seats = 2
    reward_names = ("seat_0", "seat_1")

    def __init__(self, game: str, max_turns: int, success_reward: float, opponent: str = "self"):
        self.game_id = game
        self.max_turns = max_turns
        self.success_reward = success_reward
        self.opponent = opponent
        self._games: dict[int, _SharedGame] = {}  # shared by every copy: one per game
        self.seat = -1
        self.block = -1
        self.game: _SharedGame | None = None
        self.episodes = 0  # this seat's episodes started

    def bind(self, env_index: int, num_envs: int, group_size: int) -> None:
        """Which game and seat env `env_index` plays. Envs come in blocks of `2 x group_size`:
        seat 0 of the block's `group_size` games, then seat 1 of the same games, so a group of
        envs (the group baseline's) holds one seat of games started alike."""
        self.block, within = divmod(env_index, self.seats * group_size)
        self.seat, column = divmod(within, group_size)
        self.game = self._games.setdefault(self.block * group_size + column, _SharedGame())

    def opponent_plays(self) -> bool:
        """Whether the frozen opponent plays this seat in the current game (never in
        self-play): the policy's seat alternates from game to game."""
        if self.opponent == "self" or self.game is None:
            return False
        return self.seat != (self.block + self.game.episode) % self.seats

    def _state(self) -> Any:
        assert self.game is not None and self.game.env is not None
        return self.game.env.state

    def _take(self) -> str:
        """What this seat has not yet seen: the observations queued for it since it last took
        them (TextArena hands a player its queue when it is to move)."""
        game, seat = self.game, self.seat
        assert game is not None
        queued = self._state().observations[seat]
        new = queued[game.shown[seat] :]
        if self._state().current_player_id == seat:
            game.env.get_observation()  # hands over and clears the queue
            game.shown[seat] = 0
        else:
            game.shown[seat] = len(queued)
        return _render(new, seat)

    def reset(self, rng: np.random.Generator) -> str:
        game = self.game
        if game is None:
            raise RuntimeError("TextArenaSelfPlayTask.reset before bind")
        self.episodes += 1
        if game.episode < self.episodes:
            # The first seat to start this episode starts the game, with its env's rng (seat
            # 0's env: the lower index).
            if game.env is None:
                game.env = _make_game(self.game_id)
            game.env.reset(num_players=2, seed=int(rng.integers(2**31)))
            game.episode, game.rewards, game.shown = self.episodes, None, [0, 0]
        return self._take()

    def acting(self) -> bool:
        return (
            self.game is not None
            and self.game.rewards is None
            and (self._state().current_player_id == self.seat)
        )

    def _ended(self) -> TaskReply:
        assert self.game is not None and self.game.rewards is not None
        reward = float(self.game.rewards.get(self.seat, 0.0))
        terms = tuple(reward if s == self.seat else float("nan") for s in range(self.seats))
        return TaskReply(
            text=None,
            reward=reward,
            done=True,
            success=reward >= self.success_reward,
            terms=terms,
            failed=(False,) * self.seats,
        )

    def reply(self, message: str) -> TaskReply:
        game = self.game
        assert game is not None and game.env is not None
        done, _ = game.env.step(message)
        if done:
            rewards, _ = game.env.close()
            game.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
            return self._ended()
        if self._state().turn >= self.max_turns:
            # A game still on at max_turns moves ends there, scored as a draw for both seats.
            game.rewards = {seat: 0.0 for seat in range(self.seats)}
            return self._ended()
        # Still this seat's turn (an invalid move to make again): what the game said.
        text = self._take() if self._state().current_player_id == self.seat else None
        return TaskReply(text=text, reward=0.0, done=False, success=False)

    def poll(self) -> TaskReply | None:
        """Between this seat's moves: its game's end, or the other seat's move once it is
        this seat's turn."""
        game = self.game
        if game is None or game.env is None:
            return None
        if game.rewards is not None:
            return self._ended()
        if self._state().current_player_id == self.seat:
            text = self._take()
            return TaskReply(text=text, reward=0.0, done=False, success=False) if text else None
        return None
