"""The standard task suite: each task's shipped experiment over 3 seeds, as a sweep.

Runs the sweeps `experiments/sweeps/suite_*.yaml` (one trial at a time, so that trials do not
share the cores) into `--run-dir`, and prints per task the final return (interquartile mean
over seeds with rliable's 95% bootstrap interval, and each seed's), the return of a uniformly
random policy on the same evaluation seeds, and the mean wall and compile time per seed.
A sweep that already ran is resumed, not redone.

Recorded in docs/benchmarks.md (section 6) from the first command, after
`pip install -e '.[sweep,mujoco,minatar]'`:

    python benchmarks/task_suite.py                                  # every task
    python benchmarks/task_suite.py --tasks cartpole_ppo acrobot_ppo  # some
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import common
import gymnasium as gym
import numpy as np

from agentenv_jax.config.experiments import shipped_sweeps
from agentenv_jax.config.loading import load_config
from agentenv_jax.workflow.evaluation import EVAL_SEED_BASE
from agentenv_jax.workflow.sweeps.loading import load_sweep
from agentenv_jax.workflow.sweeps.runner import SweepRunner, prepare
from agentenv_jax.workflow.sweeps.spec import read_sweep

# The one-task suites (suite_atari, several games scored human-normalised, is run as a sweep:
# docs/atari.md).
TASKS = sorted(
    n.removeprefix("suite_")
    for n in shipped_sweeps()
    if n.startswith("suite_") and not read_sweep(n).parameters
)
RANDOM_EPISODES = 10


def random_policy_return(env_id: str, episodes: int = RANDOM_EPISODES) -> float:
    """Mean return of uniformly random actions on the evaluation seeds `agentenv eval` uses."""
    env = gym.make(env_id)
    env.action_space.seed(0)
    returns = []
    for episode in range(episodes):
        env.reset(seed=EVAL_SEED_BASE + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def main() -> int:
    parser = common.make_parser(__doc__)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS)
    parser.add_argument("--run-dir", default="runs/suite", help="parent of the sweep folders")
    args = parser.parse_args()

    print(common.provenance("mujoco", "minatar", "rliable"), flush=True)
    rows = []
    for task in args.tasks:
        spec = dataclasses.replace(read_sweep(f"suite_{task}"), run_dir=args.run_dir)
        status = SweepRunner(spec, prepare(spec), lambda line: print(line, flush=True)).run()
        if status != 0:
            print(f"{task}: the sweep did not finish (status {status})", file=sys.stderr)
            return status
        sweep = load_sweep(spec.folder)
        [config] = sweep.config_rows
        trials = [t for t in sweep.trial_rows if t["status"] == "finished"]
        base = load_config(spec.base)
        rows.append(
            {
                "task": base.env.id,
                "algorithm": base.algorithm.name,
                "env steps": f"{base.run.total_env_steps:,}",
                "return IQM [95% CI]": f"{config['episode_return_mean_iqm']:.1f} "
                f"[{config['ci_low']:.1f}, {config['ci_high']:.1f}]",
                "per seed": ", ".join(f"{t['episode_return_mean']:.1f}" for t in trials),
                "random policy": f"{random_policy_return(base.env.id):.1f}",
                "wall s / seed": f"{config['wall_s_mean']:.0f}",
                "compile s / seed": f"{np.mean([t['compile_s'] for t in trials]):.1f}",
                "steps/s": f"{config['steps_per_s_mean']:,.0f}",
            }
        )
    columns = list(rows[0])
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row[c] for c in columns) + " |")
    print(f"\n(sweep folders under {Path(args.run_dir).resolve()})")
    common.save_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
