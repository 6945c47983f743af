"""The package's layers: no import circle, no import from a lower layer up, no loose module, and
the docs page and package docstring say what `tools/layers.py` says."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import agentenv_jax

from conftest import REPO

_spec = importlib.util.spec_from_file_location("layers", REPO / "tools" / "layers.py")
layers = importlib.util.module_from_spec(_spec)
sys.modules["layers"] = layers  # dataclasses look their module up there
_spec.loader.exec_module(layers)


def test_the_package_has_no_import_circle_upward_import_or_loose_module():
    assert layers.problems() == []


def _package(root: Path, files: dict[str, str]) -> Path:
    """A package `agentenv_jax` under `root` with the given files (path -> source)."""
    for name, source in files.items():
        path = root / "agentenv_jax" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / "agentenv_jax"


_TWO_LAYERS = (
    layers.Layer("low", ("core",), "the bottom"),
    layers.Layer("high", ("app",), "the top"),
)


def test_an_upward_import_is_found_even_inside_a_function(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/maths.py": """
                def f():
                    from agentenv_jax.app.main import g
                    return g
            """,
            "app/__init__.py": "",
            "app/main.py": "g = 1\n",
        },
    )
    assert layers.problems(root, _TWO_LAYERS) == [
        "upward import: agentenv_jax.core.maths (low) imports agentenv_jax.app.main (high)"
    ]


def test_an_import_circle_inside_one_layer_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "from agentenv_jax.core.b import x\ny = 1\n",
            "core/b.py": "from . import c\nx = 1\n",
            "core/c.py": "from .a import y\n",
        },
    )
    assert layers.problems(root, _TWO_LAYERS) == [
        "import circle: agentenv_jax.core.a -> agentenv_jax.core.b -> agentenv_jax.core.c"
    ]


def test_a_loose_module_at_the_top_is_in_no_layer(tmp_path):
    root = _package(
        tmp_path,
        {"__init__.py": "", "helpers.py": "", "core/__init__.py": "", "core/a.py": ""},
    )
    assert layers.problems(root, _TWO_LAYERS) == ["in no layer: agentenv_jax.helpers"]


def test_a_downward_import_and_an_outside_import_are_allowed(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "import numpy\n",
            "app/__init__.py": "",
            "app/main.py": "import agentenv_jax.core\nfrom agentenv_jax import core\n",
        },
    )
    assert layers.import_graph(root)["agentenv_jax.app.main"] == {"agentenv_jax.core"}
    assert layers.problems(root, _TWO_LAYERS) == []


def test_the_docs_page_is_regenerated():
    page = (REPO / "docs" / "layers.md").read_text()
    assert page == layers.render_markdown(layers.import_graph()), (
        "docs/layers.md is stale: python tools/layers.py --write docs/layers.md"
    )


def test_the_package_docstring_names_the_layers_in_order():
    named = re.findall(r"^\d\. (\w+): ", agentenv_jax.__doc__, re.MULTILINE)
    assert named == [layer.name for layer in layers.LAYERS]
    for layer in layers.LAYERS:
        line = next(x for x in agentenv_jax.__doc__.split("\n\n") if f" {layer.name}: " in x)
        assert all(f"`{package}`" in line for package in layer.packages), layer.name
