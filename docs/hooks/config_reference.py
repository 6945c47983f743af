"""MkDocs hook: the configuration page's tables are generated from the schema at build time.

The marker `<!-- config-reference -->` in a page is replaced by `config_reference()`, the same
Markdown `agentenv config-reference` prints, so the site cannot drift from the schema. Only
`agentenv_jax.config` is imported (no JAX, no MPI).
"""

from __future__ import annotations

import sys
from pathlib import Path

MARKER = "<!-- config-reference -->"

_REPO = Path(__file__).resolve().parents[2]


def config_reference_markdown() -> str:
    """The schema's reference tables, one `### section` heading and table per section."""
    if str(_REPO) not in sys.path:
        sys.path.insert(0, str(_REPO))
    from agentenv_jax.config.reference import config_reference

    return config_reference()


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace the marker with the reference; a page without it is returned as it is."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_reference_markdown())
