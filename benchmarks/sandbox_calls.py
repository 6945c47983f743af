"""The sandbox's cost and throughput, each side clocked the same way in one run:

1. a trivial program (`print(1 + 1)`; the old in-process tool evaluates `1 + 1`) called one
   after another: calls/s and p50/p99 latency for a warm pool's worker, a fresh sandbox per
   call (bubblewrap started, the program run, the sandbox ended), a plain subprocess with a
   timeout and no isolation, and the in-process daemon thread the tools used before;
2. how many sandboxes one process keeps running at once: a pool of W workers runs W programs
   that sleep 1 s; the batch's wall time / 1 s, and the pool's start-up;
3. one vector step of 16 envs whose messages each call the `code` tool with a program that
   sleeps 1 s: the step's wall time / 1 s (goal <= 1.3), with 16 workers, and with 1 (calls
   one after another, as before the pool) for reference.

    python benchmarks/sandbox_calls.py
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_parser, print_header, provenance  # noqa: E402

from agentenv_jax.envs.sandbox import (  # noqa: E402
    SandboxPool,
    SandboxSettings,
    SandboxWorker,
    close_shared_pools,
)
from agentenv_jax.envs.text.tasks import ArithmeticTask  # noqa: E402
from agentenv_jax.envs.text.tool_tasks import ToolTask, resolve_tools  # noqa: E402
from agentenv_jax.envs.text.tools import python, run_tool  # noqa: E402

TRIVIAL = "print(1 + 1)"
STEP_GOAL = 1.3


def latencies(call, count: int) -> list[float]:
    """Seconds of each of `count` calls, one after another (after one warm-up call)."""
    call()
    spans = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        spans.append(time.perf_counter() - started)
    return spans


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--calls", type=int, default=200, help="calls per warm side")
    parser.add_argument("--fresh-calls", type=int, default=30, help="calls per fresh side")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 4, 16, 64, 128])
    args = parser.parse_args()
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout
    print(provenance())
    print(f"{bwrap.strip()}, {shutil.which('bwrap')}\n")

    settings = SandboxSettings(isolation="bubblewrap", workers=1)
    with SandboxPool(settings) as pool:
        sides = {
            "warm pool worker": (
                lambda: _check(pool.run_source(TRIVIAL).stdout),
                args.calls,
            ),
            "fresh bubblewrap sandbox": (lambda: _fresh(settings), args.fresh_calls),
            "plain subprocess": (
                lambda: _check(
                    subprocess.run(
                        [sys.executable, "-I", "-c", TRIVIAL],
                        capture_output=True,
                        text=True,
                        timeout=5,
                    ).stdout
                ),
                args.fresh_calls,
            ),
            "in-process thread (before)": (
                lambda: _check(run_tool({"python": python}, "python", {"expression": "1 + 1"})[0]),
                args.calls * 10,
            ),
        }
        measured = {name: latencies(call, count) for name, (call, count) in sides.items()}
    warm = statistics.median(measured["warm pool worker"])
    print_header(
        f"{'a trivial program':<28} {'calls':>6} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'p50 / warm':>11}"
    )
    for name, spans in measured.items():
        p50 = statistics.median(spans)
        print(
            f"{name:<28} {len(spans):>6} {len(spans) / sum(spans):>9.1f} {p50 * 1e3:>8.2f}"
            f" {percentile(spans, 99) * 1e3:>8.2f} {p50 / warm:>11.3f}"
        )

    print()
    print_header(f"{'workers':>7} {'start s':>8} {'ok':>5} {'batch s':>8} {'batch / 1 s':>12}")
    widths = {}
    for width in args.widths:
        started = time.perf_counter()
        with SandboxPool(SandboxSettings(isolation="bubblewrap", workers=width)) as pool:
            start_s = time.perf_counter() - started
            requests = [{"kind": "source", "source": "import time; time.sleep(1)"}] * width
            started = time.perf_counter()
            results = pool.map(requests)
            batch_s = time.perf_counter() - started
        ok = sum(r.ok for r in results)
        widths[width] = {"start_s": start_s, "ok": ok, "batch_s": batch_s}
        print(f"{width:>7} {start_s:>8.2f} {ok:>5} {batch_s:>8.2f} {batch_s:>12.3f}")

    print()
    print_header(f"{'vector step, 16 envs':<22} {'step s':>7} {'step / 1 s':>11} {'goal':>6}")
    steps = {}
    for workers in (16, 1):
        tasks = [
            ToolTask(
                ArithmeticTask(),
                resolve_tools(["code"]),
                time_limit_s=30.0,
                sandbox={"isolation": "bubblewrap", "workers": workers},
            )
            for _ in range(16)
        ]
        message = (
            '<tool_call>{"name": "code", "arguments": '
            '{"code": "import time; time.sleep(1)"}}</tool_call>'
        )
        started = time.perf_counter()
        replies = ToolTask.reply_batch(tasks, [message] * 16, [np.zeros(0, np.int32)] * 16)
        step_s = time.perf_counter() - started
        assert all(r.text.startswith("exit status: 0") for r in replies), replies[0].text
        steps[workers] = step_s
        verdict = ("ok" if step_s <= STEP_GOAL else "MISS") if workers == 16 else "-"
        print(f"{workers:>2} workers{'':<12} {step_s:>7.2f} {step_s:>11.3f} {verdict:>6}")
        close_shared_pools()
    print(
        "\nRESULT "
        + json.dumps(
            {
                "latency_s": {k: statistics.median(v) for k, v in measured.items()},
                "widths": widths,
                "step_s": steps,
            }
        )
    )


def _check(text: str) -> None:
    if text.strip() != "2":
        raise RuntimeError(f"the trivial program printed {text!r}")


def _fresh(settings: SandboxSettings) -> None:
    worker = SandboxWorker("bubblewrap", settings)
    try:
        _check(worker.run({"kind": "source", "source": TRIVIAL}).stdout)
    finally:
        worker.close()


if __name__ == "__main__":
    main()
