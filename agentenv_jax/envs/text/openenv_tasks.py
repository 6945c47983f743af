"""OpenEnv (Meta's `openenv-core`) environments as text tasks, unchanged: in process, or served by
OpenEnv's own server and reached through OpenEnv's own client.

* In process: `target = "package.module:MyEnvironment"`, an `openenv.core.env_server`
  `Environment` subclass, made per env copy with `env_kwargs`; its `reset(seed=...)` (the seed
  drawn from the episode's rng, where `reset` takes one) and `step(action)` are called directly.
* Served: `base_url = "http://host:port"`, a server made by OpenEnv's `create_app` (run with
  uvicorn). OpenEnv 0.3.0's clients keep one WebSocket session per client (`/ws`; its `/reset`
  and `/step` HTTP routes make a new env per request, so they cannot hold an episode): each env
  copy opens its own session, so the server must allow at least `num_envs` concurrent sessions
  (`create_app(..., max_concurrent_envs=N)`, which needs `SUPPORTS_CONCURRENT_SESSIONS`).
  Actions go as dicts through OpenEnv's `GenericEnvClient`, or through the env's typed client
  when `client = "package.module:MyEnvClient"` names one. `target`, when also set, only names the
  classes; without it the fields are read from the server's `/schema` when the task is made.

Text and OpenEnv: each message is the action, the action class built from
`{message_field: message}` (default: the action's one str field; its other fields need
defaults); the prompt and each env turn are the observation's `observation_field` (default: its
one str field besides `done`, `reward` and `metadata`; a field of another type is shown as
JSON). The step's reward is `Observation.reward` (None counts 0.0) and its `done` ends the
episode; an episode still running after `max_turns` messages (default 8: OpenEnv envs end their
episodes themselves, so this is only a cap) is truncated. An episode succeeds when its last
reward reaches `success_reward`.

Failures. Anything wrong in the configuration (an import, a class without the field, a server
that cannot be reached when the task is made) is an `EnvError` naming the kwarg. A reset that
fails over the network (server down, refused, at capacity) is an `EnvError` naming `base_url`
and the client's error: without an episode there is nothing to train on. A step that fails
over the network (connection lost, a server error such as an exception in the env's `step`,
which OpenEnv answers as an `EXECUTION_ERROR` message, a timeout after `timeout_s`) or whose
message the action class refuses (a pydantic validation error, in process too) ends the episode
with reward `reward_on_error`: the copy's `failures` counts them, the first is printed to stderr,
and each is logged per update as `reward/openenv/failures` (the task's one reward term, named
`openenv`). The session is dropped and the next reset opens a new one. An exception raised by
an in-process env's own `step` or `reset` is a bug in code running here, and propagates.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
import types
import typing
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentenv_jax.envs.import_path import import_object
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text.tasks import TaskReply, require_int

REWARD_NAME = "openenv"  # the task's one reward term: `reward/openenv/{mean,failures}`
# Fields every OpenEnv action or observation has, which never hold the text.
_ACTION_BASE_FIELDS = ("metadata",)
_OBSERVATION_BASE_FIELDS = ("done", "reward", "metadata")
# Servers (base_url) or in-process env classes whose first failed step this process printed.
_REPORTED: set[str] = set()


def import_openenv() -> types.ModuleType:
    """The `openenv.core` module; `EnvError` saying how to install it when missing."""
    try:
        import openenv.core
    except ImportError as err:
        raise EnvError(
            f"OpenEnv envs need openenv-core ({err}): pip install 'agentenv_jax[openenv]'"
        ) from None
    return openenv.core


def _subclass(path: Any, field: str, base: type, what: str) -> type:
    """The class `path` names, checked to subclass `base`."""
    found = import_object(path, field, what)
    if not isinstance(found, type) or not issubclass(found, base):
        raise EnvError(f"{field} = {path!r}: {found!r} is not {what}")
    return found


def _number(field: str, value: Any) -> float:
    """`value` as a finite float; `EnvError` naming `field` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EnvError(f"{field} = {value!r}: expected a finite number")
    return float(value)


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _hinted(function: Any, name: str, base: type) -> type | None:
    """The class `function`'s type hint `name` (a parameter, or `return`) names, if it is a
    subclass of `base`."""
    try:
        hint = typing.get_type_hints(function).get(name)
    except Exception:
        return None
    return hint if isinstance(hint, type) and issubclass(hint, base) else None


def _generic_args(cls: type, generic: type) -> tuple[Any, ...]:
    """The type arguments `cls` gives `generic` among its bases (`Environment[A, O, S]`)."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is generic:
                return typing.get_args(base)
    return ()


def _nth_class(args: tuple[Any, ...], index: int, base: type) -> type | None:
    arg = args[index] if len(args) > index else None
    return arg if isinstance(arg, type) and issubclass(arg, base) else None


def _is_str(annotation: Any) -> bool:
    """Whether a pydantic field's annotation is `str` or an optional `str`."""
    if annotation is str:
        return True
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and str in (
        typing.get_args(annotation)
    )


# A class's or a schema's fields, each: (holds a str, required).
Fields = dict[str, tuple[bool, bool]]


def class_fields(cls: type, skip: tuple[str, ...]) -> Fields:
    """The fields of pydantic model `cls` other than `skip`."""
    return {
        name: (_is_str(info.annotation), info.is_required())
        for name, info in cls.model_fields.items()
        if name not in skip
    }


def schema_fields(schema: Mapping[str, Any], skip: tuple[str, ...]) -> Fields:
    """The fields a JSON schema (a pydantic model's, as OpenEnv's `/schema` gives it) lists,
    other than `skip`."""
    required = set(schema.get("required", ()))

    def is_str(prop: Mapping[str, Any]) -> bool:
        options = [prop, *prop.get("anyOf", ())]
        return any(isinstance(o, Mapping) and o.get("type") == "string" for o in options)

    return {
        name: (is_str(prop), name in required)
        for name, prop in schema.get("properties", {}).items()
        if name not in skip
    }


def pick_field(field: str, given: str | None, fields: Fields, owner: str) -> str:
    """`given` if `fields` holds it, else (None) the one str field; `EnvError` naming `field`."""
    listed = ", ".join(fields) or "none"
    if given is not None:
        if given not in fields:
            raise EnvError(f"{field} = {given!r}: {owner} has no such field; its fields: {listed}")
        return given
    texts = [name for name, (is_str, _) in fields.items() if is_str]
    if len(texts) != 1:
        raise EnvError(
            f"{field} is not set and {owner} has {len(texts)} str fields "
            f"({', '.join(texts) or 'none'}; its fields: {listed}): set {field} to the field "
            "that holds the text"
        )
    return texts[0]


def _url(base_url: Any) -> str:
    """`base_url` without a trailing slash; `EnvError` unless it is an http(s) URL."""
    parsed = urllib.parse.urlparse(base_url) if isinstance(base_url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise EnvError(
            f"env.kwargs.base_url = {base_url!r}: expected the OpenEnv server's http:// or "
            "https:// URL, e.g. 'http://127.0.0.1:8000'"
        )
    return base_url.rstrip("/")


def fetch_schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    """The server's `/schema` (`action`, `observation` and `state` JSON schemas); `EnvError`
    naming the URL and the status when it cannot be had."""
    url = f"{base_url}/schema"
    handlers = []
    if urllib.parse.urlparse(url).hostname in ("localhost", "127.0.0.1", "::1"):
        handlers.append(urllib.request.ProxyHandler({}))  # as OpenEnv's client: never proxied
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout_s) as response:
            schema = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise EnvError(
            f"env.kwargs.base_url = {base_url!r}: GET {url} answered HTTP {err.code} "
            f"({err.reason}); expected an OpenEnv server (openenv.core create_app)"
        ) from None
    except (OSError, ValueError) as err:
        raise EnvError(
            f"env.kwargs.base_url = {base_url!r}: cannot reach the OpenEnv server (GET {url}: "
            f"{err}); is it running?"
        ) from None
    if not all(isinstance(schema.get(key), Mapping) for key in ("action", "observation")):
        raise EnvError(
            f"env.kwargs.base_url = {base_url!r}: GET {url} gave no action and observation "
            "schemas; expected an OpenEnv server (openenv.core create_app)"
        )
    return schema


class OpenEnvTask:
    """An OpenEnv environment as a text task, in process (`target`) or served (`base_url`);
    see the module docstring. `failures` counts this copy's failed steps.

    Copies (`copy.copy`, one per env of a vector env) share the configuration and start
    without an env or a session; each makes its own at its first reset. `close()` ends them.
    """

    reward_names = (REWARD_NAME,)

    def __init__(
        self,
        target: str | None = None,
        base_url: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        client: str | None = None,
        action_class: str | None = None,
        message_field: str | None = None,
        observation_field: str | None = None,
        max_turns: int = 8,
        success_reward: float = 1.0,
        reward_on_error: float = 0.0,
        timeout_s: float = 60.0,
    ):
        core = import_openenv()
        from openenv.core.env_client import EnvClient
        from openenv.core.generic_client import GenericEnvClient

        if target is None and base_url is None:
            raise EnvError(
                "env.kwargs.target and env.kwargs.base_url are both unset: set target "
                "(package.module:MyEnvironment, run in process) or base_url (an OpenEnv server)"
            )
        self.max_turns = require_int("env.kwargs.max_turns", max_turns, 1)
        self.success_reward = _number("env.kwargs.success_reward", success_reward)
        self.reward_on_error = _number("env.kwargs.reward_on_error", reward_on_error)
        self.timeout_s = _number("env.kwargs.timeout_s", timeout_s)
        if not 0 < self.timeout_s <= 3600:
            raise EnvError(f"env.kwargs.timeout_s = {timeout_s!r}: expected seconds in (0, 3600]")
        if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
            raise EnvError(f"env.kwargs.env_kwargs = {env_kwargs!r}: expected a mapping")
        self.env_kwargs = dict(env_kwargs or {})
        self.base_url = None if base_url is None else _url(base_url)
        if self.base_url is not None and self.env_kwargs:
            raise EnvError(
                f"env.kwargs.env_kwargs = {self.env_kwargs!r}: the env served at "
                f"{self.base_url} is made by its server; env_kwargs are for target in process"
            )

        self.env_class: type | None = None
        if target is not None:
            self.env_class = _subclass(
                target, "env.kwargs.target", core.Environment, "an openenv Environment subclass"
            )
            if self.base_url is None:
                try:
                    inspect.signature(self.env_class).bind(**self.env_kwargs)
                except TypeError as err:
                    raise EnvError(
                        f"env.kwargs.env_kwargs = {self.env_kwargs!r}: {target} does not take "
                        f"them ({err})"
                    ) from None
        self.client_class: type = GenericEnvClient
        if client is not None:
            if self.base_url is None:
                raise EnvError(
                    f"env.kwargs.client = {client!r}: a client needs env.kwargs.base_url (an "
                    "env given by target runs in process)"
                )
            self.client_class = _subclass(
                client, "env.kwargs.client", EnvClient, "an openenv EnvClient subclass"
            )
        self.action_class, observation_class = self._classes(action_class, core)
        if self.action_class is None and self.base_url is None:
            raise EnvError(
                f"env.kwargs.action_class is not set and {target}'s step names no Action "
                "subclass (no type hint, no Environment[Action, Observation, State] base): "
                "set env.kwargs.action_class"
            )
        if self.action_class is None and self.client_class is not GenericEnvClient:
            raise EnvError(
                f"env.kwargs.action_class is not set and the typed client {client} names no "
                "Action subclass (no EnvClient[Action, Observation, State] base): set "
                "env.kwargs.action_class"
            )

        schema: dict[str, Any] | None = None
        if self.action_class is not None:
            action_fields = class_fields(self.action_class, _ACTION_BASE_FIELDS)
            action_owner = f"the action class {_name(self.action_class)}"
        else:
            assert self.base_url is not None
            schema = fetch_schema(self.base_url, self.timeout_s)
            action_fields = schema_fields(schema["action"], _ACTION_BASE_FIELDS)
            action_owner = f"the action schema of {self.base_url}"
        self.message_field = pick_field(
            "env.kwargs.message_field", message_field, action_fields, action_owner
        )
        others = [n for n, (_, required) in action_fields.items() if required]
        others = [n for n in others if n != self.message_field]
        if others:
            raise EnvError(
                f"env.kwargs.message_field = {self.message_field!r}: {action_owner} also "
                f"requires {', '.join(others)}, and an action is made from the message alone; "
                "give those fields defaults"
            )

        if observation_class is not None:
            observation_fields = class_fields(observation_class, _OBSERVATION_BASE_FIELDS)
            observation_owner = f"the observation class {_name(observation_class)}"
        elif self.base_url is not None:
            schema = schema or fetch_schema(self.base_url, self.timeout_s)
            observation_fields = schema_fields(schema["observation"], _OBSERVATION_BASE_FIELDS)
            observation_owner = f"the observation schema of {self.base_url}"
        elif observation_field is not None:
            observation_fields = {observation_field: (True, False)}  # checked at the first reset
            observation_owner = ""
        else:
            raise EnvError(
                f"env.kwargs.observation_field is not set and {target}'s reset names no "
                "Observation subclass (no type hint, no Environment[Action, Observation, State] "
                "base): set env.kwargs.observation_field"
            )
        self.observation_field = pick_field(
            "env.kwargs.observation_field",
            observation_field,
            observation_fields,
            observation_owner,
        )
        self._reset_takes_seed = self.env_class is not None and _takes(self.env_class.reset, "seed")
        self.failures = 0  # this copy's failed steps (see the module docstring)
        self._env: Any = None  # this copy's env (in process), made at its first reset
        self._client: Any = None  # this copy's session (served): a SyncEnvClient

    def _classes(self, action_class: str | None, core: Any) -> tuple[type | None, type | None]:
        """The action and observation classes: `action_class`, else the typed client's or the
        env's (its hints, else its generic base); None where none says."""
        from openenv.core.env_client import EnvClient

        client_args = _generic_args(self.client_class, EnvClient)
        env_args = () if self.env_class is None else _generic_args(self.env_class, core.Environment)
        action = observation = None
        if action_class is not None:
            action = _subclass(
                action_class,
                "env.kwargs.action_class",
                core.Action,
                "an openenv Action subclass",
            )
        action = action or _nth_class(client_args, 0, core.Action)
        observation = _nth_class(client_args, 1, core.Observation)
        if self.env_class is not None:
            action = (
                action
                or _hinted(self.env_class.step, "action", core.Action)
                or _nth_class(env_args, 0, core.Action)
            )
            observation = (
                observation
                or _hinted(self.env_class.reset, "return", core.Observation)
                or _hinted(self.env_class.step, "return", core.Observation)
                or _nth_class(env_args, 1, core.Observation)
            )
        return action, observation

    def __copy__(self) -> OpenEnvTask:
        # A copy shares the configuration, never a live env or session.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._env, clone._client, clone.failures = None, None, 0
        return clone

    def reset(self, rng: np.random.Generator) -> str:
        seed = int(rng.integers(2**31))
        if self.base_url is None:
            if self._env is None:
                assert self.env_class is not None
                self._env = self.env_class(**self.env_kwargs)
            observation = self._env.reset(**({"seed": seed} if self._reset_takes_seed else {}))
            return self._text(observation)
        fresh = self._client is None
        try:
            if self._client is None:
                self._client = self.client_class(
                    base_url=self.base_url,
                    connect_timeout_s=min(10.0, self.timeout_s),
                    message_timeout_s=self.timeout_s,
                ).sync()
            result = self._client.reset(seed=seed)
        except Exception as err:
            self._drop_client()
            raise EnvError(
                f"env.kwargs.base_url = {self.base_url!r}: the OpenEnv server did not start an "
                f"episode ({type(err).__name__}: {err}){_reset_hint(err, fresh)}"
            ) from err
        return self._text(result.observation)

    def reply(self, message: str) -> TaskReply:
        if self._env is None and self._client is None:
            raise RuntimeError("OpenEnvTask.reply before reset")
        from pydantic import ValidationError

        try:
            action = self._action(message)
        except ValidationError as err:
            return self._failed(f"refused a message as its action ({err.errors()[0]['msg']})")
        if self.base_url is None:
            observation = self._env.step(action)
            reward, done = observation.reward, observation.done
        else:
            try:
                result = self._client.step(action)
            except Exception as err:
                self._drop_client()
                return self._failed(f"failed a step ({type(err).__name__}: {err})")
            observation, reward, done = result.observation, result.reward, result.done
        reward = 0.0 if reward is None else float(reward)
        return TaskReply(
            text=None if done else self._text(observation),
            reward=reward,
            done=bool(done),
            success=reward >= self.success_reward,
            terms=(reward,),
            failed=(False,),
        )

    def close(self) -> None:
        """End this copy's env or session (a new one is made at the next reset)."""
        self._drop_client()
        if self._env is not None:
            env, self._env = self._env, None
            env.close()

    def _action(self, message: str) -> Any:
        """The action of `message`: the action class's (a dict for the generic client without
        one)."""
        if self.action_class is None:
            return {self.message_field: message}
        return self.action_class(**{self.message_field: message})

    def _text(self, observation: Any) -> str:
        """The observation's text (`observation_field`): an object's attribute, or a dict's key
        as the generic client gives it."""
        if isinstance(observation, Mapping):
            found = self.observation_field in observation
            value = observation.get(self.observation_field)
        else:
            found = hasattr(observation, self.observation_field)
            value = getattr(observation, self.observation_field, None)
        if not found:
            keys = observation if isinstance(observation, Mapping) else vars(observation)
            raise EnvError(
                f"env.kwargs.observation_field = {self.observation_field!r}: the env's "
                f"observation has no such field; its fields: {', '.join(map(str, keys))}"
            )
        return value if isinstance(value, str) else json.dumps(value, default=str)

    def _failed(self, what: str) -> TaskReply:
        """End the episode after a failed step: counted, and the first shown."""
        self.failures += 1
        where = self.base_url or _name(type(self._env))
        if where not in _REPORTED:
            # Once per server (or env class) and process: the counts go to the metrics.
            _REPORTED.add(where)
            print(
                f"agentenv: the OpenEnv env {where} {what}; the episode ends with "
                f"env.kwargs.reward_on_error = {self.reward_on_error:g}, and every failure is "
                f"counted per update as reward/{REWARD_NAME}/failures (shown once)",
                file=sys.stderr,
                flush=True,
            )
        return TaskReply(
            text=None,
            reward=self.reward_on_error,
            done=True,
            success=False,
            terms=(math.nan,),
            failed=(True,),
        )

    def _drop_client(self) -> None:
        """Close this copy's session, if any, as well as a broken one allows."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass  # a connection already lost has nothing left to close


def _reset_hint(err: Exception, fresh: bool) -> str:
    """What a failed reset probably means, for its error message."""
    from websockets.exceptions import ConnectionClosed

    capacity = "start it with create_app(..., max_concurrent_envs=N), N >= num_envs"
    if "CAPACITY_REACHED" in str(err):
        return f"; the server allows fewer sessions than there are envs: {capacity}"
    if fresh and isinstance(err, ConnectionClosed):
        # NOTE: a server at capacity sends its error and closes the session at once; the
        # client's reset, sent after the close arrived, then sees the close alone.
        return (
            "; the server closed the new session at once: it is at capacity (then "
            f"{capacity}) or could not make its env (see its log)"
        )
    return ""


def _takes(function: Any, name: str) -> bool:
    """Whether `function` accepts keyword `name` (by name, or through `**kwargs`)."""
    parameters = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
