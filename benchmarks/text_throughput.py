"""Token throughput of language-model PPO on the text envs: tokens generated and trained per
second, central inference (`topology.inference: learner`) ÷ env-rank inference, in one process
and under mpiexec; and the KV cache's speed-up of generation alone.

Each side trains `experiments/arithmetic_ppo.yaml` (single-turn) or `guess_number_ppo.yaml`
(multi-turn) with the tiny model for the same number of updates (`--updates`, default 30) as a
fresh job with an empty compilation cache (cold), at two response lengths: the experiment's own
(2 tokens; contexts 8 and 48) and `--long-response` (16), where generation costs more than the
env; with it the contexts are 8 (single-turn: the prompt) and `--dialogue-context` (96,
multi-turn; see `DIALOGUE_CONTEXT`). Topologies: one process (learner and env rank
interleaved), 1 learner + 2 env ranks (`mpiexec -n 3`) and 1 + 3 (`mpiexec -n 4`). Within each
setting and topology the two inference places run back to back, the one that goes first
alternating, and each ratio central ÷ env-rank is of those two runs.

Clocks, the same for every side:

* job: from just before the process (or `mpiexec`) is launched to its exit: imports, MPI start,
  compiling, the updates and the final checkpoint. Its rates are the run's whole token
  accounting (`summary.json` `token_accounting`: `produced`, the tokens env ranks generated,
  and `trained`) over those seconds. "start s": launch to the learner session's `start` event
  (`events.jsonl`, an epoch time like the launch's); "to upd 1": launch to the end of update 1;
  "compile": `summary.json` `compile_s`, XLA compile seconds summed over the learner's threads
  (it can exceed the job's seconds).
* steady: from the end of update `--k0` (default 5) to the end of the last update. Records in
  `metrics.jsonl` carry no timestamp; each update's `wall_s` (seconds since the learner session
  started, when the record was made) is in `timings.jsonl`, joined on `update`. Rate = Δ of the
  cumulative `tokens_generated` (resp. `tokens_trained`) of `metrics.jsonl` ÷ Δ `wall_s`.
  `tokens_generated` counts the tokens the learner received; on-policy, both counts grow by one
  update's tokens per update, so the two steady rates coincide. The records' `tokens_*_per_s`
  are not used: they are the session's counts over the session's seconds so far (the first
  compiles included), not per-update rates.

"upd s" is the median of the steady window's update-to-update seconds (a load burst stretches
a few updates: the median is steadier than the window's rate). "rows" is central inference's
mean rows per generation call (`central_inference` `rows_per_act_batch`; every call is padded
to all envs). A generation call costs the same whether or not rows stop at EOS: the shapes
(envs, context, response) set the cost.

Generation alone: the jitted `networks.generation.generate` of the tiny model (random
parameters, random full contexts of `--gen-context` = 32 tokens) at batch 8, 32, 128 and
response 16, cached (`prefill`, then one `decode` per token) and uncached (`use_cache=False`:
the whole buffer rerun per token), in a process of its own; the timed calls alternate between
the two, and each side's time is the median of `--gen-repeats` calls after the first (compile)
call. tokens/s = batch × response length ÷ seconds per call.

The machine has 2 cores: 1 + 2 ranks are 3 processes, 1 + 3 are 4, so the learner and env
ranks share the cores (oversubscribed): a side's rate includes waiting for a core, and more env
ranks can only add throughput while a core is idle. Env ranks run XLA single-threaded
(`topology.single_threaded_env_ranks`); under central inference they only step the text env
and wait for the learner's reply (spinning 50 µs, then sleeping), under env-rank inference each
also generates with its own CPU copy. The load average is printed before and after every run.

Recorded in docs/benchmarks.md ("Language models on text: tokens per second") from the first
command:

    python benchmarks/text_throughput.py                 # 12 min here (15 under load)
    python benchmarks/text_throughput.py --quick         # smoke run, 40 s
    python benchmarks/text_throughput.py --env-ranks 0 2 --updates 50 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import common
from generation_timing import generation_worker, print_generation

TEXT_EXPERIMENTS = ("arithmetic_ppo", "guess_number_ppo")
INFERENCE = ("env_ranks", "learner")  # topology.inference; "learner" is central inference
RESULT_PREFIX = "TEXT_THROUGHPUT "
MULTI_TURN = ("guess_number_ppo",)
# With the long response, a single-turn context holds the prompt only ("BOS 4+4="). A multi-turn
# one holds as much of the dialogue as `--dialogue-context` allows, its newest tokens: the
# prompt (24 tokens) and each turn's message, EOS and reply (up to 21 tokens). A random model's
# message of 16 byte tokens is decoded with invalid UTF-8 replaced and encoded again, ~29
# tokens on average (43 at most in 1000 draws), so 96 holds the prompt and the first turn, or
# the newest two turns. Costs depend on the shape only (every row is generated and scored to
# full length), not on how much of a dialogue fits.
SINGLE_TURN_CONTEXT = 8
DIALOGUE_CONTEXT = 96


def _side_name(env_ranks: int) -> str:
    return "1 process" if env_ranks == 0 else f"1+{env_ranks} (-n {env_ranks + 1})"


def steady_rates(run_dir: Path, k0: int) -> dict[str, float]:
    """Tokens generated and trained per second from the end of update `k0` to the end of the
    last: `metrics.jsonl`'s cumulative counts over `timings.jsonl`'s `wall_s`, joined on
    `update`."""
    metrics = {r["update"]: r for r in common.read_jsonl(run_dir / "metrics.jsonl")}
    walls = {r["update"]: r["wall_s"] for r in common.read_jsonl(run_dir / "timings.jsonl")}
    last = max(metrics)
    if k0 >= last:
        raise SystemExit(f"--k0 {k0} leaves no steady window in {last} updates")
    seconds = walls[last] - walls[k0]
    # Load bursts on a shared machine stretch single updates; the median update is the
    # steadier figure, printed beside the window's rate.
    durations = [walls[k] - walls[k - 1] for k in range(k0 + 1, last + 1)]
    return {
        "steady_s": seconds,
        "median_update_s": common.median(durations),
        "steady_generated_per_s": (
            metrics[last]["tokens_generated"] - metrics[k0]["tokens_generated"]
        )
        / seconds,
        "steady_trained_per_s": (metrics[last]["tokens_trained"] - metrics[k0]["tokens_trained"])
        / seconds,
        "updates": last,
        "first_update_s": walls[min(walls)],
    }


def train_job(world: int, config: Path, settings: list[str], name: str, args) -> dict[str, Any]:
    """One training job of `world` processes (1: no mpiexec), clocked from just before its
    launch to its exit, with an empty compilation cache of its own; its rates."""
    command = common.train_command(config, [*settings, *common.run_settings(args.run_root, name)])
    if world > 1:
        command = common.under_mpiexec(world, command)
    load_before = os.getloadavg()[0]
    launched_at = time.time()
    _, job_s = common.run_job(command, name, args.job_timeout)
    run_dir = args.run_root / name
    summary = json.loads((run_dir / "summary.json").read_text())
    events = common.read_jsonl(run_dir / "events.jsonl")
    session_start = next(e["time"] for e in events if e.get("event") == "start")
    tokens = summary["token_accounting"]
    central = summary.get("central_inference") or {}
    steady = steady_rates(run_dir, args.k0)
    return {
        "job_s": job_s,
        "start_s": session_start - launched_at,
        "to_first_update_s": session_start - launched_at + steady.pop("first_update_s"),
        "compile_s": summary.get("compile_s"),
        "produced_tokens": tokens["produced"],
        "trained_tokens": tokens["trained"],
        "tokens_reconcile": tokens["reconciles"],
        "job_generated_per_s": tokens["produced"] / job_s,
        "job_trained_per_s": tokens["trained"] / job_s,
        "rows_per_act_batch": central.get("rows_per_act_batch"),
        "central_compute_s": central.get("compute_s"),
        "load": [load_before, os.getloadavg()[0]],
        **steady,
    }


def settings_for(experiment: str, response_length: int | None, args) -> tuple[list[str], str]:
    """The `--set` strings of a setting (the budget of `args.updates` updates; the response
    length and its context, None: the experiment's own) and its title."""
    from agentenv_jax.config import load_config

    overrides = []
    if response_length is not None:
        context = args.dialogue_context if experiment in MULTI_TURN else SINGLE_TURN_CONTEXT
        overrides += [
            f"env.kwargs.response_length={response_length}",
            f"env.kwargs.context_length={context}",
        ]
    config = load_config(common.EXPERIMENTS / f"{experiment}.yaml", overrides)
    per_update = config.algorithm.rollout_length * config.env.global_num_envs
    kwargs = config.env.kwargs
    title = (
        f"{experiment}: context {kwargs['context_length']}, response "
        f"{kwargs['response_length']}, {config.env.global_num_envs} envs x "
        f"{config.algorithm.rollout_length} messages per update"
    )
    return [*overrides, f"run.total_env_steps={args.updates * per_update}"], title


def run_setting(experiment: str, response_length: int | None, args, turn: int) -> dict:
    """Every topology of one setting, both inference places back to back (which goes first
    alternates with `turn`); the runs by topology and place."""
    settings, _ = settings_for(experiment, response_length, args)
    config = common.EXPERIMENTS / f"{experiment}.yaml"
    results: dict[str, dict[str, dict]] = {}
    for env_ranks in args.env_ranks:
        order = INFERENCE if turn % 2 == 0 else INFERENCE[::-1]
        turn += 1
        side = _side_name(env_ranks)
        results[side] = {}
        for place in order:
            name = f"{experiment}-m{response_length or 'default'}-r{env_ranks}-{place}"
            world = env_ranks + 1 if env_ranks else 1
            run = train_job(world, config, [*settings, f"topology.inference={place}"], name, args)
            results[side][place] = run
            print(
                f"  {side:<10} {place:<9} job {run['job_s']:5.1f} s, steady "
                f"{run['steady_generated_per_s']:7,.0f} tokens generated/s "
                f"(load {run['load'][0]:.1f} -> {run['load'][1]:.1f})",
                flush=True,
            )
            if not run["tokens_reconcile"]:
                print(f"  WARNING: {name}'s token accounting does not reconcile", flush=True)
    return results


def _fmt(value: float | None, spec: str) -> str:
    """`value` in `spec` ("7.1f"), or a dash as wide."""
    return "-".rjust(int(spec.split(".")[0])) if value is None else format(value, spec)


RATIOS = {
    "job gen": "job_generated_per_s",
    "job trn": "job_trained_per_s",
    "steady gen": "steady_generated_per_s",
    "steady trn": "steady_trained_per_s",
}


def print_setting(title: str, results: dict[str, dict[str, dict]]) -> None:
    print(f"\n{title}")
    header = (
        f"{'topology':<10} | {'inference':<9} | {'job s':>5} | {'start s':>7} | "
        f"{'to upd 1':>8} | {'compile':>7} | {'tokens':>6} | {'job gen/s':>9} | "
        f"{'job trn/s':>9} | {'steady gen/s':>12} | {'steady trn/s':>12} | {'upd s':>5} | "
        f"{'rows':>4} | {'load':>9}"
    )
    common.print_header(header)
    for side, places in results.items():
        for place, r in places.items():
            print(
                f"{side:<10} | {place:<9} | {r['job_s']:5.1f} | {r['start_s']:7.1f} | "
                f"{r['to_first_update_s']:8.1f} | {_fmt(r['compile_s'], '7.1f')} | "
                f"{r['produced_tokens']:6} | {r['job_generated_per_s']:9,.0f} | "
                f"{r['job_trained_per_s']:9,.0f} | {r['steady_generated_per_s']:12,.0f} | "
                f"{r['steady_trained_per_s']:12,.0f} | {r['median_update_s']:5.2f} | "
                f"{_fmt(r['rows_per_act_batch'], '4.1f')} | "
                f"{r['load'][0]:4.1f}>{r['load'][1]:<4.1f}"
            )
    print("central ÷ env-rank inference (the two runs back to back):")
    for side, places in results.items():
        central, own = places["learner"], places["env_ranks"]
        ratios = ", ".join(f"{k} {central[v] / own[v]:.2f}" for k, v in RATIOS.items())
        update = own["median_update_s"] / central["median_update_s"]
        print(f"  {side:<10} {ratios}; median update (inverse) {update:.2f}")


def parse_args() -> argparse.Namespace:
    parser = common.make_parser(__doc__, keep_runs=True)
    parser.add_argument(
        "--experiments", nargs="+", default=list(TEXT_EXPERIMENTS), choices=TEXT_EXPERIMENTS
    )
    parser.add_argument("--updates", type=int, default=30, help="updates per training run")
    parser.add_argument("--k0", type=int, default=5, help="steady clock from the end of update")
    parser.add_argument(
        "--long-response", type=int, default=16, help="the second response length (0: none)"
    )
    parser.add_argument(
        "--dialogue-context",
        type=int,
        default=DIALOGUE_CONTEXT,
        help="multi-turn context with the long response",
    )
    parser.add_argument(
        "--env-ranks",
        type=int,
        nargs="+",
        default=[0, 2, 3],
        help="topologies: env ranks beside one learner (0: one process)",
    )
    parser.add_argument("--gen-batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--gen-context", type=int, default=32, help="generation: context")
    parser.add_argument("--gen-response", type=int, default=16, help="generation: response")
    parser.add_argument("--gen-repeats", type=int, default=20, help="generation: timed calls")
    parser.add_argument("--no-generation", action="store_true", help="skip generation alone")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (< 1 min): arithmetic, its own response, 1 process and 1+2, 3 updates",
    )
    parser.add_argument("--job-timeout", type=float, default=600.0, help="per job (s)")
    common.add_worker_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.experiments, args.updates, args.k0, args.env_ranks = ["arithmetic_ppo"], 3, 1, [0, 2]
        args.gen_batches, args.gen_repeats = [8], 3
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        generation_worker(args, RESULT_PREFIX)
        return
    if any(args.env_ranks):
        common.require_mpiexec()
    started = time.perf_counter()
    print(
        f"text throughput: tiny language model, {args.updates} updates per run, steady clock "
        f"from the end of update {args.k0}; load average {os.getloadavg()[0]:.1f} at the start"
    )
    print(common.provenance(), flush=True)
    responses = [None] + ([args.long_response] if args.long_response and not args.quick else [])
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "settings": []}
    with common.runs_folder(args.keep_runs, "agentenv_text_throughput_") as args.run_root:
        turn = 0
        for response_length in responses:
            for experiment in args.experiments:
                title = settings_for(experiment, response_length, args)[1]
                print(f"\n{title}", flush=True)
                results = run_setting(experiment, response_length, args, turn)
                turn += len(args.env_ranks)
                report["settings"].append({"title": title, "results": results})
    for setting in report["settings"]:
        print_setting(setting["title"], setting["results"])
    if not args.no_generation:
        worker_args = [
            "--gen-context", str(args.gen_context),
            "--gen-response", str(args.gen_response),
            "--gen-repeats", str(args.gen_repeats),
            "--gen-batches", *map(str, args.gen_batches),
        ]  # fmt: skip
        report["generation"] = common.run_worker(
            __file__, worker_args, RESULT_PREFIX, "generation alone", args.job_timeout
        )
        print_generation(report["generation"])
    print(
        f"\nwhole benchmark {time.perf_counter() - started:.0f} s; load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    common.save_json(args.json, report)


if __name__ == "__main__":
    main()
