"""The package's layers and who imports whom, read from the source with `ast` (nothing imported).

    python tools/layers.py --write docs/layers.md   # regenerate the docs page
    python tools/layers.py --check                  # exit 1 on an import circle or upward import

Every import counts, those inside functions too: a lazy import still ties two modules together.
A module may import its own layer and the layers below it; an import circle between modules is
refused even inside one layer.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "agentenv_jax"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


@dataclasses.dataclass(frozen=True)
class Layer:
    name: str
    packages: tuple[str, ...]  # sub-packages of agentenv_jax
    holds: str


# Bottom first. The package's docstring names them in this order (tests/test_layers.py).
LAYERS = (
    Layer("config", ("config",), "the schema of a run, its loading, checks and size estimates"),
    Layer(
        "core",
        ("algorithms", "networks", "envs", "parallel", "checkpoint"),
        "pure losses and updates, models, environments, device meshes, checkpoint files",
    ),
    Layer(
        "experience",
        ("buffers", "transport", "metrics"),
        "where experience is held and how it moves between ranks; what is counted and logged",
    ),
    Layer("loops", ("actor", "learner"), "the env rank's and the learner's loops"),
    Layer(
        "runtime",
        ("runtime",),
        "one driver for every run shape, the roles, the supervisor and start-up checks",
    ),
    Layer("workflow", ("workflow",), "the API, the CLI, evaluation, sweeps, Slurm and plots"),
)


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module that `name` (a module or a name inside one) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in its file)."""
    modules = module_files(root)
    package = root.name
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")[: None if is_package else -1]
                    base = base[: len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from a import b` imports module a.b when there is one, else a name of a.
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                if target == package or target.startswith(package + "."):
                    owner = _owner(target, modules)
                    if owner not in (None, name, package):
                        imported.add(owner)
        graph[name] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def layer_of(module: str, layers: Iterable[Layer] = LAYERS) -> int | None:
    """The index of `module`'s layer (bottom 0), None for the package itself or a module in no
    layer."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for i, layer in enumerate(layers):
        if parts[1] in layer.packages:
            return i
    return None


def unplaced(graph: dict[str, set[str]], layers: Iterable[Layer] = LAYERS) -> list[str]:
    """Modules outside every layer: a loose module at the top, or a sub-package no layer
    names."""
    layers = tuple(layers)
    return sorted(m for m in graph if "." in m and layer_of(m, layers) is None)


def upward_imports(
    graph: dict[str, set[str]], layers: Iterable[Layer] = LAYERS
) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer."""
    layers = tuple(layers)
    found = []
    for module, imported in sorted(graph.items()):
        own = layer_of(module, layers)
        for other in sorted(imported):
            theirs = layer_of(other, layers)
            if own is not None and theirs is not None and theirs > own:
                found.append((module, other))
    return found


def package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Sub-package -> the other sub-packages its modules import."""
    edges: dict[str, set[str]] = {}
    for module, imported in graph.items():
        if "." not in module:
            continue
        own = module.split(".")[1]
        edges.setdefault(own, set())
        edges[own] |= {m.split(".")[1] for m in imported if "." in m} - {own}
    return edges


def render_markdown(graph: dict[str, set[str]], layers: Iterable[Layer] = LAYERS) -> str:
    """The docs page: the layers, bottom last as in a stack, and who imports whom."""
    layers = tuple(layers)
    edges = package_edges(graph)
    counts = {p: sum(1 for m in graph if m.split(".")[1:2] == [p]) for p in edges}
    lines = [
        "# Layers",
        "",
        "<!-- Generated by `python tools/layers.py --write docs/layers.md`; do not edit. -->",
        "",
        "`agentenv_jax` is built in layers. A module imports its own layer and the layers below",
        "it, never one above, and no two modules import each other, even through others:",
        "`tests/test_layers.py` reads every import (those inside functions too) and fails on an",
        "import circle or an upward import.",
        "",
        "| layer | packages | holds |",
        "| --- | --- | --- |",
    ]
    for layer in reversed(layers):
        packages = ", ".join(f"`{p}` ({counts.get(p, 0)})" for p in layer.packages)
        lines.append(f"| {layer.name} | {packages} | {layer.holds} |")
    lines += [
        "",
        "In brackets: how many modules a package has. Who imports whom, by package:",
        "",
        "| package | layer | imports |",
        "| --- | --- | --- |",
    ]
    for layer in reversed(layers):
        for package in layer.packages:
            imported = sorted(
                edges.get(package, ()),
                key=lambda p: (-(layer_of(f"{PACKAGE}.{p}", layers) or 0), p),
            )
            names = ", ".join(f"`{p}`" for p in imported) or "nothing of the package"
            lines.append(f"| `{package}` | {layer.name} | {names} |")
    return "\n".join(lines) + "\n"


def problems(root: Path = ROOT, layers: Iterable[Layer] = LAYERS) -> list[str]:
    """Every import circle, upward import and module outside the layers, one line each."""
    layers = tuple(layers)
    graph = import_graph(root)
    found = [f"import circle: {' -> '.join(group)}" for group in cycles(graph)]
    for module, other in upward_imports(graph, layers):
        own, theirs = layers[layer_of(module, layers)], layers[layer_of(other, layers)]
        found.append(f"upward import: {module} ({own.name}) imports {other} ({theirs.name})")
    found += [f"in no layer: {module}" for module in unplaced(graph, layers)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the docs page here")
    parser.add_argument("--check", action="store_true", help="exit 1 on any problem")
    args = parser.parse_args(argv)
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    if args.write:
        args.write.write_text(render_markdown(import_graph()))
        print(f"wrote {args.write}")
    elif not args.check:
        print(render_markdown(import_graph()), end="")
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
