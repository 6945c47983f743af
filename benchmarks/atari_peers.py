"""Atari PPO against its peers: frames per second and score at equal frames, on one machine and
game, agentenv_jax against stable-baselines3 and Sample Factory, in one run.

Sides (every one the same budget of `--frames` frames, 8 games, 128-step rollouts, one agent
step = 4 frames):

  agentenv        `agentenv train pong_ppo` in one process (EnvPool; PPO, Nature CNN, CleanRL's
                  Atari hyperparameters), `--set env.id=ALE/<Game>-v5`
  agentenv-mpi    the same under `mpiexec -n 3` (1 learner + 2 env ranks, 4 games each)
  sb3             stable-baselines3's PPO, `CnnPolicy`, torch on CPU, on `make_atari_env`
                  (`<Game>NoFrameskip-v4` in a `SubprocVecEnv` of 8 processes, AtariWrapper:
                  no-op starts, frame skip 4 with max-pooling, episodic life, FIRE reset,
                  84x84 gray, reward clip) and `VecFrameStack(4)`, with RL-Zoo's Atari PPO
                  (n_steps 128, batch 256, 4 epochs, lr 2.5e-4 and clip 0.1 both linear to 0,
                  ent 0.01, vf 0.5, gamma 0.99, lambda 0.95, grad-norm 0.5)
  sample-factory  Sample Factory 2's APPO with its Atari defaults (`sf_examples.atari`: the
                  same wrappers on `<Game>NoFrameskip-v4`, rollout 128, 4 epochs x 4 batches
                  of 256, clip 0.1, lr 2.5e-4 linear, synchronous, CleanRL's network) scaled
                  from 8 workers x 1 game to 2 workers x 4 games, one per core, on CPU

Each side is clocked the same way, from the moment before its process is launched:

* wall s: launch to exit (interpreter start, imports, env construction, every compile, the
  training, the final checkpoint; under mpiexec the whole job).
* steady FPS: frames between two points inside the training, after the first update and after
  the last, over the seconds between them: agentenv's `steps_per_s_after_first_update` (the
  learner's) x 4; sb3's `num_timesteps` x 4 when its second rollout starts (its first update
  done) and when training ends (a callback); Sample Factory's frame count (its learner counts
  samples x frame skip) when the runner hears of its first and of its last training iteration.
* score: the mean game score of the last 20 games finished by the end of the budget: whole
  games (every life), the game's own rewards, not the clipped ones. agentenv's
  `episode_return_mean` (`run.return_window=20`); sb3's `info["episode"]` from the Monitor,
  which `make_atari_env` puts beneath AtariWrapper and so beneath its episodic-life wrapper (it
  sees only whole games; the wrapper chain is printed); Sample Factory's
  `RecordEpisodeStatistics_reward`, its gymnasium `RecordEpisodeStatistics` wrapper, the first
  on the raw game, beneath its episodic-life and reward-clip wrappers.

The ratios printed are agentenv's steady FPS / each peer's (medians over seeds; goal > 1, ahead
of both), with the launch-to-exit FPS ratios beside them (no goal).

The peers live in their own virtual environments, never in agentenv_jax's: this script runs
itself as a worker (`--worker sb3|sample-factory`) in the peer's interpreter, where it imports
only the standard library and that peer's packages. Make them once (`$PEERS_VENV_DIR` replaces
/tmp/peers-venvs; torch 2.13.0 is the CPU wheel on these machines' disk, pin it on every pip
command so it is not replaced):

    python3 -m venv /tmp/peers-venvs/atari
    /tmp/peers-venvs/atari/bin/pip install torch==2.13.0
    /tmp/peers-venvs/atari/bin/pip install torch==2.13.0 stable-baselines3==2.9.2 gymnasium \\
        ale-py opencv-python-headless
    python3 -m venv /tmp/peers-venvs/sample-factory   # it wants gymnasium 0.29 and numpy < 2
    /tmp/peers-venvs/sample-factory/bin/pip install torch==2.13.0
    /tmp/peers-venvs/sample-factory/bin/pip install torch==2.13.0 sample-factory==2.1.1 ale-py

A peer whose interpreter or packages are missing, or whose run fails, is reported with its error
and the other sides still run. ale-py >= 0.10 registers its games when imported only beside
gymnasium >= 1.1 (its vector env imports `gymnasium.vector.AutoresetMode`); beside Sample
Factory's gymnasium 0.29 the worker registers them itself (`ale_py.registration`).

Threads: torch runs `--threads` intra-op threads in sb3's process (default 1: on a shared
2-core machine torch's default pool collapses under contention, time_to_solve.py); Sample
Factory sets one thread in each of its processes itself (learner, inference, 2 rollout
workers); agentenv_jax runs with its defaults (XLA's CPU pool on the learner, one XLA thread on
MPI env ranks). What differs beyond threads: Sample Factory normalizes observations and returns
and keeps clip 0.1 constant (its Atari defaults); Sample Factory counts a frame when its
learner trains on it and stops once past the budget, sb3 and agentenv after the rollout that
reaches it (a few thousand frames over; the frames each side ran are printed). Every side's
games stop at 108,000 frames (ale-py's `NoFrameskip-v4` too).

    python benchmarks/atari_peers.py                          # Pong, 400k frames, seed 0
    python benchmarks/atari_peers.py --frames 20000 --skip agentenv-mpi sample-factory
    python benchmarks/atari_peers.py --game Breakout --seeds 0 1 --json atari_peers.json
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FRAME_SKIP = 4
ENVS = 8
SCORE_WINDOW = 20
GOAL = 1.0  # agentenv steady FPS / peer steady FPS, more than this
MPI_RANKS = 3
RESULT_PREFIX = "ATARI_PEERS_RESULT "
SIDES = ("agentenv", "agentenv-mpi", "sb3", "sample-factory")
PEERS = ("sb3", "sample-factory")
OURS = ("agentenv", "agentenv-mpi")
PEER_VENVS = {"sb3": "atari", "sample-factory": "sample-factory"}  # under $PEERS_VENV_DIR
PEER_PACKAGES = {
    "sb3": ("torch", "stable-baselines3", "gymnasium", "ale-py"),
    "sample-factory": ("torch", "sample-factory", "gymnasium", "ale-py"),
}
LABELS = {
    "agentenv": "agentenv 1 process",
    "agentenv-mpi": f"agentenv mpiexec -n {MPI_RANKS}",
    "sb3": "stable-baselines3 PPO",
    "sample-factory": "Sample Factory APPO",
}

# Everything above is the standard library: the peers' workers run this file in their own
# interpreters, which have neither agentenv_jax nor `common`; the driver imports those inside
# its functions.

# --- the peers' workers (in the peer's interpreter) -----------------------------------------


def peer_game_id(game: str) -> str:
    """Gymnasium's id of `game` as the peers' Atari examples name it (no sticky actions, the
    minimal action set, frame skip done by their wrappers)."""
    return f"{game}NoFrameskip-v4"


def register_atari_games() -> None:
    """Register ALE's `...NoFrameskip-v4` games with gymnasium, once: importing ale-py does it
    only beside gymnasium >= 1.1 (module docstring)."""
    import gymnasium
    from ale_py.registration import register_v0_v4_envs

    if "PongNoFrameskip-v4" not in gymnasium.registry:
        register_v0_v4_envs()


def sb3_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One stable-baselines3 PPO run on `args.game`, clocked from its launch."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

    imported = time.time()
    torch.set_num_threads(args.threads)
    game_id = peer_game_id(args.game)

    def make_game(**kwargs: Any) -> Any:  # in each SubprocVecEnv process
        import gymnasium

        register_atari_games()
        return gymnasium.make(game_id, **kwargs)

    class Clock(BaseCallback):
        """(time, agent steps) after the first update and after the last; finished games'
        scores from the Monitor."""

        def __init__(self) -> None:
            super().__init__()
            self.first: tuple[float, int] | None = None
            self.last: tuple[float, int] | None = None
            self.scores: collections.deque[float] = collections.deque(maxlen=SCORE_WINDOW)
            self.games = 0

        def _on_rollout_start(self) -> None:
            if self.first is None and self.num_timesteps > 0:  # the first update is done
                self.first = (time.time(), self.num_timesteps)

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # the Monitor's: a whole game ended
                    self.scores.append(float(info["episode"]["r"]))
                    self.games += 1
            return True

        def _on_training_end(self) -> None:
            self.last = (time.time(), self.num_timesteps)

    def linear(initial: float) -> Any:
        return lambda progress_remaining: progress_remaining * initial

    env = make_atari_env(make_game, n_envs=ENVS, seed=args.seed, vec_env_cls=SubprocVecEnv)
    wrappers = env.env_method("__str__", indices=0)[0]
    env = VecFrameStack(env, n_stack=4)
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        batch_size=256,
        n_epochs=4,
        learning_rate=linear(2.5e-4),
        clip_range=linear(0.1),
        ent_coef=0.01,
        vf_coef=0.5,
        gamma=0.99,
        gae_lambda=0.95,
        max_grad_norm=0.5,
        device="cpu",
        seed=args.seed,
        verbose=0,
    )
    built = time.time()
    clock = Clock()
    model.learn(total_timesteps=args.frames // FRAME_SKIP, callback=clock)
    learned = time.time()
    env.close()
    return _peer_result(
        args,
        frames=model.num_timesteps * FRAME_SKIP,
        first=(clock.first[0], clock.first[1] * FRAME_SKIP) if clock.first else None,
        last=(clock.last[0], clock.last[1] * FRAME_SKIP) if clock.last else None,
        scores=list(clock.scores),
        games=clock.games,
        wrappers=wrappers,
        phases={"start_s": imported, "setup_s": built, "learn_s": learned},
        threads=torch.get_num_threads(),
    )


def make_sample_factory_game(
    full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: Any = None
) -> Any:
    """Sample Factory's Atari pipeline (`sf_examples.atari.atari_utils.make_atari_env`) on the
    game named `peer_<gymnasium id>`, registered first in the process it runs in (every
    rollout worker is a spawned process)."""
    from sf_examples.atari.atari_utils import ATARI_ENVS, AtariSpec, make_atari_env

    register_atari_games()
    if not any(spec.name == full_env_name for spec in ATARI_ENVS):
        ATARI_ENVS.append(AtariSpec(full_env_name, full_env_name.removeprefix("peer_")))
    return make_atari_env(full_env_name, cfg, env_config, render_mode)


def sample_factory_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One Sample Factory APPO run on `args.game`, clocked from its launch."""
    from sample_factory.algo.utils.misc import EPISODIC, LEARNER_ENV_STEPS, ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from sf_examples.atari.atari_params import atari_override_defaults

    imported = time.time()
    env_name = f"peer_{peer_game_id(args.game)}"
    register_env(env_name, make_sample_factory_game)
    argv = [
        f"--env={env_name}",
        f"--experiment=sample-factory-seed{args.seed}",
        f"--train_dir={args.run_dir}",
        f"--seed={args.seed}",
        f"--train_for_env_steps={args.frames}",  # frames: its learner counts samples x 4
        "--device=cpu",
        "--num_workers=2",  # the Atari defaults' 8 workers x 1 game, on 2 cores
        f"--num_envs_per_worker={ENVS // 2}",
    ]
    parser, partial_cfg = parse_sf_args(argv=argv)
    atari_override_defaults(partial_cfg.env, parser)
    cfg, runner = make_runner(parse_full_cfg(parser, argv))
    clock: dict[str, tuple[float, int]] = {}
    scores: collections.deque[float] = collections.deque(maxlen=SCORE_WINDOW)
    games = 0

    def on_learner_steps(runner: Any, msg: dict[str, Any], policy_id: int) -> None:
        point = (time.time(), int(msg[LEARNER_ENV_STEPS]))  # after each training iteration
        clock.setdefault("first", point)
        clock["last"] = point

    def on_episode(runner: Any, msg: dict[str, Any], policy_id: int) -> None:
        nonlocal games
        score = msg[EPISODIC].get("RecordEpisodeStatistics_reward")
        if score is not None:  # a whole game ended, not a life; a numpy array of one
            scores.append(float(getattr(score, "item", lambda: score)()))
            games += 1

    # Appended after the runner's own handlers (`register_policy_msg_handler` would replace them).
    runner.policy_msg_handlers[LEARNER_ENV_STEPS].append(on_learner_steps)
    runner.register_episodic_stats_handler(on_episode)
    # One game here first: a game that cannot be made fails in this process, at once (in Sample
    # Factory's spawned env-info process the runner would wait for it forever).
    game = make_sample_factory_game(env_name, cfg)
    wrappers = str(game)
    game.close()
    status = runner.init()
    built = time.time()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    learned = time.time()
    if status != ExperimentStatus.SUCCESS:
        raise SystemExit(f"Sample Factory's runner ended with status {status}")
    return _peer_result(
        args,
        frames=int(sum(runner.env_steps.values())),
        first=clock.get("first"),
        last=clock.get("last"),
        scores=list(scores),
        games=games,
        wrappers=wrappers,
        phases={"start_s": imported, "setup_s": built, "learn_s": learned},
        threads=1,
    )


def _peer_result(
    args: argparse.Namespace,
    frames: int,
    first: tuple[float, int] | None,
    last: tuple[float, int] | None,
    scores: list[float],
    games: int,
    wrappers: str,
    phases: dict[str, float],
    threads: int,
) -> dict[str, Any]:
    """A peer run's result; `first`/`last` are (time, frames) after the first and the last
    update, `phases` the times each phase ended (start: imports, setup, learn)."""
    steady = None
    if first is not None and last is not None and last[0] > first[0]:
        steady = (last[1] - first[1]) / (last[0] - first[0])
    since = args.launched_at
    ends = list(phases.values())
    return {
        "frames": frames,
        "steady_fps": steady,
        "score": statistics.fmean(scores) if scores else None,
        "games_counted": len(scores),
        "games": games,
        "wrappers": wrappers,
        "torch_threads": threads,
        "inner_s": time.time() - since,  # launch to the result, inside the worker
        **{
            name: end - start
            for name, start, end in zip(phases, [since, *ends[:-1]], ends, strict=True)
        },
    }


def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="a peer's worker of atari_peers.py")
    parser.add_argument("--worker", choices=PEERS, required=True)
    parser.add_argument("--game", required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--launched-at", type=float, required=True)
    return parser


def worker_main(argv: list[str]) -> None:
    """A peer's run in this (the peer's) interpreter; its result is printed as one JSON line."""
    args = _worker_parser().parse_args(argv)
    worker = sb3_worker if args.worker == "sb3" else sample_factory_worker
    print(RESULT_PREFIX + json.dumps(worker(args)), flush=True)


# --- the driver (agentenv_jax's interpreter) ------------------------------------------------


def default_peer_python(side: str) -> Path:
    root = Path(os.environ.get("PEERS_VENV_DIR", "/tmp/peers-venvs"))
    return root / PEER_VENVS[side] / "bin" / "python"


def peer_versions(python: Path, side: str) -> tuple[dict[str, str] | None, str]:
    """The versions of a peer's packages in its interpreter, or None and why it cannot run."""
    if not python.exists():
        return None, f"no interpreter at {python} (make its venv: see this script's docstring)"
    code = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    )
    done = subprocess.run(
        [str(python), "-c", code, *PEER_PACKAGES[side]], capture_output=True, text=True
    )
    if done.returncode != 0:
        return None, f"{python}: {_last_error(done.stdout + done.stderr)}"
    return json.loads(done.stdout), ""


def _last_error(output: str, lines: int = 30) -> str:
    """The last traceback in a process's output, to its exception's line (at most `lines`
    lines), or without one the output's last lines."""
    text = output.rstrip().splitlines()
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent")]
    if not starts:
        return "\n".join(text[-lines:])
    end = starts[-1] + 1
    while end < len(text) and (not text[end] or text[end][0].isspace()):
        end += 1  # the frames, indented, down to the exception's own line
    return "\n".join(text[starts[-1] : end + 1][-lines:])


def _agentenv_settings(args: argparse.Namespace, seed: int, root: Path, name: str) -> list[str]:
    import common

    fields = {"seed": seed, "return_window": SCORE_WINDOW}
    budget = args.frames // FRAME_SKIP
    game = f"env.id=ALE/{args.game}-v5"
    return [game, *common.run_settings(root, name, total_env_steps=budget, **fields)]


def run_agentenv(args: argparse.Namespace, side: str, seed: int, root: Path) -> dict[str, Any]:
    """`agentenv train` in one process or under mpiexec; its launch-to-exit seconds and its
    summary."""
    import common

    name = f"{side}-seed{seed}"
    settings = _agentenv_settings(args, seed, root, name)
    label = f"{side} seed {seed}"
    if side == "agentenv":
        _, wall_s = common.run_job(common.train_command(args.config, settings), label, args.timeout)
    else:
        wall_s = common.run_agentenv_mpi(MPI_RANKS, args.config, settings, label, args.timeout)
    summary = json.loads((root / name / "summary.json").read_text())
    steady = summary["steps_per_s_after_first_update"]
    return {
        "frames": summary["env_steps"] * FRAME_SKIP,
        "wall_s": wall_s,
        "steady_fps": None if steady is None else steady * FRAME_SKIP,
        "score": summary["episode_return_mean"],
        "games_counted": min(summary["episodes"], SCORE_WINDOW),
        "games": summary["episodes"],
        "learner_wall_s": summary["wall_s"],
        "human_normalized_score": summary.get("human_normalized_score"),
        "topology": summary.get("topology"),
    }


def run_peer(args: argparse.Namespace, side: str, seed: int, root: Path) -> dict[str, Any]:
    """A peer's worker in its own interpreter, clocked from just before its launch to its exit.
    A failure is returned as `error` (the output's last traceback), not raised."""
    import common

    python = args.sb3_python if side == "sb3" else args.sf_python
    run_dir = root / f"{side}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [str(python), str(Path(__file__).resolve()), "--worker", side]
    command += ["--game", args.game, "--frames", str(args.frames), "--seed", str(seed)]
    command += ["--threads", str(args.threads), "--run-dir", str(run_dir)]
    with common.job_environment() as env:
        launched_at = time.time()
        started = time.perf_counter()
        command += ["--launched-at", repr(launched_at)]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=args.timeout
            )
        except subprocess.TimeoutExpired as err:
            return {"error": f"no result within --timeout {args.timeout:g} s ({err})"}
        wall_s = time.perf_counter() - started
    (run_dir / "output.txt").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    results = common.results_in(done.stdout, RESULT_PREFIX)
    if done.returncode != 0 or not results:
        why = _last_error(done.stdout + "\n" + done.stderr)
        return {"error": f"exit {done.returncode}:\n{why}"}
    return results[0] | {"wall_s": wall_s}


def _cell(value: float | None, spec: str) -> str:
    """A number, or `--` for none (no steady rate, or no game finished: NaN)."""
    return "--" if value is None or math.isnan(value) else format(value, spec)


def describe(side: str, run: dict[str, Any]) -> str:
    if "error" in run:
        return f"{side:<15} FAILED: {run['error'].splitlines()[-1]}"
    return (
        f"{side:<15} {run['frames']:>9,} frames in {run['wall_s']:7.1f} s, steady "
        f"{_cell(run['steady_fps'], ',.0f')} FPS, score {_cell(run['score'], '.2f')} "
        f"({run['games_counted']} of {run['games']} games)"
    )


def _median(runs: list[dict[str, Any]], value: Any) -> float | None:
    values = [value(run) for run in runs if "error" not in run]
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else None


def print_report(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Every run's row, then agentenv's FPS over each peer's (medians over seeds)."""
    import common

    print()
    common.print_header(
        f"{'side':<28} {'seed':>4} | {'frames':>9} {'wall s':>8} {'FPS launch':>10} | "
        f"{'steady FPS':>10} | {'score':>7} {'games':>9}"
    )
    for side, side_runs in runs.items():
        for run in side_runs:
            if "error" in run:
                print(f"{LABELS[side]:<28} {run['seed']:>4} | failed (its error is above)")
                continue
            games = f"{run['games_counted']}/{run['games']}"
            print(
                f"{LABELS[side]:<28} {run['seed']:>4} | {run['frames']:>9,} "
                f"{run['wall_s']:8.1f} {run['frames'] / run['wall_s']:10,.0f} | "
                f"{_cell(run['steady_fps'], ',.0f'):>10} | {_cell(run['score'], '.2f'):>7} "
                f"{games:>9}"
            )
    print(
        "FPS launch: frames / seconds from launch to exit; steady: from the end of the first "
        f"update to the end of the last;\nscore: mean of the last {SCORE_WINDOW} whole games "
        "(games: counted/finished)"
    )
    steady = {side: _median(r, lambda run: run["steady_fps"]) for side, r in runs.items()}
    launch = {
        side: _median(r, lambda run: run["frames"] / run["wall_s"]) for side, r in runs.items()
    }
    print()
    common.print_header(
        f"{'agentenv FPS / peer FPS (medians over seeds)':<50} | {'steady':>6} {'goal > 1':>8} | "
        f"{'launch':>6}"
    )
    for ours in (side for side in OURS if side in runs):
        for peer in (side for side in PEERS if side in runs):
            line = f"{LABELS[ours] + ' / ' + LABELS[peer]:<50} |"
            if None in (steady[ours], steady[peer], launch[ours], launch[peer]):
                print(f"{line} {'--':>6}")
                continue
            ratio = steady[ours] / steady[peer]
            verdict = "ok" if ratio > GOAL else "MISS"
            print(f"{line} {ratio:6.2f} {verdict:>8} | {launch[ours] / launch[peer]:6.2f}")


def _load() -> str:
    """The machine's load averages: other work on a shared machine slows every side."""
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


def _parser() -> argparse.ArgumentParser:
    import common

    parser = common.make_parser(
        __doc__,
        config=common.EXPERIMENTS / "pong_ppo.yaml",
        config_help="agentenv YAML (PPO, 8 envs x 128 steps)",
        seeds=[0],
        run_timeout=3600.0,
        keep_runs=True,
    )
    parser.add_argument("--game", default="Pong", help="Atari game, as in ALE/<Game>-v5")
    parser.add_argument(
        "--frames", type=int, default=400_000, help="frames per run (agent steps x 4)"
    )
    parser.add_argument(
        "--skip", nargs="+", default=[], choices=SIDES, metavar="SIDE", help=f"of {SIDES}"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads in sb3's process"
    )
    parser.add_argument(
        "--sb3-python",
        type=Path,
        default=default_peer_python("sb3"),
        help="the sb3 venv's interpreter ($PEERS_VENV_DIR/atari)",
    )
    parser.add_argument(
        "--sf-python",
        type=Path,
        default=default_peer_python("sample-factory"),
        help="the Sample Factory venv's interpreter ($PEERS_VENV_DIR/sample-factory)",
    )
    return parser


def main() -> None:
    import common

    args = _parser().parse_args()
    sides = [side for side in SIDES if side not in args.skip]
    print(
        f"Atari peers: {args.game}, {args.frames:,} frames per run ({args.frames // 4:,} agent "
        f"steps, {ENVS} games), seeds {args.seeds}"
    )
    print(common.provenance("envpool", "ale-py"))
    print(f"load average at start (1, 5, 15 min): {_load()}")
    print(
        f"torch intra-op threads: {args.threads} in sb3's process; Sample Factory: 1 per "
        f"process (its own); agentenv: XLA's defaults"
    )
    failed: dict[str, str] = {}
    for peer in (side for side in PEERS if side in sides):
        python = args.sb3_python if peer == "sb3" else args.sf_python
        versions, why = peer_versions(python, peer)
        if versions is None:
            failed[peer] = why
            print(f"{peer}: cannot run: {why}")
        else:
            print(f"{peer}: {python}: " + ", ".join(f"{p} {v}" for p, v in versions.items()))
    sides = [side for side in sides if side not in failed]
    if not sides:
        raise SystemExit("no side left to run")
    print(flush=True)

    def run_side(side: str, seed: int, root: Path) -> dict[str, Any]:
        started = time.perf_counter()
        if side in OURS:
            run = run_agentenv(args, side, seed, root)
        else:
            run = run_peer(args, side, seed, root)
        if "error" in run:
            print(f"  {side} seed {seed} failed, its error:\n{run['error']}", flush=True)
        run["driver_s"] = time.perf_counter() - started
        return run

    started = time.perf_counter()
    with common.runs_folder(args.keep_runs, "agentenv_atari_peers_") as root:
        runs = common.run_seeds(sides, args.seeds, run_side, describe, root)
    wrappers = {
        side: run["wrappers"] for side in PEERS for run in runs.get(side, []) if "wrappers" in run
    }
    for side, chain in wrappers.items():
        print(f"  {side} wrappers, outermost first: {chain}")
    print_report(runs)
    for peer, why in failed.items():
        print(f"{LABELS[peer]}: not run: {why}")
    seconds = time.perf_counter() - started
    print(f"\nwhole benchmark: {seconds:.0f} s; load average at the end: {_load()}")
    common.save_json(
        args.json,
        {"game": args.game, "frames": args.frames, "runs": runs, "not_run": failed}
        | {"provenance": common.provenance("envpool", "ale-py")},
    )


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        worker_main(sys.argv[1:])  # in a peer's interpreter: no agentenv_jax here
    else:
        main()
