"""The reference sides of `time_to_solve.py`: stable-baselines3's PPO on Gymnasium's CartPole-v1
and rejax's PPO on gymnax's, each with the RL-Zoo hyperparameters agentenv_jax's experiments
use (as far as the library takes them), clocked from their process's launch to the solve.

Each is one worker of `time_to_solve.py`, run in a fresh interpreter; that script's docstring
says what each clock covers and where rejax cannot follow the config.
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import time
from typing import Any


def require_sb3() -> None:
    """Stop, saying how to install them, when torch or stable-baselines3 is missing."""
    try:
        import stable_baselines3  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f"the sb3 side needs torch and stable-baselines3 ({err}): pip install -e "
            "'.[bench]', or run with --sides agentenv agentenv-mpi"
        ) from None


def sb3_worker(
    args: argparse.Namespace, target_return: float, return_window: int
) -> dict[str, Any]:
    """One stable-baselines3 PPO run with the same hyperparameters, in this interpreter,
    clocked from its launch (`--launched-at`), to a mean return of `target_return` over the
    last `return_window` episodes."""
    require_sb3()
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    imported = time.time()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    class StopAtReturn(BaseCallback):
        """Stops after the update whose rollout brought the mean of the last `return_window`
        episode returns to the target, as agentenv's learner does (its check follows each
        update)."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: collections.deque[float] = collections.deque(maxlen=return_window)
            self.solved = False

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # added by the Monitor wrapper of make_vec_env
                    self.returns.append(float(info["episode"]["r"]))
            return not self.solved  # False on the first step after the stopping update

        def _on_rollout_end(self) -> None:
            full = len(self.returns) == return_window
            self.solved = full and statistics.fmean(self.returns) >= target_return

    def linear(initial: float):
        return lambda progress_remaining: progress_remaining * initial

    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        policy_kwargs={
            "net_arch": {"pi": [64, 64], "vf": [64, 64]},
            "activation_fn": torch.nn.Tanh,
        },
        device="cpu",
        seed=args.seed,
        verbose=0,
    )
    built = time.time()
    callback = StopAtReturn()
    model.learn(total_timesteps=args.max_steps, callback=callback)
    ended = time.time()
    env.close()
    mean_return = statistics.fmean(callback.returns) if callback.returns else math.nan
    return {
        "wall_s": ended - args.launched_at,
        "start_s": imported - args.launched_at,  # interpreter start and imports
        "setup_s": built - imported,
        "learn_s": ended - built,
        "env_steps": int(model.num_timesteps),
        "return": mean_return,
        "solved": callback.solved,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    }


class _FiveValueStep:
    """A gymnax (>= 1.0) env whose `step` returns the 5 values rejax 0.1.3 unpacks, `(obs,
    state, reward, done, info)` with `done = terminated or truncated`, instead of gymnax's 6
    (`terminated`, `truncated`). Only what rejax calls is passed through."""

    def __init__(self, env: Any) -> None:
        self._env = env

    @property
    def default_params(self) -> Any:
        return self._env.default_params

    def action_space(self, params: Any = None) -> Any:
        return self._env.action_space(params)

    def observation_space(self, params: Any) -> Any:
        return self._env.observation_space(params)

    def reset(self, key: Any, params: Any = None) -> tuple[Any, Any]:
        return self._env.reset(key, params)

    def step(self, key: Any, state: Any, action: Any, params: Any = None) -> tuple[Any, ...]:
        import jax.numpy as jnp

        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def rejax_worker(args: argparse.Namespace, target_return: float) -> dict[str, Any]:
    """One rejax PPO run on gymnax's CartPole-v1 with the JAX config's hyperparameters, as far
    as rejax takes them, in this interpreter, clocked from its launch (`--launched-at`). The
    solve point is the first of rejax's in-jit evaluations whose mean return reaches
    `target_return`, timed on the host as it happens (time_to_solve.py's docstring)."""
    try:
        import gymnax
        import jax
        import optax
        from rejax import PPO
    except ImportError as err:
        raise SystemExit(
            f"the rejax side needs rejax and gymnax ({err}): pip install rejax==0.1.3, or run "
            "without rejax in --sides"
        ) from None
    imported = time.time()
    jax.config.update("jax_enable_compilation_cache", False)  # cold, like agentenv-jax
    num_envs, num_steps, num_epochs, num_minibatches = 8, 32, 20, 1
    # agentenv's annealing: linear to 0 over the gradient steps of ceil(budget / batch) updates.
    gradient_steps = (
        math.ceil(args.max_steps / (num_envs * num_steps)) * num_epochs * num_minibatches
    )
    env, env_params = gymnax.make("CartPole-v1")
    algo = PPO.create(
        env=_FiveValueStep(env),
        env_params=env_params,
        num_envs=num_envs,
        num_steps=num_steps,
        num_epochs=num_epochs,
        num_minibatches=num_minibatches,
        gamma=0.98,
        gae_lambda=0.8,
        clip_eps=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        learning_rate=optax.linear_schedule(1e-3, 0.0, gradient_steps),
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)},
        total_timesteps=args.max_steps,
        eval_freq=args.rejax_eval_freq,
        skip_initial_evaluation=True,
    )
    evaluations: list[tuple[float, int, float]] = []  # (wall time, env steps, mean return)

    def record(env_steps: Any, mean_return: Any) -> None:
        evaluations.append((time.time(), int(env_steps), float(mean_return)))

    rejax_evaluation = algo.eval_callback  # 128 episodes, sampled actions

    def eval_callback(algo: Any, ts: Any, rng: Any) -> Any:
        _, returns = rejax_evaluation(algo, ts, rng)
        jax.debug.callback(record, ts.global_step, returns.mean(), ordered=True)
        return returns.mean()

    algo = algo.replace(eval_callback=eval_callback)
    key = jax.random.PRNGKey(args.seed)
    built = time.time()
    train = jax.jit(algo.train).lower(key).compile()
    compiled = time.time()
    state, _ = train(key)
    final_steps = int(state.global_step)  # waits for the end of the budget
    ended = time.time()
    solving = next((e for e in evaluations if e[2] >= target_return), None)
    reached, env_steps, mean_return = solving or (ended, final_steps, evaluations[-1][2])
    return {
        "wall_s": reached - args.launched_at,
        "start_s": imported - args.launched_at,  # interpreter start and imports
        "setup_s": built - imported,
        "compile_s": compiled - built,
        "train_s": reached - compiled,  # training to the solving evaluation
        "budget_train_s": ended - compiled,  # the whole budget
        "env_steps": env_steps,
        "budget_env_steps": final_steps,
        "evaluations": len(evaluations),
        "return": mean_return,
        "solved": solving is not None,
    }
