"""The config reference, generated from the schema's own field comments (one source of truth)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

from agentenv_jax.config.schema import ExperimentConfig

_FIELD_LINE = re.compile(r"^\s+(\w+):\s*[^=]+?=\s*.+?#\s*(.+)$")


def _comments(cls: type) -> dict[str, str]:
    found = {}
    for line in inspect.getsource(cls).splitlines():
        match = _FIELD_LINE.match(line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        value = field.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value) if not isinstance(value, str) else f'"{value}"'


def config_reference() -> str:
    """Markdown tables of every section and field, with defaults and meaning."""
    parts = []
    hints = typing.get_type_hints(ExperimentConfig)
    for section in dataclasses.fields(ExperimentConfig):
        variants = typing.get_args(hints[section.name]) or (hints[section.name],)
        for cls in variants:
            doc = (cls.__doc__ or "").strip().splitlines()[0]
            title = f"`{section.name}`"
            if len(variants) > 1:
                title += f" with `name: {_default(dataclasses.fields(cls)[0]).strip(chr(34))}`"
            parts.append(f"### {title} — {doc}\n")
            parts.append("| key | default | meaning |\n|---|---|---|")
            parts += _rows(cls, section.name)
            parts.append("")
    return "\n".join(parts)


def _rows(cls: type, prefix: str) -> list[str]:
    """One table row per field of `cls`; a nested section's fields under its own prefix."""
    rows, comments = [], _comments(cls)
    for field in dataclasses.fields(cls):
        if field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
            nested := field.default_factory()
        ):
            rows += _rows(type(nested), f"{prefix}.{field.name}")
            continue
        rows.append(
            f"| `{prefix}.{field.name}` | `{_default(field)}` | {comments.get(field.name, '')} |"
        )
    return rows
