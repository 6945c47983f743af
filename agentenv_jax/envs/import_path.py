"""Objects named by import path in configs: `package.module:name`, or a Python file and a
name, `path/to/file.py:name` (as verl names a reward file), for env factories, text tasks,
reward functions and OpenEnv classes alike."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from agentenv_jax.envs.spaces import EnvError

_MISSING = object()


def _module(path: str, module_name: str, field: str) -> ModuleType:
    """The module `module_name` (a dotted name, or a `.py` file) of `path`, imported."""
    try:
        if module_name.endswith(".py"):
            file = Path(module_name).expanduser()
            if not file.is_file():
                raise EnvError(f"{field} = {path!r}: no such file {str(file)!r}")
            spec = importlib.util.spec_from_file_location(f"agentenv_user_{file.stem}", file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(module_name)
    except EnvError:
        raise
    except Exception as err:
        raise EnvError(
            f"{field} = {path!r}: cannot import module {module_name!r} ({type(err).__name__}: "
            f"{err})"
        ) from None


def import_object(path: Any, field: str, what: str = "an object", missing_ok: bool = False) -> Any:
    """The object `path` names (`package.module:name` or `file.py:name`). `EnvError` naming
    `field` (the setting) when `path` is not such a path or its module does not import; and
    when the module has no such name, unless `missing_ok` (then None: Gymnasium's own
    `module:EnvId-v0` ids name a registered env, not an attribute)."""
    module_name, _, name = str(path).rpartition(":")
    if not isinstance(path, str) or not module_name or not name:
        raise EnvError(
            f"{field} = {path!r}: expected {what} as package.module:name or file.py:name"
        )
    found = getattr(_module(path, module_name, field), name, _MISSING)
    if found is _MISSING:
        if missing_ok:
            return None
        raise EnvError(f"{field} = {path!r}: module {module_name!r} has no {name!r}")
    return found
