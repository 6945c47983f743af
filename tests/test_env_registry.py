"""Every Gymnasium env the project ships passes `gymnasium.utils.env_checker.check_env`.

That is each id registered with Gymnasium whose entry point is in the package (found in the
registry, so a new one is checked without being listed here), and each `module:factory` entry
point the package ships for `env.id`. They are made as the project makes them for a config
naming them (`resolve_env_factory`, default `env` settings).

Not Gymnasium envs, so not checked here (each has its own API and tests):
* text envs (`agentenv_jax/Arithmetic-v0`, `agentenv_jax/GuessNumber-v0`,
  `reasoning_gym/<dataset>`): only made as a `TextVectorEnv` of token arrays, a batch that
  `check_env` (one `gymnasium.Env`) cannot take, and not in Gymnasium's registry;
* multi-agent envs (`agentenv_jax/Navigation-v0`, `agentenv_jax/PredatorPrey-v0`,
  `pettingzoo/<module>`): `MultiAgentVectorEnv`s (or PettingZoo parallel envs), a dict per agent
  per step, not in Gymnasium's registry;
* JAX envs (`env.backend: jax`): gymnax envs, pure functions of an explicit state.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentenv_jax.envs  # noqa: F401  (registers the package's ids)
from agentenv_jax.config.schema import EnvConfig
from agentenv_jax.envs import resolve_env_factory
from agentenv_jax.envs.minatar import GAMES
from agentenv_jax.envs.multi_agent.registry import BUILT_IN as MULTI_AGENT_IDS
from agentenv_jax.envs.text.registry import TEXT_ENV_IDS


def _module(entry_point: object) -> str:
    if isinstance(entry_point, str):
        return entry_point.partition(":")[0]
    return getattr(entry_point, "__module__", "")


REGISTERED = sorted(
    env_id
    for env_id, spec in gym.registry.items()
    if _module(spec.entry_point).split(".")[0] == "agentenv_jax"
)
# The entry points the package ships for `env.id`, with kwargs that make them plain envs
# (no sleep, no injected faults: those are what they are for, not the contract).
ENTRY_POINTS = {
    "agentenv_jax.envs.slow:slow_cartpole": {"step_s": 0.0},
    "agentenv_jax.envs.faults:faulty_env": {"rate": 0.0},
}


def test_the_registry_scan_finds_every_id_and_no_excluded_one():
    minatar = {f"agentenv_jax/MinAtar-{g.title().replace('_', '')}-v1" for g in GAMES}
    assert {"agentenv_jax/Catch-v0", *minatar} <= set(REGISTERED)
    assert len(minatar) == 5
    # The text and multi-agent ids are not Gymnasium's: if one were registered, it would be
    # checked above instead of excluded.
    assert not set(REGISTERED) & (set(TEXT_ENV_IDS) | set(MULTI_AGENT_IDS))


@pytest.mark.slow
@pytest.mark.parametrize(
    "env_id, kwargs",
    [(env_id, {}) for env_id in REGISTERED] + list(ENTRY_POINTS.items()),
    ids=[*REGISTERED, *ENTRY_POINTS],
)
def test_every_gymnasium_env_passes_check_env(env_id, kwargs, monkeypatch):
    # check_env renders in every declared mode, "human" too: headless, as on CI.
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    try:
        env = resolve_env_factory(EnvConfig(id=env_id, kwargs=kwargs))()
    except ImportError as err:  # an optional package: the test extra installs every one
        pytest.fail(f"{env_id} cannot be made ({err}); pip install -e '.[test]'")
    try:
        check_env(env)
    finally:
        env.close()


@pytest.mark.slow  # a fresh interpreter, to see what importing and making the env loads
def test_a_gymnasium_env_does_not_load_the_text_tasks():
    """An env rank of a registered Gymnasium env never imports the text registry (every text
    task, the datasets, the rewards, the sandbox: ~5 MB of each env rank)."""
    probe = (
        "import sys\n"
        "from agentenv_jax.config.schema import EnvConfig\n"
        "from agentenv_jax.envs import make_vector_env\n"
        "make_vector_env(EnvConfig(id='CartPole-v1'), 2).close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('agentenv_jax.envs.text')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]", proc.stdout
