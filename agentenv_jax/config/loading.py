"""Build an `ExperimentConfig` from YAML and `key=value` overrides, with strict type checking.

Unknown keys are errors with a did-you-mean; values are checked against the schema's type hints
(no silent coercion of strings to numbers, or of numbers to booleans); ranges are checked by each
section's `validate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.experiments import resolve_config_path
from agentenv_jax.config.schema import ExperimentConfig


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "str": "a string",
        }.get(tp.__name__, tp.__name__)
    return str(tp).replace("typing.", "")


_SCIENTIFIC = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the type hint `tp`, converting only lossless cases (int -> float)."""
    if tp in (int, float) and isinstance(value, str) and _SCIENTIFIC.match(value.strip()):
        value = float(value)  # PyYAML (YAML 1.1) reads 1e5 and 3e-4 as strings
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if all(dataclasses.is_dataclass(a) for a in args):
            return _convert(value, _choose_variant(value, args, path), path)
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _convert(value, option, path)
            except ConfigError as err:
                errors.append(str(err))
        allowed = " or ".join(_type_name(o) for o in options)
        if type(None) in args:
            allowed = "null or " + allowed
        raise ConfigError(f"{path} = {value!r} is not allowed: expected {allowed}")
    if origin is typing.Literal:
        if value in args and isinstance(value, str):
            return value
        raise ConfigError(
            f"{path} = {value!r} is not allowed: expected one of {', '.join(map(repr, args))}"
            + (_did_you_mean(value, args) if isinstance(value, str) else "")
        )
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} = {value!r} is not allowed: expected a list")
        item_type = args[0]
        return tuple(_convert(v, item_type, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} = {value!r} is not allowed: expected a mapping")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} = {value!r} is not allowed: expected a mapping of fields")
        return _build(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)  # YAML reads 1e5 as a float; accept it when it is whole
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported type hint {tp!r} at {path}")
    raise ConfigError(f"{path} = {value!r} is not allowed: expected {_type_name(tp)}")


def _variant_name(cls: type) -> str:
    return next(f.default for f in dataclasses.fields(cls) if f.name == "name")


def _choose_variant(value: Any, variants: tuple[type, ...], path: str) -> type:
    """The dataclass of a tagged union (e.g. the `algorithm` section) named by `value["name"]`."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} = {value!r} is not allowed: expected a mapping of fields")
    names = {_variant_name(v): v for v in variants}
    name = value.get("name", _variant_name(variants[0]))
    if name not in names:
        raise ConfigError(
            f"{path}.name = {name!r} is not allowed: expected one of "
            f"{', '.join(map(repr, names))}"
            + (_did_you_mean(name, list(names)) if isinstance(name, str) else "")
        )
    return names[name]


def _build(cls: type, raw: Mapping[str, Any], path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(
                f"unknown key {where!r}{_did_you_mean(str(key), names)}; "
                f"allowed keys{' in ' + path if path else ''}: {', '.join(names)}"
            )
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _convert(raw[name], hints[name], f"{path}.{name}" if path else name)
    return cls(**kwargs)


def config_from_dict(raw: Mapping[str, Any] | None) -> ExperimentConfig:
    """Build and validate an `ExperimentConfig`; raises `ConfigError` naming the bad field."""
    config = _build(ExperimentConfig, raw or {}, "")
    config.validate()
    return config


# Aliases may repeat at most this many nodes in all (each alias counts the nodes it stands
# for): far more than a config needs to share a section, and far less than a "billion laughs"
# bomb, whose few lines stand for 9**9 nodes that are expanded (minutes, gigabytes) as soon as
# the config is copied or saved.
_MAX_ALIAS_NODES = 10_000

# Every rank parses the config; 2 MiB (a thousand times the largest shipped experiment)
# already takes seconds, even with libyaml (PyYAML builds a Python object per node).
_MAX_FILE_BYTES = 2 * 2**20


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


def _check_aliases(root: yaml.Node) -> None:
    """`ConfigError` (naming the line of the anchor to blame) when the document's aliases
    stand for more than `_MAX_ALIAS_NODES` nodes, or an anchored node holds an alias to itself.

    An alias is the anchored node itself, shared (the composer does not copy it), so this walks
    each distinct node once: without expanding anything, whatever the aliases add up to.
    """
    size: dict[int, int] = {}  # id(node) -> node count of its subtree with aliases expanded
    uses: dict[int, int] = {id(root): 1}  # id(node) -> places it appears in the written text
    distinct: dict[int, yaml.Node] = {}
    open_: set[int] = set()  # the nodes whose subtree is being walked: the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # a loop, not recursion: configs may nest deeper than Python's stack
        node, walked = stack.pop()
        children = _children(node)
        if walked:
            size[id(node)] = 1 + sum(size[id(child)] for child in children)
            open_.discard(id(node))
            continue
        if id(node) in size:
            continue
        if id(node) in open_:
            raise ConfigError(
                f"line {node.start_mark.line + 1}: the node anchored there holds an alias to "
                "itself; a config cannot be recursive"
            )
        open_.add(id(node))
        distinct[id(node)] = node
        stack.append((node, True))
        for child in children:
            uses[id(child)] = uses.get(id(child), 0) + 1
            stack.append((child, False))
    repeated = size[id(root)] - len(distinct)
    if repeated > _MAX_ALIAS_NODES:
        worst = max(distinct, key=lambda key: (uses[key] - 1) * size[key])
        raise ConfigError(
            f"line {distinct[worst].start_mark.line + 1}: aliases of the node anchored there "
            f"(and of others) stand for {repeated:,} nodes; at most {_MAX_ALIAS_NODES:,} are "
            "allowed, so that a YAML alias bomb cannot fill the memory: write the values out"
        )


def _construct_strict_mapping(
    loader: yaml.SafeLoader, node: yaml.MappingNode
) -> Iterator[dict[Any, Any]]:
    """A mapping, except that a key given twice in it is an error (PyYAML keeps the last
    silently, so a repeated section header would drop the first one's keys).

    A generator, as PyYAML's own mapping constructor: the values are filled in after the
    mapping is made, so nesting does not recurse."""
    data: dict[Any, Any] = {}
    yield data
    loader.flatten_mapping(node)
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # construct_mapping refuses it, naming the line
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise ConfigError(
                f"line {line}: key {key!r} is given twice in one mapping (first on line "
                f"{first_line[key]}); keep one"
            )
        first_line[key] = line
    data.update(loader.construct_mapping(node))


def _strict_loader(base: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """PyYAML's safe loader `base` with the alias bound and the duplicate-key check."""

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        def get_single_data(self) -> Any:
            node = self.get_single_node()
            if node is None:
                return None
            _check_aliases(node)  # before anything is constructed
            return self.construct_document(node)

    StrictLoader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping
    )
    return StrictLoader


# libyaml's parser (CSafeLoader) reads a config several times faster than the pure-Python one;
# PyYAML built without libyaml lacks it.
_PURE_STRICT_LOADER = _strict_loader(yaml.SafeLoader)
_STRICT_LOADER = (
    _strict_loader(yaml.CSafeLoader) if hasattr(yaml, "CSafeLoader") else _PURE_STRICT_LOADER
)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not allowed: expected key.path=value")
    key, raw_value = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not allowed: expected key.path=value")
    try:
        value = yaml.load(raw_value, Loader=_STRICT_LOADER) if raw_value.strip() else ""
    except ConfigError as err:
        raise ConfigError(f"override {text!r}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({err})") from None
    return key.split("."), value


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of the raw config mapping with dotted `key=value` overrides applied.

    Values are parsed as YAML scalars or lists (`lr=3e-4`, `net.actor_hidden=[32,32]`); the keys
    are checked when the result is built, so a misspelt key gets the same did-you-mean.
    """
    result: dict[str, Any] = _deep_copy(raw)
    for text in overrides:
        keys, value = _parse_override(text)
        node = result
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                raise ConfigError(
                    f"override {text!r}: {'.'.join(keys[: depth + 1])} is not a "
                    "section, so it has no sub-keys"
                )
            node = child
        node[keys[-1]] = value
    return result


def _deep_copy(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in raw.items()}


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(name: str, mode: int) -> ConfigError:
    kind = next((kind for is_kind, kind in _FILE_KINDS if is_kind(mode)), "not a plain file")
    return ConfigError(f"{name} is {kind}, not a regular file")


def _read_file(path: Path, name: str) -> bytes:
    """The bytes of a regular file of at most `_MAX_FILE_BYTES`; `ConfigError` starting with
    `name` when it is anything else, too large or unreadable. Never blocks on a FIFO."""
    try:
        # Without O_NONBLOCK, opening a FIFO waits for a writer, perhaps for ever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        try:
            mode = os.stat(path).st_mode  # a socket exists but cannot be opened
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise _not_regular(name, mode) from None
        raise ConfigError(f"{name} cannot be read: {err.strerror}") from None
    info = os.fstat(fd)  # of what was opened: a path swapped since is not read either
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_regular(name, info.st_mode)
    with os.fdopen(fd, "rb") as file:
        data = file.read(_MAX_FILE_BYTES + 1)  # + 1: a file that grew since fstat is refused too
    size = max(info.st_size, len(data))
    if size > _MAX_FILE_BYTES:
        raise ConfigError(
            f"{name} is {size:,} bytes; at most {_MAX_FILE_BYTES:,} "
            f"({_MAX_FILE_BYTES // 2**20} MiB) are allowed, since every rank parses it: keep "
            "large data in a file of its own and give its path"
        )
    return data


def read_yaml_mapping(path: Path, what: str, empty_hint: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping (no key twice, few aliases); `ConfigError` naming
    the file as `what` (and the line) when it is empty, not YAML, not a mapping, not a regular
    file, over 2 MiB, or when its aliases stand for too many nodes (an alias bomb)."""
    name = f"{what} {str(path)!r}"
    data = _read_file(path, name)
    try:
        raw = yaml.load(data, Loader=_STRICT_LOADER)
    except ConfigError as err:
        raise ConfigError(f"{name}, {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{name} is not valid YAML: {err}") from None
    if raw is None:
        raise ConfigError(f"{name} is empty: {empty_hint}")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name} must hold a mapping, not {type(raw).__name__}")
    return dict(raw)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw sections of a YAML experiment file (or of a shipped experiment, by name);
    `ConfigError` naming the file (and line) when it is missing, empty, not YAML, not a
    mapping, repeats a key, or is not a regular file, too large or an alias bomb."""
    return read_yaml_mapping(
        resolve_config_path(path),
        "config file",
        "expected a mapping of sections (env, algorithm, ...); to train on the defaults, "
        "give no file",
    )


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read a YAML experiment file (or the defaults when `path` is None) and apply overrides."""
    raw = {} if path is None else read_config_file(path)
    return config_from_dict(apply_overrides(raw, overrides))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """The config as plain YAML-friendly data (tuples become lists)."""
    return _plain(dataclasses.asdict(config))


def save_config(config: ExperimentConfig, path: str | Path) -> None:
    """Write the resolved config; `load_config(path)` reads it back to an equal config."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))


def _merged(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in saved.items():
        default = defaults.get(key)
        both_sections = isinstance(value, dict) and isinstance(default, dict)
        merged[key] = _merged(value, default) if both_sections else value
    return merged


def with_defaults(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A config written earlier (a checkpoint's, a sweep's), as plain data, with the keys it
    lacks taken from today's defaults: it was written before those settings existed, so it
    ran with what are now their defaults (`network.torso`, `env.backend`, ...)."""
    return _merged(dict(saved), config_to_dict(ExperimentConfig()))
