"""The collectives one call of a compiled XLA program runs, counted from its optimized HLO
text (`compiled.as_text()`)."""

from __future__ import annotations

import functools
import re

_COLLECTIVE = re.compile(
    r"\s(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(([^)]*)\)"
)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) ")
_CALLEE = re.compile(r"(?:calls|body|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def collective_operands(hlo: str) -> dict[str, int]:
    """The collectives one call of a compiled program (its optimized HLO text) runs, by kind;
    a tuple all-reduce counts once per operand (XLA's CPU runtime reduces each operand with a
    collective of its own), an all-to-all once. An instruction inside a loop counts as many
    times as the loop runs (its known trip count; once when unknown)."""
    own: dict[str, dict[str, int]] = {}
    calls: dict[str, list[tuple[str, int]]] = {}
    entry = current = None
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            own[current], calls[current] = {}, []
            entry = current if line.startswith("ENTRY") else entry
            continue
        if current is None:
            continue
        for kind, operands in _COLLECTIVE.findall(line):
            count = max(1, operands.count("%")) if kind == "all-reduce" else 1
            own[current][kind] = own[current].get(kind, 0) + count
        trip = _TRIP_COUNT.search(line)
        times = int(trip.group(1)) if trip and " while(" in line else 1
        callees = _CALLEE.findall(line)
        callees += [c.strip().lstrip("%") for b in _BRANCHES.findall(line) for c in b.split(",")]
        calls[current] += [(callee, times) for callee in callees]

    @functools.cache
    def total(name: str) -> tuple[tuple[str, int], ...]:
        counts = dict(own.get(name, {}))
        for callee, times in calls.get(name, []):
            for kind, count in total(callee):
                counts[kind] = counts.get(kind, 0) + times * count
        return tuple(sorted(counts.items()))

    return dict(total(entry)) if entry else {}
