"""Self-play against a frozen opponent: the win rate of SmolLM2 + LoRA at TextArena's TicTacToe
against the untrained model, before and after training, per seed, in one run.

Each seed trains `experiments/tictactoe_smollm2.yaml` (one seat of each game played by the
untrained model, frozen on the env rank) in one process, `agentenv train` as a user runs it.
Then the same `--episodes` games (evaluation seeds 0..N-1, as `agentenv eval` draws them, the
policy's seat alternating from game to game) are played against the untrained model by the
untrained model itself ("before": the two sides alike, so wins and losses balance up to the
first mover's edge) and by the run's final checkpoint ("after": `agentenv_jax.evaluate`).
Each side's messages are sampled at temperature 1, as in training: greedy decoding would
replay one game per opening. Printed per seed: the win, draw and loss rates, and the policy's
mean return on each seat (1 a win, -1 a loss, 0 a draw); the gain is after - before in
win-rate points.

    python benchmarks/self_play_win_rate.py                          # seed 0
    python benchmarks/self_play_win_rate.py --seeds 0 --set run.total_env_steps=288   # 4 updates
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import common

OFFLINE = {"HF_HUB_OFFLINE": "1"}


def outcomes(sample: Any) -> dict[str, float]:
    """Win, draw and loss rates of a `DialogueSample` of games, and the mean return per seat
    (a seat's dialogue opens with the game's "You are Player <seat>")."""
    returns = list(sample.returns)
    count = len(returns)
    out = {
        "win": sum(r > 0 for r in returns) / count,
        "draw": sum(r == 0 for r in returns) / count,
        "loss": sum(r < 0 for r in returns) / count,
    }
    for seat in (0, 1):
        seated = [
            r
            for r, text in zip(returns, sample.transcripts, strict=True)
            if f"You are Player {seat}" in text
        ]
        out[f"seat_{seat}"] = sum(seated) / len(seated) if seated else float("nan")
    return out


def play(run_dir: Path, episodes: int, trained: bool) -> dict[str, float]:
    """The policy's outcomes against the untrained model over `episodes` games: the run's final
    checkpoint (`trained`) or the untrained model."""
    from agentenv_jax import evaluate
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.workflow.text_dialogues import sample_dialogues

    if trained:
        sample = evaluate(run_dir, episodes=episodes, deterministic=False).dialogues
    else:
        config = load_config(run_dir / "config.yaml")
        sample = sample_dialogues(config, None, num_episodes=episodes, seed=0, temperature=1.0)
    return outcomes(sample)


def main() -> None:
    parser = common.make_parser(
        __doc__,
        config=common.EXPERIMENTS / "tictactoe_smollm2.yaml",
        seeds=[0],
        run_timeout=3 * 60 * 60,
        keep_runs=True,
        overrides=True,
    )
    parser.add_argument("--episodes", type=int, default=64, help="games per side")
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    print(
        f"{args.config.name}: win rate against the untrained model, seeds {args.seeds}, "
        f"{args.episodes} games per side, overrides {args.set or 'none'}"
    )
    print(common.provenance("textarena"), flush=True)
    runs: list[dict[str, Any]] = []
    with common.runs_folder(args.keep_runs, "agentenv_self_play_") as root:
        for seed in args.seeds:
            run_dir, train_s = common.train_seed(args, root, seed, OFFLINE)
            updates = len(common.read_jsonl(run_dir / "metrics.jsonl"))
            before = play(run_dir, args.episodes, trained=False)
            after = play(run_dir, args.episodes, trained=True)
            runs.append(
                {"seed": seed, "updates": updates, "train_s": train_s, "before": before}
                | {"after": after, "gain_points": 100 * (after["win"] - before["win"])}
            )
            print(f"  {run_dir.name}: {updates} updates in {train_s:.0f} s", flush=True)
    print()
    common.print_header(
        f"{'seed':>4} | {'updates':>7} | {'side':>6} | {'win':>5} | {'draw':>5} | {'loss':>5} | "
        f"{'seat 0':>6} | {'seat 1':>6}"
    )
    for run in runs:
        for side in ("before", "after"):
            o = run[side]
            print(
                f"{run['seed']:>4} | {run['updates']:>7} | {side:>6} | {o['win']:5.2f} | "
                f"{o['draw']:5.2f} | {o['loss']:5.2f} | {o['seat_0']:6.2f} | {o['seat_1']:6.2f}"
            )
        print(f"     gain: {run['gain_points']:+.1f} win-rate points in {run['train_s']:.0f} s")
    common.save_report(args, "textarena", runs=runs)


if __name__ == "__main__":
    main()
