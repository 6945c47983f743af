"""A session's summary: `summary.json` in the run folder and the closing lines on stderr."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from agentenv_jax.metrics.compilation import CompileTotals, compile_totals
from agentenv_jax.transport.topology import Topology


def describe_topology(topology: Topology, learner) -> str:
    shape = dict(learner.mesh.shape)
    axes = f" (data {shape['data']} x model {shape['model']})" if "model" in shape else ""
    return (
        f"{topology.num_learner_ranks} learner + {topology.num_env_ranks} env "
        f"rank(s), {topology.global_num_envs} envs, "
        f"{len(learner.mesh.devices.flat)} learner device(s){axes}"
    )


def write_summary(
    run_dir: Path,
    learner: Any,
    started: float,
    topology: str,
    compile_start: CompileTotals,
    interrupted: bool = False,
    processes: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write RUN_DIR/summary.json of a session that began at `started` (`time.perf_counter()`)
    and show the closing summary; `topology` says in words what ran it, `processes` each
    rank's `host` (as in events.jsonl). Returns the summary."""
    wall_s = time.perf_counter() - started
    accounting = learner.accounting.as_dict()
    compiled = compile_totals().since(compile_start)
    summary = {
        "run_dir": str(run_dir),
        "interrupted": interrupted,
        "topology": topology,
        "updates": learner.updates,
        "env_steps": learner.env_steps,
        "episodes": learner.episodes,
        "episode_return_mean": learner.episode_return_mean,
        "wall_s": wall_s,
        # This session's rate: a resumed run's earlier steps took place in other processes.
        "steps_per_s": learner.session_env_steps / max(wall_s, 1e-9),
        # The same once the first update (start-up, compiling) is over: the steady rate.
        "steps_per_s_after_first_update": learner.steady_rate.steps_per_s,
        "accounting": accounting,
        "env_faults": learner.env_faults,
        # This process's XLA compilation in this session (the learner's; in one process, the
        # env rank's too): a persistent-cache hit counts as a program with a short fetch.
        "compile_s": compiled.seconds,
        "compiled_programs": compiled.programs,
        "compile_cache_hits": compiled.cache_hits,
    }
    config = getattr(learner, "config", None)
    if config is not None and config.env.preset == "atari":
        from agentenv_jax.envs.atari import atari_game, human_normalized_score

        # The mean game score from random (0) to human play (1), what Atari suites compare.
        summary["human_normalized_score"] = human_normalized_score(
            atari_game(config.env.id), learner.episode_return_mean
        )
    if getattr(learner, "env_rank_usage", None) is not None:
        # CPU seconds over wall seconds of each env rank's process, from its actor's start to
        # its final report: what waiting ranks burn; its peak resident memory, and whether it
        # imported JAX (in one process: the whole process's).
        summary |= learner.env_rank_usage
    if processes:
        summary["hosts"] = hosts_of(processes)
    if hasattr(learner, "obs_stats"):
        summary["obs_normalizer_count"] = learner.obs_stats.count
    if getattr(learner, "env_rank_obs_normalizer", None) is not None:
        # Count and mean of the statistics each env rank normalized with at the end (the
        # learner's last broadcast, the same for every rank).
        summary["env_rank_obs_normalizer"] = learner.env_rank_obs_normalizer
    if getattr(learner, "text", None) is not None:
        summary |= learner.text.summary()
    if getattr(learner, "env_rank_policy_params", None) is not None:
        # The parameters each env rank's policy held at the end: 0 with central inference.
        summary["env_rank_policy_params"] = learner.env_rank_policy_params
    if getattr(learner, "inference", None) is not None:
        summary["central_inference"] = learner.inference.report()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    # Printed whatever `run.progress` says: that setting turns off only the live progress line.
    print(format_summary(summary), file=sys.stderr, flush=True)
    return summary


def hosts_of(processes: dict[int, dict[str, Any]]) -> dict[str, list[int]]:
    """Each host and the ranks it ran, in rank order."""
    hosts: dict[str, list[int]] = {}
    for rank in sorted(processes):
        hosts.setdefault(str(processes[rank]["host"]), []).append(rank)
    return hosts


def _ranks(ranks: list[int]) -> str:
    """`0-3, 7` for [0, 1, 2, 3, 7]."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _rate(steps_per_s: float | None) -> str:
    return "--" if steps_per_s is None else f"{steps_per_s:,.0f}"


def format_summary(summary: dict[str, Any]) -> str:
    acc = summary["accounting"]
    ok = "reconciles" if acc["reconciles"] else "DOES NOT RECONCILE"
    lines = [
        "─" * 72,
        f" run        {summary['run_dir']}"
        + (
            "   (interrupted: resume with agentenv train --resume this folder)"
            if summary.get("interrupted")
            else ""
        ),
        f" topology   {summary['topology']}",
        *(
            [" hosts      " + "; ".join(f"{h} ({_ranks(r)})" for h, r in summary["hosts"].items())]
            if summary.get("hosts")
            else []
        ),
        f" updates    {summary['updates']}   env steps {summary['env_steps']:,}   "
        f"episodes {summary['episodes']:,}",
        f" return     {summary['episode_return_mean']:.2f} (mean of the last episodes)",
        f" time       {summary['wall_s']:.1f} s   {summary['steps_per_s']:,.0f} env steps/s "
        f"({_rate(summary.get('steps_per_s_after_first_update'))} after the first update)   "
        f"compiling {summary.get('compile_s', 0.0):.1f} s",
    ]
    if summary.get("env_faults"):
        lines.append(
            f" env faults {summary['env_faults']:,} (envs re-created, their partial "
            "episodes dropped)"
        )
    if "sent" in acc:
        lines += [
            f" experience produced {acc['produced']:,} = sent {acc['sent']:,} + unsent "
            f"{acc['unsent']:,}",
            f"            received {acc['received']:,} = trained {acc['trained']:,} + late "
            f"{acc['late']:,}{_discarded(acc)}   ({ok})",
        ]
    else:
        lines += [
            f" replay     produced {acc['produced']:,} = inserted {acc['inserted']:,} + pending "
            f"{acc['pending']:,} + dropped {acc['dropped']:,}",
            f"            inserted {acc['inserted']:,} + restored {acc['restored']:,} = stored "
            f"{acc['stored']:,} + overwritten {acc['overwritten']:,}",
            f"            sampled {acc['sampled']:,} = trained {acc['trained']:,} + prefetched "
            f"{acc['prefetched']:,}   ({ok})",
        ]
    for name in ("token", "episode"):
        text_acc = summary.get(f"{name}_accounting")
        if text_acc is not None:
            text_ok = "reconciles" if text_acc["reconciles"] else "DOES NOT RECONCILE"
            lines.append(
                f" {name + 's':<10} produced {text_acc['produced']:,} = sent {text_acc['sent']:,}"
                f" + unsent {text_acc['unsent']:,}; received {text_acc['received']:,} = trained "
                f"{text_acc['trained']:,} + late {text_acc['late']:,}{_discarded(text_acc)}"
                f"   ({text_ok})"
            )
    if "accuracy" in summary:
        lines.append(f" accuracy   {summary['accuracy']:.3f} (the last episodes)")
    lines.append("─" * 72)
    return "\n".join(lines)


def _discarded(accounting: dict[str, Any]) -> str:
    """The `+ discarded N` term of a run whose updates dynamic sampling refilled."""
    discarded = accounting.get("discarded", 0)
    return f" + discarded {discarded:,}" if discarded else ""
